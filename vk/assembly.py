"""The virtual kubelet, assembled: named components on one :class:`kube.manager.Manager`.

:func:`build_virtual_kubelet` wires them in this order (each arrow is a handler adding keys)::

    consumer pods ──┬─▶ sync_pods_to_remote       twins created, updated, deleted  (PodReflector)
      (informer)    ├─▶ sync_status_from_remote   twin status onto the pod   (PodStatusReflector)
    twins ──────────┘   (the RemoteSide: tenant or admin identity, chosen once, vk.remote)
    consumer pods ──▶ sync_{tokens,configmaps,secrets,services}_to_remote: what twins mount/resolve
    consumer pods ──▶ provider Events about their twins, onto them
    node: registration, status, Lease; its capacity view fed by the RemoteSide; the fit gate of
          sync_pods_to_remote, whose held pods it wakes when capacity changes
    PeerNetworks ──▶ pod IPs of status back, endpoints of reflected Services; the node's network
    kubelet API ◀── both pod informers;   resync ──▶ every key of every queue, now and then

A controller's workers start once the informers it reads have listed; ``/readyz`` answers ready
when every informer has and the Node is registered. On SIGTERM the queues drain first, then the
other loops stop (the node's Lease is no longer renewed), then the watches.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kube.clients import KubeClient
from kube.informers import Change, Informer
from kube.manager import Controller, Manager
from kube.objects import ObjectKey, RawObject
from kube.queueing import KeyedQueue
from kube.reconciling import Reconciler

from .forge.accessories import CLAIM, CLAIM_TEMPLATE, CONFIGMAP, SECRET, matters_to_copies
from .forge.events import event_selector
from .forge.node import network_condition
from .forge.pods import ForgeOptions, matters_to_twin_sync
from .forge.podstatus import twin_status_inputs
from .forge.tokens import matters_to_token
from .kubelet import KubeletContext, serve_kubelet_api
from .kubelet.certificates import ServingCertificate
from .node.controller import NodeController
from .reflection.accessories import AccessoryReflector
from .reflection.addresses import PeerNetworkFollower
from .reflection.devices import DeviceMirror
from .reflection.events import EventReflector
from .reflection.informers import PodPhases, consumer_pods
from .reflection.namespaced import NamespacePods
from .reflection.pods import PodReflector
from .reflection.podstatus import PodStatusReflector, refresh_phase_gauge
from .reflection.services import ServiceReflector
from .reflection.tokens import TokenReflector
from .remote import RemoteSide, TenantSide, remote_side
from .settings import VirtualKubeletSettings

__all__ = ["PodSync", "assemble_virtual_kubelet", "build_virtual_kubelet", "forge_options"]

_BOUND_BY_THE_PROVIDER = frozenset({"nodeName"})
"""What the provider's scheduler writes into a twin's spec, and the twin sync never reads."""

logger = logging.getLogger(__name__)

Copier = AccessoryReflector | TokenReflector | ServiceReflector
"""A reflector of what twins need besides themselves, keyed in a queue of its own."""


def forge_options(settings: VirtualKubeletSettings) -> ForgeOptions:
    return ForgeOptions(
        consumer_cluster_id=settings.consumer_cluster_id,
        provider_cluster_id=settings.provider_cluster_id,
        virtual_node_name=settings.effective_node_name,
        namespace_strategy=settings.namespace_strategy,
        grant_node_selector=dict(settings.provider_node_selector),
        grant_tolerations=tuple(settings.provider_tolerations),
        service_account_tokens=settings.service_account_tokens,
    )


def build_virtual_kubelet(
    settings: VirtualKubeletSettings, consumer: KubeClient, provider: KubeClient
) -> Manager:
    """The virtual kubelet of ``settings`` as a manager, not yet running (see the module)."""
    return assemble_virtual_kubelet(settings, consumer, provider)[0]


def assemble_virtual_kubelet(
    settings: VirtualKubeletSettings, consumer: KubeClient, provider: KubeClient
) -> tuple[Manager, NodeController]:
    """:func:`build_virtual_kubelet`, with its node (to hand it a new grant while it runs)."""
    manager = Manager("virtual-kubelet", client=consumer, probes_settings=settings.probe_settings,
                      drain_timeout=settings.queue.drain_timeout)  # fmt: skip
    sides = {"consumer": consumer, "provider": provider}
    local = consumer_pods(consumer, settings.effective_node_name, settings=settings.watch)
    manager.add_informer(local)
    node = add_node(manager, settings, consumer=consumer, provider=provider)
    remote = add_remote_side(manager, settings, provider=provider, node=node)
    if isinstance(remote, TenantSide):  # a grant's DRA devices come with the GPUSlice
        mirror = DeviceMirror(consumer, node_name=settings.effective_node_name,
                              provider_id=settings.provider_cluster_id,
                              resync_seconds=settings.resync_seconds)  # fmt: skip
        remote.add_grant_handler(mirror.grant_changed)
        manager.add_task("mirror-dra-devices", mirror.run)
    copiers = add_copiers(manager, settings, **sides, local=local, remote=remote)
    prerequisites = [c for c in copiers if not isinstance(c, ServiceReflector)]
    pods = add_pod_sync(manager, settings, **sides, local=local, remote=remote, node=node,
                        prerequisites=prerequisites)  # fmt: skip
    events = add_events(manager, settings, **sides, local=local, remote=remote)

    occupied = NamespacePods()

    def local_pod_changed(change: Change) -> None:
        pods.local_changed(change)
        token_matters = matters_to_token(change.type, change.old, change.new)
        copies_matter = matters_to_copies(change.type, change.old, change.new)
        for copier in copiers:
            if isinstance(copier, TokenReflector):
                if token_matters:
                    copier.pod_changed(change.key)
            elif copies_matter:
                copier.pod_changed(change.key, change.new)
        if events is not None:
            events.pod_changed(change.key)
        if occupied.update(change.key, change.new is not None):
            # the node's last pod in this namespace went: its watches go too (issue 15)
            namespace = change.key.namespace or ""
            for reflector in (*copiers, *([events] if events is not None else [])):
                if isinstance(reflector, TokenReflector):
                    reflector.clear_namespace(namespace)
                else:
                    reflector.release(namespace)

    local.add_handler(local_pod_changed)
    services = [c for c in copiers if isinstance(c, ServiceReflector)]
    add_address_followers(manager, settings, **sides, node=node, pods=pods, services=services)
    if settings.kubelet_api:
        add_kubelet_api(manager, settings, **sides, local=local, remote=remote, node=node)
    add_resync(manager, settings, pods=pods, copiers=copiers)

    def provider_back() -> None:  # what failed in the outage is tried now, not after its backoff
        queues = (pods.to_remote, pods.status_from_remote, *(c.queue for c in copiers))
        retried = sum(queue.retry_now() for queue in queues)
        logger.info("provider back: %d keys that failed meanwhile retried now", retried)

    node.on_provider_back(provider_back)
    return manager, node


# ---- the node ------------------------------------------------------------------------------------


def add_node(manager: Manager, settings: VirtualKubeletSettings, *, consumer: KubeClient,
             provider: KubeClient) -> NodeController:  # fmt: skip
    """The Node, its status and its Lease; ready once registered."""
    node = NodeController(consumer=consumer, provider=provider, settings=settings)
    for name, factory in node.tasks().items():
        manager.add_task(name, factory)
    manager.probes.add_readiness("node-registered", node.registered.is_set)
    return node


def add_remote_side(manager: Manager, settings: VirtualKubeletSettings, *, provider: KubeClient,
                    node: NodeController) -> RemoteSide:  # fmt: skip
    """The twins and the provider's capacity, as this identity sees them (:mod:`vk.remote`)."""
    remote = remote_side(settings, provider, node.view)
    logger.info("provider identity: %s", remote.name)
    for informer in remote.informers:
        manager.add_informer(informer)
    for name, factory in remote.tasks().items():
        manager.add_task(name, factory)
    manager.probes.add_readiness("twins-listed", remote.synced.is_set)
    return remote


