"""Grants of shared and partitioned GPUs (issue 18): MIG instances, time-sliced replicas, HAMi's
memory and cores, MetaGPU units; and the reason a slice gets for a resource nobody offers."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from peering.provider.planning import allocate, free_capacity, slice_request

MIG = {"nvidia.com/mig-1g.10gb": "16", "nvidia.com/mig-2g.20gb": "8", "nvidia.com/mig-3g.40gb": "8"}


def node(name: str, devices: dict[str, str], labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": dict(labels or {})},
        "spec": {},
        "status": {"allocatable": {"cpu": "96", "memory": "1536Gi", "pods": "110", **devices},
                   "conditions": [{"type": "Ready", "status": "True"}]},
    }


NODES = [
    node("a100-mig-0", MIG, {"pool": "mig"}),
    node("a100-mig-1", MIG, {"pool": "mig"}),
    node("h100-0", {"nvidia.com/gpu": "8"}, {"pool": "whole"}),
    node("hami-0", {"nvidia.com/gpu": "40", "nvidia.com/gpumem": "92112", "nvidia.com/gpucores": "400"},
         {"pool": "hami"}),
    node("l4-shared-0", {"nvidia.com/gpu.shared": "16"}, {"pool": "shared"}),
]


def gslice(resources: dict[str, str], selector: dict[str, str] | None = None,
           status: dict[str, Any] | None = None) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "metadata": {"name": "s", "namespace": "gpuferry-tenant-a", "generation": 1,
                     "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"consumerClusterID": "a", "resources": resources, "nodeSelector": selector or {}},
    }
    if status:
        obj["status"] = status
    return obj


def decide(*slices: dict[str, Any], pods: tuple[dict[str, Any], ...] = ()) -> Any:
    got = allocate(free_capacity(NODES, pods), [slice_request(s) for s in slices])
    return got[("gpuferry-tenant-a", "s")]


def test_mig_instances_lead_the_placement_and_cpu_follows_them() -> None:
    got = decide(gslice({"nvidia.com/mig-1g.10gb": "20", "cpu": "10", "pods": "20"}))
    assert got.phase == "Granted", got.message
    assert got.nodes["a100-mig-0"]["nvidia.com/mig-1g.10gb"] == Decimal(16)
    assert got.nodes["a100-mig-1"]["nvidia.com/mig-1g.10gb"] == Decimal(4)
    # CPU and pod slots go where the instances are, in proportion (16/20 and 4/20)
    assert got.nodes["a100-mig-0"]["cpu"] == Decimal(8) and got.nodes["a100-mig-1"]["cpu"] == Decimal(2)
    assert got.nodes["a100-mig-0"]["pods"] == Decimal(16)
    assert set(got.nodes) == {"a100-mig-0", "a100-mig-1"}


def test_hami_memory_and_cores_are_granted_beside_its_gpus() -> None:
    # no selector: the whole-GPU H100 node sorts first by name, but only the HAMi node offers
    # every requested resource, so the GPUs (and their memory and cores) are placed there
    got = decide(gslice({"nvidia.com/gpu": "2", "nvidia.com/gpumem": "20000", "nvidia.com/gpucores": "100"}))
    assert got.phase == "Granted", got.message
    assert list(got.nodes) == ["hami-0"]
    assert got.nodes["hami-0"] == {"nvidia.com/gpu": Decimal(2), "nvidia.com/gpumem": Decimal(20000),
                                   "nvidia.com/gpucores": Decimal(100)}


def test_time_sliced_replicas_are_granted_from_the_shared_pool() -> None:
    got = decide(gslice({"nvidia.com/gpu.shared": "6", "cpu": "12"}))
    assert got.phase == "Granted"
    assert got.nodes == {"l4-shared-0": {"nvidia.com/gpu.shared": Decimal(6), "cpu": Decimal(12)}}


def test_short_of_mig_instances_is_insufficient_gpus() -> None:
    got = decide(gslice({"nvidia.com/mig-3g.40gb": "17"}))
    assert (got.phase, got.reason) == ("Denied", "InsufficientGPUs")
    assert "nvidia.com/mig-3g.40gb: requested 17, free 16" in got.message


def test_a_mig_profile_the_provider_does_not_offer_is_named() -> None:
    got = decide(gslice({"nvidia.com/mig-4g.40gb": "1"}))
    assert (got.phase, got.reason) == ("Denied", "ResourceNotOffered")
    assert got.message == (
        "no usable node of this provider offers the MIG profile 4g.40gb "
        "(its MIG profiles: 1g.10gb, 2g.20gb, 3g.40gb)"
    )


def test_an_unknown_resource_gets_a_suggestion() -> None:
    got = decide(gslice({"nvidia.com/gpus": "1"}))
    assert (got.phase, got.reason) == ("Denied", "ResourceNotOffered")
    assert got.message.startswith(
        "no usable node of this provider offers nvidia.com/gpus (did you mean nvidia.com/gpu?); its devices: "
    )
    assert "nvidia.com/gpu.shared" in got.message and "nvidia.com/mig-1g.10gb" in got.message


def test_a_resource_only_unselected_nodes_offer() -> None:
    got = decide(gslice({"nvidia.com/gpu.shared": "1"}, selector={"pool": "mig"}))
    assert (got.phase, got.reason) == ("Denied", "ResourceNotOffered")
    assert got.message == (
        "nvidia.com/gpu.shared is offered only by nodes the slice does not select or tolerate (l4-shared-0)"
    )


def test_a_granted_mig_slice_keeps_its_nodes() -> None:
    # granted before on a100-mig-1 only: a pass after a restart takes the same node first
    status = {
        "phase": "Granted",
        "observedGeneration": 1,
        "granted": {"nvidia.com/mig-2g.20gb": "4"},
        "shape": {"nodes": [{"name": "a100-mig-1", "free": {"nvidia.com/mig-2g.20gb": "4"}}]},
    }
    request = slice_request(gslice({"nvidia.com/mig-2g.20gb": "4"}, status=status))
    assert request.held == {"a100-mig-1": Decimal(4)}
    got = decide(gslice({"nvidia.com/mig-2g.20gb": "4"}, status=status))
    assert got.nodes == {"a100-mig-1": {"nvidia.com/mig-2g.20gb": Decimal(4)}}


def test_a_slice_of_several_kinds_puts_pod_slots_beside_each() -> None:
    # pods and CPU follow the part of a GPU each node's devices are worth: 2 whole GPUs on the
    # HAMi node, 8 x 3g.40gb (24/7 GPUs) on a MIG node, 4 shared replicas (1 GPU)
    got = decide(gslice({"nvidia.com/gpu": "2", "nvidia.com/gpumem": "20000", "nvidia.com/mig-3g.40gb": "8",
                         "nvidia.com/gpu.shared": "4", "pods": "100", "cpu": "45"}))  # fmt: skip
    assert got.phase == "Granted", got.message
    pods = {name: amounts.get("pods") for name, amounts in got.nodes.items()}
    # 100 x 2/(2 + 24/7 + 1) = 31.1, x (24/7)/(45/7) = 53.3, x 1/(45/7) = 15.6: floors, and the
    # one left over on the first node with devices
    assert pods == {"hami-0": Decimal(32), "a100-mig-0": Decimal(53), "l4-shared-0": Decimal(15)}
    assert got.nodes["hami-0"]["nvidia.com/gpumem"] == Decimal(20000)
    assert sum(a.get("cpu", Decimal(0)) for a in got.nodes.values()) == Decimal(45)
    assert all(a.get("cpu", Decimal(0)) > 0 for a in got.nodes.values())


def test_a_drained_mig_pool_is_said_to_be_unusable_not_absent() -> None:
    drained = [dict(n, spec={"unschedulable": True}) if n["metadata"]["name"].startswith("a100") else n
               for n in NODES]  # fmt: skip
    got = allocate(free_capacity(drained, []), [slice_request(gslice({"nvidia.com/mig-1g.10gb": "1"}))])
    denied = got[("gpuferry-tenant-a", "s")]
    assert (denied.phase, denied.reason) == ("Denied", "ResourceNotOffered")
    assert denied.message == (
        "no usable node of this provider offers the MIG profile 1g.10gb (none has MIG instances)"
    )
