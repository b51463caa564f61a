"""DRA devices in the GPU pool: classes understood from their CEL, devices per node and class,
allocations charged per namespace, and the devices a grant lists for its consumer to mirror."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from hack.localcluster.dra import DraGpus, device_class, resource_slice
from peering.provider.devices import (
    allocated,
    class_selector,
    granted_devices,
    node_devices,
    project_claim,
    project_slice,
)
from peering.provider.planning import allocate, free_capacity, slice_request

KEY = "gpu.nvidia.com.deviceclass.resource.k8s.io/devices"
H100 = DraGpus(4, "NVIDIA H100 80GB HBM3", "80Gi", "Hopper", "9.0.0")
L4 = DraGpus(2, "NVIDIA L4", "24Gi", "Ada Lovelace", "8.9.0")
SLICES = [project_slice(resource_slice("dra-h100-0", H100)), project_slice(resource_slice("dra-l4-0", L4))]
CLASSES = {"gpu.nvidia.com": class_selector(device_class())}


def claim(namespace: str, pool: str, *devices: str) -> dict[str, Any]:
    return project_claim({
        "metadata": {"name": "c", "namespace": namespace},
        "status": {"allocation": {"devices": {"results": [
            {"request": "gpu", "driver": "gpu.nvidia.com", "pool": pool, "device": d} for d in devices]}}},
    })  # fmt: skip


def test_the_drivers_class_is_understood_from_its_cel() -> None:
    selector = class_selector(device_class())
    assert selector.driver == "gpu.nvidia.com" and selector.attributes == (("gpu.nvidia.com", "type", "gpu"),)
    gpu = {"type": {"string": "gpu"}}
    assert selector.selects("gpu.nvidia.com", gpu)
    assert not selector.selects("gpu.nvidia.com", {"type": {"string": "mig"}})
    assert not selector.selects("other.example.com", gpu)
    both = class_selector({"spec": {"selectors": [{"cel": {"expression":
        'device.driver == "gpu.nvidia.com" && device.attributes["gpu.nvidia.com"].index == 0 '
        "&& device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('1Gi')) > 0"}}]}})  # fmt: skip
    # the capacity term is not understood: ignored (the scheduler evaluates all of it)
    assert both.attributes == (("gpu.nvidia.com", "index", 0),)
    assert both.selects("gpu.nvidia.com", {"index": {"int": 0}})
    assert not both.selects("gpu.nvidia.com", {"index": {"int": 1}})


def test_devices_per_node_and_what_claims_hold() -> None:
    assert node_devices(SLICES, CLASSES) == {"dra-h100-0": {KEY: Decimal(4)}, "dra-l4-0": {KEY: Decimal(2)}}
    held = allocated([claim("team-a", "dra-h100-0", "gpu-0", "gpu-1"), claim("b", "dra-l4-0", "gpu-0"),
                      claim("b", "elsewhere", "gpu-9")], SLICES, CLASSES)  # fmt: skip
    assert held == {("team-a", "dra-h100-0"): {KEY: Decimal(2)}, ("b", "dra-l4-0"): {KEY: Decimal(1)}}


def test_the_pool_grants_dra_devices_and_charges_twin_claims_to_their_tenant() -> None:
    nodes = [
        {"metadata": {"name": name, "labels": {}}, "spec": {},
         "status": {"allocatable": {"cpu": "96", "memory": "768Gi", "pods": "110"},
                    "conditions": [{"type": "Ready", "status": "True"}]}}
        for name in ("dra-h100-0", "dra-l4-0")
    ]  # fmt: skip
    # the provider's own claim holds one H100; a twin namespace of tenant a holds two more
    held = allocated([claim("default", "dra-h100-0", "gpu-3"), claim("ml-a", "dra-h100-0", "gpu-0", "gpu-1")],
                     SLICES, CLASSES)  # fmt: skip
    granted = {"phase": "Granted", "observedGeneration": 1, "granted": {KEY: "4"},
               "shape": {"nodes": [{"name": "dra-h100-0", "free": {KEY: "3"}},
                                   {"name": "dra-l4-0", "free": {KEY: "1"}}]}}  # fmt: skip
    slices = [{"metadata": {"name": "a", "namespace": "gpuferry-tenant-a", "generation": 1,
                            "creationTimestamp": "2026-01-01T00:00:00Z"},
               "spec": {"consumerClusterID": "a", "resources": {KEY: "4"}}, "status": granted}]  # fmt: skip
    free = free_capacity(nodes, [], {"ml-a": "a"}, {"a": {"dra-h100-0": {KEY: Decimal(3)},
                                                          "dra-l4-0": {KEY: Decimal(1)}}},
                         devices=node_devices(SLICES, CLASSES), device_use=held)  # fmt: skip
    # the twins' two devices are within the tenant's reservation: only the provider's own counts
    assert {n.name: n.free[KEY] for n in free} == {"dra-h100-0": Decimal(3), "dra-l4-0": Decimal(2)}
    decision = allocate(free, [slice_request(s) for s in slices])[("gpuferry-tenant-a", "a")]
    assert decision.phase == "Granted" and decision.granted[KEY] == 4


def test_a_grant_lists_the_devices_to_mirror() -> None:
    classes = {"gpu.nvidia.com": device_class()}
    shape = {"dra-h100-0": {KEY: Decimal(2), "cpu": Decimal(8)}, "dra-l4-0": {"cpu": Decimal(1)}}
    published = [resource_slice("dra-h100-0", H100), resource_slice("dra-l4-0", L4)]
    listed = granted_devices(shape, published, classes)
    assert listed is not None
    assert listed["classes"] == [{"name": "gpu.nvidia.com", "selectors": device_class()["spec"]["selectors"]}]
    (pool,) = listed["pools"]
    assert (pool["node"], pool["driver"], pool["pool"]) == ("dra-h100-0", "gpu.nvidia.com", "dra-h100-0")
    assert [d["name"] for d in pool["devices"]] == ["gpu-0", "gpu-1"]
    assert pool["devices"][0]["capacity"] == {"memory": {"value": "80Gi"}}
    assert pool["devices"][0]["attributes"]["productName"] == {"string": "NVIDIA H100 80GB HBM3"}
    assert granted_devices({"dra-h100-0": {"cpu": Decimal(8)}}, [], classes) is None
