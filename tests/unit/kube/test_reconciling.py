"""run_workers: what each reconciler outcome leads to; workers never die."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from itertools import pairwise

import pytest

from kube.errors import Conflict, Forbidden, PermanentError, ServerError, TemporaryError
from kube.objects import ObjectKey
from kube.queueing import KeyedQueue
from kube.reconciling import Reconciler, Requeue, run_workers
from kube.settings import QueueSettings

SETTINGS = QueueSettings(workers=2, backoff_base=0.02, backoff_max=0.1, conflict_delay=0.01, drain_timeout=1)
KEY = ObjectKey("ns", "web")


@dataclass
class Scripted:
    """Raises or returns the scripted outcomes in order, then returns None."""

    outcomes: list[BaseException | Requeue | None]
    calls: list[float] = field(default_factory=list)

    async def reconcile(self, key: ObjectKey) -> Requeue | None:
        self.calls.append(asyncio.get_running_loop().time())
        outcome = self.outcomes.pop(0) if self.outcomes else None
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome


async def run(reconciler: Scripted, *keys: ObjectKey, settle: float = 0.0) -> KeyedQueue[ObjectKey]:
    queue: KeyedQueue[ObjectKey] = KeyedQueue("test-reconcile", settings=SETTINGS)
    checked: Reconciler[ObjectKey] = reconciler
    task = asyncio.create_task(
        run_workers(queue, checked, settings=SETTINGS, logger=logging.getLogger("t"), kind="Pod")
    )
    for key in keys or (KEY,):
        queue.add(key)
    await asyncio.wait_for(queue.drain(), 2)
    await asyncio.sleep(settle)
    queue.shutdown()
    await asyncio.wait_for(task, 2)
    return queue


async def test_done_and_requeue() -> None:
    rec = Scripted([Requeue(after=0.05), None])
    await run(rec)
    assert len(rec.calls) == 2
    assert rec.calls[1] - rec.calls[0] >= 0.05


async def test_temporary_error_retries_after_its_delay(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    rec = Scripted([TemporaryError("GPU slice not granted yet", delay=0.04)])
    await run(rec)
    assert len(rec.calls) == 2 and rec.calls[1] - rec.calls[0] >= 0.04
    assert "Pod ns/web: retrying in 0.04s: GPU slice not granted yet" in caplog.text


async def test_conflicts_and_server_errors_retry_with_backoff() -> None:
    rec = Scripted(
        [Conflict("modified", status=409), Conflict("modified", status=409), ServerError("etcd", status=500)]
    )
    queue = await run(rec)
    gaps = [b - a for a, b in pairwise(rec.calls)]
    assert len(rec.calls) == 4
    assert gaps[0] >= 0.01 and gaps[1] >= 0.02  # conflict backoff starts at conflict_delay
    assert gaps[2] >= 0.02 * 4  # third failure of the key: 0.02 * 2**2
    assert queue.failures(KEY) == 0, "success resets the backoff"


@pytest.mark.parametrize("error", [PermanentError("bad spec"), Forbidden("quota exceeded", status=403)])
async def test_permanent_errors_are_logged_with_the_key_and_not_retried(
    error: Exception, caplog: pytest.LogCaptureFixture
) -> None:
    rec = Scripted([error])
    await run(rec, settle=0.05)
    assert len(rec.calls) == 1
    (record,) = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert record.getMessage().startswith("Pod ns/web: ")
    assert getattr(record, "object_key", None) == "ns/web"


async def test_unexpected_exceptions_are_logged_with_traceback_and_retried(
    caplog: pytest.LogCaptureFixture,
) -> None:
    rec = Scripted([KeyError("spec"), ZeroDivisionError()])
    await run(rec, ObjectKey("ns", "a"), ObjectKey("ns", "b"))
    assert len(rec.calls) == 4  # both keys ran; one failed twice and was retried; the workers lived
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 2 and all(r.exc_info for r in errors)
    assert "unexpected error" in errors[0].getMessage()
