"""The token bucket with a fake clock: burst, steady rate, waiting order, disabled."""

from __future__ import annotations

import asyncio

import pytest

from kube.ratelimit import TokenBucket


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def test_burst_then_steady_rate() -> None:
    clock = FakeClock()
    bucket = TokenBucket(qps=10, burst=3, clock=clock)
    assert [bucket.reserve() for _ in range(3)] == [0, 0, 0]
    assert bucket.reserve() == pytest.approx(0.1)
    assert bucket.reserve() == pytest.approx(0.2)
    clock.now += 0.2  # both waiters' tokens are now paid for
    assert bucket.tokens() == pytest.approx(0.0)
    clock.now += 10  # refills, but never beyond the burst
    assert bucket.tokens() == pytest.approx(3.0)


async def test_acquire_sleeps_on_the_clock() -> None:
    clock = FakeClock()
    bucket = TokenBucket(qps=2, burst=1, clock=clock, sleep=clock.sleep)
    for _ in range(5):
        await bucket.acquire()
    assert clock.sleeps == pytest.approx([0.5, 0.5, 0.5, 0.5])
    assert clock.now == pytest.approx(1002.0)


async def test_concurrent_waiters_are_spaced_in_arrival_order() -> None:
    clock = FakeClock()
    bucket = TokenBucket(qps=4, burst=1, clock=clock)
    delays = [bucket.reserve() for _ in range(4)]
    assert delays == pytest.approx([0, 0.25, 0.5, 0.75])
    assert bucket.waited == pytest.approx(1.5)


async def test_disabled_when_qps_is_zero() -> None:
    clock = FakeClock()
    bucket = TokenBucket(qps=0, burst=0, clock=clock, sleep=clock.sleep)
    await asyncio.gather(*(bucket.acquire() for _ in range(1000)))
    assert clock.sleeps == []
    assert not bucket.enabled


def test_burst_must_be_positive() -> None:
    with pytest.raises(ValueError):
        TokenBucket(qps=5, burst=0)
