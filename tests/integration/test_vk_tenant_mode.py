"""The virtual kubelet with a scoped identity ("tenant mode"): twin namespaces come from the
tenant's NamespaceOffloading requests, room from its GPUSlice's per-node grant, and nothing is
listed cluster-wide or created outside the twin namespaces.

The provider side's objects are written here as the provider controller writes them (its own
tests cover how it decides); the identity the kubelet uses is a real client certificate signed
by the provider's CSR API and bound by RBAC to the tenant and twin namespaces only, so any
cluster-wide list or namespace creation would fail with 403.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from hack.localcluster import LocalCluster
from kube.clients import KubeClient
from kube.errors import NotFound
from kube.metrics import REGISTRY
from kube.objects import CSRS, EVENTS, GPUSLICES, NAMESPACES, NODES, PODS, ROLEBINDINGS, ROLES, RawObject
from peering.crds import ensure_crds
from vk.app import run
from vk.forge.labels import VIRTUAL_NODE_TAINT_KEY
from vk.reflection.twins import NAMESPACEOFFLOADINGS
from vk.settings import VirtualKubeletSettings

from .conftest import NamespaceFactory
from .stopping import stop
from .waiting import condition, wait_for

pytestmark = pytest.mark.integration

H100 = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}


async def issue_identity(provider: KubeClient, user: str, directory: Path, server: str, ca: Path) -> Path:
    """A client certificate for ``user`` from the provider's CSR API, as a kubeconfig file."""
    key = ec.generate_private_key(ec.SECP256R1())
    csr = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, user)]))
        .sign(key, hashes.SHA256())
    )
    name = f"tenant-test-{uuid.uuid4().hex[:6]}"
    await provider.create(
        CSRS,
        {
            "apiVersion": "certificates.k8s.io/v1",
            "kind": "CertificateSigningRequest",
            "metadata": {"name": name},
            "spec": {
                "request": base64.b64encode(csr.public_bytes(serialization.Encoding.PEM)).decode(),
                "signerName": "kubernetes.io/kube-apiserver-client",
                "usages": ["client auth"],
            },
        },
    )
    approval = {"type": "Approved", "status": "True", "reason": "Test", "message": "tenant-mode test"}
    await provider.patch(CSRS, name, {"status": {"conditions": [approval]}}, subresource="approval")
    issued = await wait_for(provider, CSRS, name, lambda c: bool((c.get("status") or {}).get("certificate")))
    await provider.delete(CSRS, name)
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "p", "cluster": {"server": server, "certificate-authority": str(ca)}}],
        "users": [
            {
                "name": user,
                "user": {
                    "client-certificate-data": issued["status"]["certificate"],
                    "client-key-data": base64.b64encode(
                        key.private_bytes(
                            serialization.Encoding.PEM,
                            serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption(),
                        )
                    ).decode(),
                },
            }
        ],
        "contexts": [{"name": "p", "context": {"cluster": "p", "user": user}}],
        "current-context": "p",
    }
    path = directory / "tenant.kubeconfig"
    path.write_text(yaml.safe_dump(config))
    return path


async def bind(provider: KubeClient, namespace: str, user: str, rules: list[dict[str, Any]]) -> None:
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "tenant"},
            "rules": rules}  # fmt: skip
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": "tenant"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "tenant"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
    }
    await provider.create(ROLES, role, namespace)
    await provider.create(ROLEBINDINGS, binding, namespace)


RO = ["get", "list", "watch"]
TENANT_RULES = [
    {"apiGroups": ["sharing.gpuferry.io"], "resources": ["gpuslices"], "verbs": ["get", "list", "watch"]},
    {  # patch: the virtual kubelet reports on its request what pods wait for (quota, a block)
        "apiGroups": ["offloading.gpuferry.io"],
        "resources": ["namespaceoffloadings"],
        "verbs": ["get", "list", "watch", "patch"],
    },
    # the provider's PeerNetwork for the consumer: where the provider reaches consumer pods
    {"apiGroups": ["net.gpuferry.io"], "resources": ["peernetworks"], "verbs": [*RO, "patch"]},
]
RW = ["get", "list", "watch", "create", "update", "patch", "delete"]
TWIN_RULES = [  # as the provider controller binds them in twin namespaces (pods, copies, tokens)
    {"apiGroups": [""], "resources": ["pods"], "verbs": RW},
    {"apiGroups": [""], "resources": ["configmaps", "secrets"], "verbs": RW},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["get", "list", "watch"]},
]


