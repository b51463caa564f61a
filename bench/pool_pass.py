"""The provider's GPU pool pass: free capacity from every pod (how a pass read the pods before
dd5e7de, and still does for a list of pods: :func:`peering.provider.planning.free_capacity`)
against free capacity from the sums :class:`peering.provider.usage.PodUse` keeps as pods change
(:func:`peering.provider.planning.free_capacity_of_use`, what a pass reads now).

Synthetic and in-process: N single-GPU pods bound across nodes of 8 GPUs (N/8 nodes, the
offload bench's provider), each pod in one of a few namespaces. Prints, per N, the time of one
pass each way (the best of ``--repeat``), their ratio, and what keeping the sums costs per pod
event (a pod bound, then finished): the work moved from every pass to each pod's changes.
A pass is asked for on every pod change in a burst, paced (:mod:`kube.pacing`).

    .venv/bin/python -m bench.pool_pass --pods 1000 --pods 10000
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

from kube.objects import ObjectKey
from peering.provider.planning import free_capacity, free_capacity_of_use
from peering.provider.usage import PodUse

GPUS_PER_NODE = 8
NAMESPACES = ("gpuferry-tenant-a", "ml-direct", "kube-system")


def node(name: str) -> dict[str, Any]:
    allocatable = {"nvidia.com/gpu": str(GPUS_PER_NODE), "cpu": "64", "memory": "512Gi", "pods": "110"}
    conditions = [{"type": "Ready", "status": "True"}, {"type": "MemoryPressure", "status": "False"}]
    return {"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "gpu": "h100"}},
            "spec": {}, "status": {"allocatable": allocatable, "conditions": conditions}}  # fmt: skip


def pod(i: int, node_name: str, phase: str = "Running") -> dict[str, Any]:
    gpu = {"nvidia.com/gpu": "1"}
    resources = {"requests": {"cpu": "1", "memory": "8Gi", **gpu}, "limits": gpu}
    return {"metadata": {"name": f"p-{i:05d}", "namespace": NAMESPACES[i % len(NAMESPACES)]},
            "spec": {"nodeName": node_name, "containers": [{"resources": resources}], "initContainers": []},
            "status": {"phase": phase}}  # fmt: skip


def best(repeat: int, run: Callable[[], object]) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def measure(n: int, repeat: int) -> str:
    nodes = [node(f"gpu-{i:05d}") for i in range(max(1, n // GPUS_PER_NODE))]
    pods = [pod(i, nodes[i % len(nodes)]["metadata"]["name"]) for i in range(n)]
    tenants = {NAMESPACES[0]: "consumer-a"}
    use = PodUse()
    start = time.perf_counter()
    keys = [ObjectKey(p["metadata"]["namespace"], p["metadata"]["name"]) for p in pods]
    for key, p in zip(keys, pods, strict=True):  # each pod bound, then finished: two changes
        use.set(key, p)
    for key, p in zip(keys, pods, strict=True):
        use.set(key, {**p, "status": {"phase": "Succeeded"}})
    upkeep = (time.perf_counter() - start) / (2 * n)
    for key, p in zip(keys, pods, strict=True):
        use.set(key, p)
    from_pods = free_capacity(nodes, pods, tenants)
    from_sums = free_capacity_of_use(nodes, use.sums, tenants)
    if from_pods != from_sums:
        return f"N={n}: the two ways disagree ({len(from_pods)} and {len(from_sums)} nodes): not timed"
    old = best(repeat, lambda: free_capacity(nodes, pods, tenants))
    new = best(repeat, lambda: free_capacity_of_use(nodes, use.sums, tenants))
    return (f"N={n} pods on {len(nodes)} nodes: a pass from every pod {old * 1000:.1f} ms, from the kept "
            f"sums {new * 1000:.1f} ms: {old / new:.1f}x faster; keeping the sums {upkeep * 1e6:.0f} µs "
            f"per pod change")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pods", type=int, action="append", help="N (repeatable; default 1000 and 10000)")
    parser.add_argument("--repeat", type=int, default=5, help="passes timed each way; the best is printed")
    args = parser.parse_args()
    for n in args.pods or [1000, 10000]:
        if n < 1:
            parser.error(f"--pods must be at least 1, not {n}")
        print(measure(n, max(1, args.repeat)), flush=True)


if __name__ == "__main__":
    main()
