"""The integration tests' bounded stop of an in-process component."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from tests.integration.stopping import stop


async def test_a_task_that_ends_when_cancelled_is_stopped_quietly() -> None:
    task = asyncio.create_task(asyncio.sleep(60), name="polite")
    await stop(task, timeout=5)
    assert task.cancelled()


async def test_a_task_that_failed_before_is_stopped_and_its_exception_left_to_the_test() -> None:
    async def fails() -> None:
        raise RuntimeError("boom")

    task = asyncio.create_task(fails())
    await asyncio.sleep(0)
    await stop(task, timeout=5)
    assert isinstance(task.exception(), RuntimeError)


async def test_a_task_that_outlives_its_cancel_fails_the_stop_naming_the_loop_that_held_it() -> None:
    release = asyncio.Event()

    async def stuck_loop() -> None:  # swallows cancellation, as a careless cleanup may
        while not release.is_set():
            with contextlib.suppress(asyncio.CancelledError):
                await release.wait()

    async def component() -> None:
        inner = asyncio.create_task(stuck_loop(), name="component/stuck-loop")
        try:
            await asyncio.sleep(60)
        finally:
            inner.cancel()
            await inner

    task = asyncio.create_task(component(), name="component")
    await asyncio.sleep(0.01)
    with pytest.raises(AssertionError) as failed:
        await stop(task, timeout=0.2)
    message = str(failed.value)
    assert "component did not end 0 s after it was cancelled" in message
    assert "--- component/stuck-loop" in message and "stuck_loop" in message
    release.set()
    await asyncio.wait({task}, timeout=5)
    assert task.done()
