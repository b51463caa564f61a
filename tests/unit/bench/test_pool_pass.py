"""The pool-pass bench times the two ways only where they agree."""

from __future__ import annotations

from bench.pool_pass import measure, node, pod
from peering.provider.planning import free_capacity


def test_the_bench_times_both_ways_of_a_pass_and_they_agree() -> None:
    line = measure(64, 1)
    assert line.startswith("N=64 pods on 8 nodes: a pass from every pod"), line
    assert "x faster" in line and "disagree" not in line


def test_its_pods_fill_its_nodes_a_gpu_each() -> None:
    nodes = [node(f"gpu-{i}") for i in range(2)]
    pods = [pod(i, nodes[i % 2]["metadata"]["name"]) for i in range(6)]
    free = {n.name: n.free["nvidia.com/gpu"] for n in free_capacity(nodes, pods)}
    assert free == {"gpu-0": 5, "gpu-1": 5}
