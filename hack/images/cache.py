"""Where built images and layers are kept, how their inputs are hashed, and the cache's lock.

Everything lives in ``<cache>/images`` (``$GPUFERRY_CACHE``, by default ``~/.cache/gpuferry``),
named ``<name>-<key12>`` where the key is the sha256 of everything that goes into it: a recipe
version string, file contents, package lists and versions. A file is complete once it has its
final name (it is written under a temporary name and renamed).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from .oci import read_image

KEEP_VERSIONS = 3  # of each artifact: switching branches back and forth should not rebuild


def images_dir() -> Path:
    # imported here: hack.localcluster imports this package (its nodes import the images)
    from hack.localcluster.spec import cache_dir

    path = cache_dir() / "images"
    path.mkdir(parents=True, exist_ok=True)
    return path


def source_date_epoch() -> int:
    """The time stamped on every file and in image configs: ``$SOURCE_DATE_EPOCH`` or 0."""
    return int(os.environ.get("SOURCE_DATE_EPOCH", "0"))


class InputHash:
    """A sha256 over labelled inputs; every input is length-prefixed so that no two different
    sequences of inputs hash alike."""

    def __init__(self, recipe: str) -> None:
        self._h = hashlib.sha256()
        self.add("recipe", recipe)

    def add(self, label: str, value: str | bytes | Path) -> InputHash:
        data = value.read_bytes() if isinstance(value, Path) else value
        raw = data.encode() if isinstance(data, str) else data
        for part in (label.encode(), raw):
            self._h.update(len(part).to_bytes(8, "big"))
            self._h.update(part)
        return self

    def add_all(self, label: str, values: Iterable[str]) -> InputHash:
        return self.add(label, "\n".join(values))

    def hexdigest(self) -> str:
        return self._h.hexdigest()


def short(key: str) -> str:
    return key[:12]


@contextmanager
def locked(name: str) -> Iterator[None]:
    """Hold an exclusive lock on building ``name`` (another process building it waits)."""
    with (images_dir() / f".{name}.lock").open("w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def prune(prefix: str, suffix: str, keep: Path) -> list[Path]:
    """Remove older versions ``<prefix>-<key12><suffix>`` beyond the newest KEEP_VERSIONS
    (``keep`` always stays). Returns what was removed."""
    pattern = re.compile(re.escape(prefix) + "-[0-9a-f]{12}" + re.escape(suffix))
    found = [p for p in images_dir().glob(f"{prefix}-*{suffix}") if pattern.fullmatch(p.name)]
    found.sort(key=lambda p: p.stat().st_mtime, reverse=True)
    removed = []
    for path in [p for p in found if p != keep][KEEP_VERSIONS - 1 :]:
        remove(path)
        removed.append(path)
    return removed


@dataclass(frozen=True)
class BuiltImage:
    """An image tar in the cache, ready for ``ctr -n k8s.io images import``."""

    name: str
    ref: str  # gpuferry.local/<name>:<key12>
    tar: Path
    digest: str  # of the manifest
    size: int  # of the tar, in bytes
    cached: bool  # found in the cache, not built now
    seconds: float  # spent finding or building it


def image_tar(name: str, key: str) -> Path:
    return images_dir() / f"{name}-{short(key)}.tar"


def image_ref(name: str, key: str) -> str:
    return f"gpuferry.local/{name}:{short(key)}"


def cached_image(name: str, key: str, make: Callable[[Path, str], None]) -> BuiltImage:
    """The image ``name`` with inputs hashed to ``key``: from the cache, or made now by
    ``make(partial_tar, ref)`` (under the image's lock) and then moved into place."""
    started = time.monotonic()
    tar, ref = image_tar(name, key), image_ref(name, key)
    cached = tar.exists()
    if not cached:
        with locked(name):
            if not tar.exists():  # or another process made it while we waited
                partial = tar.with_name(tar.name + ".partial")
                try:
                    make(partial, ref)
                    partial.rename(tar)
                finally:
                    remove(partial)
        prune(name, ".tar", tar)
    meta = read_image(tar)
    if meta.ref != ref:
        raise ValueError(f"{tar} holds {meta.ref}, not {ref}")
    return BuiltImage(
        name=name,
        ref=ref,
        tar=tar,
        digest=meta.digest,
        size=tar.stat().st_size,
        cached=cached,
        seconds=time.monotonic() - started,
    )


@contextmanager
def building(final: Path) -> Iterator[Path]:
    """A fresh folder ``<final>.partial`` to build in, renamed to ``final`` when the block ends
    well. When it fails, only the logs (``*.log``) stay there, to be looked at."""
    partial = final.with_name(final.name + ".partial")
    remove(partial)
    partial.mkdir(parents=True)
    try:
        yield partial
    except BaseException:
        for child in partial.iterdir():
            if child.suffix != ".log":
                remove(child)
        raise
    partial.rename(final)
