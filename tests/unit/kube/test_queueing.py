"""KeyedQueue semantics: dedup, serial per key, bounded workers, delays and backoff, shutdown."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from itertools import pairwise

import pytest

from kube.queueing import KeyedQueue
from kube.settings import QueueSettings

FAST = QueueSettings(workers=4, backoff_base=0.02, backoff_max=0.1, drain_timeout=1)


@dataclass
class Tracker:
    """Records runs per key, and the most runs in flight (overall and per key)."""

    runs: Counter[str] = field(default_factory=Counter)
    started_at: dict[str, list[float]] = field(default_factory=dict)
    running: Counter[str] = field(default_factory=Counter)
    max_total: int = 0
    max_per_key: int = 0
    hold: float = 0.0

    async def __call__(self, key: str) -> float | None:
        self.runs[key] += 1
        self.started_at.setdefault(key, []).append(asyncio.get_running_loop().time())
        self.running[key] += 1
        self.max_per_key = max(self.max_per_key, self.running[key])
        self.max_total = max(self.max_total, sum(self.running.values()))
        try:
            await asyncio.sleep(self.hold)
        finally:
            self.running[key] -= 1
        return None


@asynccontextmanager
async def running(
    queue: KeyedQueue[str], handler: Callable[[str], Awaitable[float | None]], workers: int = 4
) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.create_task(queue.run(handler, workers=workers))
    try:
        yield task
    finally:
        queue.shutdown()
        await asyncio.wait_for(task, 2)


async def test_a_key_added_many_times_before_a_worker_takes_it_runs_once() -> None:
    queue: KeyedQueue[str] = KeyedQueue("dedup", settings=FAST)
    for _ in range(5):
        queue.add("a")
    queue.add("b")
    assert len(queue) == 2 and queue.pending == {"a", "b"}
    tracker = Tracker()
    async with running(queue, tracker):
        await queue.drain()
    assert tracker.runs == {"a": 1, "b": 1}


async def test_a_key_added_while_running_runs_once_more_after_never_alongside() -> None:
    queue: KeyedQueue[str] = KeyedQueue("serial", settings=FAST)
    tracker = Tracker(hold=0.05)
    async with running(queue, tracker, workers=8):
        queue.add("a")
        await asyncio.sleep(0.01)
        assert queue.processing == {"a"}
        for _ in range(5):  # added while being processed: one more run, after this one
            queue.add("a")
        assert len(queue) == 0 and queue.pending == {"a"}
        await queue.drain()
    assert tracker.runs["a"] == 2
    assert tracker.max_per_key == 1
    first, second = tracker.started_at["a"]
    assert second - first >= 0.05


async def test_concurrency_is_bounded_by_workers() -> None:
    queue: KeyedQueue[str] = KeyedQueue("bounded", settings=FAST)
    tracker = Tracker(hold=0.02)
    for i in range(12):
        queue.add(f"k{i}")
    async with running(queue, tracker, workers=3):
        await queue.drain()
    assert sum(tracker.runs.values()) == 12
    assert tracker.max_total == 3


def test_rate_limited_delays_double_up_to_the_cap_and_forget_resets() -> None:
    async def main() -> None:
        queue: KeyedQueue[str] = KeyedQueue(
            "backoff", settings=QueueSettings(backoff_base=0.5, backoff_max=3)
        )
        assert [queue.requeue_rate_limited("a") for _ in range(5)] == [0.5, 1, 2, 3, 3]
        assert queue.failures("a") == 5 and queue.requeue_rate_limited("b") == 0.5
        queue.forget("a")
        assert queue.requeue_rate_limited("a") == 0.5
        assert queue.requeue_rate_limited("c", base=0.01) == 0.01
        queue.shutdown()

    asyncio.run(main())


async def test_a_failing_handler_is_retried_with_growing_delays(caplog: pytest.LogCaptureFixture) -> None:
    queue: KeyedQueue[str] = KeyedQueue("failing", settings=FAST)
    times: list[float] = []

    async def flaky(key: str) -> None:
        times.append(asyncio.get_running_loop().time())
        if len(times) < 4:
            raise RuntimeError(f"attempt {len(times)}")
        queue.forget(key)

    queue.add("a")
    async with running(queue, flaky):
        await queue.drain()
    gaps = [b - a for a, b in pairwise(times)]
    assert len(times) == 4
    for gap, expected in zip(gaps, [0.02, 0.04, 0.08], strict=True):
        assert expected <= gap < expected + 0.05
    assert queue.failures("a") == 0
    assert "processing a failed" in caplog.text and "attempt 1" in caplog.text


async def test_retry_now_cuts_short_the_backoff_of_failed_keys_only() -> None:
    """What the keys failed on is back (a provider that answers again): those waiting out a
    backoff run now, a key delayed for another reason (a resync) keeps its time, and a key
    that fails again backs off from where it was."""
    queue: KeyedQueue[str] = KeyedQueue("outage", settings=QueueSettings(backoff_base=30, backoff_max=60))
    tracker = Tracker()
    loop = asyncio.get_running_loop()
    async with running(queue, tracker):
        queue.requeue_rate_limited("failed")
        queue.requeue_rate_limited("failed")
        queue.add_after("resync", 30)
        assert queue.retry_now() == 1
        start = loop.time()
        await asyncio.sleep(0.3)  # against a backoff of 60 s
        assert tracker.runs["failed"] == 1 and tracker.started_at["failed"][0] - start < 0.3
        assert tracker.runs["resync"] == 0 and queue.pending == {"resync"}
        assert queue.failures("failed") == 2 and queue.requeue_rate_limited("failed") == 60
        assert queue.retry_now() == 1 and queue.retry_now() == 0
        queue.discard("resync")


async def test_add_after_waits_and_the_earliest_request_wins() -> None:
    queue: KeyedQueue[str] = KeyedQueue("later", settings=FAST)
    tracker = Tracker()
    loop = asyncio.get_running_loop()
    async with running(queue, tracker):
        start = loop.time()
        queue.add_after("a", 0.5)
        queue.add_after("a", 0.05)
        queue.add_after("a", 0.3)
        assert queue.pending == {"a"} and len(queue) == 0
        await queue.drain()
    assert tracker.runs["a"] == 1
    assert 0.05 <= tracker.started_at["a"][0] - start < 0.3


async def test_the_handler_return_value_requeues_after_that_delay() -> None:
    queue: KeyedQueue[str] = KeyedQueue("resync", settings=FAST)
    runs: list[float] = []

    async def resync(key: str) -> float | None:
        runs.append(asyncio.get_running_loop().time())
        return 0.05 if len(runs) < 3 else None

    queue.add("a")
    async with running(queue, resync):
        await queue.drain()
    assert len(runs) == 3
    assert runs[2] - runs[1] >= 0.05


async def test_discard_drops_waiting_and_delayed_adds() -> None:
    queue: KeyedQueue[str] = KeyedQueue("discard", settings=FAST)
    tracker = Tracker()
    queue.add("a")
    queue.add_after("b", 0.05)
    queue.discard("a")
    queue.discard("b")
    queue.add("c")
    assert queue.pending == {"c"}
    async with running(queue, tracker):
        await queue.drain()
        await asyncio.sleep(0.08)
    assert tracker.runs == {"c": 1}


async def test_a_key_readded_after_discard_still_runs_once() -> None:
    queue: KeyedQueue[str] = KeyedQueue("readd", settings=FAST)
    tracker = Tracker()
    queue.add("a")
    queue.discard("a")
    queue.add("a")  # a stale entry of "a" is still in the ready queue: it must be skipped
    async with running(queue, tracker):
        await queue.drain()
    assert tracker.runs == {"a": 1}


async def test_shutdown_lets_the_current_run_finish_and_ignores_new_adds() -> None:
    queue: KeyedQueue[str] = KeyedQueue("stop", settings=FAST)
    finished: list[str] = []

    async def slow(key: str) -> None:
        await asyncio.sleep(0.05)
        finished.append(key)

    task = asyncio.create_task(queue.run(slow, workers=1))
    queue.add("a")
    queue.add("b")
    await asyncio.sleep(0.01)
    queue.shutdown()
    queue.add("c")
    queue.add_after("d", 0.01)
    await asyncio.wait_for(task, 1)
    assert finished == ["a"]
    assert queue.closed


async def test_shutdown_cancels_work_that_outlives_the_drain_timeout() -> None:
    queue: KeyedQueue[str] = KeyedQueue("stuck", settings=QueueSettings(drain_timeout=0.05))
    cancelled = asyncio.Event()

    async def stuck(key: str) -> None:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    task = asyncio.create_task(queue.run(stuck, workers=2))
    queue.add("a")
    await asyncio.sleep(0.01)
    queue.shutdown()
    await asyncio.wait_for(task, 1)
    assert cancelled.is_set()


async def test_cancelling_run_stops_the_workers() -> None:
    queue: KeyedQueue[str] = KeyedQueue("cancel", settings=FAST)
    task = asyncio.create_task(queue.run(Tracker(hold=10), workers=2))
    queue.add("a")
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert queue.processing == frozenset()


async def test_a_key_cancelled_mid_work_is_worked_on_again_by_the_next_run() -> None:
    """What a leader stepping down does to its workers: the key in hand is not lost."""
    queue: KeyedQueue[str] = KeyedQueue("stepdown", settings=QueueSettings(workers=1))
    started = asyncio.Event()
    seen: list[str] = []

    async def slow(key: str) -> None:
        seen.append(key)
        started.set()
        await asyncio.sleep(60)

    first = asyncio.create_task(queue.run(slow))
    queue.add("k")
    await asyncio.wait_for(started.wait(), 5)
    first.cancel()
    await asyncio.gather(first, return_exceptions=True)
    assert len(queue) == 1, "the cancelled key went back to the queue"

    async def quick(key: str) -> None:
        seen.append(key)
        queue.shutdown()

    await asyncio.wait_for(queue.run(quick), 5)
    assert seen == ["k", "k"]
