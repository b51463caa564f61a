"""The provider as this virtual kubelet's identity sees it: the one seam between its two modes.

* **tenant** (what a peering sets up: ``settings.tenant_namespace``): the scoped identity the
  provider issued. Twins go to the twin namespaces the provider made on request
  (NamespaceOffloadings in the tenant namespace) and are watched one namespace at a time; what
  fits where is the per-node grant of its GPUSlice less its own twins; what waits for quota is
  reported on the request (:class:`TenantSide`).
* **admin** (tests, development): a provider admin's kubeconfig. Twin namespaces are named by
  rule and created here; twins are watched cluster-wide by their owner label; what fits where
  comes from the provider's Nodes and every bound Pod (:class:`AdminSide`).

:func:`remote_side` chooses once, in the assembly; nothing else asks which mode runs.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine, Hashable, Sequence
from typing import Any, Protocol

from kube.clients import KubeClient
from kube.errors import AlreadyExists
from kube.informers import Change, Informer, Stored
from kube.objects import GPUSLICES, NAMESPACES, ObjectKey, RawObject
from kube.watching import Listed, watch_objects

from .forge.labels import ORIGIN_CLUSTER_ID, ORIGIN_NAMESPACE, ownership_labels
from .forge.names import twin_namespace
from .node.provider import ProviderView
from .reflection.informers import twin_pods
from .reflection.twins import TwinNamespaces
from .settings import VirtualKubeletSettings

__all__ = ["AdminSide", "RemoteSide", "TaskFactory", "TenantSide", "remote_side"]

TaskFactory = Callable[[], Coroutine[Any, Any, Any]]


class RemoteSide(Protocol):
    """This consumer's twins on the provider, where they go, and what the provider can take.

    Contract:

    * :meth:`get`, :meth:`keys`, :meth:`values`: this consumer's twin pods, each filed under the
      key of the consumer pod it stands for; :meth:`add_handler`'s handlers get every change (its
      ``key`` that key). A twin that is not found means nothing until :meth:`knows` says so for its key:
      only then may a reconciler act on its absence (create a twin, report one deleted).
    * :meth:`twin_namespace_for`: where the twins (and the copies they need) of a consumer
      namespace go; ``None``: nowhere (not offloaded), so the pod waits, until
      :meth:`add_namespaces_handler`'s handlers are called with that namespace.
    * :meth:`prepare_namespace`: makes that namespace usable before a twin is created, where this
      side makes namespaces; idempotent, and cheap when repeated.
    * :meth:`report_demand`: tells the provider what pods of a namespace wait for beyond its
      quota (``{}``: nothing), and the largest one waiting for a block no node of the grant has
      (``block``); may do nothing; repeating the last report costs nothing.
    * ``informers``: must have listed before anything reconciles pods (the manager runs them and
      the pod controllers wait for them); :meth:`tasks`: long-lived loops the manager runs too
      (per-namespace watches, and those that keep the node's
      :class:`~vk.node.provider.ProviderView` current); ``synced``: set once every twin is listed.
    """

    name: str
    informers: Sequence[Informer]
    synced: asyncio.Event

    def get(self, key: ObjectKey) -> RawObject | None: ...
    def keys(self) -> list[ObjectKey]: ...
    def resource_version(self, key: ObjectKey) -> str | None: ...
    def identity(self, key: ObjectKey) -> Stored | None: ...
    def changes(self) -> Hashable: ...
    def changed_since(self, token: Any) -> set[ObjectKey] | None: ...
    def knows(self, key: ObjectKey) -> bool: ...
    def twin_namespace_for(self, origin: str) -> str | None: ...
    async def prepare_namespace(self, origin: str) -> None: ...
    async def report_demand(self, origin: str, demand: dict[str, str], block: dict[str, str]) -> None: ...
    def add_handler(self, handler: Callable[[Change], None]) -> None: ...
    def add_namespaces_handler(self, handler: Callable[[set[str]], None]) -> None: ...
    def tasks(self) -> dict[str, TaskFactory]: ...


def remote_side(settings: VirtualKubeletSettings, provider: KubeClient, view: ProviderView) -> RemoteSide:
    """The side this identity gives: a tenant's when the settings name a tenant namespace."""
    if settings.tenant_namespace:
        return TenantSide(provider, settings=settings, view=view)
    return AdminSide(provider, settings=settings, view=view)


class _TwinStore(Protocol):
    def get(self, key: ObjectKey) -> RawObject | None: ...
    def keys(self) -> list[ObjectKey]: ...
    def resource_version(self, key: ObjectKey) -> str | None: ...
    def identity(self, key: ObjectKey) -> Stored | None: ...
    def changes(self) -> Hashable: ...
    def changed_since(self, token: Any) -> set[ObjectKey] | None: ...


class _TwinsRead:
    """The store part of a :class:`RemoteSide`: what ``twins`` holds, read as it is."""

    twins: _TwinStore

    def get(self, key: ObjectKey) -> RawObject | None:
        return self.twins.get(key)

    def keys(self) -> list[ObjectKey]:
        return self.twins.keys()

    def resource_version(self, key: ObjectKey) -> str | None:
        return self.twins.resource_version(key)

    def identity(self, key: ObjectKey) -> Stored | None:
        """The twin's UID, resourceVersion and own key (no decoding)."""
        return self.twins.identity(key)

    def changes(self) -> Hashable:
        """What changes with every change of the twins held, and only then."""
        return self.twins.changes()

    def changed_since(self, token: Any) -> set[ObjectKey] | None:
        """The consumer keys of the twins changed since :meth:`changes` gave ``token`` (None:
        cannot tell)."""
        return self.twins.changed_since(token)


