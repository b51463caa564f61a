"""The virtual node's mirror of its grant's DRA devices: ResourceSlices and DeviceClasses."""

from __future__ import annotations

from typing import Any

from vk.forge.devices import (
    PROVIDER_NODE_ATTRIBUTE,
    claim_device_status,
    claim_names,
    class_owners,
    mirror_class,
    mirror_slices,
)

NODE = {"metadata": {"name": "gpuferry-gpu-farm", "uid": "node-uid"}}
DEVICES: dict[str, Any] = {
    "classes": [{"name": "gpu.nvidia.com",
                 "selectors": [{"cel": {"expression": "device.driver == 'gpu.nvidia.com'"}}]}],
    "pools": [
        {"node": "dra-h100-0", "driver": "gpu.nvidia.com", "pool": "dra-h100-0", "devices": [
            {"name": "gpu-0", "attributes": {"productName": {"string": "NVIDIA H100 80GB HBM3"}},
             "capacity": {"memory": {"value": "80Gi"}}},
            {"name": "gpu-1", "attributes": {"productName": {"string": "NVIDIA H100 80GB HBM3"}}}]},
        {"node": "dra-l4-0", "driver": "gpu.nvidia.com", "pool": "dra-l4-0", "devices": [
            {"name": "gpu-0", "attributes": {"productName": {"string": "NVIDIA L4"}}}]},
    ],
}  # fmt: skip


def test_one_slice_per_provider_pool_on_the_virtual_node() -> None:
    slices = mirror_slices(DEVICES, node=NODE, provider_id="gpu-farm")
    assert len(slices) == 2 and len({s["metadata"]["name"] for s in slices}) == 2
    by_pool = {s["spec"]["pool"]["name"]: s for s in slices}
    h100 = by_pool["gpuferry-gpu-farm/dra-h100-0"]
    assert h100["spec"]["driver"] == "gpu.nvidia.com" and h100["spec"]["nodeName"] == "gpuferry-gpu-farm"
    assert h100["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": "gpuferry-gpu-farm", "uid": "node-uid"}]
    assert h100["metadata"]["labels"]["gpuferry.io/provider"] == "gpu-farm"
    first = h100["spec"]["devices"][0]
    assert first["capacity"] == {"memory": {"value": "80Gi"}}
    assert first["attributes"][PROVIDER_NODE_ATTRIBUTE] == {"string": "dra-h100-0"}
    assert "capacity" not in h100["spec"]["devices"][1]
    assert mirror_slices(None, node=NODE, provider_id="gpu-farm") == []
    # stable names: the same grant gives the same objects
    assert mirror_slices(DEVICES, node=NODE, provider_id="gpu-farm") == slices


def test_a_device_class_is_made_alike_and_shared_by_its_virtual_nodes() -> None:
    made = mirror_class(DEVICES["classes"][0], node=NODE)
    assert made["metadata"]["name"] == "gpu.nvidia.com"
    assert made["spec"]["selectors"] == DEVICES["classes"][0]["selectors"]
    other = {"metadata": {"name": "gpuferry-other", "uid": "other-uid"}}
    owners = class_owners(made, other)
    assert owners is not None and [o["uid"] for o in owners] == ["node-uid", "other-uid"]
    assert class_owners(made, NODE) is None  # already an owner
    theirs = {"metadata": {"name": "gpu.nvidia.com", "labels": {}}}
    assert class_owners(theirs, NODE) is None  # the consumer's admins made it: not touched


def test_a_pods_claims_by_template_once_made_and_by_name() -> None:
    pod = {"spec": {"resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "big"},
                                       {"name": "shared", "resourceClaimName": "team"},
                                       {"name": "later", "resourceClaimTemplateName": "t"}]},
           "status": {"resourceClaimStatuses": [
               {"name": "gpu", "resourceClaimName": "p-gpu-x1"}]}}  # fmt: skip
    assert claim_names(pod) == {"gpu": "p-gpu-x1", "shared": "team"}


def test_the_consumer_claim_learns_the_real_device_of_each_request() -> None:
    def claim(name: str, *results: tuple[str, str, str]) -> dict[str, Any]:
        listed = [{"request": r, "driver": "gpu.nvidia.com", "pool": p, "device": d} for r, p, d in results]
        return {"metadata": {"name": name}, "status": {"allocation": {"devices": {"results": listed}}}}

    pool = "gpuferry-gpu-farm/h100-0"
    mine = claim("c", ("gpu", pool, "gpu-0"), ("gpu", pool, "gpu-1"))
    theirs = claim("t", ("gpu", "h100-0", "gpu-2"), ("gpu", "h100-0", "gpu-3"))
    devices = claim_device_status(mine, theirs)
    assert devices is not None and [d["device"] for d in devices] == ["gpu-0", "gpu-1"]
    real = {"driver": "gpu.nvidia.com", "pool": "h100-0", "device": "gpu-3"}
    assert devices[1]["data"] == {"provider": real, "providerClaim": "t"}
    assert claim_device_status(mine, {"metadata": {"name": "t"}}) is None  # not allocated yet
