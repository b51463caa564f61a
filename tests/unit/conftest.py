"""Shared by all unit tests: no test may leave a task running behind it."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator

import pytest


@pytest.fixture(autouse=True)
async def no_leaked_tasks(request: pytest.FixtureRequest) -> AsyncIterator[None]:
    """Fail an async test that leaves tasks behind (after its other fixtures are torn down)."""
    yield
    if not inspect.iscoroutinefunction(getattr(request.node, "obj", None)):
        return
    current = asyncio.current_task()
    for _ in range(5):
        await asyncio.sleep(0)
    leaked = [t for t in asyncio.all_tasks() if t is not current and not t.done()]
    for task in leaked:
        task.cancel()
    await asyncio.gather(*leaked, return_exceptions=True)
    assert not leaked, f"tasks left running: {[t.get_name() for t in leaked]}"
