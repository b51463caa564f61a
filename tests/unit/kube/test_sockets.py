"""The API clients' sockets probe a silent peer (tests/netns/test_keepalive.py shows the effect)."""

from __future__ import annotations

import socket

from kube.sockets import keepalive_factory


def test_tcp_sockets_keep_alive_as_configured_and_zero_leaves_them_alone() -> None:
    addr = (socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", ("127.0.0.1", 1))
    with keepalive_factory(15, 4)(addr) as sock:
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 15
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL) == 15
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT) == 4
    with keepalive_factory(0, 4)(addr) as sock:
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 0
