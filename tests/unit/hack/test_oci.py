"""hack/images/oci.py: layer and image-layout tars, byte for byte deterministic."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path
from typing import Any

import pytest

from hack.images.oci import (
    CONFIG_MEDIA_TYPE,
    INDEX_MEDIA_TYPE,
    LAYER_MEDIA_TYPE,
    MANIFEST_MEDIA_TYPE,
    Dir,
    Entry,
    File,
    ImageConfig,
    Symlink,
    layer_of,
    read_image,
    split_ref,
    write_image,
    write_layer,
)

REF = "gpuferry.local/demo:0123456789ab"


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def entries(tmp_path: Path) -> dict[str, Entry]:
    source = tmp_path / "tool"
    source.write_bytes(b"#!/bin/sh\necho tool\n")
    return {
        "/usr/bin/tool": File(source, mode=0o755),
        "etc/motd": File(b"hello\n"),
        "bin/sh": Symlink("/usr/bin/tool"),
        "tmp": Dir(mode=0o1777),
        "home/user": Dir(mode=0o700, uid=1000, gid=1000),
    }


def members(path: Path) -> list[tarfile.TarInfo]:
    with tarfile.open(path) as tar:
        return tar.getmembers()


def test_layer_has_sorted_entries_their_parents_and_no_time_or_names(tmp_path: Path) -> None:
    layer = write_layer(entries(tmp_path), tmp_path / "layer.tar")
    got = members(layer.path)
    assert [m.name for m in got] == [
        "bin", "bin/sh", "etc", "etc/motd", "home", "home/user", "tmp", "usr", "usr/bin", "usr/bin/tool",
    ]  # fmt: skip
    by_name = {m.name: m for m in got}
    assert all(m.mtime == 0 and m.uname == "" and m.gname == "" for m in got)
    assert by_name["usr"].isdir() and by_name["usr"].mode == 0o755 and by_name["usr"].uid == 0
    assert by_name["tmp"].mode == 0o1777
    assert (by_name["home/user"].uid, by_name["home/user"].gid, by_name["home/user"].mode) == (
        1000,
        1000,
        0o700,
    )
    assert by_name["bin/sh"].issym() and by_name["bin/sh"].linkname == "/usr/bin/tool"
    assert by_name["usr/bin/tool"].mode == 0o755 and by_name["etc/motd"].mode == 0o644
    with tarfile.open(layer.path) as tar:
        motd = tar.extractfile("etc/motd")
        assert motd is not None and motd.read() == b"hello\n"


def test_layer_digest_is_the_sha256_of_the_uncompressed_tar(tmp_path: Path) -> None:
    layer = write_layer(entries(tmp_path), tmp_path / "layer.tar")
    data = layer.path.read_bytes()
    assert layer.digest == sha256(data)
    assert layer.size == len(data)
    assert layer_of(layer.path) == layer


def test_same_inputs_give_identical_bytes_and_mtime_is_honoured(tmp_path: Path) -> None:
    one = write_layer(entries(tmp_path), tmp_path / "one.tar")
    two = write_layer(dict(reversed(entries(tmp_path).items())), tmp_path / "two.tar")
    assert one.path.read_bytes() == two.path.read_bytes()
    later = write_layer(entries(tmp_path), tmp_path / "later.tar", mtime=1700000000)
    assert later.digest != one.digest
    assert {m.mtime for m in members(later.path)} == {1700000000}


@pytest.mark.parametrize("bad", ["", "/", "a/../b", "./a", "a//b"])
def test_layer_refuses_paths_that_do_not_name_one_place(tmp_path: Path, bad: str) -> None:
    with pytest.raises(ValueError):
        write_layer({bad: File(b"x")}, tmp_path / "layer.tar")


def blobs(image: Path) -> dict[str, bytes]:
    with tarfile.open(image) as tar:
        found = {}
        for m in tar.getmembers():
            if m.isfile() and m.name.startswith("blobs/sha256/"):
                f = tar.extractfile(m)
                assert f is not None
                found["sha256:" + m.name.removeprefix("blobs/sha256/")] = f.read()
        return found


def doc(image: Path, name: str) -> Any:
    with tarfile.open(image) as tar:
        f = tar.extractfile(name)
        assert f is not None
        return json.load(f)


def two_layer_image(tmp_path: Path, out: Path) -> tuple[list[Path], Any]:
    first = write_layer(entries(tmp_path), tmp_path / "l1.tar")
    second = write_layer({"app/run": File(b"run\n", mode=0o755)}, tmp_path / "l2.tar")
    config = ImageConfig(
        entrypoint=("/app/run",),
        cmd=("--flag",),
        env={"PATH": "/usr/bin:/bin", "A": "1"},
        workdir="/app",
        user="65532:65532",
        labels={"io.example": "yes"},
    )
    written = write_image([first, second], config, REF, out)
    return [first.path, second.path], written


def test_image_layout_index_manifest_and_config(tmp_path: Path) -> None:
    image = tmp_path / "image.tar"
    layer_paths, written = two_layer_image(tmp_path, image)
    assert [m.name for m in members(image)][:4] == ["oci-layout", "index.json", "blobs", "blobs/sha256"]
    assert doc(image, "oci-layout") == {"imageLayoutVersion": "1.0.0"}
    all_blobs = blobs(image)
    assert all(digest == sha256(data) for digest, data in all_blobs.items())  # content-addressed

    index = doc(image, "index.json")
    assert index["schemaVersion"] == 2 and index["mediaType"] == INDEX_MEDIA_TYPE
    [desc] = index["manifests"]
    assert desc["mediaType"] == MANIFEST_MEDIA_TYPE
    assert desc["annotations"] == {
        "io.containerd.image.name": REF,
        "org.opencontainers.image.ref.name": "0123456789ab",
    }
    assert desc["platform"] == {"architecture": "amd64", "os": "linux"}
    manifest_bytes = all_blobs[desc["digest"]]
    assert desc["size"] == len(manifest_bytes) and written.digest == desc["digest"]

    manifest = json.loads(manifest_bytes)
    assert manifest["schemaVersion"] == 2 and manifest["mediaType"] == MANIFEST_MEDIA_TYPE
    assert manifest["config"]["mediaType"] == CONFIG_MEDIA_TYPE
    layer_digests = [sha256(p.read_bytes()) for p in layer_paths]
    assert [la["digest"] for la in manifest["layers"]] == layer_digests
    assert {la["mediaType"] for la in manifest["layers"]} == {LAYER_MEDIA_TYPE}
    assert [la["size"] for la in manifest["layers"]] == [p.stat().st_size for p in layer_paths]
    assert [all_blobs[d] for d in layer_digests] == [p.read_bytes() for p in layer_paths]

    config = json.loads(all_blobs[manifest["config"]["digest"]])
    assert manifest["config"]["size"] == len(all_blobs[manifest["config"]["digest"]])
    assert (config["architecture"], config["os"]) == ("amd64", "linux")
    assert config["rootfs"] == {"type": "layers", "diff_ids": layer_digests}
    assert config["config"] == {
        "Entrypoint": ["/app/run"],
        "Cmd": ["--flag"],
        "Env": ["PATH=/usr/bin:/bin", "A=1"],
        "WorkingDir": "/app",
        "User": "65532:65532",
        "Labels": {"io.example": "yes"},
    }
    assert config["created"] == "1970-01-01T00:00:00Z" and len(config["history"]) == 2
    assert all(m.mtime == 0 and m.uid == 0 and m.gid == 0 for m in members(image))


def test_image_is_deterministic_and_read_back(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    _, written = two_layer_image(tmp_path / "a", tmp_path / "one.tar")
    two_layer_image(tmp_path / "b", tmp_path / "two.tar")
    assert (tmp_path / "one.tar").read_bytes() == (tmp_path / "two.tar").read_bytes()
    back = read_image(tmp_path / "one.tar")
    assert back.ref == REF and back.digest == written.digest
    assert back.config["config"]["User"] == "65532:65532"
    assert written.size == (tmp_path / "one.tar").stat().st_size


def test_a_layer_used_twice_is_stored_once(tmp_path: Path) -> None:
    layer = write_layer({"x": File(b"x")}, tmp_path / "l.tar")
    write_image([layer, layer], ImageConfig(), REF, tmp_path / "image.tar")
    assert len(blobs(tmp_path / "image.tar")) == 3  # config, manifest, the layer
    assert doc(tmp_path / "image.tar", "index.json")["manifests"][0]["digest"] in blobs(
        tmp_path / "image.tar"
    )


def test_refs_need_a_tag() -> None:
    assert split_ref("gpuferry.local/pause:abc") == ("gpuferry.local/pause", "abc")
    assert split_ref("localhost:5000/x:v1") == ("localhost:5000/x", "v1")
    for bad in ("gpuferry.local/pause", "localhost:5000/x", ":abc"):
        with pytest.raises(ValueError):
            split_ref(bad)


def test_empty_config_writes_only_env(tmp_path: Path) -> None:
    layer = write_layer({"x": File(b"x")}, tmp_path / "l.tar")
    write_image([layer], ImageConfig(workdir=""), REF, tmp_path / "image.tar")
    assert read_image(tmp_path / "image.tar").config["config"] == {"Env": []}


def test_bytes_and_file_sources_give_the_same_layer(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"same\n")
    one = write_layer({"f": File(tmp_path / "f")}, tmp_path / "one.tar")
    two = write_layer({"f": File(b"same\n")}, tmp_path / "two.tar")
    assert one.digest == two.digest
    with tarfile.open(fileobj=io.BytesIO(one.path.read_bytes())) as tar:
        assert [m.name for m in tar.getmembers()] == ["f"]
