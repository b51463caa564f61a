"""The provider's GPU pool passes are paced: one asked for right after another waits."""

from __future__ import annotations

import time

from kube.clients import KubeClient
from kube.informers import Informer
from kube.kubeconfigs import Connection
from kube.objects import NAMESPACES, NODES, PODS
from kube.reconciling import Requeue
from peering.provider.settings import ProviderSettings
from peering.provider.slices import POOL, PoolReconciler
from peering.resources import GPUSLICES


def pool(settings: ProviderSettings) -> PoolReconciler:
    nowhere = KubeClient(Connection(server="https://127.0.0.1:1"))  # nothing to write: never called
    caches = [Informer(nowhere, resource) for resource in (NODES, PODS, GPUSLICES, NAMESPACES)]
    for cache in caches:
        cache.synced.set()  # listed, and empty
    nodes, pods, slices, twins = caches
    return PoolReconciler(nowhere, nodes=nodes, pods=pods, slices=slices, twins=twins, settings=settings)


async def test_a_pass_right_after_another_is_put_off_by_its_pace_then_runs() -> None:
    reconciler = pool(ProviderSettings(pool_pace=4.0))
    first = await reconciler.reconcile(POOL)
    assert first == Requeue(ProviderSettings().resync_seconds)  # a pass: the next at the resync
    # the pass took some time t: the next is put off for up to 4t, not run
    now = time.monotonic()
    reconciler.pacer.record(started=now - 0.05, ended=now)
    again = await reconciler.reconcile(POOL)
    assert isinstance(again, Requeue) and 0 < again.after <= 0.2
    reconciler.pacer.record(started=0.0, ended=0.0)  # long ago
    assert await reconciler.reconcile(POOL) == Requeue(ProviderSettings().resync_seconds)


async def test_pace_zero_runs_every_pass_asked_for() -> None:
    reconciler = pool(ProviderSettings(pool_pace=0.0))
    for _ in range(3):
        assert await reconciler.reconcile(POOL) == Requeue(ProviderSettings().resync_seconds)