# ---- pods out, status back ---------------------------------------------------------------------


@dataclass
class PodSync:
    """The two pod queues, both keyed by consumer pod key, and their reconcilers."""

    to_remote: KeyedQueue[ObjectKey]
    status_from_remote: KeyedQueue[ObjectKey]
    reflector: PodReflector
    status: PodStatusReflector
    orphan_found: Callable[[ObjectKey], None] = lambda key: None
    """Called with the key of a twin found without its consumer pod (one left by a pod deleted
    while no virtual kubelet ran): its token Secret goes with the twin."""

    def add(self, key: ObjectKey) -> None:
        """Either pod of a pair changed: both directions look at it."""
        self.to_remote.add(key)
        self.status_from_remote.add(key)

    def local_changed(self, change: Change) -> None:
        """The consumer pod changed: its status is looked at again, unless the change is the
        status we wrote coming back, the pod is gone or terminating, or it has no twin yet; its
        twin only when the change can matter to it (not the status written back, say)."""
        key = change.key
        if change.new is None or change.new["metadata"].get("deletionTimestamp"):
            self._status_has_nothing_to_write(key)
        elif self.reflector.remote.resource_version(key) is None:
            pass  # no twin (yet): nothing to write until it comes, and its arrival wakes a pass
        elif not self.status.echoed(key, self.reflector.local.resource_version(key)):
            self.status_from_remote.add(key)
        if matters_to_twin_sync(change.type, change.old, change.new):
            self.to_remote.add(key)
        else:
            self.reflector.still_in_sync(key, change, "consumer")

    def _status_has_nothing_to_write(self, key: ObjectKey) -> None:
        """The pod is gone or terminating, or its twin is gone: status back's pass would only
        forget the pair, so it is forgotten here, without one (issue 15: 3.3 passes per pod on
        its way out). A pass already running for it is let see the change itself."""
        if self.status_from_remote.is_processing(key):
            self.status_from_remote.add(key)
        else:
            self.status.forget(key)

    def _has_consumer_pod(self, key: ObjectKey) -> bool:
        """False also while the consumer pods are not listed yet: the reconcilers run after."""
        local = self.reflector.local
        return local.synced.is_set() and local.get(key) is not None

    def remote_changed(self, change: Change) -> None:
        """The twin changed: the consumer pod's status is looked at again, unless the twin is
        gone or changed in nothing status back reads (its binding); the twin itself only when
        the change can matter to it (not its binding or its status), and not when it is the twin
        we just created coming back."""
        key = change.key
        if change.new is None:
            self._status_has_nothing_to_write(key)
        elif change.old is None or twin_status_inputs(change.old) != twin_status_inputs(change.new):
            self.status_from_remote.add(key)
        else:  # its binding, say: the consumer pod's status stays what it was
            self.status.twin_moved_on(key, _version(change.old), _version(change.new))
        version = self.reflector.remote.resource_version(key)
        if change.new is not None and self.reflector.echoes.is_echo(key, version):
            return
        if change.type == "ADDED" and not self._has_consumer_pod(key):
            self.orphan_found(key)
        if matters_to_twin_sync(change.type, change.old, change.new, unread_spec=_BOUND_BY_THE_PROVIDER):
            self.to_remote.add(key)
        else:
            self.reflector.still_in_sync(key, change, "twin")


