"""A free loopback port for a server a test starts, from below the kernel's ephemeral range: a
port picked by binding port 0 is an ephemeral one, which an outgoing connection may take as its
own before the server binds it (CI, 2026-11-27: the kubelet API's bind on 127.0.0.1:45507 failed
with "address already in use")."""

from __future__ import annotations

import random
import socket
from pathlib import Path

__all__ = ["free_port"]


def _ephemeral_start() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(low: int = 20000) -> int:
    """A loopback port in [low, the ephemeral range) that nothing is bound to now."""
    high = _ephemeral_start()
    for port in random.sample(range(low, high), min(200, high - low)):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free loopback port in {low}-{high - 1}")
