"""Process memory settings: smaller TLS read buffers, a fixed mmap threshold on glibc, and a
garbage collector that looks at the young less often and at start-up objects never."""

from __future__ import annotations

import asyncio.sslproto
import gc
import platform

import pytest

from kube.memory import GC_YOUNG_THRESHOLD, SSL_READ_BUFFER, tune_gc, tune_memory


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


class _Made:
    """A container made before the collector is tuned (a class instance is tracked)."""


def test_the_collector_looks_at_the_young_less_often_and_never_at_what_was_made_before() -> None:
    before = gc.get_threshold()
    made = _Made()
    try:
        frozen = tune_gc()
        assert GC_YOUNG_THRESHOLD == 10_000
        assert gc.get_threshold() == (GC_YOUNG_THRESHOLD, before[1], before[2])
        assert frozen == gc.get_freeze_count() > 0
        assert not any(obj is made for obj in gc.get_objects()), "frozen: out of every collection"
        later = _Made()
        assert any(obj is later for obj in gc.get_objects()), "what comes after is collected as usual"
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
