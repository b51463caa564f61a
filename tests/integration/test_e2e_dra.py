"""GPUs handed out by Dynamic Resource Allocation, across the peering (issue 18 §2), on the real
control planes. The provider's ``gpu-dra-h100-0`` (4 x H100 80GB) and ``gpu-dra-l4-0`` (4 x L4
24GB) publish ResourceSlices of ``gpu.nvidia.com``, as NVIDIA's DRA driver would. A slice of 6
devices mirrors 4 H100 and 2 L4 on the virtual node; a pod whose claim (from a
ResourceClaimTemplate) asks for one GPU with at least 40 GiB is allocated on the consumer, runs on
the provider on an H100 device and never an L4; a claim no granted device satisfies stays Pending
with the scheduler's reason; claims go with their pods; and the consumer's own identity cannot
claim devices of a class its grant does not cover, nor more than granted."""

from __future__ import annotations

import base64
import contextlib
import json
from typing import Any

import pytest

from kube.clients import KubeClient
from kube.errors import Forbidden, NotFound
from kube.objects import (
    DEVICECLASSES,
    NODES,
    PODS,
    RESOURCECLAIMS,
    RESOURCECLAIMTEMPLATES,
    RESOURCEQUOTAS,
    RESOURCESLICES,
    SECRETS,
    RawObject,
)
from peering.resources import GPUSLICES

from .clirunner import Cli
from .conftest import NamespaceFactory
from .waiting import wait_for, wait_for_items

pytestmark = pytest.mark.integration

DRIVER = "gpu.nvidia.com"
QUOTA_KEY = "gpu.nvidia.com.deviceclass.resource.k8s.io/devices"
VIRTUAL_NODE = "gpuferry-gpu-farm"


def peer(cli: Cli) -> list[str]:
    return cli.peer_args("--timeout", "60")


def template(name: str, expression: str, count: int = 1) -> RawObject:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": DRIVER, "count": count,
            "selectors": [{"cel": {"expression": expression}}]}}]}}},
    }  # fmt: skip


def claiming_pod(name: str, template_name: str) -> RawObject:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template_name}],
            "containers": [{"name": "c", "image": "nvcr.io/nvidia/cuda:13.0.0-base-ubuntu24.04",
                            "resources": {"claims": [{"name": "gpu"}]}}],
        },
    }  # fmt: skip


AT_LEAST_40GI = f"device.capacity['{DRIVER}'].memory.compareTo(quantity('40Gi')) >= 0"
AN_L4 = f"device.attributes['{DRIVER}'].productName == 'NVIDIA L4'"
AT_LEAST_100GI = f"device.capacity['{DRIVER}'].memory.compareTo(quantity('100Gi')) >= 0"


def hard(quota: RawObject) -> dict[str, str]:
    """The limits the API server enforces: the quota controller's copy of ``spec.hard``."""
    return dict((quota.get("status") or {}).get("hard") or {})


def running(p: RawObject) -> bool:
    return (p.get("status") or {}).get("phase") == "Running"


async def allocated_pools(client: KubeClient, pod: RawObject) -> list[str]:
    """The pools of the devices allocated to ``pod``'s claims."""
    pools = []
    for status in pod["status"].get("resourceClaimStatuses") or ():
        claim = await client.get(RESOURCECLAIMS, status["resourceClaimName"], pod["metadata"]["namespace"])
        pools += [r["pool"] for r in claim["status"]["allocation"]["devices"]["results"]]
    return pools