class AdminSide(_TwinsRead):
    """A provider admin's view: twins everywhere by owner label; twin namespaces made here."""

    name = "admin"
    twins: Informer

    def __init__(self, provider: KubeClient, *, settings: VirtualKubeletSettings, view: ProviderView) -> None:
        self.provider = provider
        self.consumer_id = settings.consumer_cluster_id
        self.strategy = settings.namespace_strategy
        self.view = view
        self.twins = twin_pods(provider, self.consumer_id, name="provider-twins", settings=settings.watch)
        # our twins count on the view's nodes from this watch, not from a second one of the view's
        # (a pod labelled with our origin but not managed by gpuferry is in neither: not counted)
        view.add_pod_source("twins", leave_out=f"{ORIGIN_CLUSTER_ID}!={self.consumer_id}")
        self.twins.add_event_handler(lambda item: view.handle_pod(item, "twins"))
        self.informers: Sequence[Informer] = [self.twins]
        self.synced = self.twins.synced
        self._namespaces: set[str] = set()
        self._making: dict[str, asyncio.Future[None]] = {}

    def knows(self, key: ObjectKey) -> bool:
        return self.twins.synced.is_set()

    def twin_namespace_for(self, origin: str) -> str:
        return twin_namespace(origin, self.consumer_id, strategy=self.strategy)

    async def prepare_namespace(self, origin: str) -> None:
        """Create the twin namespace once: the pods of a burst that are there at the same time
        share one creation (issue 15: each pod worker created it, 14 times for 100 pods)."""
        name = self.twin_namespace_for(origin)
        if name in self._namespaces:
            return
        making = self._making.get(name)
        if making is None:
            making = asyncio.ensure_future(self._make_namespace(name, origin))
            self._making[name] = making
            making.add_done_callback(lambda done: self._made(name, done))
        # a waiter's cancellation is its own; a failure is every waiter's, and the next call tries again
        await asyncio.shield(making)

    def _made(self, name: str, done: asyncio.Future[None]) -> None:
        self._making.pop(name, None)
        if not done.cancelled():
            done.exception()  # retrieved here too: its waiters may all have been cancelled

    async def _make_namespace(self, name: str, origin: str) -> None:
        body: RawObject = {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {
                "name": name,
                "labels": ownership_labels(self.consumer_id),
                "annotations": {ORIGIN_NAMESPACE: origin},
            },
        }
        with contextlib.suppress(AlreadyExists):
            await self.provider.create(NAMESPACES, body)
        self._namespaces.add(name)

    async def report_demand(self, origin: str, demand: dict[str, str], block: dict[str, str]) -> None:
        return None  # no tenant quota and no grant shape: nothing waits for either

    def add_handler(self, handler: Callable[[Change], None]) -> None:
        self.twins.add_handler(handler)

    def add_namespaces_handler(self, handler: Callable[[set[str]], None]) -> None:
        return None  # twin namespaces are named by rule: the map never changes

    def tasks(self) -> dict[str, TaskFactory]:
        return {"watch-provider-nodes": self.view.watch_nodes, "watch-provider-pods": self.view.watch_pods}


class TenantSide(_TwinsRead):
    """A tenant's view: twin namespaces the provider made, the grant of one GPUSlice."""

    name = "tenant"
    twins: TwinNamespaces

    def __init__(self, provider: KubeClient, *, settings: VirtualKubeletSettings, view: ProviderView) -> None:
        self.provider = provider
        self.tenant_namespace = settings.tenant_namespace
        self.slice_name = settings.slice_name
        self.settings = settings.watch
        self.view = view
        # our twins are all our pods there: they count on the view's nodes as they come
        self.twins = TwinNamespaces(provider, tenant_namespace=settings.tenant_namespace,
                                    consumer_id=settings.consumer_cluster_id, on_pod_event=view.handle_pod_in,
                                    on_synced=view.mark_pods_synced, settings=settings.watch)  # fmt: skip
        self.informers: Sequence[Informer] = [self.twins.requests]
        self.synced = self.twins.synced
        self._grant_handlers: list[Callable[[RawObject | None], None]] = [view.set_granted_nodes]

    def add_grant_handler(self, handler: Callable[[RawObject | None], None]) -> None:
        """Also tell ``handler`` each version of the GPUSlice (None: there is none)."""
        self._grant_handlers.append(handler)

    def _grant(self, slice_obj: RawObject | None) -> None:
        for handler in self._grant_handlers:
            handler(slice_obj)

    def knows(self, key: ObjectKey) -> bool:
        return self.twins.knows(key.namespace or "")

    def twin_namespace_for(self, origin: str) -> str | None:
        return self.twins.twin_namespace_for(origin)

    async def prepare_namespace(self, origin: str) -> None:
        return None  # the provider made it, with its quota and RBAC

    async def report_demand(self, origin: str, demand: dict[str, str], block: dict[str, str]) -> None:
        await self.twins.report_demand(origin, demand, block)

    def add_handler(self, handler: Callable[[Change], None]) -> None:
        self.twins.add_handler(handler)

    def add_namespaces_handler(self, handler: Callable[[set[str]], None]) -> None:
        self.twins.add_namespaces_handler(handler)

    def tasks(self) -> dict[str, TaskFactory]:
        return {"watch-twin-namespaces": self.twins.run, "watch-grant": self.watch_grant}

    async def watch_grant(self) -> None:
        """The per-node grant of our GPUSlice stands for the provider's nodes (which a tenant may
        not list)."""
        async for item in watch_objects(self.provider, GPUSLICES, namespace=self.tenant_namespace,
                                        field_selector=f"metadata.name={self.slice_name}",
                                        settings=self.settings, retry_permanent=True):  # fmt: skip
            if isinstance(item, Listed):
                if not item.keys:
                    self._grant(None)
            elif item.type == "DELETED":
                self._grant(None)
            else:
                self._grant(item.object)
