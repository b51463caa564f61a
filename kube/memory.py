"""Process-wide memory settings for components that hold many API connections.

Each TLS connection asyncio opens carries a 256 KiB read buffer (``SSLProtocol.max_size``),
allocated whole when the connection is made. A virtual kubelet watches four kinds in every
namespace it has pods in: 100 namespaces are 400 connections and ~100 MB of buffers, most of it
idle (issue 15: 56 → 263 MiB). Watch events and API answers are read just as well 64 KiB at a
time.

glibc raises its mmap threshold each time a large block is freed, after which blocks of that
size come from the heap and stay in the process when freed: the buffers of closed connections
kept RSS up after the namespaces' watches ended. A fixed threshold at the buffer's size keeps
each buffer mapped, and given back to the system when its connection closes.

Python's cyclic garbage collector looks at the youngest generation each time 700 more container
objects were made than freed. A burst allocates and frees many per pod (decoded objects, requests,
futures), and what lives across a few awaits is looked at once or twice more before it dies: the
collector took 4.1 % of the virtual kubelet's CPU at 10,000 pods, about half of it in the
youngest generation (issue 15; ``gpuferry_gc_seconds_total`` per generation). A threshold of
10,000 lets most of them die unexamined; what was made before the first request (modules,
classes, settings) is moved out of the collector's sight for good, so that full collections do
not walk it again (``gc.freeze``).
"""

from __future__ import annotations

import asyncio.sslproto
import ctypes
import gc
import logging

__all__ = ["GC_YOUNG_THRESHOLD", "SSL_READ_BUFFER", "tune_gc", "tune_memory"]

logger = logging.getLogger(__name__)

SSL_READ_BUFFER = 64 * 1024
_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
_MMAP_THRESHOLD = SSL_READ_BUFFER  # fixed: a connection's buffer is mapped, and unmapped with it
GC_YOUNG_THRESHOLD = 10_000
"""Net container allocations between two collections of the youngest generation (Python: 700)."""


def tune_memory(ssl_read_buffer: int = SSL_READ_BUFFER) -> bool:
    """Smaller TLS read buffers for connections made from now on; a fixed mmap threshold where
    the C library is glibc. Returns whether the threshold was set."""
    asyncio.sslproto.SSLProtocol.max_size = ssl_read_buffer
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl, macOS): its allocator does its own thing
        return False
    done = bool(mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD))
    if not done:
        logger.debug("mallopt(M_MMAP_THRESHOLD) refused; large blocks follow glibc's own threshold")
    return done


def tune_gc(young_threshold: int = GC_YOUNG_THRESHOLD) -> int:
    """Collect the youngest generation less often, and leave every object made so far out of
    all later collections; call once at an entry point, after the imports. The older
    generations' thresholds are kept. Returns how many objects were frozen."""
    _, middle, oldest = gc.get_threshold()
    gc.set_threshold(young_threshold, middle, oldest)
    gc.collect()  # cycles already garbage are freed, not frozen for the process's life
    gc.freeze()
    return gc.get_freeze_count()
