"""TCP keepalive on the connections to an API server, so that one that vanishes is noticed.

A stream that only reads (``kubectl logs -f`` of a quiet container, an idle exec, a watch between
events) never sends, so without keepalive a peer that is gone without a word (a partition, a
provider cluster powered off, a NAT that forgot the flow) leaves it waiting for hours: Linux
probes an idle connection only when asked to, and after 2 h by default. Go's dialer, and so
client-go, probes after 15 s; so do these sockets.
"""

from __future__ import annotations

import socket
from collections.abc import Callable

AddrInfo = tuple[int, int, int, str, tuple[str, int] | tuple[str, int, int, int] | tuple[int, bytes]]
"""What aiohttp hands a socket factory: family, type, proto, canonical name, address."""


def set_keepalive(sock: socket.socket, idle: float, probes: int) -> None:
    """Probe ``sock`` after ``idle`` seconds of silence, then every ``idle`` seconds; after
    ``probes`` probes unanswered the kernel ends the connection (ETIMEDOUT). ``idle`` <= 0 leaves
    the socket as it is."""
    if idle <= 0:
        return
    seconds = max(1, round(idle))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    if hasattr(socket, "TCP_KEEPIDLE"):  # Linux; elsewhere the system's own timers apply
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, seconds)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, seconds)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, max(1, probes))


def keepalive_factory(idle: float, probes: int) -> Callable[[AddrInfo], socket.socket]:
    """A socket factory for ``aiohttp.TCPConnector(socket_factory=…)`` whose TCP sockets keep
    alive as :func:`set_keepalive` says."""

    def make(addr: AddrInfo) -> socket.socket:
        family, kind, proto, _, _ = addr
        sock = socket.socket(family=family, type=kind, proto=proto)
        if kind == socket.SOCK_STREAM and family in (socket.AF_INET, socket.AF_INET6):
            set_keepalive(sock, idle, probes)
        return sock

    return make
