"""The consumer agent's per-VirtualNode followers (grant, gateway keys) outlive what is missing on
the provider for a while (a CRD not installed yet, an object not made yet: real 404s) and end only
when their VirtualNode goes."""

from __future__ import annotations

import asyncio
import base64
from typing import Any

from hack.localcluster import LocalCluster
from kube.clients import KubeClient
from kube.objects import SECRETS, VIRTUALNODES, ObjectKey, Resource
from peering.consumer.grants import PerVirtualNode
from peering.crds import ensure_crds

from .conftest import NamespaceFactory

#: A resource no provider serves: every request for it is a real 404 from the API server.
MISSING = Resource("notinstalled.gpuferry.io", "v1", "widgets", "Widget", namespaced=True)


class Probe(PerVirtualNode):
    task_name = "probe_missing_crd"

    def __init__(self, consumer: KubeClient, namespace: str) -> None:
        super().__init__(consumer, namespace)
        self.attempts = 0
        self.retried = asyncio.Event()

    async def follow(self, key: ObjectKey, spec: dict[str, Any], tenant: KubeClient, log: Any) -> None:
        self.attempts += 1
        if self.attempts == 3:  # retried with backoff (0.5 s, 1 s, …), not given up
            self.retried.set()
        await tenant.list(MISSING, spec["tenantNamespace"])


async def test_a_follower_retries_a_missing_crd_and_ends_with_its_virtual_node(
    provider: LocalCluster, consumer_client: KubeClient, make_namespace: NamespaceFactory
) -> None:
    await ensure_crds(consumer_client)
    ns = await make_namespace(consumer_client)
    kubeconfig = base64.b64encode(provider.spec.kubeconfig.read_bytes()).decode()
    await consumer_client.create(SECRETS, {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "id"},
                                           "data": {"kubeconfig": kubeconfig}}, ns)  # fmt: skip
    vn = {
        "apiVersion": VIRTUALNODES.api_version,
        "kind": VIRTUALNODES.kind,
        "metadata": {"name": "farm"},
        "spec": {"providerClusterID": "farm", "consumerClusterID": "eu", "nodeName": "gpuferry-farm",
                 "sliceName": "s", "tenantNamespace": "gpuferry-tenant-eu",
                 "resources": {"nvidia.com/gpu": 1},
                 "kubeconfigSecretRef": {"name": "id", "key": "kubeconfig"}},
    }  # fmt: skip
    await consumer_client.create(VIRTUALNODES, vn, ns)
    probe = Probe(consumer_client, ns)
    runner = asyncio.create_task(probe.run())
    try:
        await asyncio.wait_for(probe.retried.wait(), 30)
        (task,) = probe.tasks.values()
        assert not task.done()
        await consumer_client.delete(VIRTUALNODES, "farm", ns)
        # the VirtualNode's deletion ends its follower
        await asyncio.wait_for(asyncio.gather(task, return_exceptions=True), 30)
        assert task.cancelled() and not probe.tasks
    finally:
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)
