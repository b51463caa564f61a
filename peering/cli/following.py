"""Following a ForeignCluster's conditions from the CLI: a progress line as each step is done, a
clear error at once when one fails for good, and a local agent's death noticed as it happens."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

from kube.api import NETWORK_READY
from kube.clients import KubeClient
from kube.objects import FOREIGNCLUSTERS, RawObject
from kube.tasks import cancel_and_wait
from kube.watching import Listed, watch_objects

from ..conditions import CHANGE_REFUSED, find_condition
from ..network import FAILED_REASONS
from .common import UserError

__all__ = ["STEPS", "Follower", "StepFailed", "tail"]

STEPS = ("Authenticated", "SliceGranted", "VirtualNodeReady", NETWORK_READY)
# False reasons that waiting does not cure: the input must change
TERMINAL = {
    "Authenticated": {"Refused", "PeeringTokenMissing"},
    NETWORK_READY: {*FAILED_REASONS, "InvalidDeclaration"},
}


class StepFailed(Exception):
    """A step of the peering failed for good: ``step``, its ``reason`` and ``message``."""

    def __init__(self, step: str, reason: str, message: str, fc: RawObject) -> None:
        super().__init__(f"{step}: {reason}: {message}")
        self.step, self.reason, self.message, self.fc = step, reason, message, fc


def tail(path: Path, lines: int = 8) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as e:
        return f"(unreadable: {e})"


class Follower:
    """Watches one ForeignCluster until ``steps`` are all True for its current generation."""

    def __init__(self, client: KubeClient, name: str, generation: int, steps: tuple[str, ...]) -> None:
        self.client, self.name, self.generation, self.steps = client, name, generation, steps
        self.announced: set[str] = set()
        self.last: RawObject | None = None

    def _verdict(self, fc: RawObject, on_step: Callable[[str, RawObject], None]) -> bool:
        conditions = (fc.get("status") or {}).get("conditions")
        for step in self.steps:
            cond = find_condition(conditions, step)
            if cond is None or cond.get("observedGeneration") != self.generation:
                return False
            if cond.get("status") == "True":
                if step not in self.announced:
                    self.announced.add(step)
                    on_step(step, fc)
                continue
            reason = str(cond.get("reason"))
            slice_phase = ((fc.get("status") or {}).get("slice") or {}).get("phase")
            if step == "SliceGranted" and (slice_phase == "Denied" or reason == CHANGE_REFUSED):
                raise StepFailed(step, reason, str(cond.get("message")), fc)
            if reason in TERMINAL.get(step, ()):
                raise StepFailed(step, reason, str(cond.get("message")), fc)
            return False
        return True

    async def run(self, on_step: Callable[[str, RawObject], None]) -> RawObject:
        async for item in watch_objects(
            self.client, FOREIGNCLUSTERS, field_selector=f"metadata.name={self.name}"
        ):
            if isinstance(item, Listed):
                continue
            if item.type == "DELETED":
                raise UserError(f"the ForeignCluster {self.name} was deleted while peering")
            self.last = item.object
            if self._verdict(item.object, on_step):
                return item.object
        raise UserError(f"watching the ForeignCluster {self.name} ended")

    async def until_done(
        self,
        on_step: Callable[[str, RawObject], None],
        *,
        timeout: float,
        also: Sequence[Awaitable[str]] = (),
    ) -> RawObject:
        """Done, or the first of ``also`` that ends (e.g. an agent's exit) raises UserError with
        the message it returned; TimeoutError after ``timeout`` with the last state."""
        main = asyncio.ensure_future(self.run(on_step))
        others = [asyncio.ensure_future(a) for a in also]
        try:
            done, _ = await asyncio.wait(
                [main, *others], timeout=timeout, return_when=asyncio.FIRST_COMPLETED
            )
            if main in done:
                return main.result()
            for task in done:
                raise UserError(str(task.result()))
            raise TimeoutError(self.waiting_for())
        finally:
            await cancel_and_wait([main, *others])

    def waiting_for(self) -> str:
        """The first step not done, with its condition's reason and message."""
        conditions = ((self.last or {}).get("status") or {}).get("conditions")
        for step in self.steps:
            cond = find_condition(conditions, step)
            if cond is None or cond.get("status") != "True":
                if cond is None:
                    return f"{step}: not reported yet (is the consumer agent running?)"
                return f"{step}: {cond.get('reason')}: {cond.get('message')}"
        return "all steps done"
