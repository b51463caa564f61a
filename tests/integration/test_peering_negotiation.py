"""GPU slice negotiation against the real provider cluster: partial grants, denials, two
tenants competing, and grants re-evaluated when nodes are cordoned, deleted and added.

The slices select the L4 product (nodes gpu-l4-*), which only these tests use; what is free
there is computed from the live cluster rather than assumed.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Callable
from decimal import Decimal
from typing import Any

import pytest

from hack.localcluster import LocalCluster
from hack.localcluster.nodes import node_manifest
from kube.clients import KubeClient
from kube.errors import NotFound
from kube.objects import EVENTS, LEASES, NAMESPACES, NODES, PODS, RawObject
from peering.crds import ensure_crds
from peering.provider.app import run_provider
from peering.provider.planning import free_capacity, node_is_usable, reservations_of
from peering.provider.settings import ProviderSettings
from peering.resources import GPUSLICES, LABEL_ORIGIN_NAMESPACE, LABEL_TENANT, tenant_namespace

from .waiting import wait_for, wait_for_deletion

pytestmark = pytest.mark.integration

L4 = {"nvidia.com/gpu.product": "NVIDIA-L4"}
GPU = "nvidia.com/gpu"


@pytest.fixture
async def controller(provider_client: KubeClient) -> AsyncIterator[None]:
    await ensure_crds(provider_client)
    task = asyncio.create_task(run_provider(provider_client, settings=ProviderSettings(resync_seconds=30)))
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


@pytest.fixture
async def tenants(provider_client: KubeClient) -> AsyncIterator[Callable[[], Any]]:
    """Makes tenant namespaces (deleted, with their slices, after the test)."""
    made: list[str] = []

    async def make() -> str:
        cid = f"n{uuid.uuid4().hex[:6]}"
        await provider_client.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace",
                                                  "metadata": {"name": tenant_namespace(cid)}})
        made.append(cid)
        return cid

    yield make
    for cid in made:
        with contextlib.suppress(NotFound):
            await provider_client.delete(NAMESPACES, tenant_namespace(cid))
    for cid in made:
        await wait_for_deletion(provider_client, NAMESPACES, tenant_namespace(cid), None, timeout=60)


async def free_l4(client: KubeClient) -> dict[str, Decimal]:
    """Free L4 GPUs per usable node right now: allocatable - pods - grants of other slices."""
    nodes = [n for n in (await client.list(NODES))["items"]
             if all(n["metadata"].get("labels", {}).get(k) == v for k, v in L4.items())]
    twins = {ns["metadata"]["name"]: ns["metadata"]["labels"][LABEL_TENANT] for ns in
             (await client.list(NAMESPACES, label_selector=LABEL_ORIGIN_NAMESPACE))["items"]}
    slices = (await client.list(GPUSLICES))["items"]
    free = {n.name: n.free.get(GPU, Decimal(0))
            for n in free_capacity(nodes, (await client.list(PODS))["items"], twins, reservations_of(slices))}
    for other in slices:
        for entry in ((other.get("status") or {}).get("shape") or {}).get("nodes") or []:
            if entry["name"] in free:
                free[entry["name"]] -= Decimal(entry["free"].get(GPU, "0"))
    return free


def gpuslice(cid: str, gpus: int, *, partial: bool, name: str = "slice") -> RawObject:
    return {"apiVersion": GPUSLICES.api_version, "kind": GPUSLICES.kind,
            "metadata": {"name": name, "namespace": tenant_namespace(cid)},
            "spec": {"consumerClusterID": cid, "resources": {GPU: gpus}, "nodeSelector": L4,
                     "allowPartial": partial}}


def decided(obj: RawObject) -> bool:
    return (obj.get("status") or {}).get("phase") in {"Granted", "PartiallyGranted", "Denied"}


def granted(obj: RawObject) -> Decimal:
    return Decimal((obj.get("status") or {}).get("granted", {}).get(GPU, "0"))


async def wait_decided(client: KubeClient, cid: str, pred: Callable[[RawObject], bool] = decided,
                       name: str = "slice") -> RawObject:
    return await wait_for(client, GPUSLICES, name, pred, namespace=tenant_namespace(cid), timeout=30)


async def test_partial_grant_and_denial_with_reason(controller: None, provider_client: KubeClient,
                                                    tenants: Callable[[], Any]) -> None:
    total = sum((await free_l4(provider_client)).values(), Decimal(0))
    assert total >= 2, "the L4 nodes should have free GPUs for this test"
    greedy, late = await tenants(), await tenants()
    await provider_client.create(GPUSLICES, gpuslice(greedy, int(total) + 3, partial=True))
    got = await wait_decided(provider_client, greedy)
    assert got["status"]["phase"] == "PartiallyGranted" and granted(got) == total, got["status"]
    assert got["status"]["labels"]["nvidia.com/gpu.product"] == "NVIDIA-L4"
    shape = got["status"]["shape"]
    assert sum(Decimal(n["free"][GPU]) for n in shape["nodes"]) == total
    assert Decimal(shape["largest"][GPU]) == max(Decimal(n["free"][GPU]) for n in shape["nodes"])

    await provider_client.create(GPUSLICES, gpuslice(late, 1, partial=False))
    denied = await wait_decided(provider_client, late)
    assert denied["status"]["phase"] == "Denied"
    assert denied["status"]["reason"] == "InsufficientGPUs"
    assert "requested 1, free 0" in denied["status"]["message"]
    assert denied["status"]["granted"] == {}
    cond = {c["type"]: c for c in denied["status"]["conditions"]}
    assert cond["Denied"]["status"] == "True" and cond["Accepted"]["status"] == "False"
    # the Event is recorded right after the status is written: it may be a moment behind
    for _ in range(50):
        events = (await provider_client.list(EVENTS, tenant_namespace(late),
                                             field_selector="involvedObject.name=slice"))["items"]
        if events:
            break
        await asyncio.sleep(0.2)
    assert [(e["type"], e["reason"]) for e in events] == [("Warning", "InsufficientGPUs")], events

    # when the first tenant lets go, the second one's request is granted
    await provider_client.delete(GPUSLICES, "slice", tenant_namespace(greedy))
    again = await wait_decided(provider_client, late, lambda o: o["status"].get("phase") == "Granted")
    assert granted(again) == 1


async def test_competing_tenants_never_get_more_than_exists(
    controller: None, provider_client: KubeClient, tenants: Callable[[], Any],
) -> None:
    before = await free_l4(provider_client)
    total = sum(before.values(), Decimal(0))
    assert total >= 2
    a, b, c = await tenants(), await tenants(), await tenants()
    await asyncio.gather(*(provider_client.create(GPUSLICES, gpuslice(cid, int(total) - 1, partial=True))
                           for cid in (a, b, c)))
    results = [await wait_decided(provider_client, cid) for cid in (a, b, c)]
    grants = [granted(r) for r in results]
    assert sum(grants) == total, [r["status"] for r in results]
    per_node: dict[str, Decimal] = {}
    for r in results:
        for entry in r["status"]["shape"]["nodes"]:
            per_node[entry["name"]] = per_node.get(entry["name"], Decimal(0)) + Decimal(entry["free"][GPU])
    assert all(per_node[n] <= before[n] for n in per_node), (per_node, before)
    # oldest first: the first gets total-1, the second the 1 left (partially), the third nothing
    assert sorted(grants) == [0, 1, total - 1], grants
    assert [r["status"]["phase"] for r in results].count("Denied") == 1
    free_now = await free_l4(provider_client)  # every slice's grant subtracted, ours included
    assert all(v == 0 for v in free_now.values()), free_now


async def test_grant_follows_cordon_delete_and_add(
    controller: None, provider_client: KubeClient, provider: LocalCluster, tenants: Callable[[], Any],
) -> None:
    free = await free_l4(provider_client)
    assert len([n for n, v in free.items() if v > 0]) >= 2, free
    total = sum(free.values(), Decimal(0))
    victim = max(free, key=lambda n: (free[n], n))
    cid = await tenants()
    await provider_client.create(GPUSLICES, gpuslice(cid, int(total), partial=True))
    got = await wait_decided(provider_client, cid)
    assert got["status"]["phase"] == "Granted" and granted(got) == total

    def without_victim(obj: RawObject) -> bool:
        nodes = {n["name"] for n in (obj.get("status") or {}).get("shape", {}).get("nodes", [])}
        return granted(obj) == total - free[victim] and victim not in nodes

    await provider_client.patch(NODES, victim, {"spec": {"unschedulable": True}})
    try:
        shrunk = await wait_decided(provider_client, cid, without_victim)
        assert shrunk["status"]["phase"] == "PartiallyGranted"
    finally:
        await provider_client.patch(NODES, victim, {"spec": {"unschedulable": None}})
    await wait_decided(provider_client, cid, lambda o: granted(o) == total)

    spec = next(n for n in provider.spec.nodes if n.name == victim)
    await provider_client.delete(NODES, victim)
    try:
        await wait_decided(provider_client, cid, without_victim)
        await wait_for_deletion(provider_client, NODES, victim, None)
    finally:
        with contextlib.suppress(Exception):
            await provider_client.create(NODES, node_manifest(spec))
        await wait_for(provider_client, NODES, victim, node_is_usable, timeout=60)
    back = await wait_decided(provider_client, cid, lambda o: granted(o) == total)
    assert back["status"]["phase"] == "Granted"


async def test_one_controller_decides_at_a_time(provider_client: KubeClient,
                                                tenants: Callable[[], Any]) -> None:
    await ensure_crds(provider_client)
    settings = ProviderSettings(resync_seconds=30, lease_seconds=4, renew_seconds=1)

    def held(lease: RawObject) -> bool:
        return bool((lease.get("spec") or {}).get("holderIdentity"))

    first = asyncio.create_task(run_provider(provider_client, settings=settings))
    second: asyncio.Task[None] | None = None
    try:
        lease = await wait_for(provider_client, LEASES, settings.lease_name, held,
                               namespace=settings.lease_namespace)
        leader = lease["spec"]["holderIdentity"]
        second = asyncio.create_task(run_provider(provider_client, settings=settings))
        cid = await tenants()
        await provider_client.create(GPUSLICES, gpuslice(cid, 1, partial=False))
        assert (await wait_decided(provider_client, cid))["status"]["phase"] == "Granted"
        # the second controller waits; it never takes a Lease that is being renewed
        lease = await wait_for(provider_client, LEASES, settings.lease_name,
                               lambda obj: obj["spec"].get("renewTime") != lease["spec"]["renewTime"],
                               namespace=settings.lease_namespace)
        assert lease["spec"]["holderIdentity"] == leader
        assert not second.done()
        # the leader stops (and releases the Lease): the other takes over and decides
        first.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await first
        lease = await wait_for(provider_client, LEASES, settings.lease_name,
                               lambda obj: held(obj) and obj["spec"]["holderIdentity"] != leader,
                               namespace=settings.lease_namespace, timeout=20)
        other = await tenants()
        await provider_client.create(GPUSLICES, gpuslice(other, 1, partial=False))
        assert (await wait_decided(provider_client, other))["status"]["phase"] == "Granted"
    finally:
        for task in (first, second):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
