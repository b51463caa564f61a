"""The provider controller: watches → queues → reconcilers, as supervised root tasks.

Three queues, each with its reconciler:

* ``tenants`` (key ``ObjectKey`` of a Tenant): identity and tenant-namespace RBAC;
* ``pool`` (one key): every grant decision, serialized;
* ``twins`` (key: a tenant namespace): twin namespaces, quotas, their RBAC.

``run_provider(client)`` waits to hold the leader Lease (:mod:`.leader`), then runs until
cancelled, until a root task fails, or until it loses the Lease.
"""

from __future__ import annotations

import logging
from collections.abc import Coroutine
from typing import Any

from kube.clients import KubeClient
from kube.objects import CSRS, NAMESPACES, NODES, PODS, RESOURCEQUOTAS, ObjectKey, RawObject, labels, meta
from kube.queueing import KeyedQueue
from kube.reconciling import run_workers
from kube.tasks import run_supervised
from kube.watching import Listed, watch_objects

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
from .cache import Cache
from .leader import LeaderElector
from .settings import ProviderSettings
from .slices import POOL, PoolReconciler, project_node, project_pod
from .tenants import ANNOTATION_TENANT, TenantReconciler
from .twins import TwinReconciler

__all__ = ["run_provider"]

logger = logging.getLogger(__name__)


async def _feed(client: KubeClient, resource: Any, on_change: Any, *, label_selector: str | None = None,
                settings: ProviderSettings) -> None:
    async for item in watch_objects(client, resource, label_selector=label_selector, settings=settings.watch):
        if isinstance(item, Listed):
            for key in item.keys:
                on_change({"metadata": {"name": key.name, "namespace": key.namespace}})
            continue
        on_change(item.object)


async def run_provider(client: KubeClient, *, settings: ProviderSettings | None = None) -> None:
    """Run the provider controller with ``client`` (an admin of the provider) until cancelled."""
    settings = settings or ProviderSettings()
    tenants_q: KeyedQueue[ObjectKey] = KeyedQueue("tenants", settings=settings.queue)
    pool_q: KeyedQueue[str] = KeyedQueue("pool", settings=settings.queue)
    twins_q: KeyedQueue[str] = KeyedQueue("twins", settings=settings.queue)

    nodes = Cache(NODES, project=project_node)
    pods = Cache(PODS, project=project_pod)
    slices = Cache(GPUSLICES)
    twin_namespaces = Cache(NAMESPACES, label_selector=LABEL_ORIGIN_NAMESPACE,
                            project=lambda ns: {"metadata": {"name": meta(ns)["name"],
                                                             "labels": labels(ns)}})

    def pool_changed(_: RawObject) -> None:
        pool_q.add_after(POOL, 0.1)  # batch bursts of pod events into one pass

    def tenant_ns_changed(namespace: str | None) -> None:
        if namespace and namespace.startswith(TENANT_NAMESPACE_PREFIX):
            twins_q.add(namespace)

    def slice_changed(obj: RawObject) -> None:
        pool_changed(obj)
        tenant_ns_changed(meta(obj).get("namespace"))

    def twin_ns_changed(ns: RawObject) -> None:
        tenant = labels(ns).get(LABEL_TENANT)
        if tenant:
            tenant_ns_changed(tenant_namespace(tenant))
        pool_changed(ns)

    def quota_changed(quota: RawObject) -> None:
        tenant = labels(quota).get(LABEL_TENANT)
        if tenant:
            tenant_ns_changed(tenant_namespace(tenant))

    def tenant_changed(obj: RawObject) -> None:
        key = ObjectKey.of(obj)
        tenants_q.add(key)
        tenant_ns_changed(key.namespace)

    def csr_changed(obj: RawObject) -> None:
        found = (meta(obj).get("annotations") or {}).get(ANNOTATION_TENANT)
        if found:
            tenants_q.add(ObjectKey.parse(found))

    managed = f"{LABEL_MANAGED_BY}={MANAGED_BY}"
    roots: dict[str, Coroutine[Any, Any, Any]] = {
        "watch-nodes": nodes.run(client, pool_changed, settings=settings.watch),
        # twin pods too: those placed beyond their tenant's reservation occupy their node
        "watch-pods": pods.run(client, pool_changed, settings=settings.watch),
        "watch-gpuslices": slices.run(client, slice_changed, settings=settings.watch),
        "watch-twin-namespaces": twin_namespaces.run(client, twin_ns_changed, settings=settings.watch),
        "watch-tenants": _feed(client, TENANTS, tenant_changed, settings=settings),
        "watch-csrs": _feed(client, CSRS, csr_changed, label_selector=managed, settings=settings),
        "watch-namespaceoffloadings": _feed(client, NAMESPACEOFFLOADINGS,
                                            lambda o: tenant_ns_changed(meta(o).get("namespace")),
                                            settings=settings),
        "watch-quotas": _feed(client, RESOURCEQUOTAS, quota_changed, label_selector=managed,
                              settings=settings),
        "reconcile-tenants": run_workers(tenants_q, TenantReconciler(client, settings=settings),
                                         logger=logger, kind="Tenant"),
        "reconcile-pool": run_workers(pool_q, PoolReconciler(client, nodes=nodes, pods=pods, slices=slices,
                                                             twins=twin_namespaces, settings=settings),
                                      logger=logger, kind="GPUPool"),
        "reconcile-twins": run_workers(twins_q, TwinReconciler(client, settings=settings),
                                       logger=logger, kind="TenantNamespace"),
    }
    elector = LeaderElector(client, settings.lease_namespace, settings.lease_name,
                            lease_seconds=settings.lease_seconds, renew_seconds=settings.renew_seconds)
    try:
        await elector.acquire()
    except BaseException:
        for coro in roots.values():
            coro.close()
        raise
    roots["leader-lease"] = elector.keep()
    logger.info("provider controller running against %s", client.base_url)
    try:
        await run_supervised(roots, logger=logger)
    finally:
        for queue in (tenants_q, twins_q):
            queue.shutdown()
        pool_q.shutdown()