@pytest.fixture
async def tenant(
    provider: LocalCluster, provider_client: KubeClient, tmp_path: Path
) -> AsyncIterator[dict[str, Any]]:
    await ensure_crds(provider_client)
    consumer_id = f"t{uuid.uuid4().hex[:6]}"
    user = f"gpuferry:consumer:{consumer_id}"
    tenant_ns = f"gpuferry-tenant-{consumer_id}"
    await provider_client.create(
        NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": tenant_ns}}
    )
    await bind(provider_client, tenant_ns, user, TENANT_RULES)
    kubeconfig = await issue_identity(
        provider_client, user, tmp_path, provider.spec.server, provider.spec.pki_dir / "ca.crt"
    )
    try:
        yield {"id": consumer_id, "user": user, "ns": tenant_ns, "kubeconfig": kubeconfig}
    finally:
        for ns in (await provider_client.list(NAMESPACES, label_selector=f"test-tenant={consumer_id}"))[
            "items"
        ]:
            await provider_client.delete(NAMESPACES, ns["metadata"]["name"])
        await provider_client.delete(NAMESPACES, tenant_ns)


async def grant(provider: KubeClient, tenant: dict[str, Any], per_node: dict[str, int]) -> None:
    """A GPUSlice decided as the provider controller decides one: per-node grant in its status."""
    body = {
        "apiVersion": GPUSLICES.api_version,
        "kind": GPUSLICES.kind,
        "metadata": {"name": "slice"},
        "spec": {"consumerClusterID": tenant["id"], "resources": {"nvidia.com/gpu": sum(per_node.values())},
                 "nodeSelector": H100},
    }  # fmt: skip
    with contextlib.suppress(Exception):
        await provider.create(GPUSLICES, body, tenant["ns"])
    status = {
        "phase": "Granted",
        "granted": {"nvidia.com/gpu": str(sum(per_node.values()))},
        "shape": {
            "largest": {"nvidia.com/gpu": str(max(per_node.values()))},
            "nodes": [{"name": n, "free": {"nvidia.com/gpu": str(g), "cpu": "8", "memory": "64Gi",
                                           "pods": "20"}}
                      for n, g in per_node.items()],
        },
        "labels": H100,
    }  # fmt: skip
    await provider.patch(GPUSLICES, "slice", {"status": status}, tenant["ns"], subresource="status")


async def offload_twin(provider: KubeClient, tenant: dict[str, Any], origin: str) -> str:
    """The twin namespace as the provider controller makes it, and the request marked Ready."""
    twin = f"{origin}-{tenant['id']}"
    await provider.create(
        NAMESPACES,
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": twin, "labels": {"test-tenant": tenant["id"]}},
        },
    )
    await bind(provider, twin, tenant["user"], TWIN_RULES)
    request = {
        "apiVersion": NAMESPACEOFFLOADINGS.api_version,
        "kind": NAMESPACEOFFLOADINGS.kind,
        "metadata": {"name": origin},
        "spec": {"originNamespace": origin},
    }
    await provider.create(NAMESPACEOFFLOADINGS, request, tenant["ns"])
    await provider.patch(
        NAMESPACEOFFLOADINGS, origin, {"status": {"phase": "Ready", "remoteNamespace": twin}},
        tenant["ns"], subresource="status",
    )  # fmt: skip
    return twin


def gpu_pod(name: str, node: str, gpus: int) -> RawObject:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "containers": [
                {"name": "c", "image": "cuda", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}
            ],
            "nodeSelector": {"kubernetes.io/hostname": node},
            "tolerations": [{"key": VIRTUAL_NODE_TAINT_KEY, "operator": "Exists"}],
            "terminationGracePeriodSeconds": 0,
        },
    }


def forbidden() -> float:
    return sum(
        REGISTRY.get_sample_value("gpuferry_api_errors_total", {"verb": verb, "error": "Forbidden"}) or 0.0
        for verb in ("get", "create", "update", "patch", "delete", "watch", "stream")
    )


def reason_is(reason: str) -> Any:
    return lambda p: (p.get("status") or {}).get("reason") == reason


