"""Running the tools an image build needs, and installing the missing ones from Debian."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

Progress = Callable[[str], None]

# The PATH inside every image and every chroot (the venv first in the gpuferry image).
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_TAIL_LINES = 25


class BuildError(RuntimeError):
    """An image could not be built. The message's first line says what failed; more lines, if any,
    are the tail of the failing tool's output."""


def is_root() -> bool:
    return os.geteuid() == 0


def require_root(why: str) -> None:
    if not is_root():
        raise BuildError(f"{why} needs root (run as root, e.g. with sudo)")


def clean_env(**extra: str) -> dict[str, str]:
    """A minimal environment for build tools and chroots: nothing of the caller's leaks in (a
    PIP_FIND_LINKS or PYTHONDONTWRITEBYTECODE of the host would change what is installed)."""
    env = {"PATH": SYSTEM_PATH, "HOME": "/root", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}
    env.update(extra)
    return env


def tail(text: str, lines: int = _TAIL_LINES) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


def run(
    argv: Sequence[str | Path],
    *,
    what: str,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    log: Path | None = None,
) -> str:
    """Run a command and return its stdout (stderr goes with it into ``log`` when given). On failure
    raise a BuildError naming ``what``, with the tail of the output (and where the full log is)."""
    args = [str(a) for a in argv]
    try:
        if log is not None:
            log.parent.mkdir(parents=True, exist_ok=True)
            with log.open("w") as f:
                logged = subprocess.run(args, env=env, cwd=cwd, stdout=f, stderr=subprocess.STDOUT)
            output, returncode = log.read_text(errors="replace"), logged.returncode
            stdout = output
        else:
            captured = subprocess.run(args, env=env, cwd=cwd, capture_output=True, text=True, check=False)
            output, returncode = captured.stdout + captured.stderr, captured.returncode
            stdout = captured.stdout
    except FileNotFoundError as e:
        raise BuildError(f"{what}: {args[0]} not found") from e
    if returncode != 0:
        where = f" (full log: {log})" if log is not None else ""
        raise BuildError(f"{what} failed with exit status {returncode}{where}:\n{tail(output)}")
    return stdout


@contextmanager
def step(progress: Progress, what: str) -> Iterator[None]:
    """Report a long step when it starts and how long it took when it ends."""
    progress(f"{what} ...")
    started = time.monotonic()
    yield
    progress(f"{what}: done in {time.monotonic() - started:.1f}s")


def _present(what: str) -> bool:
    return Path(what).exists() if what.startswith("/") else shutil.which(what) is not None


def ensure_debs(needed: Mapping[str, str], progress: Progress) -> None:
    """``needed`` maps a command (or an absolute file path) to the Debian package providing it;
    install the packages of those missing with apt-get (which needs root)."""
    missing = sorted({deb for what, deb in needed.items() if not _present(what)})
    if not missing:
        return
    listed = " ".join(missing)
    if shutil.which("apt-get") is None:
        raise BuildError(
            f"missing Debian packages {listed} and no apt-get to install them: install them yourself"
        )
    if not is_root():
        raise BuildError(
            f"missing Debian packages {listed}: run as root to install them, or: apt-get install -y {listed}"
        )
    env = clean_env(DEBIAN_FRONTEND="noninteractive")
    install = ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing]
    with step(progress, f"installing Debian packages {listed}"):
        try:
            run(install, what=f"apt-get install {listed}", env=env)
        except BuildError:  # stale or missing package lists: refresh them once
            run(["apt-get", "update", "-qq"], what="apt-get update", env=env)
            run(install, what=f"apt-get install {listed}", env=env)
    still = [what for what in needed if not _present(what)]
    if still:
        raise BuildError(f"installed {listed} but still missing: {', '.join(still)}")


def deb_version(package: str) -> str:
    """The version apt would install of ``package`` (its candidate); refresh the lists once when
    apt knows none (a fresh machine), which needs root."""
    for attempt in range(2):
        out = run(["apt-cache", "policy", package], what=f"apt-cache policy {package}", env=clean_env())
        for line in out.splitlines():
            key, _, value = line.strip().partition(":")
            if key == "Candidate" and value.strip() not in ("", "(none)"):
                return value.strip()
        if attempt == 0:
            require_root(f"apt knows no {package}: refreshing the package lists")
            run(["apt-get", "update", "-qq"], what="apt-get update", env=clean_env())
    raise BuildError(f"apt has no candidate for Debian package {package}")


def apt_download(package: str, version: str, dest: Path) -> Path:
    """Download one .deb (without installing it) into ``dest`` and return its path."""
    # as root apt would drop to its sandbox user, who cannot write to our private temp folder
    sandbox = ["-o", "APT::Sandbox::User=root"] if is_root() else []
    run(
        ["apt-get", "download", "-q", *sandbox, f"{package}={version}"],
        what=f"apt-get download {package}",
        cwd=dest,
        env=clean_env(),
    )
    debs = sorted(dest.glob(f"{package}_*.deb"))
    if len(debs) != 1:
        raise BuildError(f"apt-get download {package}: expected one .deb in {dest}, found {len(debs)}")
    return debs[0]
