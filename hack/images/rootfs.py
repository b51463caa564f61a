"""Root filesystems on disk: a layer tar from a directory (overlayfs whiteouts become OCI ``.wh.``
files), running a command in an overlay over a rootfs, and unpacking an image into a folder."""

from __future__ import annotations

import os
import shlex
import stat
import tarfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from .cache import remove
from .oci import File as FileEntry
from .oci import Layer, add_entry, layer_of, open_layers, read_image
from .tools import run

WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"
_OPAQUE_XATTR = "trusted.overlay.opaque"
_HAS_FILTERS = hasattr(tarfile, "fully_trusted_filter")


def _is_opaque(path: str) -> bool:
    try:
        return os.getxattr(path, _OPAQUE_XATTR, follow_symlinks=False) == b"y"
    except OSError:
        return False


def tar_directory(root: Path, out: Path, *, mtime: int = 0) -> Layer:
    """Write ``root``'s contents as a layer tar: owners and modes as on disk, every mtime
    ``mtime``, hard links kept, depth-first in name order. An overlayfs upper directory's
    whiteouts (0/0 character devices) and opaque directories become OCI whiteout files."""
    seen: dict[tuple[int, int], str] = {}
    with out.open("wb") as raw, tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            rel_dir = os.path.relpath(dirpath, root)
            names = sorted(dirnames + filenames)
            dirnames[:] = [d for d in dirnames if not os.path.islink(os.path.join(dirpath, d))]
            if rel_dir != "." and _is_opaque(dirpath):
                add_entry(tar, f"{rel_dir}/{OPAQUE}", FileEntry(b"", mode=0), mtime=mtime)
            for name in names:
                path = os.path.join(dirpath, name)
                arcname = name if rel_dir == "." else f"{rel_dir}/{name}"
                _add_path(tar, path, arcname, seen, mtime)
    return layer_of(out)


def _add_path(
    tar: tarfile.TarFile, path: str, arcname: str, seen: dict[tuple[int, int], str], mtime: int
) -> None:
    st = os.lstat(path)
    if stat.S_ISCHR(st.st_mode) and st.st_rdev == 0:  # an overlayfs whiteout
        parent, _, name = arcname.rpartition("/")
        add_entry(
            tar,
            f"{parent}/{WHITEOUT}{name}" if parent else WHITEOUT + name,
            FileEntry(b"", mode=0),
            mtime=mtime,
        )
        return
    info = tarfile.TarInfo(arcname)
    info.mode, info.uid, info.gid, info.mtime = stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, mtime
    info.uname = info.gname = ""
    if stat.S_ISREG(st.st_mode) and st.st_nlink > 1 and (st.st_dev, st.st_ino) in seen:
        info.type, info.linkname = tarfile.LNKTYPE, seen[(st.st_dev, st.st_ino)]
        tar.addfile(info)
    elif stat.S_ISREG(st.st_mode):
        seen[(st.st_dev, st.st_ino)] = arcname
        info.size = st.st_size
        with open(path, "rb") as f:
            tar.addfile(info, f)
    elif stat.S_ISDIR(st.st_mode):
        info.type = tarfile.DIRTYPE
        tar.addfile(info)
    elif stat.S_ISLNK(st.st_mode):
        info.type, info.linkname = tarfile.SYMTYPE, os.readlink(path)
        tar.addfile(info)
    elif stat.S_ISFIFO(st.st_mode):
        info.type = tarfile.FIFOTYPE
        tar.addfile(info)
    elif stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
        info.type = tarfile.CHRTYPE if stat.S_ISCHR(st.st_mode) else tarfile.BLKTYPE
        info.devmajor, info.devminor = os.major(st.st_rdev), os.minor(st.st_rdev)
        tar.addfile(info)
    # sockets have no place in a layer


def extract_tar(tar: Path, dest: Path) -> None:
    """Unpack a rootfs tar (owners, modes, extended attributes) with GNU tar."""
    dest.mkdir(parents=True, exist_ok=True)
    run(
        ["tar", "-C", dest, "--numeric-owner", "--xattrs", "--xattrs-include=*", "-xpf", tar],
        what=f"unpacking {tar.name}",
    )


def unpack_image(image: Path, dest: Path) -> None:
    """Unpack an image tar's layers into ``dest`` as a container runtime would, applying whiteouts."""
    dest.mkdir(parents=True, exist_ok=True)
    dest.chmod(0o755)  # a container's / (a temporary folder would be 0700: no user could enter)
    meta = read_image(image)
    with tarfile.open(image, mode="r:") as outer:
        for blob in open_layers(outer, meta):
            with tarfile.open(fileobj=blob, mode="r|") as layer:
                for member in layer:
                    _apply(layer, member, dest)


def _apply(layer: tarfile.TarFile, member: tarfile.TarInfo, dest: Path) -> None:
    name = os.path.normpath(member.name.lstrip("/"))
    if name == ".":
        return
    parent, _, base = name.rpartition("/")
    target = dest / name
    if base == OPAQUE:
        for child in (dest / parent).iterdir():
            remove(child)
        return
    if base.startswith(WHITEOUT):
        remove(dest / parent / base.removeprefix(WHITEOUT))
        return
    if target.is_symlink() or (target.exists() and not (target.is_dir() and member.isdir())):
        remove(target)
    member.name = name
    if _HAS_FILTERS:  # Python >= 3.11.4; later versions default to a filter refusing what a rootfs has
        layer.extract(member, dest, numeric_owner=True, filter="fully_trusted")
    else:
        layer.extract(member, dest, numeric_owner=True)


def run_in_overlay(
    lower: Path,
    work: Path,
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    inputs: Path,
    what: str,
    log: Path,
) -> Path:
    """Run ``argv`` chrooted in an overlay of ``lower`` (left untouched) and return the overlay's
    upper directory: everything the command changed. ``inputs`` is mounted read-only at
    /tmp/gpuferry, the host's /dev at /dev (a mount point made for it is no change of the
    command's). The mounts (the overlay, /proc, /dev, a tmpfs on /tmp, the inputs) live in a
    private mount namespace, so they vanish with it even if this process dies."""
    for sub in ("upper", "work", "merged"):
        remove(work / sub)
        (work / sub).mkdir(parents=True)
    upper, merged = work / "upper", work / "merged"
    options = f"lowerdir={lower},upperdir={upper},workdir={work / 'work'}"
    options += ",index=off,metacopy=off,redirect_dir=off"  # plain copies up: a layer must stand alone
    exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(env.items()))
    q = {k: shlex.quote(str(merged / k)) for k in ("", "proc", "dev", "tmp", "tmp/gpuferry")}
    made_dev = not (lower / "dev").is_dir()
    script = f"""set -eu
mount -t overlay overlay -o {shlex.quote(options)} {q[""]}
mount -t proc proc {q["proc"]}
mkdir -p {q["dev"]}
mount --bind /dev {q["dev"]}
mount -t tmpfs -o mode=1777 tmpfs {q["tmp"]}
mkdir {q["tmp/gpuferry"]}
mount --bind -o ro {shlex.quote(str(inputs))} {q["tmp/gpuferry"]}
status=0
env -i {exports} chroot {q[""]} {shlex.join(argv)} || status=$?
umount {q["tmp/gpuferry"]} {q["tmp"]} {q["dev"]} {q["proc"]} {q[""]}
exit $status
"""
    run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script], what=what, log=log)
    if made_dev:
        (upper / "dev").rmdir()
    remove(work / "work")
    remove(merged)
    return upper
