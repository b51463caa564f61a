"""The provider controller: informers → queues → reconcilers, on a :class:`kube.manager.Manager`.

Three queues, each with its reconciler:

* ``tenants`` (key ``ObjectKey`` of a Tenant): identity and tenant-namespace RBAC;
* ``pool`` (one key): every grant decision, serialized;
* ``twins`` (key: a tenant namespace): twin namespaces, quotas, their RBAC.

``run_provider(client)`` keeps its informers warm, waits to hold the leader Lease, then reconciles
until cancelled, stopped, or until it loses the Lease; ``/healthz``, ``/readyz`` and ``/metrics``
are served throughout (:mod:`kube.manager`).
"""

from __future__ import annotations

import asyncio
import logging

from kube.api import WAITING_BLOCK_ANNOTATION
from kube.backoff import Backoff
from kube.clients import KubeClient
from kube.declaration import DECLARATION_NAME, DECLARATION_NAMESPACE
from kube.errors import KubeError
from kube.informers import Change, Informer
from kube.manager import Controller, Manager
from kube.objects import (
    CONFIGMAPS,
    CSRS,
    DEVICECLASSES,
    NAMESPACES,
    NODES,
    PEERNETWORKS,
    PODS,
    RESOURCECLAIMS,
    RESOURCEQUOTAS,
    RESOURCESLICES,
    ObjectKey,
    RawObject,
    labels,
    meta,
)
from kube.queueing import KeyedQueue
from kube.settings import LeaderElectionSettings

from ..resources import (
    GPUSLICES,
    LABEL_MANAGED_BY,
    LABEL_ORIGIN_NAMESPACE,
    LABEL_TENANT,
    MANAGED_BY,
    NAMESPACEOFFLOADINGS,
    TENANT_NAMESPACE_PREFIX,
    TENANTS,
    tenant_namespace,
)
from .admission import twin_admission_objects
from .devices import project_claim, project_slice
from .networks import TenantNetworkReconciler
from .quotas import offered_accelerators
from .settings import ProviderSettings
from .slices import POOL, DraCaches, PoolReconciler, project_node, project_pod
from .tenants import ANNOTATION_TENANT, TenantReconciler, apply
from .twins import TwinReconciler

__all__ = ["build_provider", "run_provider"]

logger = logging.getLogger(__name__)


