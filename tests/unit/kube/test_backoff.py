"""The one backoff: exponential, capped, jittered, reset by a success, overridden by Retry-After."""

from __future__ import annotations

from kube.backoff import Backoff, backoff_delay


def test_delays_double_up_to_the_cap() -> None:
    assert [backoff_delay(n, base=0.5, cap=3.0) for n in range(6)] == [0.5, 0.5, 1.0, 2.0, 3.0, 3.0]


def test_retry_after_wins_and_jitter_stays_within_its_fraction() -> None:
    assert backoff_delay(9, base=1, cap=60, retry_after=2.5) == 2.5
    delays = [backoff_delay(3, base=1, cap=60, jitter=0.2) for _ in range(200)]
    assert all(4.0 <= d <= 4.8 for d in delays)
    assert len(set(delays)) > 1


def test_a_loop_counts_its_failures_until_a_success() -> None:
    backoff = Backoff(base=1, cap=10)
    assert [backoff.next() for _ in range(5)] == [1, 2, 4, 8, 10]
    backoff.reset()
    assert backoff.next() == 1 and backoff.failures == 1
