"""The virtual Node builder: labels, taint, capacity, shape, conditions and the patches."""

from __future__ import annotations

import logging
import random
from decimal import Decimal
from typing import Any

import orjson
import pytest

from kube.clients import KubeClient
from kube.kubeconfigs import Connection
from kube.objects import ObjectKey
from kube.settings import WatchSettings
from kube.watching import Listed, WatchEvent
from vk.forge.fit import largest_blocks
from vk.forge.node import (
    GPU_COUNT_LABEL,
    LARGEST_BLOCK_ANNOTATION,
    LARGEST_GPU_BLOCK_LABEL,
    MANAGED_LABELS_ANNOTATION,
    Condition,
    kubelet_version,
    network_condition,
    node_conditions,
    node_metadata_patch,
    node_shape,
    node_status_patch,
    provider_gpu_labels,
    uniform_gpu_labels,
    virtual_node,
)
from vk.node.controller import PROBE_FAILURES, NodeController
from vk.node.provider import ProviderView, identity_keys
from vk.settings import VirtualKubeletSettings

from .builders import PROVIDER_ID, VIRTUAL_NODE, gpu_pod, node

H100 = {
    "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
    "nvidia.com/gpu.memory": "81559",
    "nvidia.com/gpu.family": "hopper",
    "nvidia.com/gpu.compute.major": "9",
    "nvidia.com/gpu.compute.minor": "0",
    "nvidia.com/cuda.driver-version.major": "580",
    "nvidia.com/cuda.runtime-version.major": "13",
    "nvidia.com/mig.capable": "true",
    "nvidia.com/gpu.present": "true",
    "nvidia.com/gpu.machine": "H100-SXM5-80GB",
    "nvidia.com/gpu.count": "8",
    "topology.kubernetes.io/zone": "eu-west-1a",
}
L4 = {
    **H100,
    "nvidia.com/gpu.product": "NVIDIA-L4",
    "nvidia.com/gpu.memory": "23034",
    "nvidia.com/gpu.family": "ada-lovelace",
    "nvidia.com/gpu.compute.minor": "9",
    "nvidia.com/gpu.compute.major": "8",
    "nvidia.com/mig.capable": "false",
    "nvidia.com/gpu.count": "2",
}
GRANT = {
    "nvidia.com/gpu": "8",
    "cpu": "64",
    "memory": "512Gi",
    "pods": "110",
    "nvidia.com/mig-1g.10gb": "14",
    "nvidia.com/gpu.shared": "16",
    "cnvrg.io/metagpu": "800",
}
SELECTOR = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
NOW = "2024-06-01T10:00:00Z"
LATER = "2024-06-01T10:05:00Z"


def fleet() -> list[dict[str, Any]]:
    return [
        node("h100-0", labels=H100),
        node("h100-1", labels=H100),
        node("l4-0", gpus=2, labels=L4),
        node("cpu-0", gpus=0, labels={"nvidia.com/gpu.product": ""}),
    ]


def build(**overrides: Any) -> dict[str, Any]:
    args: dict[str, Any] = {
        "name": VIRTUAL_NODE,
        "provider_id": PROVIDER_ID,
        "resources": GRANT,
        "node_address": "10.0.0.7",
        "kubelet_port": 10250,
        "provider_labels": provider_gpu_labels(fleet(), SELECTOR, GRANT),
        "shape": node_shape({"nvidia.com/gpu": Decimal(2), "cpu": Decimal(30)}, GRANT),
        "conditions": node_conditions(provider_reachable=True),
        "now": NOW,
    }
    args.update(overrides)
    return virtual_node(**args)


def by_type(built: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in built["status"]["conditions"]}


# ---- GPU labels ------------------------------------------------------------------------------


def test_uniform_gfd_labels_are_copied_for_the_selected_product() -> None:
    labels = uniform_gpu_labels(fleet(), SELECTOR)
    assert labels == {
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
        "nvidia.com/gpu.memory": "81559",
        "nvidia.com/gpu.family": "hopper",
        "nvidia.com/gpu.compute.major": "9",
        "nvidia.com/gpu.compute.minor": "0",
        "nvidia.com/cuda.driver-version.major": "580",
        "nvidia.com/cuda.runtime-version.major": "13",
        "nvidia.com/mig.capable": "true",
    }


def test_labels_that_differ_are_not_copied() -> None:
    labels = uniform_gpu_labels(fleet(), {})
    # the CPU node has no GPUs and does not count; H100 and L4 differ on these
    for key in ("nvidia.com/gpu.product", "nvidia.com/gpu.memory", "nvidia.com/gpu.family",
                "nvidia.com/gpu.compute.major", "nvidia.com/mig.capable"):
        assert key not in labels
    # what is the same on every GPU node stays
    assert labels["nvidia.com/cuda.driver-version.major"] == "580"


def test_gpu_present_machine_and_other_labels_are_never_copied() -> None:
    labels = uniform_gpu_labels(fleet(), SELECTOR)
    assert "nvidia.com/gpu.present" not in labels  # GPU-operator DaemonSets select on it
    assert "nvidia.com/gpu.machine" not in labels
    assert "topology.kubernetes.io/zone" not in labels
    assert GPU_COUNT_LABEL not in labels


def test_no_gpu_node_selected_means_no_gpu_labels() -> None:
    assert uniform_gpu_labels(fleet(), {"nvidia.com/gpu.product": "NVIDIA-B200"}) == {}
    assert provider_gpu_labels(fleet(), {"nvidia.com/gpu.product": "NVIDIA-B200"}, GRANT) == {}


