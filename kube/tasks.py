"""Named, guarded tasks and a supervisor for a component's root tasks.

Every long-lived loop (a watch, a queue's workers, an HTTP server, a lease renewer) runs as a
named task. :func:`create_guarded_task` logs a task's failure with its name instead of leaving
"Task exception was never retrieved" to the garbage collector. :func:`run_supervised` runs a
component's root tasks together: when the first one ends, normally or not, the others are
cancelled and awaited, and the first one's exception (if any) is raised. :func:`cancel_and_wait`
stops tasks without swallowing the caller's own cancellation.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine, Iterable, Mapping
from typing import Any, TypeVar

__all__ = ["cancel_and_wait", "create_guarded_task", "run_supervised", "wait_set"]

T = TypeVar("T")

_log = logging.getLogger(__name__)


async def wait_set(event: asyncio.Event, timeout: float) -> bool:
    """Until ``event`` is set (True) or ``timeout`` seconds have passed (False).

    Not ``asyncio.wait_for(event.wait(), timeout)``: in Python 3.11 that returns normally when the
    event is set in the same step of the loop as its task is cancelled, so the cancellation is
    swallowed and a loop around it runs on after it was told to stop (a virtual kubelet's
    node-status loop was seen running 60 s after its cancellation). ``asyncio.timeout`` tells its
    own cancellation from another's. (Python 3.12's ``wait_for`` is built on it.)
    """
    try:
        async with asyncio.timeout(timeout):
            await event.wait()
    except TimeoutError:
        return False
    return True


async def cancel_and_wait(
    tasks: Iterable[asyncio.Future[Any]], *, logger: logging.Logger | logging.LoggerAdapter[Any] | None = None
) -> None:
    """Cancel ``tasks`` and wait until every one has ended; log the failures of those that were
    still running (with the task's name). A task already done is left as it is (its result or
    exception is the caller's, and is marked retrieved).

    Not ``task.cancel(); with suppress(CancelledError): await task``: that swallows the caller's
    own cancellation too, when it comes while the task winds down, and a loop around it (a manager
    stepping down, a supervisor forgetting a child) runs on after it was told to stop. Here the
    tasks' cancellations never reach the caller, and the caller's does, once they have all ended:
    a caller cancelled meanwhile still waits for them (they were told to stop already), so that
    nothing it started outlives it.
    """
    log = logger or _log
    running: list[asyncio.Future[Any]] = []
    for task in tasks:
        if task.done():
            if not task.cancelled():
                task.exception()  # retrieved
        else:
            task.cancel()
            running.append(task)
    interrupted = False
    while not all(task.done() for task in running):
        try:
            await asyncio.wait(running)  # raises only this caller's own cancellation
        except asyncio.CancelledError:
            interrupted = True
    for task in running:
        if not task.cancelled() and (exc := task.exception()) is not None:
            name = task.get_name() if isinstance(task, asyncio.Task) else repr(task)
            log.error("task %s failed while stopping", name, exc_info=exc)
    if interrupted:
        raise asyncio.CancelledError


async def _guarded(coro: Coroutine[Any, Any, T], name: str, logger: logging.Logger) -> T | None:
    try:
        return await coro
    except asyncio.CancelledError:
        raise
    except Exception:
        logger.exception("task %s failed", name)
        return None


def create_guarded_task(
    coro: Coroutine[Any, Any, T], name: str, *, logger: logging.Logger | None = None
) -> asyncio.Task[T | None]:
    """A task named ``name`` whose exception is logged (with the name) and swallowed.

    Its result is ``None`` when it failed. Cancellation propagates as usual.
    """
    return asyncio.create_task(_guarded(coro, name, logger or _log), name=name)


async def run_supervised(
    roots: Mapping[str, Coroutine[Any, Any, Any]], *, logger: logging.Logger | None = None
) -> str:
    """Run ``roots`` (name → coroutine) until the first ends; stop the others; return its name.

    If the first task to end raised, its exception is logged with its name and re-raised after
    the others have stopped. If this coroutine is cancelled, all tasks are cancelled and awaited.
    """
    log = logger or _log
    if not roots:
        raise ValueError("run_supervised needs at least one root task")
    tasks = {name: asyncio.create_task(coro, name=name) for name, coro in roots.items()}
    try:
        done, _ = await asyncio.wait(tasks.values(), return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        await cancel_and_wait(tasks.values(), logger=log)
        raise
    first_name, first = next((n, t) for n, t in tasks.items() if t in done)
    others = {n: t for n, t in tasks.items() if t is not first}
    if first.cancelled():
        log.warning("root task %s was cancelled; stopping the others", first_name)
    elif first.exception() is not None:
        log.error("root task %s failed; stopping the others", first_name, exc_info=first.exception())
    else:
        log.info("root task %s ended; stopping the others", first_name)
    # other tasks that finished in the same step: report their failures too
    for name, task in others.items():
        if task.done() and not task.cancelled() and task.exception() is not None:
            log.error("root task %s failed", name, exc_info=task.exception())
    await cancel_and_wait([t for t in others.values() if not t.done()], logger=log)
    if not first.cancelled() and first.exception() is not None:
        raise first.exception()  # type: ignore[misc]
    return first_name
