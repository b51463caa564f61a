"""``python -m vk --virtual-node NS/NAME``: a virtual kubelet configured by a VirtualNode object
and the kubeconfig Secret it names, as the peering's VirtualNode controller will run it."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from hack.localcluster import LocalCluster
from kube.api import VirtualKubeletExit
from kube.clients import KubeClient
from kube.errors import NotFound
from kube.objects import NAMESPACES, NODES, PODS, SECRETS, RawObject
from peering.crds import ensure_crds
from vk.app import VIRTUALNODES
from vk.forge.labels import VIRTUAL_NODE_TAINT_KEY, owner_selector

from .conftest import NamespaceFactory
from .kubeconfigs import embedded_kubeconfig
from .waiting import condition, wait_for, wait_for_deletion

pytestmark = pytest.mark.integration

H100 = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}


async def wait_exit(proc: asyncio.subprocess.Process, timeout: float) -> int:
    try:
        return await asyncio.wait_for(proc.wait(), timeout)
    except TimeoutError:
        raise AssertionError(f"the virtual kubelet did not exit within {timeout}s") from None


async def test_a_virtual_node_object_drives_the_virtual_kubelet(
    consumer: LocalCluster,
    provider: LocalCluster,
    consumer_client: KubeClient,
    provider_client: KubeClient,
    make_namespace: NamespaceFactory,
    tmp_path: Path,
) -> None:
    await ensure_crds(consumer_client)
    system = await make_namespace(consumer_client)
    suffix = uuid.uuid4().hex[:6]
    consumer_id, provider_id = f"cons-{suffix}", f"farm-{suffix}"
    node = f"gpuferry-{provider_id}"
    await consumer_client.create(
        SECRETS,
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "farm-kubeconfig"},
            "data": {"kubeconfig": base64.b64encode(embedded_kubeconfig(provider.spec.kubeconfig)).decode()},
        },
        system,
    )
    vn: RawObject = {
        "apiVersion": VIRTUALNODES.api_version,
        "kind": VIRTUALNODES.kind,
        "metadata": {"name": provider_id},
        "spec": {
            "providerClusterID": provider_id,
            "consumerClusterID": consumer_id,
            "nodeName": node,
            "resources": {"nvidia.com/gpu": 8, "cpu": "64", "memory": "512Gi", "pods": "110"},
            "providerNodeSelector": H100,
            "kubeconfigSecretRef": {"name": "farm-kubeconfig"},
        },
    }
    await consumer_client.create(VIRTUALNODES, vn, system)
    args = [sys.executable, "-m", "vk", "--virtual-node", f"{system}/{provider_id}",
            "--consumer-kubeconfig", str(consumer.spec.kubeconfig)]  # fmt: skip
    log = (tmp_path / "vk.log").open("wb")
    proc = await asyncio.create_subprocess_exec(*args, stdout=log, stderr=subprocess.STDOUT)
    try:
        registered = await wait_for(
            consumer_client,
            NODES,
            node,
            lambda n: (condition(n, "Ready") or {}).get("status") == "True",
            timeout=60,
        )
        assert registered["status"]["capacity"]["nvidia.com/gpu"] == "8"
        assert registered["metadata"]["labels"]["gpuferry.io/provider"] == provider_id

        # a pod runs through it, as a twin in <ns>-<consumerClusterID> on the granted nodes
        ns = await make_namespace(consumer_client)
        pod: RawObject = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "train"},
            "spec": {
                "containers": [
                    {"name": "c", "image": "cuda", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
                ],
                "nodeSelector": {"kubernetes.io/hostname": node},
                "tolerations": [{"key": VIRTUAL_NODE_TAINT_KEY, "operator": "Exists"}],
            },
        }
        await consumer_client.create(PODS, pod, ns)
        await wait_for(consumer_client, PODS, "train", lambda p: p["status"].get("phase") == "Running",
                       namespace=ns, timeout=60)  # fmt: skip
        twin = await provider_client.get(PODS, "train", f"{ns}-{consumer_id}")
        assert twin["spec"]["nodeSelector"] == H100

        # the grant changes: the running process advertises it
        await consumer_client.patch(
            VIRTUALNODES, provider_id, {"spec": {"resources": {"nvidia.com/gpu": 16}}}, system
        )
        await wait_for(consumer_client, NODES, node,
                       lambda n: n["status"]["capacity"]["nvidia.com/gpu"] == "16", timeout=60)  # fmt: skip
        assert proc.returncode is None

        # where twins go changes (read once, at start): the process ends with "run me again"
        await consumer_client.patch(
            VIRTUALNODES, provider_id, {"spec": {"providerNodeSelector": {**H100, "pool": "b"}}}, system
        )
        assert await wait_exit(proc, 30) == VirtualKubeletExit.CHANGED

        # started again, it follows the next grant
        proc = await asyncio.create_subprocess_exec(*args, stdout=log, stderr=subprocess.STDOUT)
        await consumer_client.patch(
            VIRTUALNODES, provider_id, {"spec": {"resources": {"nvidia.com/gpu": 24}}}, system
        )
        await wait_for(consumer_client, NODES, node,
                       lambda n: n["status"]["capacity"]["nvidia.com/gpu"] == "24", timeout=60)  # fmt: skip

        # the VirtualNode is deleted: the node goes, the process ends cleanly
        await consumer_client.delete(VIRTUALNODES, provider_id, system)
        assert await wait_exit(proc, 30) == 0
        await wait_for_deletion(consumer_client, NODES, node, None, timeout=10)
    except BaseException:
        log.flush()
        print((tmp_path / "vk.log").read_text(errors="replace")[-6000:])
        raise
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        log.close()
        with contextlib.suppress(NotFound):
            await consumer_client.delete(NODES, node)
        for twin_ns in (await provider_client.list(NAMESPACES, label_selector=owner_selector(consumer_id)))[
            "items"
        ]:
            await provider_client.delete(NAMESPACES, twin_ns["metadata"]["name"])


async def test_a_virtual_node_without_its_secret_is_a_clear_error(
    consumer: LocalCluster, consumer_client: KubeClient, make_namespace: NamespaceFactory
) -> None:
    await ensure_crds(consumer_client)
    system = await make_namespace(consumer_client)
    vn = {
        "apiVersion": VIRTUALNODES.api_version,
        "kind": VIRTUALNODES.kind,
        "metadata": {"name": "lonely"},
        "spec": {
            "providerClusterID": "lonely",
            "consumerClusterID": "me",
            "nodeName": "gpuferry-lonely",
            "resources": {"nvidia.com/gpu": 1},
            "kubeconfigSecretRef": {"name": "missing"},
        },
    }
    await consumer_client.create(VIRTUALNODES, vn, system)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "vk", "--virtual-node", f"{system}/lonely",
        "--consumer-kubeconfig", str(consumer.spec.kubeconfig),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    output = (await asyncio.wait_for(proc.communicate(), 60))[0].decode()
    assert proc.returncode == 2
    assert f"VirtualNode {system}/lonely: kubeconfig Secret 'missing' not found" in output
    assert "Traceback" not in output
