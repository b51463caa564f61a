"""Peering authentication and enforcement against the real local clusters.

The provider controller runs in-process (peering.provider.app.run_provider); every check of
what the consumer may do is made with the identity the provider issued, against the real
kube-apiserver (RBAC, Pod Security admission, ResourceQuota admission).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest

from kube.clients import KubeClient
from kube.errors import Forbidden, NotFound, Unauthorized
from kube.objects import CSRS, NAMESPACES, NODES, PODS, RESOURCEQUOTAS, SECRETS, SERVICES, RawObject
from kube.objects import SELFSUBJECTREVIEWS as _SELF_REVIEWS
from peering.crds import ensure_crds
from peering.flow import (
    CONSUMER_NAMESPACE,
    PeeringError,
    establish_tenant,
    identity_secret_name,
    issue_peering_token,
    issued_client,
    request_slice,
    request_twin_namespace,
    teardown,
)
from peering.identity.keys import b64, csr_proof, make_csr, make_private_key, make_token
from peering.provider.app import run_provider
from peering.provider.planning import free_capacity, reservations_of
from peering.provider.settings import ProviderSettings
from peering.resources import GPUSLICES, LABEL_TENANT, TENANTS, tenant_namespace

from .conftest import NamespaceFactory
from .waiting import condition, wait_for, wait_for_deletion

pytestmark = pytest.mark.integration

L4 = {"nvidia.com/gpu.product": "NVIDIA-L4"}
PROVIDER_ID = "dev-provider"


def slice_resources(gpus: int) -> dict[str, str | int]:
    """A slice's resources: GPUs and the cpu, memory and pod slots to use them."""
    return {"nvidia.com/gpu": gpus, "cpu": "4", "memory": "8Gi", "pods": 10}



@pytest.fixture
async def controller(provider_client: KubeClient, consumer_client: KubeClient) -> AsyncIterator[None]:
    await ensure_crds(provider_client)
    task = asyncio.create_task(run_provider(provider_client, settings=ProviderSettings(resync_seconds=30)))
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


@pytest.fixture
async def consumer_id(provider_client: KubeClient, consumer_client: KubeClient) -> AsyncIterator[str]:
    cid = f"c{uuid.uuid4().hex[:6]}"
    yield cid
    await teardown(consumer_client, provider_client, consumer_id=cid, provider_id=PROVIDER_ID)


def pod(name: str, gpus: int = 0, **spec: Any) -> RawObject:
    container: dict[str, Any] = {"name": "main", "image": "busybox"}
    if gpus:
        container["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
    container.update(spec.pop("container", {}))
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [container], "nodeSelector": L4, **spec}}


def restricted_pod(name: str, gpus: int = 0) -> RawObject:
    """A pod that the "restricted" Pod Security level admits."""
    body = pod(name, gpus, securityContext={"runAsNonRoot": True, "runAsUser": 1000,
                                            "seccompProfile": {"type": "RuntimeDefault"}},
               container={"securityContext": {"allowPrivilegeEscalation": False,
                                              "capabilities": {"drop": ["ALL"]}}})
    return body


async def refused(call: Any, *fragments: str) -> str:
    with pytest.raises((Forbidden, Unauthorized)) as info:
        await call
    for fragment in fragments:
        assert fragment in str(info.value), str(info.value)
    return str(info.value)


