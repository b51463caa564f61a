"""Pacing of costly passes: at most a set share of a core, however often they are asked for.

A pass over a whole cluster (the provider's GPU pool: every node and every pod) is asked for on
every pod change; batching those for 0.1 s still ran passes back to back in a burst. On the
demo provider with 1,252 nodes and 10,000 pods, passes of 0.1-0.2 s ran one after the other,
and the controller spent 8.6-9.1 ms of CPU per pod, a third of a core over the run (3.4 ms
paced; issue 15). :class:`Pacer` lets the next pass start only
``factor`` times the last one's duration after it ended: a pass of 5 ms waits 20 ms, one of
0.11 s waits 0.44 s, and passes take at most ``1 / (1 + factor)`` of a core.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

__all__ = ["Pacer"]


@dataclass
class Pacer:
    """When the next pass may start, from the last one's start and end (monotonic seconds).

    ``factor``: the rest after a pass, as a multiple of its duration (0: none); ``cap``: the
    longest rest, whatever a pass took (a pass slowed by a loaded machine does not stall the
    next for long). Pure: it is given the times."""

    factor: float = 4.0
    cap: float = 2.0
    _ended: float = field(default=-math.inf, init=False)
    _took: float = field(default=0.0, init=False)

    def __post_init__(self) -> None:
        if self.factor < 0 or self.cap < 0:
            raise ValueError(f"a pacer's factor and cap are not negative, not {self.factor} and {self.cap}")

    def wait(self, now: float) -> float:
        """Seconds until the next pass may start (0: now)."""
        rest = min(self.cap, self._took * self.factor)
        return max(0.0, self._ended + rest - now)

    def record(self, started: float, ended: float) -> None:
        """A pass ran from ``started`` to ``ended``."""
        self._took = max(0.0, ended - started)
        self._ended = ended