def build_provider(client: KubeClient, *, settings: ProviderSettings | None = None) -> Manager:
    """The provider controller as a :class:`kube.manager.Manager` (not yet running)."""
    settings = settings or ProviderSettings()
    watch = settings.watch
    tenants_q: KeyedQueue[ObjectKey] = KeyedQueue("tenants", settings=settings.queue)
    pool_q: KeyedQueue[str] = KeyedQueue("pool", settings=settings.queue)
    twins_q: KeyedQueue[str] = KeyedQueue("twins", settings=settings.queue)
    networks_q: KeyedQueue[ObjectKey] = KeyedQueue("tenant_networks", settings=settings.queue)
    managed = f"{LABEL_MANAGED_BY}={MANAGED_BY}"

    nodes = Informer(client, NODES, project=project_node, settings=watch)
    # twin pods too: those placed beyond their tenant's reservation occupy their node
    pods = Informer(client, PODS, project=project_pod, settings=watch)
    slices = Informer(client, GPUSLICES, settings=watch)
    twin_namespaces = Informer(
        client, NAMESPACES, name="twin-namespaces", label_selector=LABEL_ORIGIN_NAMESPACE, settings=watch,
        project=lambda ns: {"metadata": {"name": meta(ns)["name"], "labels": labels(ns)}},
    )  # fmt: skip
    tenants = Informer(client, TENANTS, settings=watch)
    csrs = Informer(client, CSRS, label_selector=managed, settings=watch,
                    project=lambda o: {"metadata": meta(o)})  # fmt: skip
    offloadings = Informer(client, NAMESPACEOFFLOADINGS, settings=watch)
    quotas = Informer(client, RESOURCEQUOTAS, label_selector=managed, settings=watch)
    peer_networks = Informer(client, PEERNETWORKS, settings=watch)
    # DRA devices in the pool: what each node's ResourceSlices offer, what claims hold
    dra = DraCaches(
        Informer(client, RESOURCESLICES, project=project_slice, settings=watch),
        Informer(client, RESOURCECLAIMS, project=project_claim, settings=watch),
        Informer(client, DEVICECLASSES, settings=watch),
    )
    declaration = Informer(client, CONFIGMAPS, name="network-declaration", namespace=DECLARATION_NAMESPACE,
                           field_selector=f"metadata.name={DECLARATION_NAME}", settings=watch)  # fmt: skip

    def pool_changed(change: Change, batch: float = 0.1) -> None:
        if change.type == "MODIFIED" and change.old == change.new:
            # nothing the pool reads moved (the caches hold projections): a node's heartbeat, a
            # pod's conditions. Each asked for a pass over the pool. (Of the 16-17 % of
            # a core first seen at rest in issue 15's N=10,000 bench this saved 3 points; the rest
            # was the node lifecycle controller untainting the new nodes, which the pool does
            # read: the bench now waits for that to end.)
            return
        pool_q.add_after(POOL, batch)  # one pass for the changes meanwhile

    def pod_changed(change: Change) -> None:
        pool_changed(change, settings.pool_pod_batch)

    def tenant_ns_changed(namespace: str | None) -> None:
        if namespace and namespace.startswith(TENANT_NAMESPACE_PREFIX):
            twins_q.add(namespace)

    def slice_changed(change: Change) -> None:
        pool_changed(change)
        tenant_ns_changed(change.key.namespace)

    def twin_ns_changed(change: Change) -> None:
        tenant = labels(change.object).get(LABEL_TENANT)
        if tenant:
            tenant_ns_changed(tenant_namespace(tenant))
        pool_changed(change)

    def quota_changed(change: Change) -> None:
        tenant = labels(change.object).get(LABEL_TENANT)
        if tenant:
            tenant_ns_changed(tenant_namespace(tenant))

    def tenant_changed(change: Change) -> None:
        tenants_q.add(change.key)
        networks_q.add(change.key)
        tenant_ns_changed(change.key.namespace)

    def peer_network_changed(change: Change) -> None:
        if (change.key.namespace or "").startswith(TENANT_NAMESPACE_PREFIX):
            networks_q.add(change.key)  # named after its consumer, beside its Tenant

            def remaps(obj: RawObject | None) -> object:
                return ((obj or {}).get("status") or {}).get("remappedPodCIDRs")

            if remaps(change.old) != remaps(change.new):
                tenant_ns_changed(change.key.namespace)  # the twin namespaces' endpoint CIDRs

    def declaration_changed(_: Change) -> None:
        for key in tenants:
            networks_q.add(key)
            tenant_ns_changed(key.namespace)  # the twin namespaces' endpoint CIDRs

    def csr_changed(change: Change) -> None:
        found = (meta(change.object).get("annotations") or {}).get(ANNOTATION_TENANT)
        if found:
            tenants_q.add(ObjectKey.parse(found))

    def node_changed(change: Change) -> None:
        pool_changed(change)
        if offered_accelerators([change.old or {}]) != offered_accelerators([change.new or {}]):
            for key in tenants:  # a new kind of accelerator is limited in every twin namespace
                tenant_ns_changed(key.namespace)

    nodes.add_handler(node_changed)
    dra.resource_slices.add_handler(pool_changed)
    dra.classes.add_handler(pool_changed)
    dra.claims.add_handler(pod_changed)  # allocated and freed with its pod: batched as pods are

    def device_class_changed(change: Change) -> None:
        if (change.old is None) != (change.new is None):
            for key in tenants:  # a DeviceClass appeared or went: it is limited by every quota
                tenant_ns_changed(key.namespace)

    dra.classes.add_handler(device_class_changed)
    pods.add_handler(pod_changed)
    slices.add_handler(slice_changed)
    twin_namespaces.add_handler(twin_ns_changed)
    tenants.add_handler(tenant_changed)
    csrs.add_handler(csr_changed)

    def offloading_changed(change: Change) -> None:
        tenant_ns_changed(change.key.namespace)

        def block(obj: RawObject | None) -> str | None:
            return (meta(obj).get("annotations") or {}).get(WAITING_BLOCK_ANNOTATION) if obj else None

        if block(change.old) != block(change.new):
            pool_changed(change)  # a pod waits for a block (or no more): the grant may be placed anew

    offloadings.add_handler(offloading_changed)
    quotas.add_handler(quota_changed)
    peer_networks.add_handler(peer_network_changed)
    declaration.add_handler(declaration_changed)

    manager = Manager(
        "provider",
        client=client,
        probes_settings=settings.probes,
        leader_election=LeaderElectionSettings(
            enabled=settings.leader_elect, namespace=settings.lease_namespace, name=settings.lease_name,
            lease_seconds=settings.lease_seconds, renew_seconds=settings.renew_seconds,
        ),
        drain_timeout=settings.queue.drain_timeout,
    )  # fmt: skip
    for informer in (csrs, offloadings, quotas, declaration):
        manager.add_informer(informer)
    tenant_reconciler = TenantReconciler(client, settings=settings)
    manager.add_controller(
        Controller("tenants", tenants_q, tenant_reconciler, kind="Tenant", informers=[tenants], logger=logger)
    )
    pool = PoolReconciler(client, nodes=nodes, pods=pods, slices=slices, twins=twin_namespaces,
                          requests=offloadings, settings=settings, dra=dra)  # fmt: skip
    pool_informers = [nodes, pods, slices, twin_namespaces, *dra]
    manager.add_controller(
        Controller("pool", pool_q, pool, kind="GPUPool", informers=pool_informers, logger=logger)
    )
    twins = TwinReconciler(client, settings=settings, peer_networks=peer_networks, declaration=declaration,
                           nodes=nodes, device_classes=dra.classes)  # fmt: skip
    manager.add_controller(Controller("twins", twins_q, twins, kind="TenantNamespace",
                                      informers=[nodes, dra.classes], logger=logger))  # fmt: skip
    manager.add_task("twin-admission", lambda: keep_twin_admission(client, settings))
    networks = TenantNetworkReconciler(client, peer_networks=peer_networks, settings=settings)
    manager.add_controller(Controller("tenant_networks", networks_q, networks, kind="Tenant",
                                      informers=[tenants, peer_networks], logger=logger))  # fmt: skip
    return manager


async def keep_twin_admission(client: KubeClient, settings: ProviderSettings) -> None:
    """Apply the twin namespaces' admission policies, and again every resync (a deleted one
    comes back); an error is logged with the object and retried with backoff."""
    backoff = Backoff(base=1.0, cap=60.0)
    while True:
        try:
            for resource, body in twin_admission_objects():
                await apply(client, resource, body, settings.field_manager)
        except KubeError as exc:
            delay = backoff.next()
            logger.warning("%s %s: cannot apply (%s); retrying in %.0fs", resource.kind,
                           body["metadata"]["name"], exc, delay)  # fmt: skip
            await asyncio.sleep(delay)
            continue
        backoff.reset()
        await asyncio.sleep(settings.resync_seconds)


async def run_provider(
    client: KubeClient, *, settings: ProviderSettings | None = None, handle_signals: bool = False
) -> None:
    """Run the provider controller with ``client`` (an admin of the provider) until cancelled,
    stopped (SIGTERM with ``handle_signals``), or until it loses its Lease."""
    manager = build_provider(client, settings=settings)
    logger.info("provider controller starting against %s", client.base_url)
    await manager.run(handle_signals=handle_signals)