async def test_issued_identity_is_scoped_and_the_grant_enforced(
    controller: None, provider_client: KubeClient, consumer_client: KubeClient, consumer_id: str,
) -> None:
    issued = await establish_tenant(consumer_client, provider_client, consumer_id=consumer_id,
                                    provider_id=PROVIDER_ID)
    assert issued.username == f"gpuferry:consumer:{consumer_id}" and not issued.already
    again = await establish_tenant(consumer_client, provider_client, consumer_id=consumer_id,
                                   provider_id=PROVIDER_ID)
    assert again.already and again.kubeconfig == issued.kubeconfig
    tns = tenant_namespace(consumer_id)
    tenant = await provider_client.get(TENANTS, consumer_id, tns)
    assert tenant["status"]["identity"]["csrName"].startswith(f"gpuferry-{consumer_id}-")
    # the private key stays on the consumer
    stored = await consumer_client.get(SECRETS, identity_secret_name(PROVIDER_ID), CONSUMER_NAMESPACE)
    assert {"tls.key", "tls.crt", "kubeconfig"} <= set(stored["data"])
    assert stored["data"]["tls.key"] not in str(tenant)

    async with await issued_client(consumer_client, PROVIDER_ID) as me:
        review = await me.create(_SELF_REVIEWS, {"apiVersion": "authentication.k8s.io/v1",
                                                 "kind": "SelfSubjectReview"})
        user = review["status"]["userInfo"]
        assert user["username"] == issued.username and "gpuferry:consumers" in user["groups"]

        # nothing outside the tenant and twin namespaces
        await refused(me.list(SECRETS, "kube-system"), "forbidden")
        await refused(me.list(SECRETS, tns), "forbidden")  # the peering token lives here
        await refused(me.list(SECRETS), "forbidden")
        await refused(me.create(PODS, pod("outside"), "default"), "forbidden")
        await refused(me.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace",
                                             "metadata": {"name": f"{consumer_id}-mine"}}), "forbidden")
        await refused(me.list(TENANTS, "kube-system"), "forbidden")

        granted = await request_slice(me, consumer_id=consumer_id, resources=slice_resources(2),
                                      node_selector=L4)
        assert granted["status"]["phase"] == "Granted", granted["status"]
        assert granted["status"]["granted"] == {"nvidia.com/gpu": "2", "cpu": "4", "memory": "8Gi",
                                                "pods": "10"}
        # the consumer cannot grant itself more
        await refused(me.patch(GPUSLICES, consumer_id, {"status": {"granted": {"nvidia.com/gpu": "64"}}},
                               tns, subresource="status"), "forbidden")

        # a second run of each step finds it done
        again = await request_slice(me, consumer_id=consumer_id, resources=slice_resources(2),
                                    node_selector=L4)
        assert again["status"]["granted"] == granted["status"]["granted"]
        assert again["metadata"]["generation"] == granted["metadata"]["generation"]

        twin_a = await request_twin_namespace(me, consumer_id=consumer_id, origin_namespace="ml-a")
        twin_b = await request_twin_namespace(me, consumer_id=consumer_id, origin_namespace="ml-b")
        assert (twin_a, twin_b) == (f"ml-a-{consumer_id}", f"ml-b-{consumer_id}")
        assert await request_twin_namespace(me, consumer_id=consumer_id, origin_namespace="ml-a") == twin_a
        # Ready means usable: each twin's quota already enforces its share of the grant
        for twin in (twin_a, twin_b):
            quota = await provider_client.get(RESOURCEQUOTAS, "gpuferry-grant", twin)
            assert quota["status"]["hard"]["requests.nvidia.com/gpu"] == "1", (twin, quota["status"])

        # Pod Security admission (baseline) refuses privileged and hostPath pods
        privileged = pod("priv", container={"securityContext": {"privileged": True}})
        await refused(me.create(PODS, privileged, twin_a), "violates PodSecurity", "privileged")
        await refused(me.create(PODS, pod("hostpath", volumes=[
            {"name": "root", "hostPath": {"path": "/"}}]), twin_a), "violates PodSecurity", "hostPath")

        # the grant (2 GPUs) holds across both twin namespaces
        await me.create(PODS, pod("gpu-a1", gpus=1), twin_a)
        await me.create(PODS, pod("gpu-b1", gpus=1), twin_b)
        await refused(me.create(PODS, pod("gpu-a2", gpus=1), twin_a), "exceeded quota")
        await refused(me.create(PODS, pod("gpu-b2", gpus=1), twin_b), "exceeded quota")
        await refused(me.create(PODS, pod("gpu-b3", gpus=2), twin_b), "exceeded quota")
        # twin namespaces open no ports on the provider's nodes
        node_port = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "np"},
                     "spec": {"type": "NodePort", "ports": [{"port": 80}]}}
        await refused(me.create(SERVICES, node_port, twin_a), "exceeded quota", "services.nodeports")
        # a pod without requests gets the LimitRange defaults and counts against cpu and memory
        await refused(me.create(PODS, pod("no-gpu", container={"resources": {"requests": {"cpu": "3"}}}),
                                twin_a), "exceeded quota", "requests.cpu")
        # nor can the consumer raise its own quota
        await refused(me.patch(RESOURCEQUOTAS, "gpuferry-grant",
                               {"spec": {"hard": {"requests.nvidia.com/gpu": "8"}}}, twin_a), "forbidden")

        # finalizers the consumer puts on its own objects must not keep anything behind
        keep = {"metadata": {"finalizers": ["example.com/keep"]}}
        await me.patch(PODS, "gpu-a1", keep, twin_a)
        await me.patch(GPUSLICES, consumer_id, keep, tns)
        removed = await teardown(consumer_client, provider_client, consumer_id=consumer_id,
                                 provider_id=PROVIDER_ID)
        assert f"provider: namespace/{twin_a}" in removed and f"provider: namespace/{tns}" in removed
        # the old certificate no longer opens anything
        await refused(me.list(GPUSLICES, tns))
        await refused(me.list(PODS, twin_a))
        await refused(me.create(PODS, pod("after", gpus=1), twin_b))

    assert await teardown(consumer_client, provider_client, consumer_id=consumer_id,
                          provider_id=PROVIDER_ID) == []
    # teardown returns once the namespaces are gone
    left_ns = await provider_client.list(NAMESPACES, label_selector=f"{LABEL_TENANT}={consumer_id}")
    assert left_ns["items"] == []
    with pytest.raises(NotFound):
        await provider_client.get(NAMESPACES, tns)
    assert (await provider_client.list(CSRS, label_selector=f"{LABEL_TENANT}={consumer_id}"))["items"] == []
    with pytest.raises(NotFound):
        await consumer_client.get(SECRETS, identity_secret_name(PROVIDER_ID), CONSUMER_NAMESPACE)
    for twin in (twin_a, twin_b):
        await wait_for_deletion(provider_client, NAMESPACES, twin, None, timeout=90)