def test_gpu_count_is_the_largest_node_capped_by_the_grant() -> None:
    assert provider_gpu_labels(fleet(), SELECTOR, GRANT)[GPU_COUNT_LABEL] == "8"
    l4 = {"nvidia.com/gpu.product": "NVIDIA-L4"}
    assert provider_gpu_labels(fleet(), l4, GRANT)[GPU_COUNT_LABEL] == "2"
    assert provider_gpu_labels(fleet(), SELECTOR, {**GRANT, "nvidia.com/gpu": "4"})[GPU_COUNT_LABEL] == "4"
    assert GPU_COUNT_LABEL not in provider_gpu_labels(fleet(), SELECTOR, {"cpu": "4"})


# ---- the Node --------------------------------------------------------------------------------


def test_identity_labels_and_copied_labels() -> None:
    labels = build(extra_labels={"team": "ml"})["metadata"]["labels"]
    assert labels["type"] == "virtual-kubelet"
    assert labels["kubernetes.io/role"] == "agent"
    assert labels["kubernetes.io/hostname"] == VIRTUAL_NODE
    assert labels["kubernetes.io/os"] == "linux"
    assert labels["kubernetes.io/arch"] == "amd64"
    assert labels["gpuferry.io/provider"] == PROVIDER_ID
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert labels[GPU_COUNT_LABEL] == "8"
    assert labels["team"] == "ml"


def test_extra_labels_cannot_override_identity() -> None:
    labels = build(extra_labels={"type": "other", "kubernetes.io/hostname": "x"})["metadata"]["labels"]
    assert labels["type"] == "virtual-kubelet"
    assert labels["kubernetes.io/hostname"] == VIRTUAL_NODE


def test_taint() -> None:
    assert build()["spec"]["taints"] == [
        {"key": "virtual-node.gpuferry.io/not-allowed", "value": "true", "effect": "NoExecute"}
    ]


def test_capacity_and_allocatable_are_the_grant_verbatim() -> None:
    status = build()["status"]
    assert status["capacity"] == GRANT
    assert status["allocatable"] == GRANT
    assert status["capacity"]["nvidia.com/mig-1g.10gb"] == "14"
    assert status["capacity"]["cnvrg.io/metagpu"] == "800"
    assert status["capacity"] is not status["allocatable"]


def test_largest_block_annotation_and_label() -> None:
    built = build()
    shape = orjson.loads(built["metadata"]["annotations"][LARGEST_BLOCK_ANNOTATION])
    assert shape["nvidia.com/gpu"] == "2"
    assert shape["cpu"] == "30"
    # granted, but no provider node has any free: 0, not missing
    assert shape["cnvrg.io/metagpu"] == "0"
    assert shape["nvidia.com/mig-1g.10gb"] == "0"
    assert set(shape) == set(GRANT)
    assert built["metadata"]["labels"][LARGEST_GPU_BLOCK_LABEL] == "2"


def test_shape_is_capped_by_the_grant_and_never_negative() -> None:
    shape = node_shape({"nvidia.com/gpu": Decimal(8), "cpu": Decimal(-3), "memory": Decimal(2**40)},
                       {"nvidia.com/gpu": "4", "cpu": "16", "memory": "64Gi"})
    assert shape == {"nvidia.com/gpu": "4", "cpu": "0", "memory": "64Gi"}


def test_shape_from_fit_four_nodes_with_two_free_each() -> None:
    nodes = [node(f"n{i}") for i in range(4)]
    pods = [gpu_pod(f"p{i}", f"n{i}", gpus=6) for i in range(4)]
    shape = node_shape(largest_blocks(nodes, pods), {"nvidia.com/gpu": "8"})
    assert shape == {"nvidia.com/gpu": "2"}


def test_managed_labels_annotation_lists_every_label_set() -> None:
    built = build()
    managed = set(built["metadata"]["annotations"][MANAGED_LABELS_ANNOTATION].split(","))
    assert managed == set(built["metadata"]["labels"])


def test_addresses_endpoint_and_node_info() -> None:
    status = build(version=kubelet_version("v1.36.4"), boot_id="b00t")["status"]
    assert status["addresses"] == [
        {"type": "InternalIP", "address": "10.0.0.7"},
        {"type": "Hostname", "address": VIRTUAL_NODE},
    ]
    assert status["daemonEndpoints"] == {"kubeletEndpoint": {"Port": 10250}}
    info = status["nodeInfo"]
    assert info["kubeletVersion"] == "v1.36.4-gpuferry"
    assert info["operatingSystem"] == "linux"
    assert info["architecture"] == "amd64"
    assert info["containerRuntimeVersion"] == "gpuferry://0.1.0"
    assert info["bootID"] == "b00t"
    assert info["machineID"] and info["systemUUID"]
    # stable across restarts
    assert build()["status"]["nodeInfo"]["systemUUID"] == info["systemUUID"]


def test_kubelet_version() -> None:
    assert kubelet_version("v1.36.4") == "v1.36.4-gpuferry"
    assert kubelet_version("v1.33.1+k3s1") == "v1.33.1-gpuferry"
    assert kubelet_version("v1.34.0-rc.1") == "v1.34.0-gpuferry"
    assert kubelet_version("") == "v1.36.4-gpuferry"
    assert kubelet_version("weird") == "v1.36.4-gpuferry"


# ---- conditions ------------------------------------------------------------------------------


def test_conditions_when_the_provider_answers() -> None:
    conditions = by_type(build())
    assert set(conditions) == {
        "Ready", "MemoryPressure", "DiskPressure", "PIDPressure", "NetworkUnavailable", "ProviderReachable"
    }
    assert conditions["Ready"]["status"] == "True"
    assert conditions["Ready"]["reason"] == "ProviderReachable"
    assert conditions["ProviderReachable"]["status"] == "True"
    for pressure in ("MemoryPressure", "DiskPressure", "PIDPressure", "NetworkUnavailable"):
        assert conditions[pressure]["status"] == "False"
    assert all(c["lastHeartbeatTime"] == NOW and c["lastTransitionTime"] == NOW for c in conditions.values())


