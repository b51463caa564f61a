"""Exponential backoff, the one every retry loop of gpuferry uses: watches reconnecting, work
queues requeueing a failing key, a node heartbeat retrying, a supervisor restarting a process.

``delay(n)`` is ``base * factor ** (n - 1)`` capped at ``cap``, plus up to ``jitter`` of itself at
random (so that many clients do not retry in step); a server's ``Retry-After`` wins when given.
:class:`Backoff` counts the failures of one loop and forgets them after a success.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

__all__ = ["Backoff", "backoff_delay"]


def backoff_delay(
    failures: int,
    *,
    base: float,
    cap: float,
    factor: float = 2.0,
    jitter: float = 0.0,
    retry_after: float | None = None,
) -> float:
    """The wait before retry number ``failures`` (1-based; 0 counts as 1)."""
    if retry_after is not None:
        return retry_after
    delay = min(base * factor ** max(failures - 1, 0), cap)
    return delay * (1 + jitter * random.random()) if jitter else delay


@dataclass
class Backoff:
    """The failures of one retry loop and the delay before its next attempt."""

    base: float = 0.5
    """First delay, in seconds."""
    cap: float = 60.0
    """Longest delay (jitter aside)."""
    factor: float = 2.0
    jitter: float = 0.0
    """Random fraction added to each delay."""
    failures: int = field(default=0, init=False)

    def next(self, retry_after: float | None = None) -> float:
        """Count one more failure; the delay to wait before trying again."""
        self.failures += 1
        return backoff_delay(self.failures, base=self.base, cap=self.cap, factor=self.factor,
                             jitter=self.jitter, retry_after=retry_after)  # fmt: skip

    def reset(self) -> None:
        """A success: the next failure waits ``base`` again."""
        self.failures = 0
