"""Watches started on demand, one per namespace, owned by one named root task.

Reflectors watch a consumer namespace (its ConfigMaps, Services…) or a twin namespace (its pods,
its Events) only once a pod there needs it, so those watches cannot be listed up front like a
:class:`kube.manager.Manager`'s informers. :class:`NamespaceTasks` keeps them: :meth:`start`
runs one per namespace, and :meth:`run` (the reflector's root task under the manager) holds
them and cancels them all when it ends, so nothing outlives the virtual kubelet's stop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

__all__ = ["NamespaceTasks"]

logger = logging.getLogger(__name__)


class NamespaceTasks:
    """Named tasks, one per namespace (see the module docstring)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._tasks: dict[str, asyncio.Task[Any]] = {}
        self._closed = False

    def __contains__(self, namespace: object) -> bool:
        return namespace in self._tasks

    def __len__(self) -> int:
        return len(self._tasks)

    def start(self, namespace: str, factory: Callable[[], Coroutine[Any, Any, Any]]) -> bool:
        """Run ``factory()`` for ``namespace`` unless one runs already (or all were stopped);
        whether it was started."""
        if self._closed or namespace in self._tasks:
            return False
        task = asyncio.create_task(factory(), name=f"{self.name} {namespace}")
        task.add_done_callback(self._ended)
        self._tasks[namespace] = task
        return True

    def cancel(self, namespace: str) -> None:
        task = self._tasks.pop(namespace, None)
        if task is not None:
            task.cancel()

    def _ended(self, task: asyncio.Task[Any]) -> None:
        if not task.cancelled() and task.exception() is not None:
            logger.error("%s failed", task.get_name(), exc_info=task.exception())

    async def run(self) -> None:
        """Hold the tasks until cancelled; then cancel them and wait for them to end."""
        try:
            await asyncio.Event().wait()
        finally:
            self._closed = True
            tasks = list(self._tasks.values())
            self._tasks.clear()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
