"""What asks the provider's GPU pool for a pass: a change of what it reads, not every event."""

from __future__ import annotations

import asyncio
from typing import Any

from kube.clients import KubeClient
from kube.informers import Informer
from kube.kubeconfigs import Connection
from kube.manager import Controller
from kube.objects import NODES, PODS, RESOURCECLAIMS
from kube.watching import WatchEvent
from peering.provider.app import build_provider
from peering.provider.settings import ProviderSettings
from peering.provider.slices import POOL


def gpu_node(heartbeat: str, ready: str = "True", gpus: str = "8") -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "gpu-0", "uid": "u-0", "resourceVersion": heartbeat,
                     "labels": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}},
        "status": {"allocatable": {"nvidia.com/gpu": gpus},
                   "conditions": [{"type": "Ready", "status": ready, "lastHeartbeatTime": heartbeat}]},
    }  # fmt: skip


def pod(phase: str, condition: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "train", "namespace": "ml", "uid": "p-0", "resourceVersion": condition},
        "spec": {"nodeName": "gpu-0",
                 "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
        "status": {"phase": phase, "conditions": [{"type": "Ready", "status": condition}]},
    }  # fmt: skip


async def test_a_pass_follows_what_the_pool_reads_and_not_a_heartbeat() -> None:
    settings = ProviderSettings(pool_pod_batch=0.1)  # a pod's change as soon as a node's
    manager = build_provider(KubeClient(Connection(server="https://127.0.0.1:1")), settings=settings)
    (pool,) = [c for c in manager.controllers if c.name == "pool"]
    informers: dict[object, Informer] = {i.resource: i for i in pool.informers}

    async def asked(resource: object, event: WatchEvent) -> bool:
        informers[resource].receive(event)
        await asyncio.sleep(0.15)  # changes are batched for 0.1 s
        if POOL not in pool.queue.pending:
            return False
        await take(pool)
        return True

    assert await asked(NODES, WatchEvent("ADDED", gpu_node("t1")))
    assert not await asked(NODES, WatchEvent("MODIFIED", gpu_node("t2"))), "a heartbeat"
    assert await asked(NODES, WatchEvent("MODIFIED", gpu_node("t3", ready="False")))
    assert await asked(NODES, WatchEvent("MODIFIED", gpu_node("t4", ready="False", gpus="4")))
    assert await asked(PODS, WatchEvent("ADDED", pod("Pending", "False")))
    assert not await asked(PODS, WatchEvent("MODIFIED", pod("Pending", "True"))), "a condition"
    assert await asked(PODS, WatchEvent("MODIFIED", pod("Running", "True")))
    assert await asked(PODS, WatchEvent("DELETED", pod("Running", "True")))


async def take(controller: Controller) -> None:
    key = await controller.queue.get()
    controller.queue.done(key)


async def test_pod_changes_come_to_one_pass_after_the_pod_batch_a_nodes_at_once() -> None:
    settings = ProviderSettings(pool_pod_batch=0.4)
    manager = build_provider(KubeClient(Connection(server="https://127.0.0.1:1")), settings=settings)
    (pool,) = [c for c in manager.controllers if c.name == "pool"]
    informers: dict[object, Informer] = {i.resource: i for i in pool.informers}
    started = asyncio.get_running_loop().time()
    informers[PODS].receive(WatchEvent("ADDED", pod("Pending", "False")))
    await asyncio.sleep(0.15)
    informers[PODS].receive(WatchEvent("MODIFIED", pod("Running", "True")))
    assert POOL in pool.queue.pending and POOL not in pool.queue._dirty, "not due yet"
    await take(pool)  # one pass for both, when the batch is up
    assert asyncio.get_running_loop().time() - started >= 0.4
    assert POOL not in pool.queue.pending

    started = asyncio.get_running_loop().time()
    informers[PODS].receive(WatchEvent("DELETED", pod("Running", "True")))
    informers[NODES].receive(WatchEvent("ADDED", gpu_node("t1")))
    await take(pool)  # the node's change brings the pass forward, the pod's counted in it
    assert asyncio.get_running_loop().time() - started < 0.3
    await asyncio.sleep(0.5)
    assert POOL not in pool.queue.pending, "the pod's later add was dropped for the earlier one"


async def test_a_claims_change_is_batched_as_a_pods_is() -> None:
    settings = ProviderSettings(pool_pod_batch=0.4)
    manager = build_provider(KubeClient(Connection(server="https://127.0.0.1:1")), settings=settings)
    (pool,) = [c for c in manager.controllers if c.name == "pool"]
    informers: dict[object, Informer] = {i.resource: i for i in pool.informers}
    metadata = {"name": "gpu", "namespace": "ml", "uid": "c-0", "resourceVersion": "1"}
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": metadata}
    started = asyncio.get_running_loop().time()
    informers[RESOURCECLAIMS].receive(WatchEvent("ADDED", claim))
    await asyncio.sleep(0.15)
    assert POOL in pool.queue.pending and POOL not in pool.queue._dirty, "not due yet"
    await take(pool)
    assert asyncio.get_running_loop().time() - started >= 0.4