async def test_csr_without_valid_proof_is_never_approved(
    controller: None, provider_client: KubeClient, consumer_client: KubeClient, consumer_id: str,
) -> None:
    tns = tenant_namespace(consumer_id)
    token = await issue_peering_token(provider_client, consumer_id)
    assert await issue_peering_token(provider_client, consumer_id) == token  # kept, not rotated
    csr = make_csr(make_private_key(), f"gpuferry:consumer:{consumer_id}", ("gpuferry:consumers",))
    wrong = csr_proof(make_token(), consumer_id, csr)
    spec = {"consumerClusterID": consumer_id, "csr": b64(csr), "csrProof": wrong,
            "peeringTokenSecretRef": {"name": "peering-token"}}
    await provider_client.create(TENANTS, {"apiVersion": TENANTS.api_version, "kind": "Tenant",
                                           "metadata": {"name": consumer_id, "namespace": tns}, "spec": spec})
    tenant = await wait_for(provider_client, TENANTS, consumer_id,
                            lambda t: (condition(t, "Authenticated") or {}).get("reason") == "InvalidProof",
                            namespace=tns)
    assert condition(tenant, "Authenticated")["status"] == "False"  # type: ignore[index]
    assert "identity" not in tenant["status"]

    # a valid proof for a CSR that asks for more than a consumer identity
    greedy = make_csr(make_private_key(), "system:admin", ("system:masters",))
    await provider_client.patch(TENANTS, consumer_id, {"spec": {
        "csr": b64(greedy), "csrProof": csr_proof(token, consumer_id, greedy)}}, tns)
    tenant = await wait_for(provider_client, TENANTS, consumer_id,
                            lambda t: (condition(t, "Authenticated") or {}).get("reason") == "InvalidCSR",
                            namespace=tns)
    assert "system:admin" in condition(tenant, "Authenticated")["message"]  # type: ignore[index]
    assert (await provider_client.list(CSRS, label_selector=f"{LABEL_TENANT}={consumer_id}"))["items"] == []

    # the right proof for the right CSR is issued
    await provider_client.patch(TENANTS, consumer_id, {"spec": {
        "csr": b64(csr), "csrProof": csr_proof(token, consumer_id, csr)}}, tns)
    await wait_for(provider_client, TENANTS, consumer_id,
                   lambda t: (condition(t, "Authenticated") or {}).get("status") == "True", namespace=tns)


