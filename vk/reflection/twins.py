"""Twins seen through a scoped identity: one pod informer per twin namespace the provider made.

With the identity a peering issues, the virtual kubelet may not list pods cluster-wide, nor
create namespaces. The provider makes each twin namespace when the consumer asks for it, through
a ``NamespaceOffloading`` in the consumer's tenant namespace (``spec.originNamespace``; once
ready, ``status.phase: Ready`` and ``status.remoteNamespace``). :class:`TwinNamespaces` keeps
those requests in an informer, the origin → twin namespace map, and one pod
:class:`~kube.informers.Informer` per twin namespace, started and stopped as namespaces come and
go. To the reflectors it reads like one store keyed by consumer pod key.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable

from kube import api
from kube.clients import KubeClient
from kube.errors import Forbidden, NotFound
from kube.informers import Change, Informer, Stored
from kube.objects import NAMESPACEOFFLOADINGS, ObjectKey, RawObject
from kube.settings import WatchSettings
from kube.watching import Listed, WatchEvent

from .informers import after_each_item, twin_pods
from .namespaced import NamespaceTasks

__all__ = ["NAMESPACEOFFLOADINGS", "TwinNamespaces", "twin_mapping"]

logger = logging.getLogger(__name__)

DEMAND_ANNOTATION = api.DEMAND_ANNOTATION
WAITING_BLOCK_ANNOTATION = api.WAITING_BLOCK_ANNOTATION


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
    """Twin pods of one consumer in the twin namespaces of its tenant (see the module docstring).

    ``requests`` is the informer of the NamespaceOffloadings (for the manager to run);
    :meth:`run` holds the per-namespace pod informers and must run alongside it.
    """

    def __init__(
        self,
        client: KubeClient,
        *,
        tenant_namespace: str,
        consumer_id: str,
        on_pod_event: Callable[[str, WatchEvent | Listed], None] | None = None,
        on_synced: Callable[[], None] | None = None,
        settings: WatchSettings | None = None,
    ) -> None:
        self.client = client
        self.tenant_namespace = tenant_namespace
        self.consumer_id = consumer_id
        self._on_pod_event = on_pod_event
        self._on_synced = on_synced
        self._settings = settings or WatchSettings()
        self.requests = Informer(client, NAMESPACEOFFLOADINGS, name="namespaceoffloadings",
                                 namespace=tenant_namespace, settings=self._settings,
                                 retry_permanent=True)  # fmt: skip
        after_each_item(self.requests, self._apply)
        self.mapping: dict[str, str] = {}
        """Origin (consumer) namespace → twin namespace, for ready requests."""
        self._pods: dict[str, Informer] = {}
        self._epoch = 0
        """Grows with each pass over the requests, which may change :attr:`mapping` and the pod
        informers (see :meth:`changes`)."""
        self._watches = NamespaceTasks("watch-twins")
        self._handlers: list[Callable[[Change], None]] = []
        self._namespace_handlers: list[Callable[[set[str]], None]] = []
        self._demand: dict[str, tuple[dict[str, str], dict[str, str]]] = {}
        self._demand_refused: set[str] = set()
        self._applied = False
        self.synced = asyncio.Event()
        """Set once the requests were listed and every twin namespace known then was listed."""

    # ---- reading -------------------------------------------------------------------------------

    def twin_namespace_for(self, origin: str) -> str | None:
        return self.mapping.get(origin)

    def knows(self, origin: str) -> bool:
        """Whether a twin of a pod in ``origin`` that is not here is truly missing: the requests
        are listed, and ``origin`` has no twin namespace or its pods were listed."""
        if not self._applied:
            return False
        twin = self.mapping.get(origin)
        if twin is None:
            return True
        informer = self._pods.get(twin)
        return informer is not None and informer.synced.is_set()

    def _holding(self, key: ObjectKey) -> Informer | None:
        """The informer of the twin namespace that holds ``key``'s twin (None: none does)."""
        twin = self.mapping.get(key.namespace or "")
        informer = self._pods.get(twin) if twin else None
        if informer is not None:
            return informer
        for other in self._pods.values():  # a namespace on its way out still has its twins
            if key in other:
                return other
        return None

    def get(self, key: ObjectKey) -> RawObject | None:
        informer = self._holding(key)
        return informer.get(key) if informer is not None else None

    def keys(self) -> list[ObjectKey]:
        return [key for informer in self._pods.values() for key in informer]

    def resource_version(self, key: ObjectKey) -> str | None:
        informer = self._holding(key)
        return informer.resource_version(key) if informer is not None else None

    def identity(self, key: ObjectKey) -> Stored | None:
        informer = self._holding(key)
        return informer.identity(key) if informer is not None else None

    def __len__(self) -> int:
        return sum(len(informer) for informer in self._pods.values())

    def changes(self) -> tuple[int, tuple[int, ...]]:
        """What changes with every change of a twin, of the origin → twin namespace map or of
        the informers held (:meth:`kube.informers.Informer.changes`), and only then."""
        return self._epoch, tuple(informer.changes() for informer in self._pods.values())

    def changed_since(self, token: tuple[int, tuple[int, ...]]) -> set[ObjectKey] | None:
        """The consumer keys of the twins changed since :meth:`changes` gave ``token`` (None:
        the twin namespaces changed since, or a store cannot tell)."""
        epoch, counts = token
        if epoch != self._epoch or len(counts) != len(self._pods):
            return None
        found: set[ObjectKey] = set()
        for informer, count in zip(self._pods.values(), counts, strict=True):
            changed = informer.changed_since(count)
            if changed is None:
                return None
            found |= changed
        return found

    # ---- subscribing ---------------------------------------------------------------------------

    def add_handler(self, handler: Callable[[Change], None]) -> None:
        """Call ``handler`` with every change of a twin, keyed by its consumer key (a twin that
        goes with its namespace: a deletion with neither side known)."""
        self._handlers.append(handler)

    def add_namespaces_handler(self, handler: Callable[[set[str]], None]) -> None:
        """Call ``handler`` with the origins whose twin namespace appeared, changed or went."""
        self._namespace_handlers.append(handler)

    def _notify(self, change: Change) -> None:
        for handler in self._handlers:
            handler(change)

    # ---- demand ------------------------------------------------------------------------------

    async def report_demand(self, origin: str, demand: dict[str, str], block: dict[str, str]) -> None:
        """Tell the provider what pods of ``origin`` wait for beyond its twin namespace's quota
        (an annotation on the request; the provider moves quota headroom there first), and the
        largest one waiting for a block (the provider places the grant so that one node holds
        it, where one can)."""
        if self._demand.get(origin) == (demand, block) or origin in self._demand_refused:
            return  # said already, or not ours to say (until a restart)
        annotations = {
            DEMAND_ANNOTATION: json.dumps(demand, sort_keys=True) if demand else None,
            WAITING_BLOCK_ANNOTATION: json.dumps(block, sort_keys=True) if block else None,
        }
        request = self.requests.get(ObjectKey(self.tenant_namespace, origin))
        have = ((request or {}).get("metadata") or {}).get("annotations") or {}
        if request is not None and all(have.get(k) == v for k, v in annotations.items()):
            self._demand[origin] = (demand, block)  # the request says so already (a restart)
            return
        try:
            body = {"metadata": {"annotations": annotations}}
            await self.client.patch(NAMESPACEOFFLOADINGS, origin, body, self.tenant_namespace)
        except NotFound:
            return
        except Forbidden as exc:  # advisory: an identity that may not say it still runs pods
            if origin not in self._demand_refused:
                self._demand_refused.add(origin)
                logger.warning("demand of %s not reported to the provider: %s", origin, exc)
            return
        self._demand[origin] = (demand, block)
        logger.info("demand of %s reported to the provider: %s, waiting block %s", origin, demand or "none",
                    block or "none")  # fmt: skip

    # ---- running -------------------------------------------------------------------------------

    async def run(self) -> None:
        """Hold one pod informer per twin namespace until cancelled (then stop them all)."""
        await self._watches.run()

    def _apply(self) -> None:
        if not self.requests.synced.is_set():
            return
        requests = self.requests.values()
        mapping = dict(m for r in requests if (m := twin_mapping(r)) is not None)
        self._epoch += 1
        changed = {o for o in mapping.keys() | self.mapping.keys() if mapping.get(o) != self.mapping.get(o)}
        self.mapping = mapping
        wanted = set(mapping.values())
        for twin in [t for t in self._pods if t not in wanted]:
            self._watches.cancel(twin)
            for key in self._pods.pop(twin):
                self._notify(Change("DELETED", key, None, None))
        for twin in wanted - self._pods.keys():
            self._start(twin)
        self._applied = True
        self._update_synced()
        if changed:
            logger.info("twin namespaces of tenant %s: %s", self.tenant_namespace, mapping or "none")
            for handler in self._namespace_handlers:
                handler(changed)

    def _start(self, twin: str) -> None:
        # retried on 403: a namespace just made may have its RoleBinding a moment later
        informer = twin_pods(self.client, self.consumer_id, name=f"twins-{twin}", namespace=twin,
                             settings=self._settings, retry_permanent=True)  # fmt: skip
        informer.add_handler(self._notify)
        on_event = self._on_pod_event
        if on_event is not None:
            informer.add_event_handler(lambda item: on_event(twin, item))
        self._pods[twin] = informer
        self._watches.start(twin, lambda: self._watch(informer))

    async def _watch(self, informer: Informer) -> None:
        waiter = asyncio.create_task(informer.synced.wait())
        waiter.add_done_callback(lambda _: self._update_synced())
        try:
            await informer.run()
        finally:
            waiter.cancel()

    def _update_synced(self) -> None:
        if self.synced.is_set() or not self._applied:
            return
        if all(informer.synced.is_set() for informer in self._pods.values()):
            self.synced.set()
            if self._on_synced is not None:
                self._on_synced()
