"""Run a command inside a named network namespace (or the current one) and check its result.

``ip netns exec NAME argv…`` enters the namespace and then execs ``argv`` (same pid), so the
command sees the namespace's interfaces, nftables and ``/proc/sys/net``. Namespaces are named as
``ip netns`` names them (``/run/netns/NAME``); ``None`` means the caller's own namespace, which is
what a gateway or agent pod uses.
"""

from __future__ import annotations

import asyncio
import errno
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = [
    "CommandError",
    "SysctlReadOnly",
    "ensure_sysctls",
    "netns_inode",
    "ns_argv",
    "read_sysctl",
    "run",
    "write_sysctl",
]

NETNS_DIR = Path("/run/netns")
PROC_SYS = Path("/proc/sys")


class CommandError(RuntimeError):
    """A command exited non-zero; ``stderr`` holds what it said."""

    def __init__(self, argv: Sequence[str], code: int, stderr: str) -> None:
        super().__init__(f"{' '.join(argv)} exited {code}: {stderr.strip() or '(no output)'}")
        self.argv = list(argv)
        self.code = code
        self.stderr = stderr


def ns_argv(argv: Sequence[str], netns: str | None) -> list[str]:
    return ["ip", "netns", "exec", netns, *argv] if netns else list(argv)


def netns_inode(netns: str | None) -> int:
    """Identity of a namespace: the inode of its nsfs file."""
    path = NETNS_DIR / netns if netns else Path("/proc/self/ns/net")
    return os.stat(path).st_ino


async def run(
    argv: Sequence[str],
    *,
    netns: str | None = None,
    stdin: str | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = 30.0,
) -> str:
    """Run ``argv`` in ``netns``; returns stdout, raises `CommandError` on a non-zero exit."""
    full = ns_argv(argv, netns)
    process = await asyncio.create_subprocess_exec(
        *full,
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=dict(env) if env is not None else None,
    )
    try:
        async with asyncio.timeout(timeout):
            out, err = await process.communicate(stdin.encode() if stdin is not None else None)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise CommandError(full, -9, f"timed out after {timeout}s") from None
    if process.returncode:
        raise CommandError(full, process.returncode, err.decode(errors="replace"))
    return out.decode(errors="replace")


async def write_sysctl(values: Mapping[str, str], *, netns: str | None = None) -> None:
    """Set ``net.*`` sysctls of a namespace (``net.ipv4.ip_forward`` → ``/proc/sys/net/…``)."""
    if not values:
        return
    await run(["sysctl", "-q", "-w", *(f"{key}={value}" for key, value in values.items())], netns=netns)


class SysctlReadOnly(RuntimeError):
    """A sysctl must change and ``/proc/sys`` is read-only here (a container): the pod's
    ``securityContext.sysctls`` must set it."""

    def __init__(self, wrong: Mapping[str, str], wanted: Mapping[str, str]) -> None:
        listed = ", ".join(f"{key} is {wrong[key]}, needs {wanted[key]}" for key in wrong)
        super().__init__(
            f"{listed}; /proc/sys is read-only in this container: set them in the pod's "
            "securityContext.sysctls (the chart's gateway.sysctls), which the kubelet must allow "
            "(--allowed-unsafe-sysctls 'net.ipv4.ip_forward,net.ipv4.conf.*')"
        )
        self.wrong = dict(wrong)


def _sysctl_path(key: str) -> Path:
    return PROC_SYS.joinpath(*key.split("."))


async def read_sysctl(key: str, *, netns: str | None = None) -> str:
    """The value of a ``net.*`` sysctl of a namespace (stripped)."""
    if netns is None:
        return _sysctl_path(key).read_text().strip()
    return (await run(["sysctl", "-n", key], netns=netns)).strip()


async def ensure_sysctls(values: Mapping[str, str], *, netns: str | None = None) -> dict[str, str]:
    """Set those of ``values`` that differ; returns what it changed (key: old value).

    In a container ``/proc/sys`` is mounted read-only: a value that is already right is left
    alone (the pod's ``securityContext.sysctls`` set it), one that is wrong raises
    `SysctlReadOnly` naming what to set."""
    wrong = {key: value for key in values if (value := await read_sysctl(key, netns=netns)) != values[key]}
    if not wrong:
        return {}
    if netns is None:
        try:
            for key in wrong:
                _sysctl_path(key).write_text(values[key])
        except OSError as exc:
            if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
                raise SysctlReadOnly(wrong, values) from None
            raise
    else:
        await write_sysctl({key: values[key] for key in wrong}, netns=netns)
    return wrong