async def test_dra_claims_are_allocated_on_the_virtual_node_and_on_the_provider(
    cli: Cli,
    consumer_client: KubeClient,
    provider_client: KubeClient,
    make_namespace: NamespaceFactory,
) -> None:
    # a DeviceClass the provider does not have: refused with what it has
    code, _, err = await cli(*peer(cli), "--devices", "tpu.example.com=1")
    assert code == 3, err
    assert (
        "ResourceNotOffered: no usable node of this provider has devices of DeviceClass tpu.example.com "
        "(DeviceClasses with devices: gpu.nvidia.com)"
    ) in err, err

    result = json.loads(await cli.ok(*peer(cli), "--devices", f"{DRIVER}=6", "-o", "json"))
    assert result["slice"]["phase"] == "Granted", result["slice"]
    assert result["slice"]["granted"][QUOTA_KEY] == "6"
    gslice = await provider_client.get(GPUSLICES, "ml-eu", "gpuferry-tenant-ml-eu")
    pools = {p["pool"]: len(p["devices"]) for p in gslice["status"]["devices"]["pools"]}
    assert pools == {"gpu-dra-h100-0": 4, "gpu-dra-l4-0": 2}, pools

    # the virtual node: its ResourceSlices mirror the grant's devices; DRA devices are not capacity
    def mirrored(items: list[RawObject]) -> dict[str, int]:
        return {s["spec"]["pool"]["name"]: len(s["spec"]["devices"]) for s in items
                if s["spec"].get("nodeName") == VIRTUAL_NODE}  # fmt: skip

    both = {f"{VIRTUAL_NODE}/gpu-dra-h100-0": 4, f"{VIRTUAL_NODE}/gpu-dra-l4-0": 2}
    await wait_for_items(consumer_client, RESOURCESLICES, lambda items: mirrored(items) == both)
    device_class = await consumer_client.get(DEVICECLASSES, DRIVER)
    assert device_class["metadata"]["ownerReferences"][0]["name"] == VIRTUAL_NODE
    node = await consumer_client.get(NODES, VIRTUAL_NODE)
    assert QUOTA_KEY not in node["status"]["capacity"]

    # the ML engineer's claims: a GPU with at least 40 GiB, an L4, and one nobody has
    ns = await make_namespace(consumer_client)
    await cli.ok("offload", "namespace", ns, "--kubeconfig", cli.c, "-q")
    for name, expression in (("big", AT_LEAST_40GI), ("l4", AN_L4), ("huge", AT_LEAST_100GI)):
        await consumer_client.create(RESOURCECLAIMTEMPLATES, template(name, expression), ns)
        await consumer_client.create(PODS, claiming_pod(f"wants-{name}", name), ns)
    twin_ns = f"{ns}-ml-eu"
    big = await wait_for(consumer_client, PODS, "wants-big", running, namespace=ns, timeout=60)
    assert big["spec"]["nodeName"] == VIRTUAL_NODE
    assert await allocated_pools(consumer_client, big) == [f"{VIRTUAL_NODE}/gpu-dra-h100-0"]
    twin = await wait_for(provider_client, PODS, "wants-big", running, namespace=twin_ns, timeout=30)
    assert twin["spec"]["nodeName"] == "gpu-dra-h100-0"
    assert await allocated_pools(provider_client, twin) == ["gpu-dra-h100-0"]
    # and the consumer's claim says which real device that is
    (claim_status,) = big["status"]["resourceClaimStatuses"]
    back = await wait_for(consumer_client, RESOURCECLAIMS, claim_status["resourceClaimName"],
                          lambda c: bool((c.get("status") or {}).get("devices")),
                          namespace=ns, timeout=30)  # fmt: skip
    (device,) = back["status"]["devices"]
    assert device["pool"] == f"{VIRTUAL_NODE}/gpu-dra-h100-0"
    twin_claim = twin["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
    twin_result = (await provider_client.get(RESOURCECLAIMS, twin_claim, twin_ns))["status"]["allocation"]
    twin_result = twin_result["devices"]["results"][0]
    assert device["data"]["provider"] == {k: twin_result[k] for k in ("driver", "pool", "device")}
    l4 = await wait_for(consumer_client, PODS, "wants-l4", running, namespace=ns, timeout=60)
    assert await allocated_pools(consumer_client, l4) == [f"{VIRTUAL_NODE}/gpu-dra-l4-0"]
    assert (await provider_client.get(PODS, "wants-l4", twin_ns))["spec"]["nodeName"] == "gpu-dra-l4-0"
    info = json.loads(await cli.ok("info", "--kubeconfig", cli.c, "-o", "json"))
    assert info["providers"][0]["accelerators"][QUOTA_KEY] == {"granted": 6, "used": 2, "free": 4}

    def unschedulable(p: RawObject) -> bool:
        scheduled = [c for c in p["status"].get("conditions") or () if c["type"] == "PodScheduled"]
        return bool(scheduled) and scheduled[0]["status"] == "False"

    huge = await wait_for(consumer_client, PODS, "wants-huge", unschedulable, namespace=ns, timeout=60)
    message = next(c["message"] for c in huge["status"]["conditions"] if c["type"] == "PodScheduled")
    assert "cannot allocate all claims" in message, message
    assert huge["status"]["phase"] == "Pending"
    # a claim of a DeviceClass that exists on neither side: Pending, and the reason names it
    tpu = template("tpu", "true")
    tpu["spec"]["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] = "tpu.example.com"
    await consumer_client.create(RESOURCECLAIMTEMPLATES, tpu, ns)
    await consumer_client.create(PODS, claiming_pod("wants-tpu", "tpu"), ns)
    odd = await wait_for(consumer_client, PODS, "wants-tpu", unschedulable, namespace=ns, timeout=60)
    message = next(c["message"] for c in odd["status"]["conditions"] if c["type"] == "PodScheduled")
    assert "tpu.example.com" in message, message

    # claims go with their pods, on both sides
    twin_claims = (await provider_client.list(RESOURCECLAIMS, twin_ns))["items"]
    assert len(twin_claims) == 2, twin_claims
    await consumer_client.delete(PODS, "wants-l4", ns, grace_period_seconds=0)

    await wait_for_items(provider_client, RESOURCECLAIMS, lambda items: len(items) == 1, namespace=twin_ns)

    # the consumer's own identity: the devices its grant covers, no more, and no other class
    quota = await provider_client.get(RESOURCEQUOTAS, "gpuferry-grant", twin_ns)
    assert quota["spec"]["hard"][QUOTA_KEY] == "6"

    # a smaller grant: the mirror follows (the L4 pool's slice goes)
    changed = json.loads(await cli.ok(*peer(cli), "--devices", f"{DRIVER}=4", "-o", "json"))
    assert changed["slice"]["granted"][QUOTA_KEY] == "4", changed["slice"]
    h100_only = {f"{VIRTUAL_NODE}/gpu-dra-h100-0": 4}
    await wait_for_items(consumer_client, RESOURCESLICES, lambda items: mirrored(items) == h100_only)
    # the API server enforces status.hard, which the quota controller copies from spec.hard
    await wait_for(provider_client, RESOURCEQUOTAS, "gpuferry-grant",
                   lambda q: q["spec"]["hard"].get(QUOTA_KEY) == "4" == hard(q).get(QUOTA_KEY),
                   namespace=twin_ns, timeout=30)  # fmt: skip
    other_class: RawObject = {
        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
        "metadata": {"name": "any-gpu.example.com"},
        "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{DRIVER}'"}}]},
    }  # fmt: skip
    await provider_client.create(DEVICECLASSES, other_class)
    try:
        key = "any-gpu.example.com.deviceclass.resource.k8s.io/devices"
        await wait_for(provider_client, RESOURCEQUOTAS, "gpuferry-grant",
                       lambda q: q["spec"]["hard"].get(key) == "0" == hard(q).get(key),
                       namespace=twin_ns, timeout=30)  # fmt: skip
        secret = await consumer_client.get(SECRETS, "gpuferry-identity-gpu-farm", "gpuferry-system")
        async with KubeClient.from_kubeconfig_data(base64.b64decode(secret["data"]["kubeconfig"])) as me:
            with pytest.raises(Forbidden, match="exceeded quota"):
                await me.create(RESOURCECLAIMS, claim("other", "any-gpu.example.com", 1), twin_ns)
            with pytest.raises(Forbidden, match="exceeded quota"):
                await me.create(RESOURCECLAIMS, claim("five", DRIVER, 5), twin_ns)
    finally:
        with contextlib.suppress(NotFound):
            await provider_client.delete(DEVICECLASSES, "any-gpu.example.com")


def claim(name: str, device_class: str, count: int) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": device_class, "count": count}}]}},
    }  # fmt: skip
