"""The virtual Node on the real clusters: registration, GPU labels, the largest block, the Lease,
readiness as the consumer's node lifecycle controller sees it, and a provider outage.

The shared provider API server is never stopped: the outage goes through a TCP relay of the
test's own (TLS passes through it untouched; the server's certificate names 127.0.0.1), which
the test closes and reopens on the same port.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson
import pytest

from hack.localcluster import LocalCluster
from kube.clients import KubeClient
from kube.errors import NotFound
from kube.objects import LEASES, NODES, PODS, RawObject
from vk.forge.fit import largest_blocks
from vk.forge.node import LARGEST_BLOCK_ANNOTATION, LARGEST_GPU_BLOCK_LABEL, node_shape
from vk.node.controller import NodeController
from vk.node.lease import LEASE_NAMESPACE
from vk.settings import VirtualKubeletSettings

from .conftest import NamespaceFactory
from .relay import Relay, kubeconfig_via
from .waiting import condition, wait_for, wait_for_deletion

pytestmark = pytest.mark.integration

H100 = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
GRANT = {
    "nvidia.com/gpu": "8",
    "cpu": "96",
    "memory": "1Ti",
    "pods": "110",
    "nvidia.com/mig-1g.10gb": "7",
    "cnvrg.io/metagpu": "400",
}
LIFECYCLE = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")


def make_settings(
    consumer: LocalCluster, provider_kubeconfig: Path, **overrides: Any
) -> VirtualKubeletSettings:
    suffix = uuid.uuid4().hex[:6]
    values: dict[str, Any] = {
        "consumer_kubeconfig": consumer.spec.kubeconfig,
        "provider_kubeconfig": provider_kubeconfig,
        "consumer_cluster_id": f"cons-{suffix}",
        "provider_cluster_id": f"nodetest-{suffix}",
        "resources": GRANT,
        "provider_node_selector": H100,
        "heartbeat_seconds": 1.0,
        "status_seconds": 5.0,
        "provider_probe_seconds": 0.5,
    }
    values.update(overrides)
    return VirtualKubeletSettings(**values)


@contextlib.asynccontextmanager
async def running(settings: VirtualKubeletSettings, *, cleanup: bool = True) -> AsyncIterator[NodeController]:
    """A NodeController running as a task; the Node and its Lease are deleted afterwards."""
    consumer = KubeClient.from_kubeconfig(settings.consumer_kubeconfig or "")
    provider = KubeClient.from_kubeconfig(settings.provider_kubeconfig)
    async with consumer, provider:
        controller = NodeController(consumer=consumer, provider=provider, settings=settings)
        task = asyncio.create_task(controller.run(), name=f"node {settings.effective_node_name}")
        try:
            yield controller
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            if cleanup:
                with contextlib.suppress(NotFound):
                    await consumer.delete(NODES, settings.effective_node_name)
                with contextlib.suppress(NotFound):
                    await consumer.delete(LEASES, settings.effective_node_name, LEASE_NAMESPACE)


def ready(node: RawObject) -> dict[str, Any]:
    return condition(node, "Ready") or {}


def lifecycle_taints(node: RawObject) -> list[dict[str, Any]]:
    return [t for t in (node.get("spec") or {}).get("taints") or [] if t["key"] in LIFECYCLE]


def schedulable(node: RawObject) -> bool:
    """Ready, the node lifecycle controller's not-ready taint lifted, and ours for an unreachable
    provider too."""
    taints = (node.get("spec") or {}).get("taints") or []
    return ready(node).get("status") == "True" and not lifecycle_taints(node) and not [
        t for t in taints if t["key"] == "gpuferry.io/provider-unreachable"
    ]


def label(name: str, value: str | None) -> Callable[[RawObject], bool]:
    return lambda node: (node["metadata"].get("labels") or {}).get(name) == value


def renew_time(lease: RawObject) -> datetime:
    return datetime.fromisoformat(lease["spec"]["renewTime"].replace("Z", "+00:00"))


async def expected_gpu_block(provider_client: KubeClient, selector: dict[str, str]) -> str:
    nodes = (await provider_client.list(NODES))["items"]
    pods = (await provider_client.list(PODS))["items"]
    return node_shape(largest_blocks(nodes, pods, selector=selector), GRANT)["nvidia.com/gpu"]


async def test_node_registers_ready_with_grant_labels_block_and_lease(
    consumer: LocalCluster, provider: LocalCluster, consumer_client: KubeClient, provider_client: KubeClient
) -> None:
    settings = make_settings(consumer, provider.spec.kubeconfig)
    name = settings.effective_node_name
    async with running(settings, cleanup=False):  # the second run below adopts the Node
        node = await wait_for(consumer_client, NODES, name, schedulable, timeout=60)
        assert node["status"]["capacity"] == GRANT
        assert node["status"]["allocatable"] == GRANT
        labels = node["metadata"]["labels"]
        assert labels["type"] == "virtual-kubelet"
        assert labels["kubernetes.io/role"] == "agent"
        assert labels["kubernetes.io/hostname"] == name
        assert labels["gpuferry.io/provider"] == settings.provider_cluster_id
        assert labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
        assert labels["nvidia.com/gpu.family"] == "hopper"
        assert labels["nvidia.com/gpu.memory"] == "81559"
        assert labels["nvidia.com/gpu.compute.major"] == "9"
        assert labels["nvidia.com/mig.capable"] == "true"
        assert labels["nvidia.com/gpu.count"] == "8"
        assert "nvidia.com/gpu.present" not in labels
        assert {"key": "virtual-node.gpuferry.io/not-allowed", "value": "true", "effect": "NoExecute"} in [
            {k: t.get(k) for k in ("key", "value", "effect")} for t in node["spec"]["taints"]
        ]
        assert ready(node)["reason"] == "ProviderReachable"
        assert (condition(node, "ProviderReachable") or {}).get("status") == "True"
        info = node["status"]["nodeInfo"]
        assert info["kubeletVersion"].startswith("v1.") and info["kubeletVersion"].endswith("-gpuferry")
        assert info["containerRuntimeVersion"] == "gpuferry://0.1.0"
        assert node["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"] == settings.kubelet_port
        assert {"type": "InternalIP", "address": settings.node_address} in node["status"]["addresses"]

        # the largest block: what the provider's own listing says one H100 node has free
        block = await expected_gpu_block(provider_client, H100)
        node = await wait_for(consumer_client, NODES, name, label(LARGEST_GPU_BLOCK_LABEL, block))
        shape = orjson.loads(node["metadata"]["annotations"][LARGEST_BLOCK_ANNOTATION])
        assert shape["nvidia.com/gpu"] == block
        assert shape["cnvrg.io/metagpu"] == "0"  # granted, but no provider node has any
        assert set(shape) == set(GRANT)

        # the Lease: held by the node, owned by it, renewed every heartbeat
        lease = await consumer_client.get(LEASES, name, LEASE_NAMESPACE)
        assert lease["spec"]["holderIdentity"] == name
        assert lease["spec"]["leaseDurationSeconds"] == 40
        assert lease["metadata"]["ownerReferences"][0]["uid"] == node["metadata"]["uid"]
        first = renew_time(lease)
        renewed = await wait_for(consumer_client, LEASES, name, lambda ls: renew_time(ls) > first,
                                 namespace=LEASE_NAMESPACE, timeout=10)
        assert renewed["spec"]["holderIdentity"] == name

    # a restart adopts the same Node: same UID, still Ready, Lease renewed again
    uid = node["metadata"]["uid"]
    async with running(settings):
        later = renew_time(await consumer_client.get(LEASES, name, LEASE_NAMESPACE))
        await wait_for(consumer_client, LEASES, name, lambda ls: renew_time(ls) > later,
                       namespace=LEASE_NAMESPACE, timeout=15)
        node = await wait_for(consumer_client, NODES, name, schedulable, timeout=30)
        assert node["metadata"]["uid"] == uid
    await wait_for_deletion(consumer_client, NODES, name, None, timeout=30)
    # the Lease goes with its Node (deleted here, and owned by the Node anyway)
    await wait_for_deletion(consumer_client, LEASES, name, LEASE_NAMESPACE, timeout=30)


async def test_a_retired_node_is_written_no_more(
    consumer: LocalCluster, provider: LocalCluster, consumer_client: KubeClient
) -> None:
    """Once its VirtualNode is gone the kubelet is retired: the peering's controller deletes the
    Node while the process still drains, and neither the status sync nor the Lease brings it
    back (before: a sync in that window registered it again, and it outlived `gpuferry unpeer`)."""
    settings = make_settings(consumer, provider.spec.kubeconfig)
    name = settings.effective_node_name
    async with running(settings) as controller:
        await wait_for(consumer_client, NODES, name, lambda _: True, timeout=60)
        # not retired, a Node deleted behind its back is registered again at the next sync
        await consumer_client.delete(NODES, name)
        controller.apply_grant({**GRANT, "nvidia.com/gpu": "7"}, {})  # a change: sync now
        await wait_for(consumer_client, NODES, name, lambda _: True, timeout=30)
        await wait_for(consumer_client, LEASES, name, lambda _: True, namespace=LEASE_NAMESPACE, timeout=30)
        controller.retire()
        await consumer_client.delete(NODES, name)
        with contextlib.suppress(NotFound):  # the Node owns its Lease: the garbage collector may be first
            await consumer_client.delete(LEASES, name, LEASE_NAMESPACE)
        controller.apply_grant(GRANT, {})  # a change: a sync would come at once
        await asyncio.sleep(3 * settings.heartbeat_seconds + 1.0)  # the Lease renewed every 1 s before
        for resource, namespace in ((NODES, None), (LEASES, LEASE_NAMESPACE)):
            with pytest.raises(NotFound):
                await consumer_client.get(resource, name, namespace)
        assert await controller.sync() is None
        # retired is not stopped: its loops run on (a loop that ended would stop its manager)
        (task,) = [t for t in asyncio.all_tasks() if t.get_name() == f"node {name}"]
        assert not task.done()


async def test_no_product_label_when_products_differ(
    consumer: LocalCluster, provider: LocalCluster, consumer_client: KubeClient
) -> None:
    settings = make_settings(consumer, provider.spec.kubeconfig, provider_node_selector={})
    async with running(settings):
        node = await wait_for(consumer_client, NODES, settings.effective_node_name,
                              lambda n: ready(n).get("status") == "True", timeout=60)
        labels = node["metadata"]["labels"]
        assert "nvidia.com/gpu.product" not in labels  # H100 and L4
        assert "nvidia.com/gpu.family" not in labels
        assert "nvidia.com/mig.capable" not in labels
        assert labels["nvidia.com/cuda.driver-version.major"] == "580"  # the same everywhere
        assert labels["nvidia.com/gpu.count"] == "8"


async def test_largest_block_follows_the_pods_on_the_provider(
    consumer: LocalCluster,
    provider: LocalCluster,
    consumer_client: KubeClient,
    provider_client: KubeClient,
    make_namespace: NamespaceFactory,
) -> None:
    # one provider node, so that a pod placed there moves the block (whatever else runs elsewhere)
    target = "gpu-h100-3"
    selector = {**H100, "kubernetes.io/hostname": target}
    settings = make_settings(consumer, provider.spec.kubeconfig, provider_node_selector=selector)
    name = settings.effective_node_name
    namespace = await make_namespace(provider_client)
    async with running(settings) as controller:
        before = await expected_gpu_block(provider_client, selector)
        await wait_for(consumer_client, NODES, name, label(LARGEST_GPU_BLOCK_LABEL, before), timeout=60)
        taken = min(6, int(before))
        assert taken > 0, f"{target} has no free GPU: another test left pods there"
        pod: RawObject = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "takes-gpus", "namespace": namespace},
            "spec": {
                "nodeName": target,
                "containers": [{
                    "name": "main",
                    "image": "nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04",
                    "resources": {"limits": {"nvidia.com/gpu": str(taken)}, "requests": {"cpu": "100m"}},
                }],
            },
        }
        await provider_client.create(PODS, pod, namespace)
        after = str(int(before) - taken)
        await wait_for(consumer_client, NODES, name, label(LARGEST_GPU_BLOCK_LABEL, after), timeout=15)
        assert controller.largest_block == int(after)
        # the oracle the pod reflector asks: one more GPU than is left does not fit
        too_big: RawObject = {"spec": {"containers": [
            {"name": "c", "resources": {"limits": {"nvidia.com/gpu": str(int(after) + 1)}}}
        ]}}
        result = controller.fit(too_big)
        assert result is not None and not result.ok
        assert result.reason == "ExceedsLargestBlock"
        assert f"largest free block on any provider node is {after}" in result.message
        if int(after) > 0:
            fits = controller.fit({"spec": {"containers": [
                {"name": "c", "resources": {"limits": {"nvidia.com/gpu": after}}}
            ]}})
            assert fits is not None and fits.ok and fits.node == target

        await provider_client.delete(PODS, "takes-gpus", namespace, grace_period_seconds=0)
        await wait_for(consumer_client, NODES, name, label(LARGEST_GPU_BLOCK_LABEL, before), timeout=30)


async def test_unreachable_provider_taints_the_node_no_schedule_and_keeps_the_lease(
    consumer: LocalCluster, provider: LocalCluster, consumer_client: KubeClient, tmp_path: Path
) -> None:
    bad = kubeconfig_via(provider.spec.kubeconfig, "https://127.0.0.1:1", tmp_path)
    settings = make_settings(consumer, bad)
    name = settings.effective_node_name
    async with running(settings) as controller:
        node = await wait_for(consumer_client, NODES, name,
                              lambda n: ready(n).get("reason") == "ProviderUnreachable", timeout=60)
        assert ready(node)["status"] == "True"
        assert "/readyz" in ready(node)["message"]
        assert {"key": "gpuferry.io/provider-unreachable", "value": "true", "effect": "NoSchedule"} in (
            node["spec"]["taints"]
        )
        assert (condition(node, "ProviderReachable") or {}).get("status") == "False"
        assert node["status"]["capacity"] == GRANT
        assert controller.fit({"spec": {"containers": []}}) is None  # nothing known: no gate
        # the virtual kubelet is alive: the Lease is renewed all along
        lease = await wait_for(consumer_client, LEASES, name, lambda _: True, namespace=LEASE_NAMESPACE)
        first = renew_time(lease)
        await wait_for(consumer_client, LEASES, name, lambda ls: renew_time(ls) > first,
                       namespace=LEASE_NAMESPACE, timeout=10)
        # so the node lifecycle controller says neither not-ready nor unreachable
        node = await consumer_client.get(NODES, name)
        assert not [t for t in node["spec"].get("taints") or [] if t["key"].startswith("node.kubernetes.io/")]
        assert ready(node)["status"] == "True"


async def test_provider_outage_and_return(
    consumer: LocalCluster, provider: LocalCluster, consumer_client: KubeClient, tmp_path: Path
) -> None:
    relay = Relay(provider.spec.ports.apiserver)
    await relay.start()
    try:
        via = kubeconfig_via(provider.spec.kubeconfig, f"https://127.0.0.1:{relay.port}", tmp_path)
        settings = make_settings(consumer, via)
        name = settings.effective_node_name
        async with running(settings):
            await wait_for(consumer_client, NODES, name, schedulable, timeout=60)

            await relay.stop()
            node = await wait_for(consumer_client, NODES, name,
                                  lambda n: ready(n).get("reason") == "ProviderUnreachable", timeout=20)
            # still Ready (a live node posting a true status): no not-ready taint for the
            # lifecycle controller to evict by, only ours, NoSchedule
            assert ready(node)["status"] == "True"
            taints = {(t["key"], t["effect"]) for t in node["spec"].get("taints") or []}
            assert ("gpuferry.io/provider-unreachable", "NoSchedule") in taints
            assert not {k for k, _ in taints if k.startswith("node.kubernetes.io/")}, taints
            first = renew_time(await consumer_client.get(LEASES, name, LEASE_NAMESPACE))
            await wait_for(consumer_client, LEASES, name, lambda ls: renew_time(ls) > first,
                           namespace=LEASE_NAMESPACE, timeout=10)

            await relay.start()  # the same port again
            node = await wait_for(consumer_client, NODES, name,
                                  lambda n: schedulable(n) and ready(n)["reason"] == "ProviderReachable",
                                  timeout=45)  # fmt: skip
            assert ready(node)["reason"] == "ProviderReachable"
            assert all(t["key"] != "gpuferry.io/provider-unreachable" for t in node["spec"]["taints"])
    finally:
        await relay.stop()
