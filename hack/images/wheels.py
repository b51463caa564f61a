"""The Python side of the gpuferry image: the project's sources and wheel, and the wheels of its
runtime dependencies for the image's Python (downloaded on the host, installed offline)."""

from __future__ import annotations

import fnmatch
import os
import shutil
import sys
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .cache import InputHash
from .tools import BuildError, run

REPO = Path(__file__).resolve().parents[2]
ZIP_EPOCH = 315532800  # 1980-01-01: a wheel is a zip, which cannot hold older time stamps
_SKIPPED_DIRS = {"__pycache__"}
_SKIPPED_SUFFIXES = (".pyc", ".pyo")
_LICENSE_PATTERNS = ("LICEN[CS]E*", "COPYING*", "NOTICE*", "AUTHORS*")


def pyproject(repo: Path = REPO) -> dict[str, Any]:
    with (repo / "pyproject.toml").open("rb") as f:
        return tomllib.load(f)


def runtime_requirements(repo: Path = REPO) -> list[str]:
    """``[project].dependencies`` of pyproject.toml, as written."""
    return list(pyproject(repo)["project"]["dependencies"])


def console_scripts(repo: Path = REPO) -> dict[str, str]:
    return dict(pyproject(repo)["project"].get("scripts", {}))


def package_dirs(repo: Path = REPO) -> list[str]:
    """The top-level packages setuptools puts into the wheel (``[tool.setuptools.packages.find]``)."""
    patterns = pyproject(repo)["tool"]["setuptools"]["packages"]["find"]["include"]
    return sorted(
        p.name
        for p in repo.iterdir()
        if (p / "__init__.py").is_file() and any(fnmatch.fnmatchcase(p.name, pat) for pat in patterns)
    )


def project_sources(repo: Path = REPO) -> list[str]:
    """Every file that goes into the wheel, relative to ``repo``, sorted: pyproject.toml, the readme,
    license files, and every file of the packages (but byte-code)."""
    meta = pyproject(repo)["project"]
    files = {"pyproject.toml"}
    readme = meta.get("readme")
    if isinstance(readme, str):
        files.add(readme)
    files.update(
        p.name
        for p in repo.iterdir()
        if p.is_file() and any(fnmatch.fnmatchcase(p.name, pat) for pat in _LICENSE_PATTERNS)
    )
    for package in package_dirs(repo):
        # followlinks: peering/chart is a link to charts/gpuferry, and the chart (its CRDs
        # above all) must be in the wheel, or a CLI installed from it cannot install or peer
        for dirpath, dirnames, filenames in os.walk(repo / package, followlinks=True):
            dirnames[:] = sorted(
                d for d in dirnames if d not in _SKIPPED_DIRS and not d.endswith(".egg-info")
            )
            rel = Path(dirpath).relative_to(repo)
            files.update(str(rel / f) for f in filenames if not f.endswith(_SKIPPED_SUFFIXES))
    return sorted(files)


def source_hash(repo: Path = REPO) -> str:
    """The sha256 of the project's sources by path and content (not time stamps): a fresh clone of
    the same commit has the same hash."""
    h = InputHash("gpuferry-sources/1")
    for rel in project_sources(repo):
        path = repo / rel
        h.add(rel + (" +x" if os.access(path, os.X_OK) else ""), path)
    return h.hexdigest()


def build_wheel(dest: Path, *, repo: Path = REPO, work: Path, epoch: int, log: Path) -> Path:
    """Build gpuferry's wheel from a copy of exactly its sources (the checkout gets no build/)."""
    src = work / "src"
    for rel in project_sources(repo):
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(repo / rel, src / rel)
    dest.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, SOURCE_DATE_EPOCH=str(max(epoch, ZIP_EPOCH)))
    run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", dest, src],
        what="building the gpuferry wheel",
        env=env,
        log=log,
    )
    wheels = sorted(dest.glob("gpuferry-*.whl"))
    if len(wheels) != 1:
        raise BuildError(f"expected one gpuferry wheel in {dest}, found {[w.name for w in wheels]}")
    return wheels[0]


def target_tags(python: str, glibc: tuple[int, int]) -> list[str]:
    """pip download options selecting binary wheels for CPython ``python`` (e.g. "3.11") on
    x86_64 Linux with glibc ``glibc``: pip does not widen an explicit manylinux platform to the
    older glibc versions it is compatible with, so every one is named."""
    cp = "cp" + python.replace(".", "")
    platforms = [f"manylinux_2_{minor}_x86_64" for minor in range(glibc[1], 16, -1)]
    platforms += ["manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64", "linux_x86_64"]
    opts = ["--only-binary=:all:", "--python-version", python, "--implementation", "cp"]
    for abi in (cp, "abi3", "none"):
        opts += ["--abi", abi]
    for platform in platforms:
        opts += ["--platform", platform]
    return opts


def download_wheels(
    requirements: Sequence[str], dest: Path, *, python: str, glibc: tuple[int, int], log: Path
) -> list[Path]:
    """Download wheels of ``requirements`` and all they need for the image's Python into ``dest``
    (with the host's pip and its configuration: index, proxies, certificates)."""
    dest.mkdir(parents=True, exist_ok=True)
    argv: list[str | Path] = [sys.executable, "-m", "pip", "download", "-d", dest]
    argv += [*target_tags(python, glibc), *requirements]
    run(argv, what="downloading the wheels of gpuferry's dependencies", log=log)
    return sorted(dest.glob("*.whl"))
