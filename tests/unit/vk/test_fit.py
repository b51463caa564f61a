from __future__ import annotations

from decimal import Decimal

from kube.quantities import parse_resource_list
from vk.forge.fit import (
    fits_somewhere,
    is_terminal,
    largest_blocks,
    node_free,
    per_node_free,
    placement_request,
    tolerates,
    unschedulable_reason,
)

from .builders import gpu_pod, node


def four_nodes_two_free_gpus_each() -> tuple[list[dict[str, object]], list[dict[str, object]]]:
    nodes = [node(f"gpu-node-{i}", gpus=8, cpu="64", memory="512Gi") for i in range(4)]
    pods = [gpu_pod(f"busy-{i}-{j}", f"gpu-node-{i}") for i in range(4) for j in range(6)]
    return nodes, pods


def test_node_free_subtracts_non_terminal_bound_pods() -> None:
    n = node("gpu-node-0", gpus=8, cpu="64", memory="512Gi", pods="110")
    pods = [
        gpu_pod("a", "gpu-node-0", gpus=2, cpu="4", memory="32Gi"),
        gpu_pod("b", "gpu-node-0", gpus=1, cpu="500m", memory="1536Mi", phase="Pending"),
        gpu_pod("done", "gpu-node-0", gpus=4, phase="Succeeded"),
        gpu_pod("failed", "gpu-node-0", gpus=4, phase="Failed"),
        gpu_pod("elsewhere", "gpu-node-1", gpus=4),
        gpu_pod("unbound", None, gpus=4, phase="Pending"),
    ]
    memory = Decimal((512 - 32) * 2**30 - 1536 * 2**20)
    assert node_free(n, pods) == {
        "nvidia.com/gpu": Decimal(5),
        "cpu": Decimal("59.5"),
        "memory": memory,
        "pods": Decimal(108),
    }
    assert is_terminal(pods[2]) and not is_terminal(pods[0])


def test_the_issue_case_four_nodes_two_free_gpus_a_pod_asking_four() -> None:
    nodes, pods = four_nodes_two_free_gpus_each()
    free = per_node_free(nodes, pods)
    assert sum(f["nvidia.com/gpu"] for f in free.values()) == 8, "the virtual node would show 8"
    assert largest_blocks(nodes, pods)["nvidia.com/gpu"] == 2
    result = fits_somewhere(placement_request(gpu_pod("big", gpus=4)), free)
    assert not result.ok
    assert result.reason == "ExceedsLargestBlock"
    assert result.message == (
        "pod needs 4 nvidia.com/gpu but the largest free block on any provider node "
        "is 2 (8 free in total across 4 nodes)"
    )
    assert result.node is None
    ok = fits_somewhere(placement_request(gpu_pod("small", gpus=2)), free)
    assert ok.ok and ok.reason == "Fits" and ok.node == "gpu-node-0"


def test_resources_are_considered_jointly_on_one_node() -> None:
    nodes = [
        node("gpus-no-cpu", gpus=4, cpu="1"),
        node("lots-of-cpu", gpus=1, cpu="64"),
        node("nothing-much", gpus=1, cpu="1"),
    ]
    free = per_node_free(nodes, [])
    assert largest_blocks(nodes, [])["nvidia.com/gpu"] == 4 and largest_blocks(nodes, [])["cpu"] == 64
    result = fits_somewhere(placement_request(gpu_pod("p", gpus=4, cpu="8", memory="16Gi")), free)
    assert not result.ok and result.reason == "NoNodeFitsAll"
    assert result.message == (
        "pod needs 8 cpu, 16Gi memory and 4 nvidia.com/gpu on a single node, but none of 3 nodes has all of "
        "them free: the closest, gpus-no-cpu, has 512Gi memory and 4 nvidia.com/gpu but only 1 cpu free"
    )


def test_several_resources_too_big() -> None:
    free = per_node_free([node("n1", gpus=2, memory="64Gi")], [])
    result = fits_somewhere(placement_request(gpu_pod("p", gpus=4, memory="128Gi")), free)
    assert result.message == (
        "pod needs 128Gi memory but the largest free block on any provider node is 64Gi (64Gi free in total "
        "across 1 node); pod needs 4 nvidia.com/gpu but the largest free block on any provider node is 2 "
        "(2 free in total across 1 node)"
    )


