"""Process memory settings: smaller TLS read buffers, a fixed mmap threshold on glibc."""

from __future__ import annotations

import asyncio.sslproto
import platform

import pytest

from kube.memory import SSL_READ_BUFFER, tune_memory


def test_new_tls_connections_get_the_smaller_read_buffer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(asyncio.sslproto.SSLProtocol, "max_size", 256 * 1024)  # restored after
    fixed = tune_memory()
    assert asyncio.sslproto.SSLProtocol.max_size == SSL_READ_BUFFER == 64 * 1024
    loop = asyncio.new_event_loop()
    try:
        protocol = asyncio.sslproto.SSLProtocol(loop, asyncio.Protocol(), None, None, server_side=False)
        assert len(protocol._ssl_buffer) == SSL_READ_BUFFER
    finally:
        loop.close()
    if platform.libc_ver()[0] == "glibc":
        assert fixed, "glibc takes M_MMAP_THRESHOLD"