def _version(obj: RawObject) -> str | None:
    return (obj.get("metadata") or {}).get("resourceVersion")


def add_pod_sync(
    manager: Manager,
    settings: VirtualKubeletSettings,
    *,
    consumer: KubeClient,
    provider: KubeClient,
    local: Informer,
    remote: RemoteSide,
    node: NodeController,
    prerequisites: Sequence[AccessoryReflector | TokenReflector],
) -> PodSync:
    """``sync_pods_to_remote`` and ``sync_status_from_remote``, fed by both pod informers."""
    reflector = PodReflector(consumer=consumer, provider=provider, local=local, remote=remote,
                             opts=forge_options(settings), fit=node, accessories=prerequisites)  # fmt: skip
    status = PodStatusReflector(consumer=consumer, local=local, twins=remote,
                                node_address=settings.node_address, provider=provider)  # fmt: skip
    to_remote: KeyedQueue[ObjectKey] = KeyedQueue("sync_pods_to_remote", settings=settings.queue)
    from_remote: KeyedQueue[ObjectKey] = KeyedQueue("sync_status_from_remote", settings=settings.queue)
    pods = PodSync(to_remote, from_remote, reflector, status)
    for prerequisite in prerequisites:
        if isinstance(prerequisite, TokenReflector):  # its token Secret goes with an orphan twin
            pods.orphan_found = prerequisite.pod_changed
    informers = [local, *remote.informers]
    _add_controller(manager, pods.to_remote, reflector, "Pod", informers)
    _add_controller(manager, pods.status_from_remote, status, "Pod", informers)
    remote.add_handler(pods.remote_changed)

    def namespaces_changed(origins: set[str]) -> None:  # offloaded, or no longer
        for key in local:
            if key.namespace in origins:
                pods.to_remote.add(key)

    def retry_held() -> None:  # the provider's capacity changed: held pods may fit now
        for key in reflector.gated_keys():
            pods.to_remote.add(key)

    remote.add_namespaces_handler(namespaces_changed)
    node.on_capacity_change(retry_held)
    consumer_phases, provider_phases = PodPhases(), PodPhases()
    local.add_handler(lambda change: consumer_phases.update(change.key, change.new))
    remote.add_handler(lambda change: provider_phases.update(change.key, remote.get(change.key)))
    manager.probes.before_metrics.append(
        lambda: refresh_phase_gauge(consumer_phases.counts(), provider_phases.counts())
    )
    return pods


