"""Twins seen through a scoped identity: one pod watch per twin namespace the provider made.

With the identity a peering issues, the virtual kubelet may not list pods cluster-wide, nor
create namespaces. The provider makes each twin namespace when the consumer asks for it, through
a ``NamespaceOffloading`` in the consumer's tenant namespace (``spec.originNamespace``; once
ready, ``status.phase: Ready`` and ``status.remoteNamespace``). :class:`TwinNamespaces` watches
those requests, keeps the origin → twin namespace map, and runs one :class:`PodCache` per twin
namespace, started and stopped as namespaces come and go. To the reflector it looks like one
cache keyed by consumer pod key.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Iterator

from kube.clients import KubeClient
from kube.errors import NotFound
from kube.objects import NAMESPACEOFFLOADINGS, ObjectKey, RawObject
from kube.settings import WatchSettings
from kube.watching import Listed, WatchEvent, watch_objects

from .caches import PodCache

__all__ = ["NAMESPACEOFFLOADINGS", "TwinNamespaces", "twin_mapping"]

logger = logging.getLogger(__name__)

DEMAND_ANNOTATION = "gpuferry.io/demand"


def twin_mapping(request: RawObject) -> tuple[str, str] | None:
    """(origin namespace, twin namespace) of a ready NamespaceOffloading request, else None."""
    spec, status = request.get("spec") or {}, request.get("status") or {}
    origin, twin = spec.get("originNamespace"), status.get("remoteNamespace")
    if status.get("phase") != "Ready" or not origin or not twin:
        return None
    if request["metadata"].get("deletionTimestamp"):
        return None
    return str(origin), str(twin)


class TwinNamespaces:
    """Twin pods of one consumer in the twin namespaces of its tenant (see the module docstring)."""

    def __init__(
        self,
        client: KubeClient,
        *,
        tenant_namespace: str,
        key_of: Callable[[RawObject], ObjectKey | None],
        on_change: Callable[[ObjectKey], None],
        on_namespaces: Callable[[set[str]], None] = lambda _: None,
        on_event: Callable[[str, WatchEvent | Listed], None] | None = None,
        label_selector: str | None = None,
        settings: WatchSettings | None = None,
    ) -> None:
        self.client = client
        self.tenant_namespace = tenant_namespace
        self._key_of = key_of
        self._on_change = on_change
        self._on_namespaces = on_namespaces
        self._on_event = on_event
        self._label_selector = label_selector
        self._settings = settings or WatchSettings()
        self.mapping: dict[str, str] = {}
        """Origin (consumer) namespace → twin namespace, for ready requests."""
        self._caches: dict[str, PodCache] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._requests: dict[ObjectKey, RawObject] = {}
        self._demand: dict[str, dict[str, str]] = {}
        self._requests_synced = asyncio.Event()
        self.synced = asyncio.Event()
        """Set once the requests were listed and every twin namespace known then was listed."""

    # ---- the PodCache face ---------------------------------------------------------------------

    def twin_namespace_for(self, origin: str) -> str | None:
        return self.mapping.get(origin)

    def namespace_synced(self, origin: str) -> bool:
        """Whether the twins of ``origin`` are known (its twin namespace's pods were listed)."""
        twin = self.mapping.get(origin)
        cache = self._caches.get(twin) if twin else None
        return cache is not None and cache.synced.is_set()

    def get(self, key: ObjectKey) -> RawObject | None:
        twin = self.mapping.get(key.namespace or "")
        cache = self._caches.get(twin) if twin else None
        if cache is not None:
            return cache.get(key)
        for other in self._caches.values():  # a namespace on its way out still has its twins
            if (found := other.get(key)) is not None:
                return found
        return None

    def keys(self) -> list[ObjectKey]:
        return [key for cache in self._caches.values() for key in cache]

    def __iter__(self) -> Iterator[ObjectKey]:
        return iter(self.keys())

    def phases(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for cache in self._caches.values():
            for phase, n in cache.phases().items():
                counts[phase] = counts.get(phase, 0) + n
        return counts

    def __len__(self) -> int:
        return sum(len(cache) for cache in self._caches.values())

    # ---- demand ------------------------------------------------------------------------------

    async def report_demand(self, origin: str, demand: dict[str, str]) -> None:
        """Tell the provider what pods of ``origin`` wait for beyond its twin namespace's quota
        (an annotation on the request; the provider moves quota headroom there first)."""
        if self._demand.get(origin) == demand:
            return
        value = json.dumps(demand, sort_keys=True) if demand else None
        try:
            await self.client.patch(
                NAMESPACEOFFLOADINGS,
                origin,
                {"metadata": {"annotations": {DEMAND_ANNOTATION: value}}},
                self.tenant_namespace,
            )
        except NotFound:
            return
        self._demand[origin] = demand
        logger.info("demand of %s reported to the provider: %s", origin, demand or "none")

    # ---- running -------------------------------------------------------------------------------

    async def run(self) -> None:
        """Watch the requests forever and keep one pod watch per twin namespace."""
        try:
            async for item in watch_objects(
                self.client,
                NAMESPACEOFFLOADINGS,
                namespace=self.tenant_namespace,
                settings=self._settings,
                retry_permanent=True,
            ):
                self._handle(item)
        finally:
            for task in self._tasks.values():
                task.cancel()
            await asyncio.gather(*self._tasks.values(), return_exceptions=True)

    def _handle(self, item: WatchEvent | Listed) -> None:
        if isinstance(item, Listed):
            for key in [k for k in self._requests if k not in item.keys]:
                del self._requests[key]
            self._requests_synced.set()
        elif item.type == "DELETED":
            self._requests.pop(item.key, None)
        else:
            self._requests[item.key] = item.object
        if self._requests_synced.is_set():
            self._apply()

    def _apply(self) -> None:
        mapping = dict(m for r in self._requests.values() if (m := twin_mapping(r)) is not None)
        changed = {o for o in mapping.keys() | self.mapping.keys() if mapping.get(o) != self.mapping.get(o)}
        self.mapping = mapping
        wanted = set(mapping.values())
        for twin in [t for t in self._caches if t not in wanted]:
            self._tasks.pop(twin).cancel()
            cache = self._caches.pop(twin)
            for key in cache:
                self._on_change(key)
        for twin in wanted - self._caches.keys():
            self._start(twin)
        self._update_synced()
        if changed:
            logger.info("twin namespaces of tenant %s: %s", self.tenant_namespace, mapping or "none")
            self._on_namespaces(changed)

    def _start(self, twin: str) -> None:
        def on_event(item: WatchEvent | Listed) -> None:
            if self._on_event is not None:
                self._on_event(twin, item)

        cache = PodCache(
            f"provider {twin}",
            self.client,
            key_of=self._key_of,
            on_change=self._on_change,
            label_selector=self._label_selector,
            settings=self._settings,
            namespace=twin,
            on_event=on_event,
            retry_permanent=True,  # a namespace just made: its RoleBinding may be a moment behind
        )
        self._caches[twin] = cache
        self._tasks[twin] = asyncio.create_task(self._run_cache(twin, cache), name=f"watch_twins {twin}")

    async def _run_cache(self, twin: str, cache: PodCache) -> None:
        waiter = asyncio.create_task(cache.synced.wait())
        waiter.add_done_callback(lambda _: self._update_synced())
        try:
            await cache.run()
        finally:
            waiter.cancel()

    def _update_synced(self) -> None:
        if self._requests_synced.is_set() and all(c.synced.is_set() for c in self._caches.values()):
            self.synced.set()
