"""Backend choice: kernel WireGuard where a wireguard link can be made, else wireguard-go."""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from netfabric.wireguard import (
    BackendKind,
    KernelBackend,
    TunnelError,
    UserspaceBackend,
    detect_backend,
    find_wireguard_go,
    kernel_wireguard_available,
)


def test_find_wireguard_go_prefers_explicit_then_current_build_then_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GPUFERRY_WIREGUARD_GO", raising=False)
    monkeypatch.setenv("GPUFERRY_CACHE", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path / "path"))
    assert find_wireguard_go() is None

    (tmp_path / "path").mkdir()
    debian = tmp_path / "path" / "wireguard-go"
    debian.write_text("#!/bin/sh\n")
    debian.chmod(0o755)
    assert find_wireguard_go() == debian

    for version, complete in (("v0.0.0-2025", True), ("v0.0.0-2026", True), ("v0.0.0-2027", False)):
        build = tmp_path / f"wireguard-go-{version}"
        (build / "bin").mkdir(parents=True)
        binary = build / "bin" / "wireguard-go"
        binary.write_text("#!/bin/sh\n")
        binary.chmod(0o755)
        if complete:
            (build / ".complete").write_text("done\n")
    assert find_wireguard_go() == tmp_path / "wireguard-go-v0.0.0-2026" / "bin" / "wireguard-go"

    monkeypatch.setenv("GPUFERRY_WIREGUARD_GO", "/opt/wg/wireguard-go")
    assert find_wireguard_go() == Path("/opt/wg/wireguard-go")


_CAN_NETNS = bool(shutil.which("ip") and os.geteuid() == 0)


@pytest.fixture
def netns() -> Iterator[str]:
    name = f"gfwg{uuid.uuid4().hex[:8]}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)


def _ip_can_make_wireguard(netns: str) -> bool:
    """The same question asked of iproute2, independently of pyroute2."""
    made = subprocess.run(
        ["ip", "-n", netns, "link", "add", "wgcheck", "type", "wireguard"], capture_output=True
    )
    subprocess.run(["ip", "-n", netns, "link", "del", "wgcheck"], capture_output=True)
    return made.returncode == 0


def _links(netns: str) -> str:
    return subprocess.run(["ip", "-n", netns, "-o", "link"], capture_output=True, text=True).stdout


# CI runs as root: there the detection must run, never skip.
@pytest.mark.skipif(not _CAN_NETNS and not os.environ.get("CI"), reason="needs root and iproute2")
async def test_detection_matches_the_kernel_and_falls_back(netns: str) -> None:
    kernel = _ip_can_make_wireguard(netns)
    assert await kernel_wireguard_available(netns=netns) is kernel
    backend = await detect_backend(netns=netns)
    assert backend.kind is (BackendKind.KERNEL if kernel else BackendKind.USERSPACE)
    assert isinstance(backend, KernelBackend if kernel else UserspaceBackend)
    # The probe leaves nothing behind.
    assert "gfprobe" not in _links(netns)
    assert (await detect_backend(netns=netns, prefer=BackendKind.USERSPACE)).kind is BackendKind.USERSPACE
    if not kernel:
        with pytest.raises(TunnelError, match="no wireguard module"):
            await detect_backend(netns=netns, prefer=BackendKind.KERNEL)
        assert await KernelBackend(netns=netns).state("wg0") is None
