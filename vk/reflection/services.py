"""Consumer Services reflected into twin namespaces, so that pods on the provider resolve them.

The same shape as :mod:`vk.reflection.accessories`: keys are consumer ``(namespace, name)`` of
Services; ``reconcile`` brings the copy in the twin namespace (and its one EndpointSlice) to what
:mod:`vk.forge.services` forges, or removes it. A namespace's Services are reflected while it has
pods on this virtual node (their twins are the ones resolving them); the copies go with the last
pod. Only copies gpuferry made are touched.

What wakes a key up: a change of the consumer Service or of one of its EndpointSlices (one
informer of each per namespace in use, held by :meth:`ServiceReflector.run`), the first consumer
pod of its namespace appearing on the node or the last going (every Service of the namespace), a
new view from the network fabric (every Service), and the periodic resync.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable

from kube.clients import KubeClient
from kube.errors import Conflict, NotFound
from kube.informers import Informer
from kube.logs import ObjectLogger, object_logger
from kube.metrics import counter
from kube.objects import ENDPOINTSLICES, SERVICES, ObjectKey, RawObject
from kube.queueing import KeyedQueue
from kube.reconciling import Requeue
from kube.settings import QueueSettings, WatchSettings

from ..forge.addresses import identity
from ..forge.labels import origin_of
from ..forge.services import SERVICE_NAME_LABEL, remote_endpoint_slice, remote_service, slice_name, translator
from .namespaced import NamespacePods, NamespaceTasks

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
        twin_namespace_for: Callable[[str], str | None],
        consumer_id: str,
        node: str,
        settings: WatchSettings | None = None,
        queue_settings: QueueSettings | None = None,
    ) -> None:
        self.consumer = consumer
        self.provider = provider
        self.twin_namespace_for = twin_namespace_for
        self.consumer_id = consumer_id
        self.node = node
        self.settings = settings or WatchSettings()
        self.queue: KeyedQueue[ObjectKey] = KeyedQueue("sync_services_to_remote", settings=queue_settings)
        self.twin_back: Callable[[str], str] = identity
        """Consumer view of a twin's address → the twin's own (set from the fabric's PeerNetwork)."""
        self.to_provider_view: Callable[[str], str] | None = None
        """Consumer pod address → where the provider reaches it (None: no fabric, unreachable)."""
        self._services: dict[str, Informer] = {}  # consumer namespace -> its Services
        self._slices: dict[str, Informer] = {}  # consumer namespace -> its Services' EndpointSlices
        self._watches = NamespaceTasks("watch-consumer-services")
        self._copies: set[ObjectKey] = set()
        self._occupied = NamespacePods()
        """Namespaces with pods on the node, kept by :meth:`pod_changed`: their Services are copied."""

    # ---- what wakes keys up --------------------------------------------------------------------

    def pod_changed(self, key: ObjectKey, pod: RawObject | None) -> None:
        """A consumer pod on the node appeared or went (``pod`` None), or changed its spec
        (:func:`~vk.forge.accessories.matters_to_copies`). The Services of its namespace are
        looked at when it is the namespace's first pod on the node or was its last: a copy is
        kept exactly while the namespace has pods here, and what it holds comes from the Service
        and its EndpointSlices, watched on their own (issue 15: every pod's every change queued
        every Service of its namespace, each pass a GET and two applies on the provider)."""
        namespace = key.namespace or ""
        first = pod is not None and namespace not in self._occupied
        last = self._occupied.update(key, pod is not None)
        if pod is not None and namespace not in self._services:
            self._watch_namespace(namespace)
        if first or last:
            for service in [k for k in {*self._service_keys(), *self._copies} if k.namespace == namespace]:
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
        for key in {*self._service_keys(), *self._copies}:
            self.queue.add(key)

    def _service_keys(self) -> list[ObjectKey]:
        return [key for informer in self._services.values() for key in informer]

    def _watch_namespace(self, namespace: str) -> None:
        services = Informer(self.consumer, SERVICES, name=f"consumer-services-{namespace}",
                            namespace=namespace, settings=self.settings, retry_permanent=True)  # fmt: skip
        services.add_handler(lambda change: self.queue.add(change.key))
        slices = Informer(self.consumer, ENDPOINTSLICES, name=f"consumer-endpointslices-{namespace}",
                          namespace=namespace, label_selector=SERVICE_NAME_LABEL, settings=self.settings,
                          retry_permanent=True)  # fmt: skip
        slices.add_handler(lambda change: self._wake_for_slice(change.object))
        self._services[namespace], self._slices[namespace] = services, slices
        self._watches.start(namespace, lambda: _run_both(services, slices))

    def release(self, namespace: str) -> None:
        """No pod of the node is left in ``namespace``: stop watching its Services (their copies
        were queued by the last pod's change, and are deleted: nothing there uses them)."""
        self._watches.cancel(namespace)
        self._services.pop(namespace, None)
        self._slices.pop(namespace, None)

    async def run(self) -> None:
        """Hold the per-namespace informers until cancelled."""
        await self._watches.run()

    def _wake_for_slice(self, slice_: RawObject) -> None:
        meta = slice_.get("metadata") or {}
        if service := (meta.get("labels") or {}).get(SERVICE_NAME_LABEL):
            self.queue.add(ObjectKey(meta.get("namespace"), service))

    def _in_use(self, namespace: str) -> bool:
        return namespace in self._occupied

    # ---- reconciling ---------------------------------------------------------------------------

    async def reconcile(self, key: ObjectKey) -> Requeue | None:
        log = object_logger(logger, "Service", key)
        namespace = key.namespace or ""
        twin_ns = self.twin_namespace_for(namespace)
        if twin_ns is None:
            return None
        services = self._services.get(namespace)
        source = services.get(key) if services is not None and self._in_use(namespace) else None
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
        found = self._slices.get(namespace)
        slices = [s for s in (found.values() if found is not None else ())
                  if (s["metadata"].get("labels") or {}).get(SERVICE_NAME_LABEL) == key.name]  # fmt: skip
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


async def _run_both(services: Informer, slices: Informer) -> None:
    await asyncio.gather(services.run(), slices.run())


def _shape(service: RawObject) -> tuple[str, bool]:
    spec = service.get("spec") or {}
    return str(spec.get("type") or "ClusterIP"), spec.get("clusterIP") == "None"
