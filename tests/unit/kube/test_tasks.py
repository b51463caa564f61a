"""Guarded tasks and the root-task supervisor."""

from __future__ import annotations

import asyncio
import logging

import pytest

from kube.tasks import cancel_and_wait, create_guarded_task, run_supervised, wait_set


async def forever(stopped: list[str], name: str) -> None:
    try:
        await asyncio.sleep(10)
    finally:
        stopped.append(name)


async def test_guarded_task_logs_its_failure_with_its_name(caplog: pytest.LogCaptureFixture) -> None:
    async def boom() -> int:
        raise RuntimeError("lease lost")

    task = create_guarded_task(boom(), "lease-renewer", logger=logging.getLogger("t"))
    assert task.get_name() == "lease-renewer"
    assert await task is None
    (record,) = caplog.records
    assert record.getMessage() == "task lease-renewer failed" and record.exc_info

    async def fine() -> int:
        return 7

    assert await create_guarded_task(fine(), "fine") == 7


async def test_the_first_root_task_to_end_stops_the_others() -> None:
    stopped: list[str] = []

    async def short() -> None:
        await asyncio.sleep(0.01)

    first = await run_supervised(
        {"watch": forever(stopped, "watch"), "server": forever(stopped, "server"), "oneshot": short()}
    )
    assert first == "oneshot"
    assert sorted(stopped) == ["server", "watch"]


async def test_a_failing_root_task_is_logged_and_raised_after_the_others_stop(
    caplog: pytest.LogCaptureFixture,
) -> None:
    stopped: list[str] = []

    async def broken() -> None:
        await asyncio.sleep(0.01)
        raise ValueError("bad config")

    with pytest.raises(ValueError, match="bad config"):
        await run_supervised({"workers": forever(stopped, "workers"), "broken": broken()})
    assert stopped == ["workers"]
    assert "root task broken failed" in caplog.text


async def test_cancelling_the_supervisor_cancels_every_root_task() -> None:
    stopped: list[str] = []
    sup = asyncio.create_task(run_supervised({"a": forever(stopped, "a"), "b": forever(stopped, "b")}))
    await asyncio.sleep(0.01)
    sup.cancel()
    with pytest.raises(asyncio.CancelledError):
        await sup
    assert sorted(stopped) == ["a", "b"]


async def test_a_loop_waiting_for_an_event_stops_when_cancelled_as_the_event_comes() -> None:
    # asyncio.wait_for(event.wait(), 30) in Python 3.11 returns here, and the loop runs on
    event = asyncio.Event()
    passes = 0

    async def loop() -> None:
        nonlocal passes
        while True:
            event.clear()
            passes += 1
            await wait_set(event, 30)

    task = asyncio.create_task(loop(), name="status-loop")
    await asyncio.sleep(0)
    assert passes == 1
    event.set()
    task.cancel()  # in the same step: what it waits for is done as the cancellation comes
    done, _ = await asyncio.wait({task}, timeout=5)
    assert task in done and task.cancelled()
    assert passes == 1


async def test_wait_set_says_whether_the_event_came_in_time() -> None:
    event = asyncio.Event()
    assert await wait_set(event, 0.01) is False
    asyncio.get_running_loop().call_later(0.01, event.set)
    assert await wait_set(event, 5) is True
    assert await wait_set(event, 0) is True  # set already: no wait at all


async def winds_down(seconds: float, started: asyncio.Event, ended: list[str], name: str) -> None:
    """Runs until cancelled, then takes ``seconds`` to clean up (a Lease released, a process
    ended) before it lets the cancellation through."""
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        started.set()
        await asyncio.sleep(seconds)
        ended.append(name)
        raise


async def test_a_caller_cancelled_while_its_tasks_wind_down_is_cancelled_after_they_end() -> None:
    # `task.cancel(); with suppress(CancelledError): await task` returns normally here: the
    # caller's own cancellation is taken for the task's, and a loop around it runs on
    winding, ended, after = asyncio.Event(), list[str](), list[str]()
    task = asyncio.create_task(winds_down(0.2, winding, ended, "lease"), name="lease")

    async def stopper() -> None:
        while True:  # a loop that stops its child, then would go round again
            await cancel_and_wait([task])
            after.append("went on")
            await asyncio.sleep(0)

    caller = asyncio.create_task(stopper())
    await asyncio.wait_for(winding.wait(), 5)
    caller.cancel()
    done, _ = await asyncio.wait({caller}, timeout=5)
    assert caller in done and caller.cancelled(), "the caller's cancellation was swallowed"
    assert ended == ["lease"], "the caller left before its task had ended"
    assert after == []


async def test_cancel_and_wait_logs_failures_and_leaves_done_tasks_alone(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def fails_when_cancelled() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            raise RuntimeError("could not release the lease")

    async def failed_before() -> None:
        raise ValueError("the caller's business")

    earlier = asyncio.create_task(failed_before(), name="earlier")
    await asyncio.sleep(0)
    assert earlier.done()
    quiet = asyncio.create_task(forever([], "quiet"), name="quiet")
    loud = asyncio.create_task(fails_when_cancelled(), name="renew-lease")
    await asyncio.sleep(0)
    await cancel_and_wait([earlier, quiet, loud], logger=logging.getLogger("t"))
    assert quiet.cancelled() and loud.done() and not earlier.cancelled()
    (record,) = caplog.records
    assert record.getMessage() == "task renew-lease failed while stopping"
    assert isinstance(record.exc_info[1], RuntimeError)  # type: ignore[index]
    await cancel_and_wait([])  # nothing to do
