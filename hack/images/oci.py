"""OCI image layouts as tar files, for ``ctr -n k8s.io images import FILE.tar``. No I/O beyond the
files named; no Docker, no registry.

Layers are uncompressed tars (``application/vnd.oci.image.layer.v1.tar``), so a layer's digest is
its diff_id. Everything is deterministic: the same inputs give byte-identical files (entries in a
fixed order, owner 0:0 unless given, every mtime ``mtime``, no user or group names).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import io
import json
import tarfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

LAYER_MEDIA_TYPE = "application/vnd.oci.image.layer.v1.tar"
CONFIG_MEDIA_TYPE = "application/vnd.oci.image.config.v1+json"
MANIFEST_MEDIA_TYPE = "application/vnd.oci.image.manifest.v1+json"
INDEX_MEDIA_TYPE = "application/vnd.oci.image.index.v1+json"
NAME_ANNOTATION = "io.containerd.image.name"
REF_ANNOTATION = "org.opencontainers.image.ref.name"
_CHUNK = 1 << 20


@dataclass(frozen=True)
class File:
    """A regular file in a layer, from a file on disk or from bytes."""

    source: Path | bytes
    mode: int = 0o644
    uid: int = 0
    gid: int = 0


@dataclass(frozen=True)
class Symlink:
    target: str


@dataclass(frozen=True)
class Dir:
    mode: int = 0o755
    uid: int = 0
    gid: int = 0


Entry = File | Symlink | Dir


@dataclass(frozen=True)
class Layer:
    """An uncompressed layer tar: its digest is also its diff_id."""

    path: Path
    digest: str
    size: int


@dataclass(frozen=True)
class ImageConfig:
    """The runtime part of an image config (what ``docker inspect`` shows under Config)."""

    entrypoint: Sequence[str] = ()
    cmd: Sequence[str] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    workdir: str = "/"
    user: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class WrittenImage:
    ref: str
    digest: str  # of the manifest: what containerd calls the image's digest
    config_digest: str
    size: int  # of the image tar


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return "sha256:" + h.hexdigest()


def layer_of(path: Path) -> Layer:
    """Describe an existing uncompressed layer tar."""
    return Layer(path=path, digest=sha256_file(path), size=path.stat().st_size)


def _clean(path: str) -> str:
    parts = path.removeprefix("/").split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"bad path in layer: {path!r}")
    return "/".join(parts)


def _parents(path: str) -> list[str]:
    parts = path.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))]


def _info(name: str, *, mtime: int, mode: int = 0, uid: int = 0, gid: int = 0) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.mtime = mtime
    info.mode = mode
    info.uid, info.gid = uid, gid
    info.uname = info.gname = ""
    return info


def write_layer(entries: Mapping[str, Entry], out: Path, *, mtime: int = 0) -> Layer:
    """Write a layer tar with ``entries`` (paths in the image, absolute or not). Parent directories
    not named are added as 0755 root directories. Entries are written sorted by path."""
    wanted: dict[str, Entry] = {_clean(p): e for p, e in entries.items()}
    for path in list(wanted):
        for parent in _parents(path):
            wanted.setdefault(parent, Dir())
    with out.open("wb") as raw, tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(wanted):
            add_entry(tar, path, wanted[path], mtime=mtime)
    return layer_of(out)


def add_entry(tar: tarfile.TarFile, path: str, entry: Entry, *, mtime: int = 0) -> None:
    if isinstance(entry, Dir):
        info = _info(path, mtime=mtime, mode=entry.mode, uid=entry.uid, gid=entry.gid)
        info.type = tarfile.DIRTYPE
        tar.addfile(info)
    elif isinstance(entry, Symlink):
        info = _info(path, mtime=mtime, mode=0o777)
        info.type, info.linkname = tarfile.SYMTYPE, entry.target
        tar.addfile(info)
    elif isinstance(entry.source, bytes):
        info = _info(path, mtime=mtime, mode=entry.mode, uid=entry.uid, gid=entry.gid)
        info.size = len(entry.source)
        tar.addfile(info, io.BytesIO(entry.source))
    else:
        info = _info(path, mtime=mtime, mode=entry.mode, uid=entry.uid, gid=entry.gid)
        info.size = entry.source.stat().st_size
        with entry.source.open("rb") as f:
            tar.addfile(info, f)


def split_ref(ref: str) -> tuple[str, str]:
    """``gpuferry.local/pause:abc`` -> (``gpuferry.local/pause``, ``abc``)."""
    name, sep, tag = ref.rpartition(":")
    if not sep or not name or "/" in tag:
        raise ValueError(f"reference without a tag: {ref!r}")
    return name, tag


def _json(doc: Any) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def image_documents(
    layers: Sequence[Layer], config: ImageConfig, ref: str, *, mtime: int = 0
) -> tuple[bytes, bytes, bytes]:
    """The config, manifest and index.json of an image, as the bytes written."""
    _, tag = split_ref(ref)
    created = _rfc3339(mtime)
    runtime: dict[str, Any] = {"Env": [f"{k}={v}" for k, v in config.env.items()]}
    if config.entrypoint:
        runtime["Entrypoint"] = list(config.entrypoint)
    if config.cmd:
        runtime["Cmd"] = list(config.cmd)
    if config.workdir:
        runtime["WorkingDir"] = config.workdir
    if config.user:
        runtime["User"] = config.user
    if config.labels:
        runtime["Labels"] = dict(config.labels)
    config_doc = {
        "architecture": "amd64",
        "os": "linux",
        "created": created,
        "config": runtime,
        "rootfs": {"type": "layers", "diff_ids": [layer.digest for layer in layers]},
        "history": [
            {"created": created, "created_by": f"gpuferry hack/images: layer {i}"} for i in range(len(layers))
        ],
    }
    config_bytes = _json(config_doc)
    manifest_doc = {
        "schemaVersion": 2,
        "mediaType": MANIFEST_MEDIA_TYPE,
        "config": {
            "mediaType": CONFIG_MEDIA_TYPE,
            "digest": _digest(config_bytes),
            "size": len(config_bytes),
        },
        "layers": [{"mediaType": LAYER_MEDIA_TYPE, "digest": la.digest, "size": la.size} for la in layers],
    }
    manifest_bytes = _json(manifest_doc)
    index_doc = {
        "schemaVersion": 2,
        "mediaType": INDEX_MEDIA_TYPE,
        "manifests": [
            {
                "mediaType": MANIFEST_MEDIA_TYPE,
                "digest": _digest(manifest_bytes),
                "size": len(manifest_bytes),
                "platform": {"architecture": "amd64", "os": "linux"},
                "annotations": {NAME_ANNOTATION: ref, REF_ANNOTATION: tag},
            }
        ],
    }
    return config_bytes, manifest_bytes, _json(index_doc)


def _rfc3339(epoch: int) -> str:
    return dt.datetime.fromtimestamp(epoch, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def write_image(
    layers: Sequence[Layer], config: ImageConfig, ref: str, out: Path, *, mtime: int = 0
) -> WrittenImage:
    """Write an OCI image-layout tar: ``oci-layout``, ``index.json``, then ``blobs/sha256/*``."""
    config_bytes, manifest_bytes, index_bytes = image_documents(layers, config, ref, mtime=mtime)
    blobs: dict[str, bytes | Path] = {
        _digest(config_bytes): config_bytes,
        _digest(manifest_bytes): manifest_bytes,
    }
    for layer in layers:
        blobs.setdefault(layer.digest, layer.path)
    with out.open("wb") as raw, tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        add_entry(tar, "oci-layout", File(_json({"imageLayoutVersion": "1.0.0"})), mtime=mtime)
        add_entry(tar, "index.json", File(index_bytes), mtime=mtime)
        add_entry(tar, "blobs", Dir(), mtime=mtime)
        add_entry(tar, "blobs/sha256", Dir(), mtime=mtime)
        for digest in sorted(blobs):
            add_entry(tar, "blobs/sha256/" + digest.removeprefix("sha256:"), File(blobs[digest]), mtime=mtime)
    manifest_digest = _digest(manifest_bytes)
    return WrittenImage(
        ref=ref, digest=manifest_digest, config_digest=_digest(config_bytes), size=out.stat().st_size
    )


@dataclass(frozen=True)
class ImageTar:
    """What an image tar holds, read back (for the cache, tests and unpacking)."""

    ref: str
    digest: str
    manifest: dict[str, Any]
    config: dict[str, Any]


def _member(tar: tarfile.TarFile, name: str) -> IO[bytes]:
    f = tar.extractfile(name)
    if f is None:
        raise ValueError(f"{name} is not a file in {tar.name!r}")
    return f


def read_image(path: Path) -> ImageTar:
    """Read index.json, the manifest and the config of an image tar written by write_image."""
    with tarfile.open(path, mode="r:") as tar:
        index = json.load(_member(tar, "index.json"))
        desc = index["manifests"][0]
        blob = "blobs/sha256/" + desc["digest"].removeprefix("sha256:")
        manifest = json.load(_member(tar, blob))
        config = json.load(
            _member(tar, "blobs/sha256/" + manifest["config"]["digest"].removeprefix("sha256:"))
        )
    return ImageTar(
        ref=desc["annotations"][NAME_ANNOTATION], digest=desc["digest"], manifest=manifest, config=config
    )


def open_layers(tar: tarfile.TarFile, image: ImageTar) -> list[IO[bytes]]:
    """File objects of the image's layer tars, bottom first (``tar`` is the opened image tar)."""
    return [
        _member(tar, "blobs/sha256/" + la["digest"].removeprefix("sha256:"))
        for la in image.manifest["layers"]
    ]
