"""ConfigMaps, Secrets and DRA claim templates and claims of offloaded pods, copied to the twin
namespace and kept in sync.

One :class:`AccessoryReflector` per kind, the same shape for all: keys are
``(namespace, name)`` on the consumer; ``reconcile`` compares what the consumer's pods on the
virtual node reference with what the twin namespace holds, and creates, replaces or deletes the
copy (only copies gpuferry made: an object of the same name made on the provider by someone else
is reported, never touched).

What wakes a key up: a consumer pod on the node appearing, going or changing its spec (the names
it references, before and after), a change of the consumer object (one informer per namespace
where a pod on the node references an object of the kind, held by
:meth:`AccessoryReflector.run`), and the periodic resync. Before a twin is created, the pod
reflector calls :meth:`ensure_for`, so that the copies exist before the provider's
kubelet looks for them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from kube.clients import KubeClient
from kube.errors import AlreadyExists, Conflict, NotFound
from kube.informers import Informer
from kube.logs import object_logger
from kube.metrics import counter
from kube.objects import (
    CONFIGMAPS,
    RESOURCECLAIMS,
    RESOURCECLAIMTEMPLATES,
    SECRETS,
    ObjectKey,
    RawObject,
    Resource,
)
from kube.queueing import KeyedQueue
from kube.reconciling import Requeue
from kube.settings import QueueSettings, WatchSettings

from ..forge.accessories import Kind, copy_differs, is_copyable, references, remote_copy
from ..forge.labels import origin_of
from .namespaced import NamespaceTasks

__all__ = ["AccessoryReflector"]

logger = logging.getLogger(__name__)

_COPIES = counter(
    "vk_accessory_copies", "ConfigMap/Secret copies written to twin namespaces.", ["kind", "op"]
)
_RESOURCES: dict[Kind, Resource] = {
    "configmaps": CONFIGMAPS,
    "secrets": SECRETS,
    "resourceclaimtemplates": RESOURCECLAIMTEMPLATES,
    "resourceclaims": RESOURCECLAIMS,
}
_REPLACED_WHOLE = frozenset({"resourceclaimtemplates", "resourceclaims"})
"""Kinds whose spec cannot change: a copy that differs is deleted and made again."""


class AccessoryReflector:
    """Copies of one kind (ConfigMaps or Secrets); see the module docstring."""

    def __init__(
        self,
        kind: Kind,
        *,
        consumer: KubeClient,
        provider: KubeClient,
        twin_namespace_for: Callable[[str], str | None],
        consumer_id: str,
        settings: WatchSettings | None = None,
        queue_settings: QueueSettings | None = None,
    ) -> None:
        self.kind = kind
        self.resource = _RESOURCES[kind]
        self.consumer = consumer
        self.provider = provider
        self.twin_namespace_for = twin_namespace_for
        self.consumer_id = consumer_id
        self.settings = settings or WatchSettings()
        self.queue: KeyedQueue[ObjectKey] = KeyedQueue(f"sync_{kind}_to_remote", settings=queue_settings)
        self._sources: dict[str, Informer] = {}  # consumer namespace -> its objects of this kind
        self._watches = NamespaceTasks(f"watch-consumer-{kind}")
        self._refs: dict[ObjectKey, set[str]] = {}  # pod key -> names it referenced last time
        self._copies: set[ObjectKey] = set()  # consumer keys we believe have a copy

    # ---- what wakes keys up --------------------------------------------------------------------

    def pod_changed(self, key: ObjectKey, pod: RawObject | None) -> None:
        """A consumer pod on the node appeared, went (``pod`` None) or had its spec changed
        (:func:`~vk.forge.accessories.matters_to_copies`); ``pod`` as the change brought it."""
        namespace = key.namespace or ""
        now = references(pod)[self.kind] if pod is not None else set()
        before = self._refs.pop(key, set())
        if pod is not None and now:
            # most pods reference none: nothing kept for them (ten thousand pods), and no watch
            # of a kind the pods of a namespace never name (DRA claims, in most namespaces)
            self._refs[key] = now
            self._watch_namespace(namespace)
        for name in now | before:
            self.queue.add(ObjectKey(namespace, name))

    def resync(self) -> None:
        for key in {
            *self._copies,
            *(ObjectKey(k.namespace, n) for k, names in self._refs.items() for n in names),
        }:
            self.queue.add(key)

    def _watch_namespace(self, namespace: str) -> None:
        if namespace in self._sources:
            return
        informer = Informer(self.consumer, self.resource, name=f"consumer-{self.kind}-{namespace}",
                            namespace=namespace, settings=self.settings, retry_permanent=True)  # fmt: skip
        informer.add_handler(lambda change: self._wake(change.key))
        self._sources[namespace] = informer
        self._watches.start(namespace, informer.run)

    def release(self, namespace: str) -> None:
        """No pod of the node is left in ``namespace``: stop watching it (its copies were queued
        by the pods' last changes, and are found by a GET from now on)."""
        self._watches.cancel(namespace)
        self._sources.pop(namespace, None)

    async def run(self) -> None:
        """Hold the per-namespace informers until cancelled."""
        await self._watches.run()

    def _wake(self, key: ObjectKey) -> None:
        if key in self._copies or self._referenced(key):
            self.queue.add(key)

    def _referenced(self, key: ObjectKey) -> bool:
        return any(k.namespace == key.namespace and key.name in names for k, names in self._refs.items())

    # ---- reconciling ---------------------------------------------------------------------------

    async def _source(self, key: ObjectKey) -> RawObject | None:
        namespace = key.namespace or ""
        informer = self._sources.get(namespace)
        if informer is not None and informer.synced.is_set():
            return informer.get(key)
        try:  # its namespace's watch has not listed yet: ask
            return await self.consumer.get(self.resource, key.name, namespace)
        except NotFound:
            return None

    async def reconcile(self, key: ObjectKey) -> Requeue | None:
        log = object_logger(logger, self.resource.kind, key)
        namespace = key.namespace or ""
        twin_ns = self.twin_namespace_for(namespace)
        if twin_ns is None:
            return None  # the namespace has no twin (yet): nothing can be copied there
        wanted = self._referenced(key)
        source = await self._source(key) if wanted else None
        try:
            copy: RawObject | None = await self.provider.get(self.resource, key.name, twin_ns)
        except NotFound:
            copy = None
        ours = copy is not None and (origin_of(copy) or (None,))[0] == self.consumer_id
        if copy is not None and not ours:
            log.warning("%s/%s exists on the provider and is not gpuferry's: left alone", twin_ns, key.name)
            return None
        if not wanted or source is None or not is_copyable(source, self.kind):
            if copy is not None:
                try:
                    await self.provider.delete(
                        self.resource, key.name, twin_ns, preconditions_uid=copy["metadata"]["uid"]
                    )
                    _COPIES.labels(self.kind, "delete").inc()
                    log.info("copy in %s deleted (%s)", twin_ns, "unused" if not wanted else "source gone")
                except (NotFound, Conflict):
                    pass
            self._copies.discard(key)
            return None
        desired = remote_copy(source, self.kind, namespace=twin_ns, consumer_id=self.consumer_id)
        if copy is None:
            try:
                await self.provider.create(self.resource, desired, twin_ns)
                _COPIES.labels(self.kind, "create").inc()
                log.info("copied to %s", twin_ns)
            except AlreadyExists:
                return Requeue(0.5)
        elif copy_differs(copy, desired):
            if copy.get("immutable") or self.kind in _REPLACED_WHOLE:
                await self.provider.delete(self.resource, key.name, twin_ns)
                return Requeue(0.5)  # an immutable copy is replaced by delete + create
            desired["metadata"]["resourceVersion"] = copy["metadata"]["resourceVersion"]
            await self.provider.replace(self.resource, key.name, desired, twin_ns)
            _COPIES.labels(self.kind, "update").inc()
            log.info("copy in %s updated", twin_ns)
        self._copies.add(key)
        return None

    async def ensure_for(self, pod: RawObject) -> None:
        """Make the copies ``pod`` needs now (before its twin is created)."""
        namespace = pod["metadata"]["namespace"]
        names = references(pod)[self.kind]
        self._refs.setdefault(ObjectKey(namespace, pod["metadata"]["name"]), set()).update(names)
        for name in sorted(names):
            await self.reconcile(ObjectKey(namespace, name))

    def known_keys(self) -> Iterable[ObjectKey]:
        return set(self._copies)
