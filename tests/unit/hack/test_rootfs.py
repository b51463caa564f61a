"""hack/images/rootfs.py: layer tars from directories (overlayfs whiteouts included) and unpacking
images layer over layer."""

from __future__ import annotations

import os
import stat
import tarfile
from pathlib import Path

import pytest

from hack.images.oci import Dir, File, ImageConfig, Symlink, write_image, write_layer
from hack.images.rootfs import tar_directory, unpack_image

ROOT = os.geteuid() == 0


def tree(root: Path) -> None:
    (root / "etc").mkdir(parents=True)
    (root / "etc" / "conf").write_text("conf\n")
    (root / "etc" / "conf").chmod(0o640)
    (root / "bin").mkdir()
    (root / "bin" / "tool").write_text("tool\n")
    (root / "bin" / "tool").chmod(0o755)
    os.link(root / "bin" / "tool", root / "bin" / "tool-again")
    (root / "bin" / "sh").symlink_to("tool")
    (root / "linked-dir").symlink_to("etc")
    os.mkfifo(root / "fifo")


def test_directory_to_layer_keeps_modes_links_and_order(tmp_path: Path) -> None:
    tree(tmp_path / "root")
    layer = tar_directory(tmp_path / "root", tmp_path / "layer.tar", mtime=7)
    with tarfile.open(layer.path) as tar:
        got = {m.name: m for m in tar.getmembers()}
        names = [m.name for m in tar.getmembers()]
    assert names == [
        "bin",
        "etc",
        "fifo",
        "linked-dir",
        "bin/sh",
        "bin/tool",
        "bin/tool-again",
        "etc/conf",
    ]  # fmt: skip  (a directory before what it holds, names sorted)
    assert got["etc/conf"].mode == 0o640 and got["bin/tool"].mode == 0o755
    assert got["bin/sh"].issym() and got["bin/sh"].linkname == "tool"
    assert got["linked-dir"].issym()  # not followed
    assert got["bin/tool-again"].islnk() and got["bin/tool-again"].linkname == "bin/tool"
    assert got["fifo"].isfifo()
    assert {m.mtime for m in got.values()} == {7}
    assert {(m.uname, m.gname) for m in got.values()} == {("", "")}


def test_directory_to_layer_is_deterministic(tmp_path: Path) -> None:
    tree(tmp_path / "one")
    tree(tmp_path / "two")
    one = tar_directory(tmp_path / "one", tmp_path / "one.tar")
    two = tar_directory(tmp_path / "two", tmp_path / "two.tar")
    assert one.digest == two.digest


# making whiteouts (0/0 character devices, trusted.* xattrs) needs root; CI runs as root and must
# run this, never skip it
@pytest.mark.skipif(not ROOT and not os.environ.get("CI"), reason="needs root (mknod, trusted.* xattrs)")
def test_overlayfs_whiteouts_become_oci_whiteouts(tmp_path: Path) -> None:
    upper = tmp_path / "upper"
    (upper / "etc" / "gone-dir").mkdir(parents=True)
    (upper / "replaced").mkdir()
    os.mknod(upper / "etc" / "removed", stat.S_IFCHR | 0o600, os.makedev(0, 0))
    os.mknod(upper / "top-removed", stat.S_IFCHR | 0o600, os.makedev(0, 0))
    os.setxattr(upper / "replaced", "trusted.overlay.opaque", b"y")
    (upper / "replaced" / "new").write_text("new\n")
    layer = tar_directory(upper, tmp_path / "layer.tar")
    with tarfile.open(layer.path) as tar:
        got = {m.name: m for m in tar.getmembers()}
    assert "etc/removed" not in got and "top-removed" not in got
    assert got["etc/.wh.removed"].isfile() and got["etc/.wh.removed"].size == 0
    assert got[".wh.top-removed"].isfile()
    assert got["replaced/.wh..wh..opq"].isfile()
    assert got["replaced/new"].isfile() and got["etc/gone-dir"].isdir()


def test_unpack_applies_layers_in_order_with_whiteouts(tmp_path: Path) -> None:
    lower = write_layer(
        {
            "a/keep": File(b"keep\n"),
            "a/drop": File(b"drop\n"),
            "d/old": File(b"old\n"),
            "d/sub/old": File(b"old\n"),
            "link": Symlink("a/keep"),
            "becomes-dir": File(b"file\n"),
        },
        tmp_path / "lower.tar",
    )
    upper = write_layer(
        {
            "a/.wh.drop": File(b""),
            "d/.wh..wh..opq": File(b""),
            "d/new": File(b"new\n", mode=0o600),
            "link": File(b"now a file\n"),
            "becomes-dir": Dir(),
            "becomes-dir/inside": File(b"inside\n"),
        },
        tmp_path / "upper.tar",
    )
    image = tmp_path / "image.tar"
    write_image([lower, upper], ImageConfig(), "gpuferry.local/t:1", image)
    dest = tmp_path / "rootfs"
    unpack_image(image, dest)
    found = sorted(str(p.relative_to(dest)) for p in dest.rglob("*"))
    assert found == ["a", "a/keep", "becomes-dir", "becomes-dir/inside", "d", "d/new", "link"]
    assert (dest / "link").read_text() == "now a file\n" and not (dest / "link").is_symlink()
    assert stat.S_IMODE((dest / "d" / "new").stat().st_mode) == 0o600
