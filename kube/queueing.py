"""A work queue of object keys: deduplicated, serial per key, bounded workers, delayed retries.

The semantics are client-go's ``workqueue`` (rate-limited, delaying), in asyncio:

* a key is pending at most once, however often it is added before a worker takes it;
* a key is never processed by two workers at once: a key added while it is being processed is
  marked dirty and processed once more after the current run ends;
* at most ``workers`` keys are processed concurrently;
* :meth:`KeyedQueue.add_after` adds a key later (the earliest of several requested times wins);
  :meth:`KeyedQueue.requeue_rate_limited` does so with a per-key exponential backoff that
  :meth:`KeyedQueue.forget` resets once the key succeeds, and :meth:`KeyedQueue.retry_now` cuts
  short for every key at once (what they failed on is back).

:meth:`KeyedQueue.run` runs the workers with a handler until :meth:`KeyedQueue.shutdown` (it
then lets work in progress finish, for up to ``drain_timeout``) or until cancelled.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

from . import metrics
from .backoff import backoff_delay
from .settings import QueueSettings
from .tasks import wait_set

__all__ = ["Handler", "KeyedQueue"]

K = TypeVar("K", bound=Hashable)

Handler = Callable[[K], Awaitable[float | None]]
"""Processes one key; returns ``None`` when done, or seconds after which to process it again."""

logger = logging.getLogger(__name__)

_DEPTH = metrics.gauge("queue_depth", "Keys waiting in a work queue.", ["queue"])
_ADDS = metrics.counter("queue_adds", "Keys added to a work queue (before deduplication).", ["queue"])
_RETRIES = metrics.counter("queue_retries", "Keys re-added with a backoff after a failure.", ["queue"])
_WORK = metrics.histogram("queue_work_duration_seconds", "Time spent processing one key.", ["queue"])
_WAIT = metrics.histogram(
    "queue_wait_duration_seconds", "Time a key waited before a worker took it.", ["queue"]
)


class KeyedQueue(Generic[K]):
    """Keys to process, see the module docstring. ``name`` labels its metrics and logs."""

    def __init__(self, name: str, *, settings: QueueSettings | None = None) -> None:
        self.name = name
        self.settings = settings or QueueSettings()
        self._ready: asyncio.Queue[K] = asyncio.Queue()
        self._dirty: set[K] = set()  # must be processed (again): in _ready, or running and re-added
        self._processing: set[K] = set()
        self._delayed: dict[K, tuple[float, asyncio.TimerHandle]] = {}
        self._failures: dict[K, int] = {}
        self._added_at: dict[K, float] = {}
        self._closed = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._nothing_running = asyncio.Event()
        self._nothing_running.set()
        self._depth = _DEPTH.labels(name)
        self._adds = _ADDS.labels(name)
        self._retries = _RETRIES.labels(name)
        self._work = _WORK.labels(name)
        self._wait = _WAIT.labels(name)

    # -- state ---------------------------------------------------------------------------------

    def __len__(self) -> int:
        """Keys waiting for a worker (not counting delayed keys or keys being processed).

        O(workers), not O(keys), and a set operation rather than a loop in Python: it is read on
        every change (issue 15: a sum over every dirty key made a burst of N pods cost O(N²))."""
        return len(self._dirty) - len(self._processing & self._dirty)

    @property
    def pending(self) -> frozenset[K]:
        """Keys that will be processed: waiting, delayed, or re-added while being processed."""
        return frozenset(self._dirty) | frozenset(self._delayed)

    @property
    def processing(self) -> frozenset[K]:
        """Keys a worker is processing right now."""
        return frozenset(self._processing)

    def is_processing(self, key: K) -> bool:
        """Whether a worker is processing ``key`` right now (O(1))."""
        return key in self._processing

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def failures(self, key: K) -> int:
        """Consecutive rate-limited requeues of ``key`` since it last succeeded."""
        return self._failures.get(key, 0)

    def _changed(self) -> None:
        self._depth.set(len(self))
        if self._processing:
            self._nothing_running.clear()
        else:
            self._nothing_running.set()
        if self._dirty or self._processing or self._delayed:
            self._idle.clear()
        else:
            self._idle.set()

    # -- adding --------------------------------------------------------------------------------

    def add(self, key: K) -> None:
        """Process ``key`` as soon as a worker is free (once, however often it is added)."""
        if self.closed:
            return
        self._adds.inc()
        if key in self._dirty:
            return
        self._dirty.add(key)
        self._added_at.setdefault(key, time.monotonic())
        if key not in self._processing:
            self._ready.put_nowait(key)
        self._changed()

    def add_after(self, key: K, delay: float) -> None:
        """Add ``key`` after ``delay`` seconds; an earlier pending delayed add of it wins."""
        if self.closed:
            return
        if delay <= 0:
            self.add(key)
            return
        loop = asyncio.get_running_loop()
        due = loop.time() + delay
        found = self._delayed.get(key)
        if found is not None:
            if found[0] <= due:
                return
            found[1].cancel()
        self._delayed[key] = (due, loop.call_at(due, self._fire, key))
        self._changed()

    def _fire(self, key: K) -> None:
        self._delayed.pop(key, None)
        self.add(key)
        self._changed()

    def requeue_rate_limited(self, key: K, *, base: float | None = None) -> float:
        """Add ``key`` again after its backoff delay (doubling per failure); returns the delay."""
        failures = self._failures.get(key, 0) + 1
        first = self.settings.backoff_base if base is None else base
        delay = backoff_delay(failures, base=first, cap=self.settings.backoff_max)
        self._failures[key] = failures
        self._retries.inc()
        self.add_after(key, delay)
        return delay

    def retry_now(self) -> int:
        """Add now every key waiting out a backoff after a failure (what it failed on is back:
        the keys of an outage are not to wait up to ``backoff_max`` more); keys delayed for any
        other reason keep their time. Their failure counts stay. Returns how many."""
        failed = [key for key in self._delayed if self._failures.get(key, 0) > 0]
        for key in failed:
            self._delayed.pop(key)[1].cancel()
            self.add(key)
        self._changed()
        return len(failed)

    def forget(self, key: K) -> None:
        """Reset ``key``'s backoff: call it when the key was processed successfully."""
        self._failures.pop(key, None)

    def discard(self, key: K) -> None:
        """Drop any waiting or delayed add of ``key`` (a run in progress is not interrupted)."""
        self._dirty.discard(key)
        self._added_at.pop(key, None)
        found = self._delayed.pop(key, None)
        if found is not None:
            found[1].cancel()
        self._failures.pop(key, None)
        self._changed()

    # -- taking --------------------------------------------------------------------------------

    async def get(self) -> K:
        """Wait for a key and mark it as being processed; the caller must call :meth:`done`."""
        while True:
            key = await self._ready.get()
            # stale entries: discarded since, or re-added by done() while still listed
            if key in self._dirty and key not in self._processing:
                break
        self._dirty.discard(key)
        self._processing.add(key)
        added = self._added_at.pop(key, None)
        if added is not None:
            self._wait.observe(time.monotonic() - added)
        self._changed()
        return key

    def done(self, key: K) -> None:
        """The run of ``key`` ended; if it was added meanwhile, it is queued again."""
        self._processing.discard(key)
        if key in self._dirty and not self.closed:
            self._ready.put_nowait(key)
        self._changed()

    # -- running -------------------------------------------------------------------------------

    async def _worker(self, handler: Handler[K]) -> None:
        while not self.closed:
            key = await self.get()
            if self.closed:
                self.done(key)
                return
            started = time.monotonic()
            try:
                again = await handler(key)
            except asyncio.CancelledError:
                if not self.closed:  # cancelled mid-work (a leader stepping down): not done
                    self.add(key)
                raise
            except Exception:
                delay = self.requeue_rate_limited(key)
                logger.exception("queue %s: processing %s failed; retrying in %.2fs", self.name, key, delay)
            else:
                if again is not None:
                    self.add_after(key, again)
            finally:
                self._work.observe(time.monotonic() - started)
                self.done(key)

    async def run(self, handler: Handler[K], *, workers: int | None = None) -> None:
        """Process keys with ``workers`` concurrent workers until :meth:`shutdown` or cancelled.

        A handler's exception is logged and the key requeued with backoff; the worker goes on.
        """
        count = workers if workers is not None else self.settings.workers
        if count < 1:
            raise ValueError(f"queue {self.name}: at least one worker is needed, not {count}")
        tasks = [
            asyncio.create_task(self._worker(handler), name=f"queue-{self.name}-worker-{i}")
            for i in range(count)
        ]
        try:
            await self._closed.wait()
            await wait_set(self._nothing_running, self.settings.drain_timeout)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def shutdown(self) -> None:
        """Stop: no more adds, delayed adds dropped, workers stop after the key they hold."""
        self._closed.set()
        for _, handle in self._delayed.values():
            handle.cancel()
        self._delayed.clear()
        self._changed()

    async def drain(self) -> None:
        """Wait until nothing is waiting, delayed or being processed (for tests and shutdown)."""
        await self._idle.wait()