def test_extended_resources_absent_from_every_node() -> None:
    free = per_node_free([node("n1"), node("n2")], [])
    request = parse_resource_list({"nvidia.com/mig-1g.10gb": "1", "cpu": "1"})
    result = fits_somewhere(request, free)
    assert result.message == (
        "pod needs 1 nvidia.com/mig-1g.10gb but the largest free block on any provider "
        "node is 0 (0 free in total across 2 nodes)"
    )


def test_no_provider_nodes() -> None:
    result = fits_somewhere({"nvidia.com/gpu": Decimal(1)}, {})
    assert not result.ok and result.reason == "NoProviderNodes"


def test_zero_requests_fit_anywhere() -> None:
    assert fits_somewhere({"nvidia.com/gpu": Decimal(0)}, {"n": {}}).ok


def test_overcommitted_nodes_count_as_zero_free() -> None:
    nodes = [node("n1", gpus=1)]
    pods = [gpu_pod("a", "n1", gpus=1), gpu_pod("b", "n1", gpus=1)]
    assert node_free(nodes[0], pods)["nvidia.com/gpu"] == -1
    assert largest_blocks(nodes, pods)["nvidia.com/gpu"] == 0
    result = fits_somewhere({"nvidia.com/gpu": Decimal(1)}, per_node_free(nodes, pods))
    assert "is 0 (0 free in total across 1 node)" in result.message


def test_only_schedulable_ready_matching_untainted_nodes_count() -> None:
    gpu_taint = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
    nodes = [
        node("ready", gpus=2),
        node("cordoned", gpus=8, unschedulable=True),
        node("not-ready", gpus=8, ready=False),
        node("tainted", gpus=4, taints=[gpu_taint]),
        node("prefer", gpus=3, taints=[{"key": "x", "effect": "PreferNoSchedule"}]),
        node("a100", gpus=6, labels={"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}),
    ]
    selector = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert sorted(per_node_free(nodes, [], selector=selector)) == ["prefer", "ready"]
    assert largest_blocks(nodes, [], selector=selector)["nvidia.com/gpu"] == 3
    tolerated = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert largest_blocks(nodes, [], selector=selector, tolerations=tolerated)["nvidia.com/gpu"] == 4
    assert largest_blocks(nodes, [])["nvidia.com/gpu"] == 6
    assert unschedulable_reason(nodes[1]) == "cordoned"
    assert unschedulable_reason(nodes[2]) == "not Ready"
    assert unschedulable_reason(nodes[3]) == "has taint nvidia.com/gpu=present:NoSchedule"
    assert unschedulable_reason(nodes[5], selector=selector) == (
        "does not match node selector nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3"
    )
    assert unschedulable_reason({"metadata": {"name": "bare"}}) == "not Ready"


def test_tolerates() -> None:
    taint = {"key": "dedicated", "value": "ml", "effect": "NoSchedule"}
    assert tolerates([{"key": "dedicated", "operator": "Equal", "value": "ml"}], taint)
    assert tolerates([{"key": "dedicated", "value": "ml", "effect": "NoSchedule"}], taint)
    assert tolerates([{"operator": "Exists"}], taint)
    assert not tolerates([{"key": "dedicated", "operator": "Equal", "value": "web"}], taint)
    assert not tolerates([{"key": "dedicated", "operator": "Exists", "effect": "NoExecute"}], taint)
    assert not tolerates([], taint)


def test_placement_request_takes_a_pod_slot() -> None:
    assert placement_request(gpu_pod("p", gpus=2, cpu="500m", memory="1Gi")) == {
        "cpu": Decimal("0.5"),
        "memory": Decimal(2**30),
        "nvidia.com/gpu": Decimal(2),
        "pods": Decimal(1),
    }


def test_pods_slot_exhaustion() -> None:
    nodes = [node("n1", pods="2")]
    pods = [gpu_pod("a", "n1"), gpu_pod("b", "n1")]
    result = fits_somewhere(placement_request(gpu_pod("c")), per_node_free(nodes, pods))
    assert result.message.startswith("pod needs 1 pods but the largest free block")