def _add_controller(manager: Manager, queue: KeyedQueue[ObjectKey], reconciler: Reconciler[ObjectKey],
                    kind: str, informers: Sequence[Informer]) -> None:  # fmt: skip
    manager.add_controller(Controller(queue.name, queue, reconciler, kind=kind, informers=informers,
                                      logger=logger))  # fmt: skip


# ---- what twins need besides themselves ----------------------------------------------------------


def add_copiers(
    manager: Manager,
    settings: VirtualKubeletSettings,
    *,
    consumer: KubeClient,
    provider: KubeClient,
    local: Informer,
    remote: RemoteSide,
) -> list[Copier]:
    """Tokens, ConfigMaps and Secrets (written before a twin is created too), and Services."""
    common: dict[str, Any] = {
        "consumer": consumer, "provider": provider,
        "consumer_id": settings.consumer_cluster_id, "twin_namespace_for": remote.twin_namespace_for,
        "queue_settings": settings.queue,
    }  # fmt: skip
    copiers: list[Copier] = []
    if settings.service_account_tokens:  # the token pass reads the pod; the others get it with the change
        copiers.append(TokenReflector(pods=local, **common))
    kinds = (CONFIGMAP, SECRET, CLAIM_TEMPLATE, CLAIM)
    copiers += [AccessoryReflector(kind, settings=settings.watch, **common) for kind in kinds]
    copiers.append(ServiceReflector(node=settings.effective_node_name, settings=settings.watch, **common))
    for copier in copiers:
        kind = "Pod" if isinstance(copier, TokenReflector) else copier.resource.kind
        _add_controller(manager, copier.queue, copier, kind, [local])
        if not isinstance(copier, TokenReflector):
            manager.add_task(f"watch-consumer-{copier.kind}", copier.run)
    return copiers


def add_events(manager: Manager, settings: VirtualKubeletSettings, *, consumer: KubeClient,
               provider: KubeClient, local: Informer,
               remote: RemoteSide) -> EventReflector | None:  # fmt: skip
    """Provider Events about twins, onto their consumer pods: those ``provider_events`` names
    (None: no copier, no watch)."""
    selector = event_selector(settings.provider_events)
    if selector is None:
        return None
    events = EventReflector(consumer=consumer, provider=provider, pods=local,
                            twin_namespace_for=remote.twin_namespace_for, node=settings.effective_node_name,
                            settings=settings.watch, field_selector=selector)  # fmt: skip
    manager.add_task("watch-provider-events", events.run)
    return events


