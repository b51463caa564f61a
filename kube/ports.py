"""A free port for a server about to start (a test's, the bench's, a process-mode kubelet API),
from below the kernel's ephemeral range: a port picked by binding port 0 is an ephemeral one,
which an outgoing connection may take as its own before the server binds it (CI, 2026-11-27: the
kubelet API's bind on 127.0.0.1:45507 failed with "address already in use")."""

from __future__ import annotations

import errno
import random
import socket
from pathlib import Path

__all__ = ["free_port"]


def _ephemeral_start() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(address: str = "127.0.0.1", *, low: int = 20000) -> int:
    """A port of ``address`` in [low, the ephemeral range) that nothing is bound to now.

    Raises ``OSError`` when 200 tries found none, and at once when ``address`` is not one of
    this machine's (no port of it will ever be free)."""
    high = _ephemeral_start()
    for port in random.sample(range(low, high), min(200, max(0, high - low))):
        with socket.socket() as sock:
            try:
                sock.bind((address, port))
            except OSError as exc:
                if exc.errno == errno.EADDRNOTAVAIL:
                    raise OSError(exc.errno, f"{address} is not an address of this machine") from exc
                continue
            return port
    raise OSError(f"no free port on {address} in {low}-{high - 1}")
