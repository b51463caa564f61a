"""The pure parts of the image recipes: input hashes, the project's sources, file lists, ELF
checks, the cache's bookkeeping and the CLI's errors. No root, no network, seconds."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hack.images import BuildError, binary_image, build_images
from hack.images.cache import InputHash, building, images_dir, prune
from hack.images.gpuferry import PACKAGES_FILE, read_packages
from hack.images.oci import Dir, File, Symlink
from hack.images.small import TESTBOX_APPLETS, binary_entries, busybox_entries, is_static_elf
from hack.images.wheels import (
    REPO,
    package_dirs,
    project_sources,
    runtime_requirements,
    source_hash,
    target_tags,
)


def test_input_hash_depends_on_every_input_and_on_their_boundaries() -> None:
    base = InputHash("r/1").add("a", "xy").add("b", "z").hexdigest()
    assert base == InputHash("r/1").add("a", "xy").add("b", "z").hexdigest()
    assert base != InputHash("r/2").add("a", "xy").add("b", "z").hexdigest()
    assert base != InputHash("r/1").add("a", "x").add("b", "yz").hexdigest()
    assert base != InputHash("r/1").add("a", "xy").add("b", "zz").hexdigest()
    assert (
        InputHash("r").add_all("l", ["a", "b"]).hexdigest()
        != InputHash("r").add_all("l", ["b", "a"]).hexdigest()
    )


def mini_repo(root: Path) -> Path:
    shutil.copy(REPO / "pyproject.toml", root / "pyproject.toml")
    (root / "README.md").write_text("readme\n")
    for package in ("kube", "vk", "peering", "netfabric"):
        (root / package / "sub").mkdir(parents=True)
        (root / package / "__init__.py").write_text(f"# {package}\n")
        (root / package / "sub" / "__init__.py").write_text("")
        (root / package / "__pycache__").mkdir()
        (root / package / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"junk")
    (root / "hack").mkdir()
    (root / "hack" / "__init__.py").write_text("")  # not a package of the wheel
    (root / "tests").mkdir()
    (root / "vkish").mkdir()  # matches vk* but is no package
    return root


def test_project_sources_are_what_goes_into_the_wheel(tmp_path: Path) -> None:
    repo = mini_repo(tmp_path)
    assert package_dirs(repo) == ["kube", "netfabric", "peering", "vk"]
    assert project_sources(repo) == [
        "README.md",
        "kube/__init__.py", "kube/sub/__init__.py",
        "netfabric/__init__.py", "netfabric/sub/__init__.py",
        "peering/__init__.py", "peering/sub/__init__.py",
        "pyproject.toml",
        "vk/__init__.py", "vk/sub/__init__.py",
    ]  # fmt: skip


def test_source_hash_follows_content_not_time_stamps(tmp_path: Path) -> None:
    repo = mini_repo(tmp_path)
    before = source_hash(repo)
    os.utime(repo / "vk" / "__init__.py", (time.time() + 3600, time.time() + 3600))
    (repo / "vk" / "__pycache__" / "y.cpython-311.pyc").write_bytes(b"more junk")
    (repo / "hack" / "new.py").write_text("print()\n")
    assert source_hash(repo) == before
    (repo / "vk" / "sub" / "data.json").write_text("{}")
    with_data = source_hash(repo)
    assert with_data != before
    (repo / "vk" / "__init__.py").write_text("# changed\n")
    assert source_hash(repo) not in (before, with_data)


def test_this_checkouts_sources_and_requirements() -> None:
    sources = project_sources()
    assert "pyproject.toml" in sources and "README.md" in sources
    assert "vk/__main__.py" in sources and "netfabric/__main__.py" in sources
    assert not [s for s in sources if s.startswith(("hack/", "tests/")) or s.endswith(".pyc")]
    assert any(r.startswith("aiohttp") for r in runtime_requirements())


def test_wheel_tags_name_every_compatible_glibc() -> None:
    opts = target_tags("3.11", (2, 36))
    platforms = [opts[i + 1] for i, o in enumerate(opts) if o == "--platform"]
    assert platforms[0] == "manylinux_2_36_x86_64" and "manylinux_2_17_x86_64" in platforms
    assert "manylinux_2_34_x86_64" in platforms  # cryptography's wheels
    assert "manylinux2014_x86_64" in platforms
    abis = [opts[i + 1] for i, o in enumerate(opts) if o == "--abi"]
    assert abis == ["cp311", "abi3", "none"]
    assert "--only-binary=:all:" in opts


def test_packages_file_lists_what_the_image_needs() -> None:
    packages = read_packages(PACKAGES_FILE)
    assert {"python3", "python3-venv", "nftables", "iproute2", "ca-certificates"} <= set(packages)
    assert all(not p.startswith("#") and " " not in p for p in packages)


def test_read_packages_drops_comments(tmp_path: Path) -> None:
    listed = tmp_path / "p.txt"
    listed.write_text("# header\na  # why\n\n  b c\n")
    assert read_packages(listed) == ["a", "b", "c"]


def test_testbox_links_every_applet_to_busybox_but_busybox_itself(tmp_path: Path) -> None:
    busybox = tmp_path / "busybox"
    busybox.write_bytes(b"\x7fELF")
    applets = ["bin/busybox", "bin/sh", "usr/sbin/httpd", "usr/bin/wget", "bin/tar"]
    got = busybox_entries(busybox, applets)
    assert got["bin/busybox"] == File(busybox, mode=0o755)
    assert got["bin/sh"] == Symlink("/bin/busybox") and got["usr/sbin/httpd"] == Symlink("/bin/busybox")
    assert got["tmp"] == Dir(mode=0o1777) and isinstance(got["www"], Dir)
    passwd = got["etc/passwd"]
    assert isinstance(passwd, File) and isinstance(passwd.source, bytes)
    assert passwd.source.startswith(b"root:x:0:0:")
    nsswitch = got["etc/nsswitch.conf"]
    assert isinstance(nsswitch, File) and b"hosts: files dns" in bytes(nsswitch.source)
    assert {"sh", "httpd", "wget", "nslookup", "tar", "cat", "sleep", "hostname"} == set(TESTBOX_APPLETS)


def test_binary_image_files_have_a_nonroot_user(tmp_path: Path) -> None:
    got = binary_entries("coredns", tmp_path / "coredns")
    assert got["coredns"] == File(tmp_path / "coredns", mode=0o755)
    assert got["tmp"] == Dir(mode=0o1777)
    assert got["home/nonroot"] == Dir(mode=0o700, uid=65532, gid=65532)
    passwd = got["etc/passwd"]
    assert isinstance(passwd, File) and b"nonroot:x:65532:65532:" in bytes(passwd.source)


def elf(tmp_path: Path, *, interp: bool) -> Path:
    """A minimal x86-64 ELF header with one program header (PT_INTERP or PT_LOAD)."""
    header = bytearray(64)
    header[:5] = b"\x7fELF\x02"
    struct.pack_into("<Q", header, 32, 64)  # e_phoff
    struct.pack_into("<HH", header, 54, 56, 1)  # e_phentsize, e_phnum
    program = bytearray(56)
    struct.pack_into("<I", program, 0, 3 if interp else 1)
    path = tmp_path / ("dynamic" if interp else "static")
    path.write_bytes(bytes(header + program))
    return path


def test_static_elf_detection(tmp_path: Path) -> None:
    assert is_static_elf(elf(tmp_path, interp=False))
    assert not is_static_elf(elf(tmp_path, interp=True))
    assert not is_static_elf(Path(sys.executable).resolve())  # CPython is linked dynamically
    (tmp_path / "script").write_text("#!/bin/sh\n")
    assert not is_static_elf(tmp_path / "script")


def test_binary_image_refuses_a_dynamic_or_missing_binary(tmp_path: Path) -> None:
    with pytest.raises(BuildError, match="not a static"):
        binary_image("thing", elf(tmp_path, interp=True), "v1")
    with pytest.raises(BuildError, match="no binary"):
        binary_image("thing", tmp_path / "absent", "v1")


def test_build_images_refuses_unknown_and_bad_names(tmp_path: Path) -> None:
    with pytest.raises(BuildError, match="no image named nothing"):
        build_images(only=["nothing"])
    for bad in ("pause", "Bad_Name", "a/b"):
        with pytest.raises(BuildError, match="bad name"):
            build_images(binaries={bad: (tmp_path / "x", "v1")})


def test_prune_keeps_the_newest_versions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUFERRY_CACHE", str(tmp_path))
    made = []
    for i in range(5):
        path = images_dir() / f"thing-{i:012x}.tar"
        path.write_text(str(i))
        os.utime(path, (1000 + i, 1000 + i))
        made.append(path)
    other = images_dir() / "thing-base-000000000000.tar"
    other.write_text("another artifact")
    removed = prune("thing", ".tar", made[0])
    assert sorted(removed) == [made[1], made[2]]
    assert all(p.exists() for p in (made[0], made[3], made[4], other))


def test_building_renames_on_success_and_keeps_only_logs_on_failure(tmp_path: Path) -> None:
    final = tmp_path / "thing-000000000000"
    with building(final) as partial:
        (partial / "layer.tar").write_text("layer")
    assert (final / "layer.tar").exists() and not partial.exists()
    failed = tmp_path / "other-000000000000"
    with pytest.raises(RuntimeError), building(failed) as partial:
        (partial / "step.log").write_text("what went wrong")
        (partial / "rootfs").mkdir()
        raise RuntimeError("boom")
    assert not failed.exists()
    assert sorted(p.name for p in partial.iterdir()) == ["step.log"]


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hack.images", *args], cwd=REPO, capture_output=True, text=True, timeout=60
    )


def test_cli_reports_one_error_line_without_traceback(tmp_path: Path) -> None:
    unknown = cli("build", "--only", "nothing")
    assert unknown.returncode == 1
    assert unknown.stderr.startswith("error: no image named nothing") and "Traceback" not in unknown.stderr
    dynamic = cli("build", "--binary", f"thing={elf(tmp_path, interp=True)}@v1", "--only", "thing")
    assert dynamic.returncode == 1 and "Traceback" not in dynamic.stderr
    assert dynamic.stderr.strip().splitlines() == [
        f"error: thing: {tmp_path / 'dynamic'} is not a static x86-64 executable (it would need libraries)"
    ]
    usage = cli("build", "--binary", "no-version")
    assert usage.returncode == 2 and "NAME=PATH@VERSION" in usage.stderr
