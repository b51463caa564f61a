"""Watches started on demand, one per namespace, owned by one named root task.

Reflectors watch a consumer namespace (its ConfigMaps, Services…) or a twin namespace (its pods,
its Events) only once a pod there needs it, so those watches cannot be listed up front like a
:class:`kube.manager.Manager`'s informers. :class:`NamespaceTasks` keeps them: :meth:`start`
runs one per namespace, :meth:`cancel` stops one when no pod of the node is left in its
namespace (:class:`NamespacePods` says when), and :meth:`run` (the reflector's root task under
the manager) holds them and cancels them all when it ends, so nothing outlives the virtual
kubelet's stop. ``gpuferry_vk_namespace_watches`` counts them, per reflector.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from kube.metrics import gauge
from kube.objects import ObjectKey

__all__ = ["NamespacePods", "NamespaceTasks"]

logger = logging.getLogger(__name__)

_WATCHES = gauge("vk_namespace_watches", "Per-namespace watches a reflector holds now.", ["reflector"])


class NamespacePods:
    """Which namespaces have pods on the node: :meth:`update` says when one has none left."""

    def __init__(self) -> None:
        self._pods: dict[str, set[str]] = {}

    def update(self, key: ObjectKey, present: bool) -> bool:
        """Record that the pod ``key`` is (or is no longer) on the node; True when that left its
        namespace without any."""
        namespace = key.namespace or ""
        names = self._pods.get(namespace)
        if present:
            self._pods.setdefault(namespace, set()).add(key.name)
            return False
        if names is None:
            return False
        names.discard(key.name)
        if names:
            return False
        del self._pods[namespace]
        return True

    def __contains__(self, namespace: object) -> bool:
        return namespace in self._pods


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
        task.add_done_callback(lambda done: self._ended(namespace, done))
        self._tasks[namespace] = task
        _WATCHES.labels(self.name).set(len(self._tasks))
        return True

    def cancel(self, namespace: str) -> None:
        task = self._tasks.pop(namespace, None)
        if task is not None:
            task.cancel()
        _WATCHES.labels(self.name).set(len(self._tasks))

    def _ended(self, namespace: str, task: asyncio.Task[Any]) -> None:
        if self._tasks.get(namespace) is task:  # ended by itself (a cancelled one is gone already)
            del self._tasks[namespace]
            _WATCHES.labels(self.name).set(len(self._tasks))
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
            _WATCHES.labels(self.name).set(0)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
