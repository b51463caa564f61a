"""Build (or find in the cache) every image a local cluster's node imports."""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Callable, Collection, Mapping
from pathlib import Path

from .cache import BuiltImage
from .gpuferry import gpuferry_image
from .small import binary_image, pause_image, testbox_image
from .tools import BuildError, Progress

RECIPES: dict[str, Callable[[Progress], BuiltImage]] = {
    "pause": pause_image,
    "testbox": testbox_image,
    "gpuferry": gpuferry_image,
}
_NAME = re.compile(r"[a-z0-9]+(?:[._-][a-z0-9]+)*")


def _ignore(msg: str) -> None:
    pass


def build_images(
    *,
    progress: Progress = _ignore,
    binaries: Mapping[str, tuple[Path, str]] | None = None,
    only: Collection[str] | None = None,
) -> dict[str, BuiltImage]:
    """Every image, built now or found in the cache, by name: pause, testbox, gpuferry, and an
    image per entry of ``binaries`` (image name -> (static binary, version); the binary is run
    as ``/<name>``). ``only`` restricts the build to those names. Raises BuildError."""
    binaries = dict(binaries or {})
    for name in binaries:
        if name in RECIPES or not _NAME.fullmatch(name):
            raise BuildError(f"bad name for a binary image: {name!r}")
    known = [*RECIPES, *binaries]
    wanted = list(only) if only is not None else known
    if unknown := [n for n in wanted if n not in known]:
        raise BuildError(f"no image named {', '.join(unknown)} (known: {', '.join(known)})")
    built: dict[str, BuiltImage] = {}
    for name in known:
        if name not in wanted:
            continue
        started = time.monotonic()
        try:
            if name in RECIPES:
                image = RECIPES[name](progress)
            else:
                path, version = binaries[name]
                image = binary_image(name, path, version)
        except OSError as e:  # a full disk, an unwritable cache, a binary that is not there
            raise BuildError(f"{name}: cannot build the image: {e}") from e
        image = dataclasses.replace(image, seconds=time.monotonic() - started)  # with the input hashing
        how = "cached" if image.cached else "built"
        progress(f"{name}: {how} {image.ref} ({image.size / 1e6:.1f} MB) in {image.seconds:.1f}s")
        built[name] = image
    return built