async def test_deleting_the_tenant_revokes_access(
    controller: None, provider_client: KubeClient, consumer_client: KubeClient, consumer_id: str,
    make_namespace: NamespaceFactory,
) -> None:
    first = await establish_tenant(consumer_client, provider_client, consumer_id=consumer_id,
                                   provider_id=PROVIDER_ID, max_twin_namespaces=2)
    tns = tenant_namespace(consumer_id)
    old_csr = (await provider_client.get(TENANTS, consumer_id, tns))["status"]["identity"]["csrName"]
    # renewal: a new key and certificate through the same proof; the old CSR is cleaned up
    renewed = await establish_tenant(consumer_client, provider_client, consumer_id=consumer_id,
                                     provider_id=PROVIDER_ID, max_twin_namespaces=2,
                                     renew_within=timedelta(days=3650))
    assert not renewed.already and renewed.kubeconfig != first.kubeconfig
    new_csr = (await provider_client.get(TENANTS, consumer_id, tns))["status"]["identity"]["csrName"]
    assert new_csr != old_csr
    await wait_for_deletion(provider_client, CSRS, old_csr, None, timeout=30)
    async with await issued_client(consumer_client, PROVIDER_ID) as me:
        twin = await request_twin_namespace(me, consumer_id=consumer_id, origin_namespace="infer")
        await me.list(PODS, twin)
        await me.list(GPUSLICES, tns)
        with pytest.raises(PeeringError, match="kube-public is a reserved namespace"):
            await request_twin_namespace(me, consumer_id=consumer_id, origin_namespace="kube-public",
                                         mapping="SameName", timeout=20)
        taken = await make_namespace(provider_client)
        with pytest.raises(PeeringError, match=f"namespace {taken} exists on the provider"):
            await request_twin_namespace(me, consumer_id=consumer_id, origin_namespace=taken,
                                         mapping="SameName", timeout=20)
        same = await request_twin_namespace(me, consumer_id=consumer_id,
                                            origin_namespace=f"free-{consumer_id}", mapping="SameName")
        assert same == f"free-{consumer_id}"
        with pytest.raises(PeeringError, match="at most 2 twin namespaces"):
            await request_twin_namespace(me, consumer_id=consumer_id, origin_namespace="third", timeout=20)
        await provider_client.delete(TENANTS, consumer_id, tns)
        await wait_for_deletion(provider_client, TENANTS, consumer_id, tns, timeout=60)
        # the API server's authorizer drops the deleted RoleBindings from its cache within moments
        for _ in range(20):
            try:
                await me.list(GPUSLICES, tns)
            except (Forbidden, Unauthorized):
                break
            await asyncio.sleep(0.5)
        await refused(me.list(GPUSLICES, tns), "forbidden")
        await refused(me.list(PODS, twin))
        for name in (twin, same):
            await wait_for_deletion(provider_client, NAMESPACES, name, None, timeout=90)



async def test_quotas_follow_the_grant_and_hold_without_the_controller(
    provider_client: KubeClient, consumer_client: KubeClient, consumer_id: str,
) -> None:
    await ensure_crds(provider_client)
    task = asyncio.create_task(run_provider(provider_client, settings=ProviderSettings(resync_seconds=30)))
    tns = tenant_namespace(consumer_id)
    cordoned: str | None = None
    try:
        await establish_tenant(consumer_client, provider_client, consumer_id=consumer_id,
                               provider_id=PROVIDER_ID, pod_security="restricted")
        async with await issued_client(consumer_client, PROVIDER_ID) as me:
            got = await request_slice(me, consumer_id=consumer_id, resources=slice_resources(4),
                                      node_selector=L4, allow_partial=True)
            assert got["status"]["granted"]["nvidia.com/gpu"] == "4", got["status"]
            twin_a = await request_twin_namespace(me, consumer_id=consumer_id, origin_namespace="train")
            twin_b = await request_twin_namespace(me, consumer_id=consumer_id, origin_namespace="serve")

            def hard(value: str) -> Any:
                return lambda q: (q.get("status") or {}).get("hard", {}).get(
                    "requests.nvidia.com/gpu") == value

            for twin in (twin_a, twin_b):
                await wait_for(provider_client, RESOURCEQUOTAS, "gpuferry-grant", hard("2"), namespace=twin)
            labels = (await provider_client.get(NAMESPACES, twin_a))["metadata"]["labels"]
            assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
            await refused(me.create(PODS, pod("plain", gpus=1), twin_a), "violates PodSecurity",
                          'restricted:latest')
            await me.create(PODS, restricted_pod("a1", gpus=1), twin_a)
            await wait_for(provider_client, PODS, "a1", lambda p: bool(p["spec"].get("nodeName")),
                           namespace=twin_a)
            # the provider loses an L4 node: the grant shrinks to 2, and so do the quotas
            pods_on = {(await provider_client.get(PODS, "a1", twin_a))["spec"]["nodeName"]}
            shape = (await provider_client.get(GPUSLICES, consumer_id, tns))["status"]["shape"]["nodes"]
            cordoned = next(n["name"] for n in shape if n["name"] not in pods_on)
            await provider_client.patch(NODES, cordoned, {"spec": {"unschedulable": True}})
            await wait_for(provider_client, GPUSLICES, consumer_id,
                           lambda s: s["status"]["granted"].get("nvidia.com/gpu") == "2", namespace=tns)
            for twin in (twin_a, twin_b):
                await wait_for(provider_client, RESOURCEQUOTAS, "gpuferry-grant", hard("1"), namespace=twin)
            # with the controller gone, the API server still holds the consumer to its grant
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await refused(me.create(PODS, restricted_pod("a2", gpus=1), twin_a), "exceeded quota")
            await me.create(PODS, restricted_pod("b1", gpus=1), twin_b)
            await refused(me.create(PODS, restricted_pod("b2", gpus=1), twin_b), "exceeded quota")
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        if cordoned:
            await provider_client.patch(NODES, cordoned, {"spec": {"unschedulable": None}})


