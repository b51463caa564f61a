"""The ``gpuferry`` image: Debian bookworm with Python, nftables and iproute2, the project's
dependencies in the virtualenv /opt/gpuferry, wireguard-go, and the gpuferry wheel.

Three layers, each cached by the hash of its inputs in ``<cache>/images``:

* base (``gpuferry-base-<key>/``): mmdebstrap's ``essential`` variant with the packages of
  gpuferry-packages.txt, then install-gpuferry.sh installs the dependencies of pyproject.toml
  offline from wheels downloaded on the host. Its rootfs is kept unpacked next to its tar.
* wireguard-go (``wireguard-go-<key>.tar``): the static binary of hack/build-wireguard-go.sh.
* app (``gpuferry-app-<key>/``): the wheel built from this checkout, installed with --no-deps by
  the image's own pip (install-gpuferry.sh again) in an overlay over the base rootfs; the layer
  is the overlay's upper directory. Keyed by the sources' content, so a fresh clone hits it.

The Containerfile at the repository root installs the same package list with the same script.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
from dataclasses import dataclass
from pathlib import Path

from .cache import (
    BuiltImage,
    InputHash,
    building,
    cached_image,
    images_dir,
    locked,
    prune,
    remove,
    short,
    source_date_epoch,
)
from .oci import Entry, File, ImageConfig, Layer, layer_of, sha256_file, write_image, write_layer
from .rootfs import extract_tar, run_in_overlay, tar_directory
from .tools import SYSTEM_PATH, BuildError, Progress, clean_env, ensure_debs, require_root, run, step
from .wheels import REPO, build_wheel, download_wheels, runtime_requirements, source_hash

HERE = Path(__file__).resolve().parent
PACKAGES_FILE = HERE / "gpuferry-packages.txt"
INSTALL_SCRIPT = HERE / "install-gpuferry.sh"
WIREGUARD_SCRIPT = REPO / "hack" / "build-wireguard-go.sh"
# the recipes' versions are part of their keys: bump one when changing how its layer is made
BASE_RECIPE, WIREGUARD_RECIPE, APP_RECIPE, IMAGE_RECIPE = (
    "gpuferry-base/1",
    "wireguard-go/1",
    "gpuferry-app/1",
    "gpuferry/1",
)
SUITE = "bookworm"
MIRRORS = (
    "deb http://deb.debian.org/debian bookworm main",
    "deb http://deb.debian.org/debian bookworm-updates main",
    "deb http://deb.debian.org/debian-security bookworm-security main",
)
PYTHON, GLIBC = "3.11", (2, 36)  # bookworm's: the wheels downloaded must fit them
# as debian:bookworm-slim: no manuals, documentation (but copyrights) or translations
DPKG_OPTIONS = tuple(
    f"--dpkgopt=path-{kind}=/usr/share/{path}"
    for kind, path in [
        ("exclude", "man/*"),
        ("exclude", "info/*"),
        ("exclude", "locale/*"),
        ("exclude", "doc/*"),
        ("include", "doc/*/copyright"),
    ]
)
# apt as root throughout: whether it could drop to _apt would depend on where the cache is (a
# path _apt cannot read), and with it the owner of /var/lib/apt/lists/partial in the layer
APT_OPTIONS = ('--aptopt=Acquire::Retries "3"', '--aptopt=APT::Sandbox::User "root"')
MERGED_USR_HOOKS = "/usr/share/mmdebstrap/hooks/merged-usr"  # merged /usr without usrmerge and perl
BASE_EPOCH = 1735689600  # 2025-01-01, the base's time stamps when SOURCE_DATE_EPOCH is not set
VENV = "/opt/gpuferry"
STAGED = "/tmp/gpuferry"  # where a build's inputs are in the chroot (install script, wheels)
MODULES = ("vk", "peering.provider", "peering.consumer", "netfabric")  # each run as python -m MODULE
IMAGE_ENV = {"PATH": f"{VENV}/bin:{SYSTEM_PATH}", "PYTHONUNBUFFERED": "1"}
IMAGE_CMD = ("gpuferry",)
_PROXY_VARS = ("http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY")


def read_packages(path: Path = PACKAGES_FILE) -> list[str]:
    """The package names of gpuferry-packages.txt (``#`` starts a comment)."""
    return [name for line in path.read_text().splitlines() for name in line.split("#", 1)[0].split()]


def base_epoch() -> int:
    return source_date_epoch() or BASE_EPOCH


@dataclass(frozen=True)
class Base:
    key: str
    layer: Layer
    rootfs: Path


def base_key() -> str:
    key = (
        InputHash(BASE_RECIPE)
        .add_all("packages", read_packages())
        .add_all("requirements", runtime_requirements())
    )
    key.add("install", INSTALL_SCRIPT).add_all("mirrors", MIRRORS).add_all("dpkg", DPKG_OPTIONS + APT_OPTIONS)
    return key.add("python", f"{PYTHON} {GLIBC}").add("epoch", str(base_epoch())).hexdigest()


def _chroot_env() -> str:
    return " ".join(f"{k}={v}" for k, v in clean_env(SOURCE_DATE_EPOCH=str(base_epoch())).items())


def _mmdebstrap(work: Path, out: Path, log: Path) -> None:
    stage = work / Path(STAGED).name  # copied into the new rootfs as STAGED, removed afterwards
    (stage / "requirements.txt").write_text("\n".join(runtime_requirements()) + "\n")
    shutil.copy(INSTALL_SCRIPT, stage / INSTALL_SCRIPT.name)
    freeze = shlex.quote(str(log.with_name("pip-freeze.txt")))
    install = (
        f"sh {STAGED}/{INSTALL_SCRIPT.name} --find-links {STAGED}/wheels -- -r {STAGED}/requirements.txt"
    )
    hooks = [
        f"copy-in {shlex.quote(str(stage))} {Path(STAGED).parent}",
        f'chroot "$1" env -i {_chroot_env()} {install}',
        f'chroot "$1" {VENV}/bin/python -m pip freeze --all > {freeze}',
        f'rm -rf "$1"{STAGED} "$1"/root/.cache "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*'
        ' "$1"/var/log/dpkg.log "$1"/var/log/apt/* "$1"/var/log/alternatives.log'
        ' "$1"/var/cache/debconf/*-old "$1"/var/lib/dpkg/*-old',
    ]
    argv: list[str | Path] = [
        "mmdebstrap", "--mode=root", "--format=tar", "--variant=essential", "--skip=output/dev",
        "--include=" + ",".join(read_packages()), f"--hook-dir={MERGED_USR_HOOKS}", *DPKG_OPTIONS,
        *APT_OPTIONS, *(f"--customize-hook={h}" for h in hooks), SUITE, out, *MIRRORS,
    ]  # fmt: skip
    env = clean_env(SOURCE_DATE_EPOCH=str(base_epoch()), TMPDIR=str(work))
    env.update({k: v for k in _PROXY_VARS if (v := os.environ.get(k))})
    run(argv, what="mmdebstrap (the gpuferry base layer)", env=env, log=log)


def gpuferry_base(progress: Progress) -> Base:
    """The base layer, built now if it is not in the cache (needs root: mmdebstrap, chroot)."""
    key = base_key()
    final = images_dir() / f"gpuferry-base-{short(key)}"
    if not (final / "layer.tar").exists():
        require_root("building the gpuferry base layer (mmdebstrap, chroot)")
        needed = {"mmdebstrap": "mmdebstrap", MERGED_USR_HOOKS: "mmdebstrap", "unshare": "util-linux"}
        ensure_debs(needed, progress)
        with locked("gpuferry-base"):
            if not (final / "layer.tar").exists():
                _build_base(final, progress)
            prune("gpuferry-base", "", final)
    if not (final / "rootfs").is_dir():  # the unpacked copy was removed: unpack it again
        extract_tar(final / "layer.tar", final / "rootfs")
    return Base(key, layer_of(final / "layer.tar"), final / "rootfs")


def _build_base(final: Path, progress: Progress) -> None:
    with building(final) as partial:
        wheels = partial / "work" / "gpuferry" / "wheels"
        with step(progress, "gpuferry: downloading the wheels of the dependencies"):
            found = download_wheels(
                runtime_requirements(), wheels, python=PYTHON, glibc=GLIBC, log=partial / "pip-download.log"
            )
        progress(f"gpuferry: {len(found)} wheels")
        with step(progress, f"gpuferry: base layer (mmdebstrap {SUITE})"):
            _mmdebstrap(partial / "work", partial / "layer.tar", partial / "mmdebstrap.log")
        with step(progress, "gpuferry: unpacking the base rootfs"):
            extract_tar(partial / "layer.tar", partial / "rootfs")
        remove(partial / "work")


def wireguard_go() -> tuple[Path, str]:
    """Where hack/build-wireguard-go.sh puts its static wireguard-go, and the version it pins."""
    where = run(["bash", WIREGUARD_SCRIPT, "--print-bin"], what="hack/build-wireguard-go.sh --print-bin")
    binary = Path(where.strip())
    match = re.fullmatch(r"wireguard-go-(.+)", binary.parent.parent.name)
    if match is None:
        raise BuildError(f"hack/build-wireguard-go.sh --print-bin: unexpected path {binary}")
    return binary, match.group(1)


def wireguard_key(version: str) -> str:
    key = InputHash(WIREGUARD_RECIPE).add("version", version).add("epoch", str(source_date_epoch()))
    return key.hexdigest()


def wireguard_layer(binary: Path, key: str, progress: Progress) -> Layer:
    """The layer with /usr/local/bin/wireguard-go, building the binary first if it is missing."""
    tar = images_dir() / f"wireguard-go-{short(key)}.tar"
    if not tar.exists():
        if not (binary.parent.parent / ".complete").exists():
            with step(progress, "gpuferry: building wireguard-go (hack/build-wireguard-go.sh)"):
                run(["bash", WIREGUARD_SCRIPT], what="hack/build-wireguard-go.sh")
        if not binary.is_file():
            raise BuildError(f"hack/build-wireguard-go.sh built no binary at {binary}")
        partial = tar.with_name(tar.name + ".partial")
        entries: dict[str, Entry] = {"usr/local/bin/wireguard-go": File(binary, mode=0o755)}
        write_layer(entries, partial, mtime=source_date_epoch())
        partial.rename(tar)
        prune("wireguard-go", ".tar", tar)
    return layer_of(tar)


@dataclass(frozen=True)
class App:
    key: str
    layer: Layer
    wheel: Path


def app_key(base: str) -> str:
    return (
        InputHash(APP_RECIPE)
        .add("base", base)
        .add("sources", source_hash())
        .add("install", INSTALL_SCRIPT)
        .hexdigest()
    )


def gpuferry_app(base: Base, progress: Progress) -> App:
    """The app layer: the gpuferry wheel of this checkout, installed over the base."""
    key = app_key(base.key)
    final = images_dir() / f"gpuferry-app-{short(key)}"
    if not (final / "layer.tar").exists():
        require_root("installing the gpuferry wheel into the image (overlayfs, chroot)")
        with locked("gpuferry-app"):
            if not (final / "layer.tar").exists():
                _build_app(base, final, progress)
            prune("gpuferry-app", "", final)
    wheels = sorted((final / "in").glob("gpuferry-*.whl"))
    return App(key, layer_of(final / "layer.tar"), wheels[0])


def _build_app(base: Base, final: Path, progress: Progress) -> None:
    with building(final) as partial:
        with step(progress, "gpuferry: building the wheel"):
            epoch = source_date_epoch()
            wheel = build_wheel(partial / "in", work=partial / "src", epoch=epoch, log=partial / "wheel.log")
        shutil.copy(INSTALL_SCRIPT, partial / "in" / "install-gpuferry.sh")
        argv = ["sh", f"{STAGED}/{INSTALL_SCRIPT.name}", "--no-deps", "--check", f"{STAGED}/{wheel.name}"]
        env = clean_env(SOURCE_DATE_EPOCH=str(base_epoch()))
        with step(progress, "gpuferry: installing the wheel in an overlay over the base"):
            upper = run_in_overlay(
                base.rootfs,
                partial / "overlay",
                argv,
                env=env,
                inputs=partial / "in",
                what="install-gpuferry.sh --no-deps --check (in the image)",
                log=partial / "install.log",
            )
            tar_directory(upper, partial / "layer.tar", mtime=epoch)
        remove(partial / "overlay")
        remove(partial / "src")


def gpuferry_image(progress: Progress) -> BuiltImage:
    """The whole image: found in the cache by the hash of its layers' inputs, or built."""
    wg_binary, wg_version = wireguard_go()
    base, wg = base_key(), wireguard_key(wg_version)
    key = InputHash(IMAGE_RECIPE).add("base", base).add("wireguard-go", wg).add("app", app_key(base))
    key.add_all("env", [f"{k}={v}" for k, v in IMAGE_ENV.items()]).add_all("cmd", IMAGE_CMD)
    key.add("epoch", str(source_date_epoch()))

    def make(out: Path, ref: str) -> None:
        built_base = gpuferry_base(progress)
        app = gpuferry_app(built_base, progress)
        labels = {
            "io.gpuferry.wheel": app.wheel.name,
            "io.gpuferry.wheel.sha256": sha256_file(app.wheel).removeprefix("sha256:"),
            "io.gpuferry.wireguard-go": wg_version,
        }
        config = ImageConfig(cmd=IMAGE_CMD, env=IMAGE_ENV, labels=labels)
        layers = [built_base.layer, wireguard_layer(wg_binary, wg, progress), app.layer]
        with step(progress, "gpuferry: writing the image"):
            write_image(layers, config, ref, out, mtime=source_date_epoch())

    return cached_image("gpuferry", key.hexdigest(), make)