def test_an_unreachable_provider_keeps_the_node_ready_and_taints_it_no_schedule() -> None:
    built = build(conditions=node_conditions(provider_reachable=False, provider_error="connection refused"),
                  provider_unreachable=True)
    conditions = by_type(built)
    # Ready=False would let the consumer's taint manager evict the running pods after 300 s
    assert conditions["Ready"]["status"] == "True"
    assert conditions["Ready"]["reason"] == "ProviderUnreachable"
    assert "connection refused" in conditions["Ready"]["message"]
    assert "keep running" in conditions["Ready"]["message"]
    assert conditions["ProviderReachable"]["status"] == "False"
    unreachable = {"key": "gpuferry.io/provider-unreachable", "value": "true", "effect": "NoSchedule"}
    assert unreachable in built["spec"]["taints"]
    # the taint comes and goes by patch, others' taints kept
    up = server_side(build())
    up["spec"]["taints"].append({"key": "node.kubernetes.io/other", "effect": "NoSchedule"})
    patch = node_metadata_patch(up, built)
    assert patch is not None and unreachable in patch["spec"]["taints"]
    assert {"key": "node.kubernetes.io/other", "effect": "NoSchedule"} in patch["spec"]["taints"]
    down = server_side(built)
    back = node_metadata_patch(down, build())
    assert back is not None and unreachable not in back["spec"]["taints"]


def test_not_probed_yet_is_not_ready() -> None:
    conditions = by_type(build(conditions=node_conditions(provider_reachable=None)))
    assert conditions["Ready"]["status"] == "False"
    assert conditions["ProviderReachable"]["status"] == "Unknown"


def test_transition_time_kept_while_the_status_stays() -> None:
    first = build()
    again = build(now=LATER, previous_conditions=first["status"]["conditions"])
    ready = by_type(again)["Ready"]
    assert ready["lastTransitionTime"] == NOW
    assert ready["lastHeartbeatTime"] == LATER
    down = build(now=LATER, previous_conditions=first["status"]["conditions"],
                 conditions=node_conditions(provider_reachable=False, provider_error="x"))
    assert by_type(down)["ProviderReachable"]["lastTransitionTime"] == LATER
    assert by_type(down)["Ready"]["lastTransitionTime"] == NOW  # still True
    assert by_type(down)["MemoryPressure"]["lastTransitionTime"] == NOW


# ---- patches ---------------------------------------------------------------------------------


def server_side(built: dict[str, Any], **metadata: Any) -> dict[str, Any]:
    """``built`` as the API server returns it: with a resourceVersion, uid and others' taints."""
    out = orjson.loads(orjson.dumps(built))
    out["metadata"].update({"resourceVersion": "42", "uid": "u-1", **metadata})
    return dict(out)


def test_no_patch_when_nothing_changed() -> None:
    current = server_side(build())
    later = build(now=LATER, previous_conditions=current["status"]["conditions"])
    assert node_metadata_patch(current, later) is None
    assert node_status_patch(current, later) is None


def test_heartbeat_sends_the_conditions_only() -> None:
    current = server_side(build())
    later = build(now=LATER, previous_conditions=current["status"]["conditions"])
    patch = node_status_patch(current, later, heartbeat=True)
    assert patch is not None
    assert set(patch["status"]) == {"conditions"}
    assert {c["lastHeartbeatTime"] for c in patch["status"]["conditions"]} == {LATER}


def test_status_patch_on_readiness_change() -> None:
    current = server_side(build())
    down = build(now=LATER, previous_conditions=current["status"]["conditions"],
                 conditions=node_conditions(provider_reachable=False, provider_error="refused"))
    patch = node_status_patch(current, down)
    assert patch is not None
    by = {c["type"]: c for c in patch["status"]["conditions"]}
    assert (by["Ready"]["status"], by["Ready"]["reason"]) == ("True", "ProviderUnreachable")
    assert by["ProviderReachable"]["status"] == "False"