async def free_l4_gpus(client: KubeClient) -> dict[str, int]:
    """Free L4 GPUs per usable node as the pool sees them (grants in force subtracted)."""
    nodes = (await client.list(NODES, label_selector="nvidia.com/gpu.product=NVIDIA-L4"))["items"]
    twins = {ns["metadata"]["name"]: ns["metadata"]["labels"][LABEL_TENANT] for ns in
             (await client.list(NAMESPACES, label_selector="gpuferry.io/origin-namespace"))["items"]}
    slices = (await client.list(GPUSLICES))["items"]
    free = {n.name: int(n.free.get("nvidia.com/gpu", 0))
            for n in free_capacity(nodes, (await client.list(PODS))["items"], twins, reservations_of(slices))}
    for held in reservations_of(slices).values():
        for node, amounts in held.items():
            if node in free:
                free[node] -= int(amounts.get("nvidia.com/gpu", 0))
    return free


async def test_twin_pods_outside_the_grant_occupy_their_node(
    controller: None, provider_client: KubeClient, consumer_client: KubeClient, consumer_id: str,
) -> None:
    before = await free_l4_gpus(provider_client)
    assert len([n for n, v in before.items() if v >= 2]) >= 2, before
    await establish_tenant(consumer_client, provider_client, consumer_id=consumer_id, provider_id=PROVIDER_ID)
    async with await issued_client(consumer_client, PROVIDER_ID) as me:
        got = await request_slice(me, consumer_id=consumer_id, resources=slice_resources(1), node_selector=L4)
        assert got["status"]["phase"] == "Granted", got["status"]
        (reserved,) = [n["name"] for n in got["status"]["shape"]["nodes"]]
        other = next(n for n in sorted(before) if n != reserved and before[n] >= 1)
        twin = await request_twin_namespace(me, consumer_id=consumer_id, origin_namespace="edge")
        # the consumer's own credentials put a twin pod on an L4 node outside its grant
        stray = pod("stray", gpus=1)
        stray["spec"]["nodeSelector"] = {**L4, "kubernetes.io/hostname": other}
        await me.create(PODS, stray, twin)
        await wait_for(provider_client, PODS, "stray", lambda p: p["spec"].get("nodeName") == other,
                       namespace=twin)
    # another tenant asks for everything: the node with the stray pod has one GPU less to give
    rival = f"r{uuid.uuid4().hex[:6]}"
    await provider_client.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace",
                                              "metadata": {"name": tenant_namespace(rival)}})
    try:
        await provider_client.create(GPUSLICES, {
            "apiVersion": GPUSLICES.api_version, "kind": GPUSLICES.kind,
            "metadata": {"name": "all", "namespace": tenant_namespace(rival)},
            "spec": {"consumerClusterID": rival, "resources": {"nvidia.com/gpu": 64}, "nodeSelector": L4,
                     "allowPartial": True}})  # fmt: skip
        decided = await wait_for(provider_client, GPUSLICES, "all",
                                 lambda s: (s.get("status") or {}).get("phase") == "PartiallyGranted",
                                 namespace=tenant_namespace(rival))
        shape = {n["name"]: int(n["free"]["nvidia.com/gpu"]) for n in decided["status"]["shape"]["nodes"]}
        expected = {n: v - (n == reserved) - (n == other) for n, v in before.items()}
        assert shape == {n: v for n, v in expected.items() if v > 0}, (shape, before, reserved, other)
    finally:
        await provider_client.delete(NAMESPACES, tenant_namespace(rival))


async def test_establish_says_when_no_provider_controller_answers(
    provider_client: KubeClient, consumer_client: KubeClient, consumer_id: str,
) -> None:
    await ensure_crds(provider_client)
    with pytest.raises(PeeringError, match="has no status yet: is the provider controller running"):
        await establish_tenant(consumer_client, provider_client, consumer_id=consumer_id,
                               provider_id=PROVIDER_ID, timeout=3)