async def test_a_scoped_identity_runs_pods_in_granted_twin_namespaces_only(
    consumer: LocalCluster,
    provider: LocalCluster,
    consumer_client: KubeClient,
    provider_client: KubeClient,
    make_namespace: NamespaceFactory,
    tenant: dict[str, Any],
) -> None:
    h100 = sorted(
        n["metadata"]["name"]
        for n in (
            await provider_client.list(NODES, label_selector="nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3")
        )["items"]
    )
    await grant(provider_client, tenant, {h100[0]: 2, h100[1]: 2})
    settings = VirtualKubeletSettings(
        consumer_kubeconfig=consumer.spec.kubeconfig,
        provider_kubeconfig=tenant["kubeconfig"],
        consumer_cluster_id=tenant["id"],
        provider_cluster_id=f"p{tenant['id']}",
        resources={"nvidia.com/gpu": "8", "cpu": "16", "memory": "128Gi", "pods": "40"},
        provider_node_selector=H100,
        tenant_namespace=tenant["ns"],
        slice_name="slice",
        heartbeat_seconds=2,
        provider_probe_seconds=1,
    )
    node = settings.effective_node_name
    forbidden_before = forbidden()
    task = asyncio.create_task(run(settings))
    try:
        registered = await wait_for(
            consumer_client,
            NODES,
            node,
            lambda n: (condition(n, "Ready") or {}).get("status") == "True",
            timeout=60,
        )
        # the largest block comes from the per-node grant: 2, although the node shows 8
        block = "gpuferry.io/largest-gpu-block"
        await wait_for(consumer_client, NODES, node, lambda n: n["metadata"]["labels"].get(block) == "2")
        assert registered["status"]["capacity"]["nvidia.com/gpu"] == "8"

        ns = await make_namespace(consumer_client)
        # not offloaded yet: the pod waits with a reason, no twin is attempted
        await consumer_client.create(PODS, gpu_pod("early", node, 1), ns)
        await wait_for(
            consumer_client, PODS, "early", reason_is("NamespaceNotOffloaded"), namespace=ns, timeout=30
        )

        twin_ns = await offload_twin(provider_client, tenant, ns)
        await wait_for(consumer_client, PODS, "early", lambda p: p["status"].get("phase") == "Running",
                       namespace=ns, timeout=30)  # fmt: skip
        twin = await provider_client.get(PODS, "early", twin_ns)
        assert twin["spec"]["nodeName"] in h100, "the grant's node selector keeps twins on H100 nodes"

        # 4 GPUs in one pod do not fit in any node's grant of 2
        await consumer_client.create(PODS, gpu_pod("big", node, 4), ns)
        big = await wait_for(
            consumer_client, PODS, "big", reason_is("ProviderCapacity"), namespace=ns, timeout=30
        )
        assert "largest free block on any provider node is 2" in big["status"]["message"]
        # and it says so to the provider, whose pool may place the grant anew for it
        waiting = "gpuferry.io/waiting-block"
        request = await wait_for(provider_client, NAMESPACEOFFLOADINGS, ns,
                                 lambda r: waiting in (r["metadata"].get("annotations") or {}),
                                 namespace=tenant["ns"], timeout=10)  # fmt: skip
        assert json.loads(request["metadata"]["annotations"][waiting])["nvidia.com/gpu"] == "4"

        # the grant grows on one node: the gated pod goes without waiting for a timer
        await grant(provider_client, tenant, {h100[0]: 2, h100[1]: 2, h100[2]: 4})
        await wait_for(consumer_client, PODS, "big", lambda p: p["status"].get("phase") == "Running",
                       namespace=ns, timeout=25)  # fmt: skip
        assert not task.done()
        await wait_for(provider_client, NAMESPACEOFFLOADINGS, ns,
                       lambda r: waiting not in (r["metadata"].get("annotations") or {}),
                       namespace=tenant["ns"], timeout=10)  # fmt: skip
        # nothing it did needed more than the tenant's rights: no request was refused
        assert forbidden() == forbidden_before

        # a pod the provider's admission refuses (Pod Security baseline on the twin namespace, as
        # the provider controller labels it): it fails on the consumer in the provider's words
        await provider_client.patch(NAMESPACES, twin_ns, {"metadata": {"labels": {
            "pod-security.kubernetes.io/enforce": "baseline"}}})  # fmt: skip
        root = gpu_pod("root", node, 1)
        root["spec"]["containers"][0]["securityContext"] = {"privileged": True}
        await consumer_client.create(PODS, root, ns)
        refused = await wait_for(consumer_client, PODS, "root", reason_is("ProviderRejected"),
                                 namespace=ns, timeout=30)  # fmt: skip
        assert refused["status"]["phase"] == "Failed"
        assert "violates PodSecurity" in refused["status"]["message"], refused["status"]
        assert "privileged" in refused["status"]["message"]
        events = (await consumer_client.list(EVENTS, namespace=ns,
                                             field_selector="involvedObject.name=root"))["items"]  # fmt: skip
        assert [e["reason"] for e in events].count("ProviderRejected") == 1, events
        with contextlib.suppress(NotFound):
            await provider_client.get(PODS, "root", twin_ns)
            raise AssertionError("no twin was made of a refused pod")
    finally:
        await stop(task)
        with contextlib.suppress(NotFound):
            await consumer_client.delete(NODES, node)
