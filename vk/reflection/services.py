"""Consumer Services reflected into twin namespaces, so that pods on the provider resolve them.

The same shape as :mod:`vk.reflection.accessories`: keys are consumer ``(namespace, name)`` of
Services; ``reconcile`` brings the copy in the twin namespace (and its one EndpointSlice) to what
:mod:`vk.forge.services` forges, or removes it. A namespace's Services are reflected while it has
pods on this virtual node (their twins are the ones resolving them); the copies go with the last
pod. Only copies gpuferry made are touched.

What wakes a key up: a change of the consumer Service or of one of its EndpointSlices (one watch
of each per namespace in use), a consumer pod on the node appearing or going (every Service of
its namespace), a new view from the network fabric (every Service), and the periodic resync.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable

from kube.clients import KubeClient
from kube.errors import Conflict, NotFound
from kube.logs import ObjectLogger, object_logger
from kube.metrics import counter
from kube.objects import ENDPOINTSLICES, SERVICES, ObjectKey, RawObject
from kube.queueing import KeyedQueue
from kube.reconciling import Requeue
from kube.settings import WatchSettings
from kube.watching import Listed, watch_objects

from ..forge.addresses import identity
from ..forge.labels import origin_of
from ..forge.services import SERVICE_NAME_LABEL, remote_endpoint_slice, remote_service, slice_name, translator
from .caches import PodCache

__all__ = ["ServiceReflector"]

logger = logging.getLogger(__name__)

_WRITES = counter("vk_service_copies", "Service copies and their EndpointSlices written.", ["kind", "op"])
FIELD_MANAGER = "gpuferry-virtual-kubelet"


class ServiceReflector:
    """Services of namespaces with pods on the node, copied to their twin namespaces."""

    kind = "services"
    resource = SERVICES

    def __init__(
        self,
        *,
        consumer: KubeClient,
        provider: KubeClient,
        pods: PodCache,
        twin_namespace_for: Callable[[str], str | None],
        consumer_id: str,
        node: str,
        settings: WatchSettings | None = None,
    ) -> None:
        self.consumer = consumer
        self.provider = provider
        self.pods = pods
        self.twin_namespace_for = twin_namespace_for
        self.consumer_id = consumer_id
        self.node = node
        self.settings = settings or WatchSettings()
        self.queue: KeyedQueue[ObjectKey] = KeyedQueue("sync_services_to_remote")
        self.twin_back: Callable[[str], str] = identity
        """Consumer view of a twin's address → the twin's own (set from the fabric's PeerNetwork)."""
        self.to_provider_view: Callable[[str], str] | None = None
        """Consumer pod address → where the provider reaches it (None: no fabric, unreachable)."""
        self._services: dict[ObjectKey, RawObject] = {}
        self._slices: dict[ObjectKey, RawObject] = {}
        self._watched: dict[str, list[asyncio.Task[None]]] = {}
        self._copies: set[ObjectKey] = set()

    # ---- what wakes keys up --------------------------------------------------------------------

    def pod_changed(self, key: ObjectKey) -> None:
        namespace = key.namespace or ""
        if self.pods.get(key) is not None and namespace not in self._watched:
            self._watched[namespace] = [
                asyncio.create_task(watch(namespace), name=f"{name} {namespace}")
                for watch, name in (
                    (self._watch_services, "watch_consumer_services"),
                    (self._watch_slices, "watch_consumer_endpointslices"),
                )
            ]
        for service in [k for k in {*self._services, *self._copies} if k.namespace == namespace]:
            self.queue.add(service)

    def set_views(
        self,
        *,
        twin_back: Callable[[str], str] | None = None,
        to_provider_view: Callable[[str], str] | None = None,
    ) -> None:
        """The fabric's addresses changed (either PeerNetwork): every Service again."""
        if twin_back is not None:
            self.twin_back = twin_back
        if to_provider_view is not None:
            self.to_provider_view = None if to_provider_view is identity else to_provider_view
        self.resync()

    def resync(self) -> None:
        for key in {*self._services, *self._copies}:
            self.queue.add(key)

    async def _watch_services(self, namespace: str) -> None:
        async for item in watch_objects(
            self.consumer, SERVICES, namespace=namespace, settings=self.settings, retry_permanent=True
        ):
            if isinstance(item, Listed):
                for key in [k for k in self._services if k.namespace == namespace and k not in item.keys]:
                    del self._services[key]
                    self.queue.add(key)
                continue
            if item.type == "DELETED":
                self._services.pop(item.key, None)
            else:
                self._services[item.key] = item.object
            self.queue.add(item.key)

    async def _watch_slices(self, namespace: str) -> None:
        async for item in watch_objects(
            self.consumer, ENDPOINTSLICES, namespace=namespace, settings=self.settings, retry_permanent=True,
            label_selector=SERVICE_NAME_LABEL,
        ):  # fmt: skip
            if isinstance(item, Listed):
                for key in [k for k in self._slices if k.namespace == namespace and k not in item.keys]:
                    self._wake_for_slice(self._slices.pop(key))
                continue
            if item.type == "DELETED":
                self._slices.pop(item.key, None)
            else:
                self._slices[item.key] = item.object
            self._wake_for_slice(item.object)

    def _wake_for_slice(self, slice_: RawObject) -> None:
        meta = slice_.get("metadata") or {}
        if service := (meta.get("labels") or {}).get(SERVICE_NAME_LABEL):
            self.queue.add(ObjectKey(meta.get("namespace"), service))

    def _in_use(self, namespace: str) -> bool:
        return any(k.namespace == namespace for k in self.pods)

    async def stop(self) -> None:
        tasks = [t for group in self._watched.values() for t in group]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.queue.shutdown()

    # ---- reconciling ---------------------------------------------------------------------------

    async def reconcile(self, key: ObjectKey) -> Requeue | None:
        log = object_logger(logger, "Service", key)
        namespace = key.namespace or ""
        twin_ns = self.twin_namespace_for(namespace)
        if twin_ns is None:
            return None
        source = self._services.get(key) if self._in_use(namespace) else None
        try:
            copy: RawObject | None = await self.provider.get(SERVICES, key.name, twin_ns)
        except NotFound:
            copy = None
        if copy is not None and (origin_of(copy) or (None,))[0] != self.consumer_id:
            log.warning("%s/%s exists on the provider and is not gpuferry's: left alone", twin_ns, key.name)
            return None
        if source is None:
            if copy is not None:
                await self._delete(key, twin_ns, copy, log)
            self._copies.discard(key)
            return None
        desired = remote_service(source, namespace=twin_ns, consumer_id=self.consumer_id)
        if copy is not None and _shape(copy) != _shape(desired):  # clusterIP and type are immutable
            await self._delete(key, twin_ns, copy, log)
            return Requeue(0.2)
        await self.provider.patch(SERVICES, key.name, desired, twin_ns, patch_type="apply",
                                  field_manager=FIELD_MANAGER, force=True)  # fmt: skip
        _WRITES.labels("Service", "apply").inc()
        if copy is None:
            log.info("reflected to %s", twin_ns)
        self._copies.add(key)
        if desired["spec"]["type"] == "ExternalName":
            return None
        slices = [s for s in self._slices.values()
                  if s["metadata"].get("namespace") == namespace
                  and (s["metadata"].get("labels") or {}).get(SERVICE_NAME_LABEL) == key.name]  # fmt: skip
        translate = translator(self.node, self.twin_back, self.to_provider_view)
        body = remote_endpoint_slice(source, slices, namespace=twin_ns, consumer_id=self.consumer_id,
                                     translate=translate)  # fmt: skip
        await self.provider.patch(ENDPOINTSLICES, body["metadata"]["name"], body, twin_ns, patch_type="apply",
                                  field_manager=FIELD_MANAGER, force=True)  # fmt: skip
        _WRITES.labels("EndpointSlice", "apply").inc()
        return None

    async def _delete(self, key: ObjectKey, twin_ns: str, copy: RawObject, log: ObjectLogger) -> None:
        for resource, name, uid in (
            (ENDPOINTSLICES, slice_name(key.name), None),
            (SERVICES, key.name, copy["metadata"]["uid"]),
        ):
            try:
                await self.provider.delete(resource, name, twin_ns, preconditions_uid=uid)
                _WRITES.labels(resource.kind, "delete").inc()
            except (NotFound, Conflict):
                pass
        log.info("copy in %s deleted", twin_ns)

    def known_keys(self) -> Iterable[ObjectKey]:
        return set(self._copies)


def _shape(service: RawObject) -> tuple[str, bool]:
    spec = service.get("spec") or {}
    return str(spec.get("type") or "ClusterIP"), spec.get("clusterIP") == "None"
