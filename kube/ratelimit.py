"""A client-side token bucket, like client-go's ``flowcontrol.NewTokenBucketRateLimiter``.

The bucket holds up to ``burst`` tokens and refills at ``qps`` tokens per second. Each request
takes one token; when none is left the caller waits for its turn. Waiting callers reserve their
token up front (the bucket may go negative), so they are served in arrival order and the
rate holds however many wait at once. The clock and the sleep are injectable for tests.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

__all__ = ["TokenBucket"]


class TokenBucket:
    """``qps`` tokens per second, at most ``burst`` saved up; ``qps <= 0`` means unlimited."""

    def __init__(
        self,
        qps: float,
        burst: int,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        if qps > 0 and burst < 1:
            raise ValueError(f"burst must be at least 1 when qps > 0, not {burst}")
        self.qps = qps
        self.burst = burst
        self._clock = clock
        self._sleep = sleep
        self._tokens = float(burst)
        self._stamp = clock()
        self.waited = 0.0
        """Total seconds callers have been told to wait (a metric and a test aid)."""

    @property
    def enabled(self) -> bool:
        return self.qps > 0

    def _refill(self) -> None:
        now = self._clock()
        elapsed = max(now - self._stamp, 0.0)
        self._stamp = now
        self._tokens = min(float(self.burst), self._tokens + elapsed * self.qps)

    def reserve(self) -> float:
        """Take a token now and return how long the caller must wait before using it."""
        if not self.enabled:
            return 0.0
        self._refill()
        self._tokens -= 1.0
        if self._tokens >= 0:
            return 0.0
        delay = -self._tokens / self.qps
        self.waited += delay
        return delay

    def tokens(self) -> float:
        """Tokens available right now (negative when callers are waiting)."""
        if self.enabled:
            self._refill()
        return self._tokens

    async def acquire(self) -> None:
        """Wait until this caller may send its request."""
        delay = self.reserve()
        if delay > 0:
            await self._sleep(delay)
