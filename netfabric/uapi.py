"""A client for the WireGuard userspace API socket (``/var/run/wireguard/<iface>.sock``).

``wireguard-go`` serves the cross-platform UAPI on a unix socket per interface. One request per
connection, as ``wg`` does: connect, write the request, read until the empty line after
``errno=``. Texts are built and parsed in `netfabric.wgconfig` (pure).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno as errnos
import os
from pathlib import Path

from netfabric.wgconfig import DeviceConfig, DeviceState, UapiError, parse_errno, parse_get, render_set

__all__ = ["SOCKET_DIR", "UapiError", "get_device", "set_device", "socket_path"]

#: Where wireguard-go puts its sockets (``WG_SOCKET_DIR`` is not configurable in wireguard-go).
SOCKET_DIR = Path("/var/run/wireguard")
_MAX_ANSWER = 1 << 20


def socket_path(iface: str, socket_dir: Path = SOCKET_DIR) -> Path:
    return socket_dir / f"{iface}.sock"


async def _exchange(path: Path, request: str, *, timeout: float) -> str:
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_unix_connection(os.fspath(path))
            try:
                writer.write(request.encode("ascii"))
                await writer.drain()
                chunks: list[bytes] = []
                size = 0
                while True:
                    line = await reader.readline()
                    if not line:
                        break  # the device closed the connection
                    chunks.append(line)
                    size += len(line)
                    if size > _MAX_ANSWER:
                        raise UapiError(f"{path}: answer larger than {_MAX_ANSWER} bytes")
                    if line == b"\n" and len(chunks) > 1 and chunks[-2].startswith(b"errno="):
                        break
            finally:
                writer.close()
                with contextlib.suppress(OSError):
                    await writer.wait_closed()
    except TimeoutError:
        raise UapiError(f"{path}: no answer within {timeout}s") from None
    except FileNotFoundError:
        raise UapiError(f"{path}: no such socket (is wireguard-go running?)", errnos.ENOENT) from None
    except ConnectionRefusedError:
        raise UapiError(f"{path}: connection refused (stale socket?)", errnos.ECONNREFUSED) from None
    return b"".join(chunks).decode("ascii", errors="replace")


async def set_device(path: Path, config: DeviceConfig, *, timeout: float = 5.0) -> None:
    """Make the device ``config``, removing peers it does not name; `UapiError` on errno != 0.

    Peers that stay are updated in place (their sessions survive), see `render_set`.
    """
    current = await get_device(path, timeout=timeout)
    request = render_set(config, remove_peers=[peer.public_key for peer in current.peers])
    answer = await _exchange(path, request, timeout=timeout)
    code = parse_errno([line for line in answer.split("\n") if line])
    if code:
        raise UapiError(f"{path}: set=1 failed with errno={code} ({os.strerror(code)})", code)


async def get_device(path: Path, *, timeout: float = 5.0) -> DeviceState:
    """The device's current state (``get=1``)."""
    return parse_get(await _exchange(path, "get=1\n\n", timeout=timeout))
