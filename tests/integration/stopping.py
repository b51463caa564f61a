"""Stopping an in-process component (a virtual kubelet run as a task) at a test's end, bounded.

A task that does not end when cancelled would hold the test's teardown until pytest-timeout's
300 s, say nothing of why, and leave its node to the next test. :func:`stop` waits a bounded
time and, if the task is still there, fails with the stacks of every task still pending, which
name the loop that kept it.
"""

from __future__ import annotations

import asyncio
import io
from typing import Any

STOP_SECONDS = 60.0


def pending_stacks(*, exclude: asyncio.Task[Any] | None = None) -> str:
    """The stack of each pending task of the running loop but ``exclude``, by task name."""
    out = io.StringIO()
    for task in sorted(asyncio.all_tasks(), key=lambda t: t.get_name()):
        if task is exclude or task.done():
            continue
        out.write(f"--- {task.get_name()}: {task.get_coro()!r}\n")
        task.print_stack(limit=12, file=out)
    return out.getvalue()


async def stop(task: asyncio.Task[Any], *, timeout: float = STOP_SECONDS) -> None:
    """Cancel ``task`` and wait for it to end, at most ``timeout`` seconds; then fail with the
    stacks of what is still pending (the task cancelled once more, so that it may yet end)."""
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=timeout)
    if done:
        if not task.cancelled():
            task.exception()  # retrieved: how it ended is the test's concern, not its teardown's
        return
    stacks = pending_stacks(exclude=asyncio.current_task())
    task.cancel()
    grace = min(10.0, timeout)
    await asyncio.wait({task}, timeout=grace)
    again = f" (nor {grace:.0f} s after a second cancel)" if not task.done() else ""
    raise AssertionError(
        f"{task.get_name()} did not end {timeout:.0f} s after it was cancelled{again}; "
        f"pending tasks:\n{stacks}"
    )