# ---- addresses, the kubelet API, resync --------------------------------------------------------


def add_address_followers(
    manager: Manager,
    settings: VirtualKubeletSettings,
    *,
    consumer: KubeClient,
    provider: KubeClient,
    node: NodeController,
    pods: PodSync,
    services: Sequence[ServiceReflector],
) -> None:
    """Both PeerNetworks: the provider's pods in our view (twin IPs in pod status, Service
    endpoints; the node's NetworkReady) and ours in the provider's (endpoints it can reach)."""

    def twins_remapped(function: Callable[[str], str]) -> None:
        pods.status.remap_ip = function
        for key in pods.status.local:  # every status again, in the new view
            pods.status_from_remote.add(key)
        for reflector in services:  # and every reflected Service's endpoints
            reflector.set_views(twin_back=ours.reverse())

    def ours_remapped(function: Callable[[str], str]) -> None:
        for reflector in services:
            reflector.set_views(to_provider_view=function)

    ours = PeerNetworkFollower(consumer, namespace=settings.peer_network_namespace,
                               peer_id=settings.provider_cluster_id, on_change=twins_remapped,
                               on_object=lambda obj: node.set_network(network_condition(obj)),
                               settings=settings.watch)  # fmt: skip
    theirs = PeerNetworkFollower(provider, namespace=settings.provider_peer_network_namespace,
                                 peer_id=settings.consumer_cluster_id, on_change=ours_remapped,
                                 settings=settings.watch)  # fmt: skip
    manager.add_task("follow-peer-network", ours.run)
    manager.add_task("follow-provider-peer-network", theirs.run)


def add_kubelet_api(manager: Manager, settings: VirtualKubeletSettings, *, consumer: KubeClient,
                    provider: KubeClient, local: Informer, remote: RemoteSide,
                    node: NodeController) -> None:  # fmt: skip
    """logs, exec, attach, port-forward, pods, stats: TLS on ``node_address:kubelet_port``. Its
    serving certificate is asked for once the Node reports this address: an approver checks the
    certificate's addresses against the Node's, and a Node that still shows an earlier address
    (its kubelet moved to another pod) would get the request denied."""
    name = settings.effective_node_name
    ctx = KubeletContext(node_name=name, provider=provider, local_pod=local.get, twin_pod=remote.get,
                         local_keys=local.keys, local_identity=local.identity,
                         twin_identity=remote.identity, started=datetime.datetime.now(datetime.UTC),
                         followed=(local, remote), log_resume_seconds=settings.log_resume_seconds,
                         own_metrics=manager.probes.metrics_text)  # fmt: skip
    certificate = ServingCertificate(consumer, node_name=name, addresses=(settings.node_address,),
                                     self_approve=settings.kubelet_csr_self_approve,
                                     expiration_seconds=settings.kubelet_cert_seconds,
                                     sign_timeout=120.0)  # fmt: skip

    async def serve() -> None:
        await node.registered.wait()
        await serve_kubelet_api(consumer=consumer, ctx=ctx, certificate=certificate,
                                host=settings.node_address, port=settings.kubelet_port)  # fmt: skip

    manager.add_task("kubelet-api", serve)


def add_resync(manager: Manager, settings: VirtualKubeletSettings, *, pods: PodSync,
               copiers: Sequence[Copier]) -> None:  # fmt: skip
    """Reconcile everything now and then: collects orphans, heals anything a lost event hid."""

    async def resync() -> None:
        while True:
            await asyncio.sleep(settings.resync_seconds)
            for key in {*pods.reflector.local.keys(), *pods.reflector.remote.keys()}:
                # a pair whose versions did not move since a pass found nothing to do would
                # find nothing again: skipped without decoding it (issue 15, ten thousand
                # pods), by each queue on its own
                if not pods.reflector.settled(key):
                    pods.to_remote.add(key)
                if not pods.status.settled(key):
                    pods.status_from_remote.add(key)
            for copier in copiers:
                copier.resync()

    manager.add_task("resync", resync)