def test_status_patch_after_the_lifecycle_controller_set_unknown() -> None:
    current = server_side(build())
    for cond in current["status"]["conditions"]:
        cond.update(status="Unknown", reason="NodeStatusUnknown",
                    message="Kubelet stopped posting node status.")
    patch = node_status_patch(current, build(now=LATER, previous_conditions=current["status"]["conditions"]))
    assert patch is not None
    ready = next(c for c in patch["status"]["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True"
    assert ready["lastTransitionTime"] == LATER


def test_status_patch_removes_a_resource_no_longer_granted() -> None:
    current = server_side(build())
    smaller = {k: v for k, v in GRANT.items() if k != "cnvrg.io/metagpu"} | {"nvidia.com/gpu": "4"}
    desired = build(resources=smaller, previous_conditions=current["status"]["conditions"])
    patch = node_status_patch(current, desired)
    assert patch is not None
    assert patch["status"]["capacity"] == {"nvidia.com/gpu": "4", "cnvrg.io/metagpu": None}
    assert patch["status"]["allocatable"] == {"nvidia.com/gpu": "4", "cnvrg.io/metagpu": None}
    assert "conditions" not in patch["status"]


def test_metadata_patch_updates_block_and_removes_labels_no_longer_uniform() -> None:
    current = server_side(build())
    current["metadata"]["labels"]["owner"] = "someone-else"  # kubectl label: kept
    desired = build(provider_labels=provider_gpu_labels(fleet(), {}, GRANT),
                    shape=node_shape({"nvidia.com/gpu": Decimal(1)}, GRANT))
    patch = node_metadata_patch(current, desired)
    assert patch is not None
    labels = patch["metadata"]["labels"]
    assert labels["nvidia.com/gpu.product"] is None
    assert labels["nvidia.com/gpu.family"] is None
    assert labels[LARGEST_GPU_BLOCK_LABEL] == "1"
    assert "owner" not in labels
    assert "nvidia.com/cuda.driver-version.major" not in labels  # unchanged
    shape = orjson.loads(patch["metadata"]["annotations"][LARGEST_BLOCK_ANNOTATION])
    assert shape["nvidia.com/gpu"] == "1"
    assert "spec" not in patch
    assert "resourceVersion" not in patch["metadata"]


def test_metadata_patch_keeps_lifecycle_taints_and_restores_ours() -> None:
    not_ready = {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}
    current = server_side(build())
    current["spec"]["taints"] = [not_ready]
    patch = node_metadata_patch(current, build())
    assert patch is not None
    assert patch["spec"]["taints"] == [
        not_ready,
        {"key": "virtual-node.gpuferry.io/not-allowed", "value": "true", "effect": "NoExecute"},
    ]
    assert patch["metadata"]["resourceVersion"] == "42"
    # with our taint in place (and a timeAdded from the server), no taint change
    current["spec"]["taints"] = [not_ready, {**patch["spec"]["taints"][1], "timeAdded": NOW}]
    assert node_metadata_patch(current, build()) is None


def test_adopting_a_foreign_node_of_the_same_name() -> None:
    current = {"metadata": {"name": VIRTUAL_NODE, "resourceVersion": "7", "labels": {"x": "y"}},
               "spec": {}, "status": {}}
    patch = node_metadata_patch(current, build())
    assert patch is not None
    assert patch["metadata"]["labels"]["type"] == "virtual-kubelet"
    assert "x" not in patch["metadata"]["labels"]
    status = node_status_patch(current, build())
    assert status is not None
    assert status["status"]["capacity"] == GRANT
    assert {c["type"] for c in status["status"]["conditions"]} >= {"Ready", "ProviderReachable"}


# ---- the provider view (fed by hand: no watch, no I/O) --------------------------------------


def make_view(selector: dict[str, str] | None = None) -> tuple[ProviderView, list[int]]:
    changes: list[int] = []
    view = ProviderView(
        provider=KubeClient(Connection(server="https://127.0.0.1:1")),
        selector=selector or {},
        settings=WatchSettings(),
        on_change=lambda: changes.append(1),
        ignored_selector_keys=identity_keys(PROVIDER_ID, VIRTUAL_NODE),
    )
    return view, changes


def listed(*objects: dict[str, Any]) -> Listed:
    return Listed("1", frozenset(ObjectKey.of(o) for o in objects))


def feed(view: ProviderView, nodes: list[dict[str, Any]], pods: list[dict[str, Any]]) -> None:
    for n in nodes:
        view.handle_node(WatchEvent("ADDED", n))
    view.handle_node(listed(*nodes))
    for p in pods:
        view.handle_pod(WatchEvent("ADDED", p))
    view.handle_pod(listed(*pods))


def gpus_of(free: dict[str, dict[str, Decimal]]) -> dict[str, Decimal]:
    return {name: amounts.get("nvidia.com/gpu", Decimal(0)) for name, amounts in free.items()}


def test_view_free_room_per_node_and_largest_block() -> None:
    view, _ = make_view(SELECTOR)
    assert not view.synced
    feed(view, fleet(), [gpu_pod("a", "h100-0", gpus=6), gpu_pod("b", "h100-1", gpus=3),
                         gpu_pod("c", "l4-0", gpus=2)])
    assert view.synced
    assert gpus_of(view.per_node_free()) == {"h100-0": 2, "h100-1": 5}  # L4 and CPU not selected
    assert view.largest()["nvidia.com/gpu"] == 5
    assert view.per_node_free()["h100-0"]["pods"] == 109


def test_view_follows_pods_incrementally() -> None:
    view, changes = make_view(SELECTOR)
    pod = gpu_pod("a", "h100-0", gpus=6)
    feed(view, fleet(), [pod])
    count = len(changes)
    view.handle_pod(WatchEvent("MODIFIED", pod))  # same node, same request: nothing changed
    assert len(changes) == count
    view.handle_pod(WatchEvent("MODIFIED", gpu_pod("a", "h100-0", gpus=6, phase="Succeeded")))
    assert gpus_of(view.per_node_free()) == {"h100-0": 8, "h100-1": 8}
    assert len(changes) == count + 1
    view.handle_pod(WatchEvent("ADDED", gpu_pod("b", "h100-1", gpus=8)))
    assert view.largest()["nvidia.com/gpu"] == 8
    view.handle_pod(WatchEvent("ADDED", gpu_pod("c", "h100-0", gpus=1)))
    assert view.largest()["nvidia.com/gpu"] == 7
    view.handle_pod(WatchEvent("DELETED", gpu_pod("c", "h100-0", gpus=1)))
    assert view.largest()["nvidia.com/gpu"] == 8
    # a relist without "b": it was deleted while the watch was down
    view.handle_pod(listed())
    assert gpus_of(view.per_node_free()) == {"h100-0": 8, "h100-1": 8}


def test_view_fed_by_a_second_watch_counts_its_pods_and_relists_each_watch_apart() -> None:
    """The twin informer feeds the view the twins, which the view's own watch leaves out: each
    watch's relist forgets only what that watch fed, and the view is synced once both listed."""
    view, _ = make_view(SELECTOR)
    view.add_pod_source("twins", leave_out="gpuferry.io/origin-cluster-id!=cons")
    assert view.pod_label_selector == "gpuferry.io/origin-cluster-id!=cons"
    other, twin = gpu_pod("other", "h100-0", gpus=2), gpu_pod("twin", "h100-1", gpus=3)
    feed(view, fleet(), [other])
    assert not view.synced, "the twins are not listed yet"
    view.handle_pod(WatchEvent("ADDED", twin), "twins")
    view.handle_pod(listed(twin), "twins")
    assert view.synced
    assert gpus_of(view.per_node_free()) == {"h100-0": 6, "h100-1": 5}
    view.handle_pod(listed(), "")  # the view's own relist: "other" was deleted meanwhile, "twin" stays
    assert gpus_of(view.per_node_free()) == {"h100-0": 8, "h100-1": 5}
    view.handle_pod(WatchEvent("ADDED", other))
    view.handle_pod(listed(), "twins")  # and the twins' relist forgets only the twin
    assert gpus_of(view.per_node_free()) == {"h100-0": 6, "h100-1": 8}


def test_a_pod_that_moves_between_the_views_watches_is_counted_once() -> None:
    """A twin whose labels someone changes leaves one watch (a deletion there) and enters the
    other (an addition there), in either order: it is counted once, by the watch it entered."""
    for entering_first in (True, False):
        view, _ = make_view(SELECTOR)
        view.add_pod_source("twins", leave_out="gpuferry.io/origin-cluster-id!=cons")
        moved = gpu_pod("moved", "h100-0", gpus=2)
        feed(view, fleet(), [])
        view.handle_pod(WatchEvent("ADDED", moved), "twins")
        view.handle_pod(listed(moved), "twins")
        if entering_first:
            view.handle_pod(WatchEvent("ADDED", moved))
            view.handle_pod(WatchEvent("DELETED", moved), "twins")
        else:
            view.handle_pod(WatchEvent("DELETED", moved), "twins")
            view.handle_pod(WatchEvent("ADDED", moved))
        assert gpus_of(view.per_node_free()) == {"h100-0": 6, "h100-1": 8}, entering_first
        view.handle_pod(listed(), "twins")  # the watch it left lists it no more: still counted
        assert gpus_of(view.per_node_free()) == {"h100-0": 6, "h100-1": 8}, entering_first
        view.handle_pod(WatchEvent("DELETED", moved))
        assert gpus_of(view.per_node_free()) == {"h100-0": 8, "h100-1": 8}, entering_first


def test_view_ignores_node_heartbeats_but_not_readiness() -> None:
    view, changes = make_view(SELECTOR)
    feed(view, fleet(), [])
    count = len(changes)
    beat = node("h100-0", labels=H100)
    beat["status"]["conditions"][0]["lastHeartbeatTime"] = LATER
    view.handle_node(WatchEvent("MODIFIED", beat))
    assert len(changes) == count
    view.handle_node(WatchEvent("MODIFIED", node("h100-0", labels=H100, ready=False)))
    assert len(changes) == count + 1
    assert set(view.per_node_free()) == {"h100-1"}
    view.handle_node(WatchEvent("DELETED", node("h100-1", labels=H100)))
    assert view.per_node_free() == {}


def test_view_nodes_version_moves_with_labels_and_allocatable_not_readiness() -> None:
    """The virtual node's GPU labels are derived from the nodes' labels and allocatable only:
    a node going NotReady, tainted or cordoned (every few seconds somewhere, on a large provider)
    does not make them be computed again."""
    view, _ = make_view(SELECTOR)
    feed(view, fleet(), [])
    version = view.nodes_version
    view.handle_node(WatchEvent("MODIFIED", node("h100-0", labels=H100, ready=False)))
    view.handle_node(WatchEvent("MODIFIED", node("h100-0", labels=H100, unschedulable=True,
                                                 taints=[{"key": "k", "effect": "NoSchedule"}])))  # fmt: skip
    assert view.nodes_version == version
    view.handle_node(WatchEvent("MODIFIED", node("h100-0", labels=H100, gpus=4)))
    assert view.nodes_version == version + 1
    view.handle_node(WatchEvent("MODIFIED", node("h100-0", labels={**H100, "extra": "x"}, gpus=4)))
    assert view.nodes_version == version + 2
    view.handle_node(WatchEvent("ADDED", node("h100-9", labels=H100)))
    view.handle_node(WatchEvent("DELETED", node("h100-9", labels=H100)))
    assert view.nodes_version == version + 4


def test_view_eligible_nodes_kept_as_nodes_change_match_a_fresh_view() -> None:
    """The nodes a pod may land on are kept per selector and tolerations and updated one node
    at a time: after many changes of readiness, taints, cordons and labels, they are what a view
    fed only the final nodes finds."""
    rng = random.Random(15)
    taint = {"key": "nvidia.com/gpu", "effect": "NoSchedule"}
    toleration = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    view, _ = make_view(SELECTOR)
    feed(view, [node(f"h100-{i}", labels=H100) for i in range(20)], [])
    asked = [({}, []), ({"zone": "a"}, []), ({}, [toleration])]

    def answers(v: ProviderView) -> list[list[str]]:
        return [sorted(v.per_node_free(selector=sel, tolerations=tol)) for sel, tol in asked]

    answers(view)  # kept from here on
    final: dict[str, dict[str, Any] | None] = {f"h100-{i}": node(f"h100-{i}", labels=H100) for i in range(20)}
    for _ in range(400):
        name = f"h100-{rng.randrange(24)}"
        if rng.random() < 0.1:
            view.handle_node(WatchEvent("DELETED", node(name, labels=H100)))
            final[name] = None
            continue
        changed = node(name, labels={**H100, **({"zone": "a"} if rng.random() < 0.5 else {})},
                       ready=rng.random() < 0.8, unschedulable=rng.random() < 0.2,
                       taints=[taint] if rng.random() < 0.3 else None)  # fmt: skip
        view.handle_node(WatchEvent("MODIFIED", changed))
        final[name] = changed
    fresh, _ = make_view(SELECTOR)
    feed(fresh, [n for n in final.values() if n is not None], [])
    assert answers(view) == answers(fresh)
    assert any(answers(view)), "the changes left some node eligible"


def scanned_largest(view: ProviderView) -> dict[str, Decimal]:
    """The largest free block per resource, by a scan of every node the grant picks."""
    largest: dict[str, Decimal] = {}
    for free in view.per_node_free().values():
        for name, amount in free.items():
            largest[name] = max(largest.get(name, Decimal(0)), amount)
    return largest


def test_view_largest_block_kept_as_pods_and_nodes_change_matches_a_scan() -> None:
    """The largest free block is kept between answers and moved by each pod's change: after
    each of many pods coming, going and growing, and nodes changing, it is what a scan of every
    node finds (the incremental answer may drop itself, never go wrong)."""
    rng = random.Random(1515)
    view, _ = make_view(SELECTOR)
    nodes = [node(f"h100-{i}", labels=H100) for i in range(6)] + [node("l4-0", gpus=2, labels=L4)]
    feed(view, nodes, [])
    assert view.largest() == scanned_largest(view)
    placed: dict[str, dict[str, Any]] = {}
    for step in range(1500):
        roll = rng.random()
        if roll < 0.45 or not placed:  # a pod comes (or changes its size on the same name)
            name = f"p{rng.randrange(60)}"
            pod = gpu_pod(name, rng.choice([n["metadata"]["name"] for n in nodes]), gpus=rng.randrange(1, 5),
                          cpu=str(rng.randrange(1, 9)), memory=f"{rng.randrange(1, 64)}Gi")  # fmt: skip
            view.handle_pod(WatchEvent("MODIFIED" if name in placed else "ADDED", pod))
            placed[name] = pod
        elif roll < 0.85:  # a pod goes, or finishes
            name = rng.choice(sorted(placed))
            gone = placed.pop(name)
            if rng.random() < 0.5:
                view.handle_pod(WatchEvent("DELETED", gone))
            else:
                finished = gpu_pod(name, gone["spec"]["nodeName"], phase="Succeeded")
                view.handle_pod(WatchEvent("MODIFIED", finished))
        else:  # a node changes: readiness, size or a cordon
            i = rng.randrange(6)
            changed = node(f"h100-{i}", labels=H100, gpus=rng.choice([4, 8]), ready=rng.random() < 0.8,
                           unschedulable=rng.random() < 0.1)  # fmt: skip
            nodes[i] = changed
            view.handle_node(WatchEvent("MODIFIED", changed))
        if rng.random() < 0.3:
            assert view.largest() == scanned_largest(view), f"step {step}"
    assert view.largest() == scanned_largest(view)
    assert view.largest()["nvidia.com/gpu"] > 0


def test_view_largest_block_is_a_copy() -> None:
    view, _ = make_view(SELECTOR)
    feed(view, fleet(), [])
    view.largest()["nvidia.com/gpu"] = Decimal(99)
    assert view.largest()["nvidia.com/gpu"] == 8


def test_view_fit_is_fit_not_sum() -> None:
    view, _ = make_view(SELECTOR)
    feed(view, [node(f"h100-{i}", labels=H100) for i in range(4)],
         [gpu_pod(f"p{i}", f"h100-{i}", gpus=6) for i in range(4)])
    result = view.fit(gpu_pod("big", gpus=4, phase=None))
    assert not result.ok
    assert result.reason == "ExceedsLargestBlock"
    assert "largest free block on any provider node is 2 (8 free in total across 4 nodes)" in result.message
    assert view.fit(gpu_pod("small", gpus=2, phase=None)).ok


def test_view_fit_uses_the_pods_tolerations_and_node_selector() -> None:
    view, _ = make_view()
    tainted = node("h100-t", labels=H100, taints=[{"key": "nvidia.com/gpu", "effect": "NoSchedule"}])
    feed(view, [tainted, node("l4-0", gpus=2, labels=L4)], [])
    pod = gpu_pod("p", gpus=4, phase=None)
    assert view.fit(pod).reason == "ExceedsLargestBlock"  # the L4 node only: 2 GPUs
    pod["spec"]["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    fit = view.fit(pod)
    assert fit.ok and fit.node == "h100-t"
    # the virtual node's identity and gpuferry's labels are ignored; GFD ones narrow the nodes
    pod["spec"]["nodeSelector"] = {"type": "virtual-kubelet", "kubernetes.io/hostname": VIRTUAL_NODE,
                                   LARGEST_GPU_BLOCK_LABEL: "8"}
    assert view.fit(pod).ok
    pod["spec"]["nodeSelector"]["nvidia.com/gpu.product"] = "NVIDIA-L4"
    assert not view.fit(pod).ok


def test_view_fit_follows_nodes_and_pods_after_it_answered() -> None:
    # fits are answered from kept per-node free room and kept eligible nodes: both must follow
    view, _ = make_view(SELECTOR)
    feed(view, [node("h100-0", labels=H100), node("h100-1", labels=H100)], [])
    pod = gpu_pod("p", gpus=8, phase=None)
    assert view.fit(pod).node == "h100-0"
    view.handle_pod(WatchEvent("ADDED", gpu_pod("a", "h100-0", gpus=1)))
    assert view.fit(pod).node == "h100-1"  # h100-0 has 7 left
    cordoned = node("h100-1", labels=H100)
    cordoned["spec"]["unschedulable"] = True
    view.handle_node(WatchEvent("MODIFIED", cordoned))
    result = view.fit(pod)
    assert not result.ok and "largest free block on any provider node is 7" in result.message
    view.handle_pod(WatchEvent("DELETED", gpu_pod("a", "h100-0", gpus=1)))
    assert view.fit(pod).node == "h100-0"
    view.handle_node(WatchEvent("MODIFIED", node("h100-0", labels=H100, gpus=4)))  # allocatable shrank
    assert not view.fit(pod).ok
    view.handle_node(WatchEvent("MODIFIED", node("h100-1", labels=H100)))  # uncordoned
    assert view.fit(pod).node == "h100-1"
    view.handle_node(WatchEvent("DELETED", node("h100-1", labels=H100)))
    assert not view.fit(pod).ok
    assert view.fit(gpu_pod("q", gpus=4, phase=None)).node == "h100-0"


def test_the_network_condition_follows_the_peer_networks_own() -> None:
    assert network_condition(None) == Condition(
        "NetworkReady", "True", "NoNetworkFabric",
        "no network fabric for this provider (peered without one): nothing to wait for",
    )  # fmt: skip
    assert network_condition({"status": {}}).status == "Unknown"
    down = {"status": {"conditions": [{"type": "NetworkReady", "status": "False", "reason": "NoHandshake",
                                       "message": "no handshake in 3m"}]}}  # fmt: skip
    assert network_condition(down) == Condition(
        "NetworkReady", "False", "NoHandshake", "tunnel to the provider: no handshake in 3m"
    )
    conditions = node_conditions(provider_reachable=True, network=network_condition(down))
    assert conditions[-1].type == "NetworkReady" and conditions[-1].status == "False"


def test_view_counts_the_tainted_nodes_the_grant_tolerates() -> None:
    """A slice granted on tainted GPU nodes: its tolerations count for every pod (twins carry
    them), and the largest block is taken over those nodes too."""
    tainted = node("h100-t", labels=H100, taints=[{"key": "nvidia.com/gpu", "effect": "NoSchedule"}])
    plain, _ = make_view()
    feed(plain, [tainted, node("l4-0", gpus=2, labels=L4)], [])
    assert plain.largest()["nvidia.com/gpu"] == 2
    gpu = [{"key": "nvidia.com/gpu", "operator": "Exists"}]
    client = KubeClient(Connection(server="https://127.0.0.1:1"))
    view = ProviderView(provider=client, selector={}, settings=WatchSettings(), tolerations=gpu)
    feed(view, [tainted, node("l4-0", gpus=2, labels=L4)], [])
    assert view.largest()["nvidia.com/gpu"] == 8
    fit = view.fit(gpu_pod("p", gpus=4, phase=None))
    assert fit.ok and fit.node == "h100-t"


def test_a_pod_waiting_on_a_withdrawn_grant_is_told_so() -> None:
    view, _ = make_view()
    block = {"nvidia.com/gpu": "2", "cpu": "8", "memory": "64Gi", "pods": "10"}
    shape = {"nodes": [{"name": "n1", "free": block}]}
    granted = {"spec": {}, "status": {"phase": "Granted", "shape": shape}}
    view.set_granted_nodes(granted)
    view.mark_pods_synced()
    assert view.fit(gpu_pod("p")).ok
    withdrawn = {"spec": {}, "status": {"phase": "Denied", "reason": "NoMatchingNodes",
                                        "message": "no schedulable node matches"}}  # fmt: skip
    view.set_granted_nodes(withdrawn)
    result = view.fit(gpu_pod("p"))
    assert not result.ok and result.reason == "NothingGranted"
    assert result.message == (
        "the provider grants nothing now (GPUSlice Denied: NoMatchingNodes: no schedulable node matches)"
    )
    assert "none is Ready" not in result.message


def test_the_view_watches_only_the_nodes_the_grant_picks() -> None:
    view, _ = make_view({"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "b": "2"})
    assert view.node_label_selector == "b=2,nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3"
    assert make_view()[0].node_label_selector is None  # no selector: every node


def test_pods_asking_the_same_share_one_request() -> None:
    view, _ = make_view(SELECTOR)
    feed(view, fleet(), [gpu_pod("a", "h100-0", gpus=2), gpu_pod("b", "h100-1", gpus=2),
                         gpu_pod("c", "h100-1", gpus=1)])  # fmt: skip
    requests = {key.name: request for key, (_, request, _) in view._pods.items()}
    assert requests["a"] is requests["b"] and requests["a"] is not requests["c"]
    assert gpus_of(view.per_node_free()) == {"h100-0": 6, "h100-1": 5}  # shared, never changed


# ---- shared and partitioned GPUs (issue 18) ---------------------------------------------------

A100_MIG = {
    "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
    "nvidia.com/gpu.memory": "81920",
    "nvidia.com/mig.capable": "true",
    "nvidia.com/mig.strategy": "mixed",
    "nvidia.com/cuda.driver-version.major": "580",
    "nvidia.com/mig-1g.10gb.count": "16",
    "nvidia.com/mig-1g.10gb.memory": "9728",
    "nvidia.com/mig-1g.10gb.slices.gi": "1",
    "nvidia.com/gpu.count": "8",
}
L4_SHARED = {
    **L4,
    "nvidia.com/gpu.product": "NVIDIA-L4-SHARED",
    "nvidia.com/gpu.replicas": "4",
    "nvidia.com/gpu.sharing-strategy": "time-slicing",
}


def sharing_fleet() -> list[dict[str, Any]]:
    return [
        *fleet(),
        node("a100-mig-0", gpus=0, labels=A100_MIG, extra={"nvidia.com/mig-1g.10gb": "16"}),
        node("a100-mig-1", gpus=0, labels={**A100_MIG, "nvidia.com/mig-1g.10gb.count": "14"},
             extra={"nvidia.com/mig-1g.10gb": "14"}),
        node("l4-shared-0", gpus=0, labels=L4_SHARED, extra={"nvidia.com/gpu.shared": "16"}),
    ]


def test_a_mig_grant_copies_the_labels_of_the_mig_nodes_only() -> None:
    # no selector: the whole-GPU nodes are left out, since the grant has none of their GPUs
    labels = provider_gpu_labels(sharing_fleet(), None, {"nvidia.com/mig-1g.10gb": "20", "cpu": "8"})
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-80GB"
    assert labels["nvidia.com/mig.strategy"] == "mixed"
    assert labels["nvidia.com/mig-1g.10gb.memory"] == "9728"
    assert labels["nvidia.com/mig-1g.10gb.slices.gi"] == "1"
    assert "nvidia.com/mig-1g.10gb.count" not in labels  # per node, not the virtual node's
    assert GPU_COUNT_LABEL not in labels  # no whole GPU granted


def test_a_time_sliced_grant_says_how_its_gpus_are_shared() -> None:
    labels = provider_gpu_labels(sharing_fleet(), None, {"nvidia.com/gpu.shared": "4"})
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-L4-SHARED"
    assert labels["nvidia.com/gpu.replicas"] == "4"
    assert labels["nvidia.com/gpu.sharing-strategy"] == "time-slicing"


def test_a_grant_across_sharing_schemes_copies_only_what_they_share() -> None:
    grant = {"nvidia.com/gpu.shared": "4", "nvidia.com/mig-1g.10gb": "2"}
    labels = provider_gpu_labels(sharing_fleet(), None, grant)
    assert "nvidia.com/gpu.product" not in labels and "nvidia.com/gpu.replicas" not in labels
    assert labels["nvidia.com/cuda.driver-version.major"] == "580"


def offline_controller(**settings: Any) -> NodeController:
    """A node controller whose clients reach nothing: its pure parts, and what it does with a
    probe's answer."""
    nowhere = KubeClient(Connection(server="https://127.0.0.1:1"))
    return NodeController(consumer=nowhere, provider=nowhere, settings=VirtualKubeletSettings(
        consumer_kubeconfig=None, provider_kubeconfig=None, consumer_cluster_id="consumer-1",
        provider_cluster_id=PROVIDER_ID, resources={"nvidia.com/gpu": "4", "pods": "110"}, **settings,
    ))  # fmt: skip


def test_the_nodes_gpu_labels_follow_the_provider_nodes_between_updates() -> None:
    """The controller keeps the GPU labels it read until a provider node changes (issue 15: a
    burst of pods marks the Node dirty every second); each kind of node change reaches them."""
    controller = offline_controller()
    view = controller.view

    def labels() -> dict[str, str]:
        return controller.desired(None)["metadata"]["labels"]

    feed(view, [node("h100-0", labels=H100), node("h100-1", labels=H100)], [])
    assert labels()["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    view.handle_pod(WatchEvent("ADDED", gpu_pod("p", "h100-0")))  # pods change nothing here
    assert labels()["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    view.handle_node(WatchEvent("ADDED", node("l4-0", gpus=2, labels=L4)))  # no longer uniform
    assert "nvidia.com/gpu.product" not in labels()
    view.handle_node(WatchEvent("DELETED", node("l4-0", gpus=2, labels=L4)))
    assert labels()["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    view.handle_node(WatchEvent("MODIFIED", node("h100-1", labels={**H100, "nvidia.com/gpu.memory": "1"})))
    assert "nvidia.com/gpu.memory" not in labels()
    view.handle_node(listed(node("h100-0", labels=H100)))  # a relist without h100-1
    assert labels()["nvidia.com/gpu.memory"] == "81559"


def test_a_new_grant_is_advertised_without_a_restart_and_a_bad_one_is_refused() -> None:
    controller = offline_controller(node_labels={"team": "a"})
    woken: list[int] = []
    controller.on_capacity_change(lambda: woken.append(1))
    feed(controller.view, [node("h100-0", labels=H100), node("h100-1", labels=H100)], [])
    before = controller.desired(None)
    assert before["status"]["capacity"]["nvidia.com/gpu"] == "4"
    assert before["metadata"]["labels"]["team"] == "a"
    woken.clear()

    controller.apply_grant({"nvidia.com/gpu": "2", "pods": "110"}, {"team": "b"})
    after = controller.desired(None)
    assert after["status"]["capacity"]["nvidia.com/gpu"] == "2"
    assert after["status"]["allocatable"]["nvidia.com/gpu"] == "2"
    assert after["metadata"]["labels"]["team"] == "b"
    assert controller.largest_block == 2  # the free block is capped by the new grant
    assert woken  # pods waiting for room are looked at again

    woken.clear()
    controller.apply_grant({"nvidia.com/gpu": "2", "pods": "110"}, {"team": "b"})  # the same: nothing
    assert not woken
    controller.apply_grant({"nvidia.com/gpu": "two"}, {})  # not a quantity: the grant in force stays
    assert controller.desired(None)["status"]["capacity"]["nvidia.com/gpu"] == "2" and not woken


def test_the_provider_back_after_an_outage_wakes_its_listeners_once() -> None:
    """Found unreachable (PROBE_FAILURES probes in a row), then answering again: the queues'
    listener is called once then, not at the first probe of a process (nothing failed before)
    nor at a probe that fails once between good ones."""
    controller = offline_controller()
    back: list[int] = []
    controller.on_provider_back(lambda: back.append(1))
    controller._record_probe(None)  # the first probe: reachable, nothing to retry
    controller._record_probe("connection refused")  # one failure: still reachable
    controller._record_probe(None)
    assert controller.reachable is True and back == []
    for _ in range(PROBE_FAILURES):
        controller._record_probe("connection refused")
    assert controller.reachable is False and back == []
    controller._record_probe(None)
    assert controller.reachable is True and back == [1]
    controller._record_probe(None)
    assert back == [1]


def test_a_listener_that_raises_stops_neither_the_others_nor_the_probe(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A bug in one listener (the provider back, capacity changed) is logged; the listeners
    after it are still told, the probe's result is recorded and the Node marked to be written."""
    controller = offline_controller()
    told: list[str] = []

    def broken() -> None:
        raise RuntimeError("listener bug")

    controller.on_provider_back(broken)
    controller.on_provider_back(lambda: told.append("back"))
    controller.on_capacity_change(broken)
    controller.on_capacity_change(lambda: told.append("capacity"))
    controller._record_probe(None)
    for _ in range(PROBE_FAILURES):
        controller._record_probe("connection refused")
    controller._dirty.clear()
    controller._probed.clear()
    with caplog.at_level(logging.ERROR):
        controller._record_probe(None)
        controller.apply_grant({"nvidia.com/gpu": "3"}, {})
    assert told == ["back", "capacity"]
    assert controller.reachable is True and controller._dirty.is_set() and controller._probed.is_set()
    assert controller.resources == {"nvidia.com/gpu": "3"}
    failures = [r for r in caplog.records if "listener" in r.getMessage()]
    assert len(failures) == 2 and all(r.exc_info for r in failures), caplog.text
