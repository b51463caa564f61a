"""WireGuard interfaces: kernel WireGuard over netlink, or userspace ``wireguard-go`` over UAPI.

`detect_backend` picks one without asking the user: it tries to create a throwaway ``wireguard``
link in the target namespace (the kernel loads the module on demand); EOPNOTSUPP means no kernel
WireGuard, and the userspace backend is used. Both backends implement `Backend`:

- ``ensure(iface, config, mtu=…)`` creates the interface when absent, (re)configures it to exactly
  ``config`` (peers replaced), sets the MTU and brings it up. It may repeat.
- ``state(iface)`` reads the device back (None when there is no such device).
- ``remove(iface)`` deletes the interface and, for wireguard-go, ends its process and removes its
  socket. It may repeat and must end with nothing left.

The userspace binary is, in order: ``$GPUFERRY_WIREGUARD_GO``, the newest current build from
``hack/build-wireguard-go.sh`` in ``$GPUFERRY_CACHE`` (~/.cache/gpuferry), ``wireguard-go`` on
PATH (Debian's). wireguard-go is started in its daemon mode, so the tunnel outlives the
controller that started it, exactly like a kernel interface does.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import errno
import os
import shutil
import signal
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from ipaddress import IPv4Network
from pathlib import Path
from typing import Any, Protocol

from pyroute2 import AsyncIPRoute, AsyncWireGuard
from pyroute2.netlink.exceptions import NetlinkError

from kube.settings import cache_dir
from netfabric.nsexec import CommandError, netns_inode, run
from netfabric.routes import delete_link, ensure_link, link_exists
from netfabric.uapi import SOCKET_DIR, UapiError, get_device, set_device, socket_path
from netfabric.wgconfig import DeviceConfig, DeviceState, PeerState

__all__ = [
    "Backend",
    "BackendKind",
    "KernelBackend",
    "TunnelError",
    "UserspaceBackend",
    "detect_backend",
    "find_wireguard_go",
    "wireguard_go_pids",
]


class TunnelError(RuntimeError):
    """The tunnel interface could not be created, configured or removed."""


class BackendKind(enum.StrEnum):
    KERNEL = "kernel"
    USERSPACE = "userspace"


class Backend(Protocol):
    kind: BackendKind

    async def ensure(self, iface: str, config: DeviceConfig, *, mtu: int) -> None:
        """Create if absent, configure to exactly ``config``, set ``mtu``, bring up. May repeat."""

    async def state(self, iface: str) -> DeviceState | None:
        """The device as it is now, or None when it does not exist (or does not answer)."""

    async def remove(self, iface: str) -> None:
        """Remove the interface and everything that serves it. May repeat; leaves nothing."""


# --- kernel ----------------------------------------------------------------------------------


def _ns(netns: str | None) -> dict[str, Any]:
    return {"netns": netns} if netns else {}


async def kernel_wireguard_available(*, netns: str | None = None) -> bool:
    """Whether a ``wireguard`` link can be created in ``netns`` (probe link, removed at once)."""
    probe = f"gfprobe{os.getpid() % 100000}"
    async with AsyncIPRoute(**_ns(netns)) as ipr:
        try:
            await ipr.link("add", ifname=probe, kind="wireguard")
        except NetlinkError as e:
            if e.code in (errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOENT, errno.EINVAL):
                return False
            if e.code != errno.EEXIST:
                raise
        found = await ipr.link_lookup(ifname=probe)
        if found:
            await ipr.link("del", index=found[0])
        return True


@dataclass
class KernelBackend:
    """Kernel WireGuard: ``ip link add type wireguard`` and the ``wireguard`` genetlink family."""

    netns: str | None = None
    kind: BackendKind = BackendKind.KERNEL

    async def ensure(self, iface: str, config: DeviceConfig, *, mtu: int) -> None:
        async with AsyncIPRoute(**_ns(self.netns)) as ipr:
            try:
                await ipr.link("add", ifname=iface, kind="wireguard")
            except NetlinkError as e:
                if e.code != errno.EEXIST:
                    raise TunnelError(f"{iface}: cannot create a wireguard link: {e}") from e
        async with AsyncWireGuard(**_ns(self.netns)) as wg:
            current = await self._peers(wg, iface)
            wanted = {peer.public_key for peer in config.peers}
            for key in current - wanted:
                await wg.set(iface, peer={"public_key": key, "remove": True})
            await wg.set(
                iface,
                private_key=config.private_key,
                listen_port=config.listen_port,
                fwmark=config.fwmark,
            )
            for peer in config.peers:
                spec: dict[str, Any] = {
                    "public_key": peer.public_key,
                    "persistent_keepalive": peer.keepalive_seconds,
                    "replace_allowed_ips": True,
                    "allowed_ips": [str(network) for network in peer.allowed_ips],
                }
                if peer.endpoint is not None:
                    spec["endpoint_addr"] = str(peer.endpoint[0])
                    spec["endpoint_port"] = peer.endpoint[1]
                await wg.set(iface, peer=spec)
        await ensure_link(iface, mtu=mtu, netns=self.netns)

    @staticmethod
    async def _peers(wg: AsyncWireGuard, iface: str) -> set[str]:
        keys = set()
        for message in await _info(wg, iface):
            for peer in message.get_attr("WGDEVICE_A_PEERS") or []:
                key = peer.get_attr("WGPEER_A_PUBLIC_KEY")
                if key:
                    keys.add(key.decode() if isinstance(key, bytes) else str(key))
        return keys

    async def state(self, iface: str) -> DeviceState | None:
        if not await link_exists(iface, netns=self.netns):
            return None
        async with AsyncWireGuard(**_ns(self.netns)) as wg:
            try:
                messages = await _info(wg, iface)
            except NetlinkError:
                return None
        return _kernel_state(messages)

    async def remove(self, iface: str) -> None:
        await delete_link(iface, netns=self.netns)


async def _info(wg: AsyncWireGuard, iface: str) -> list[Any]:
    """``WG_CMD_GET_DEVICE`` answers (pyroute2's async ``info`` yields them)."""
    answer = await wg.info(iface)
    if hasattr(answer, "__aiter__"):
        return [message async for message in answer]
    return list(answer)


def _kernel_state(messages: Sequence[Any]) -> DeviceState:
    public: str | None = None
    port = fwmark = 0
    peers: list[PeerState] = []
    for message in messages:
        key = message.get_attr("WGDEVICE_A_PUBLIC_KEY")
        if key:
            public = key.decode() if isinstance(key, bytes) else str(key)
        port = message.get_attr("WGDEVICE_A_LISTEN_PORT") or port
        fwmark = message.get_attr("WGDEVICE_A_FWMARK") or fwmark
        for peer in message.get_attr("WGDEVICE_A_PEERS") or []:
            peer_key = peer.get_attr("WGPEER_A_PUBLIC_KEY")
            handshake = peer.get_attr("WGPEER_A_LAST_HANDSHAKE_TIME") or {}
            seconds = int(handshake.get("tv_sec", 0)) if isinstance(handshake, dict) else 0
            endpoint = peer.get_attr("WGPEER_A_ENDPOINT") or {}
            allowed = []
            for item in peer.get_attr("WGPEER_A_ALLOWEDIPS") or []:
                text = item.get("addr") if isinstance(item, dict) else None
                if text and ":" not in text:
                    allowed.append(IPv4Network(text))
            peers.append(
                PeerState(
                    public_key=peer_key.decode() if isinstance(peer_key, bytes) else str(peer_key),
                    endpoint=f"{endpoint['addr']}:{endpoint['port']}" if endpoint.get("addr") else None,
                    last_handshake=datetime.fromtimestamp(seconds, tz=UTC) if seconds else None,
                    rx_bytes=int(peer.get_attr("WGPEER_A_RX_BYTES") or 0),
                    tx_bytes=int(peer.get_attr("WGPEER_A_TX_BYTES") or 0),
                    keepalive_seconds=int(peer.get_attr("WGPEER_A_PERSISTENT_KEEPALIVE_INTERVAL") or 0),
                    allowed_ips=tuple(allowed),
                )
            )
    return DeviceState(public_key=public, listen_port=port, fwmark=fwmark, peers=tuple(peers))


# --- userspace -------------------------------------------------------------------------------


def find_wireguard_go() -> Path | None:
    """The wireguard-go to run: explicit, then a current cached build, then Debian's on PATH."""
    explicit = os.environ.get("GPUFERRY_WIREGUARD_GO")
    if explicit:
        return Path(explicit)
    builds = sorted(
        (d for d in cache_dir().glob("wireguard-go-*") if (d / ".complete").is_file()),
        key=lambda d: d.name,
        reverse=True,
    )
    for build in builds:
        binary = build / "bin" / "wireguard-go"
        if os.access(binary, os.X_OK):
            return binary
    found = shutil.which("wireguard-go")
    return Path(found) if found else None


def wireguard_go_pids(iface: str, *, netns: str | None = None) -> list[int]:
    """Pids of wireguard-go processes serving ``iface`` in ``netns`` (found through /proc)."""
    try:
        wanted = netns_inode(netns)
    except FileNotFoundError:
        return []
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            if not argv or not argv[0].endswith(b"wireguard-go") or iface.encode() not in argv[1:]:
                continue
            if os.stat(entry / "ns" / "net").st_ino != wanted:
                continue
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        pids.append(int(entry.name))
    return sorted(pids)


def _alive(pid: int) -> bool:
    try:
        state = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state != "Z"


@dataclass
class UserspaceBackend:
    """``wireguard-go`` in daemon mode, configured over its UAPI socket."""

    netns: str | None = None
    binary: Path | None = None
    socket_dir: Path = SOCKET_DIR
    kind: BackendKind = BackendKind.USERSPACE

    def _binary(self) -> Path:
        binary = self.binary or find_wireguard_go()
        if binary is None:
            raise TunnelError(
                "no kernel WireGuard and no wireguard-go: install Debian's wireguard-go or run"
                " hack/build-wireguard-go.sh"
            )
        return binary

    async def _start(self, iface: str) -> None:
        path = socket_path(iface, self.socket_dir)
        # A killed wireguard-go leaves its socket behind (its TUN goes with its last fd).
        path.unlink(missing_ok=True)
        if await link_exists(iface, netns=self.netns):
            await delete_link(iface, netns=self.netns)
        env = {k: v for k, v in os.environ.items() if k not in ("LOG_LEVEL", "WG_PROCESS_FOREGROUND")}
        env["WG_I_PREFER_BUGGY_USERSPACE_TO_POLISHED_KMOD"] = "1"  # Debian's build asks for it
        try:
            # Daemon mode: the parent creates the TUN and the socket, hands them to a detached
            # child and exits 0; a non-zero exit means the device could not be made.
            await run([os.fspath(self._binary()), iface], netns=self.netns, env=env, timeout=15)
        except CommandError as e:
            raise TunnelError(f"{iface}: wireguard-go did not start: {e.stderr.strip()}") from e
        for _ in range(100):
            if path.exists():
                return
            await asyncio.sleep(0.02)
        raise TunnelError(f"{iface}: wireguard-go started but {path} did not appear")

    async def ensure(self, iface: str, config: DeviceConfig, *, mtu: int) -> None:
        if await self.state(iface) is None:
            await self._start(iface)
        try:
            await set_device(socket_path(iface, self.socket_dir), config)
        except UapiError as e:
            raise TunnelError(f"{iface}: configuring wireguard-go failed: {e}") from e
        await ensure_link(iface, mtu=mtu, netns=self.netns)

    async def state(self, iface: str) -> DeviceState | None:
        path = socket_path(iface, self.socket_dir)
        if not path.exists() or not wireguard_go_pids(iface, netns=self.netns):
            return None
        try:
            return await get_device(path, timeout=2.0)
        except UapiError:
            return None

    async def remove(self, iface: str) -> None:
        # Deleting the TUN makes wireguard-go shut down; a signal covers a process stuck without it.
        if await link_exists(iface, netns=self.netns):
            await delete_link(iface, netns=self.netns)
        pids = wireguard_go_pids(iface, netns=self.netns)
        for sig, rounds in ((None, 50), (signal.SIGTERM, 50), (signal.SIGKILL, 50)):
            if sig is not None:
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, sig)
            for _ in range(rounds):
                pids = [pid for pid in pids if _alive(pid)]
                if not pids:
                    break
                await asyncio.sleep(0.02)
            if not pids:
                break
        if pids:
            raise TunnelError(f"{iface}: wireguard-go {pids} did not exit")
        socket_path(iface, self.socket_dir).unlink(missing_ok=True)


async def detect_backend(*, netns: str | None = None, prefer: BackendKind | None = None) -> Backend:
    """Kernel WireGuard when the kernel has it (or ``prefer`` says so), else wireguard-go."""
    if prefer is BackendKind.USERSPACE:
        return UserspaceBackend(netns=netns)
    if await kernel_wireguard_available(netns=netns):
        return KernelBackend(netns=netns)
    if prefer is BackendKind.KERNEL:
        raise TunnelError("kernel WireGuard was asked for, but this kernel has no wireguard module")
    return UserspaceBackend(netns=netns)
