"""Offload throughput: N GPU pods created on the consumer until the consumer sees them Running,
against the same N pods created directly on the provider (the baseline).

Runs on the local clusters (profile "demo" by default: ``make demo`` first). The virtual kubelet
runs as its own process (``python -m vk``) so that its CPU seconds and peak RSS can be read from
/proc. Prints p50/p99 per pod, total time, the ratio to the baseline, CPU and RSS.

    .venv/bin/python bench/offload.py --pods 100 --pods 1000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

from hack.localcluster import NodeSpec, profile_clusters
from hack.localcluster.nodes import node_manifest
from kube.clients import KubeClient
from kube.errors import NotFound
from kube.objects import NAMESPACES, NODES, PODS, RawObject
from kube.settings import ClientSettings
from kube.watching import Listed, watch_objects

TOLERATION = {"key": "virtual-node.gpuferry.io/not-allowed", "operator": "Exists", "effect": "NoExecute"}


def pod(name: str) -> RawObject:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "containers": [{"name": "c", "image": "cuda", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
            "tolerations": [TOLERATION],
            "terminationGracePeriodSeconds": 0,
        },
    }


async def create_and_time(client: KubeClient, namespace: str, count: int) -> tuple[list[float], float]:
    """Create ``count`` pods and return per-pod seconds to Running and the total seconds."""
    running: dict[str, float] = {}
    created: dict[str, float] = {}
    done = asyncio.Event()

    async def watch() -> None:
        async for item in watch_objects(client, PODS, namespace=namespace):
            if isinstance(item, Listed):
                continue
            name = item.key.name
            if item.object.get("status", {}).get("phase") == "Running" and name not in running:
                running[name] = time.monotonic()
                if len(running) == count:
                    done.set()
                    return

    watcher = asyncio.create_task(watch())
    await asyncio.sleep(0.5)
    start = time.monotonic()
    sem = asyncio.Semaphore(32)

    async def create(i: int) -> None:
        name = f"p-{i:05d}"
        async with sem:
            created[name] = time.monotonic()
            await client.create(PODS, pod(name), namespace)

    await asyncio.gather(*(create(i) for i in range(count)))
    await asyncio.wait_for(done.wait(), timeout=max(120, count))
    total = time.monotonic() - start
    await watcher
    return [running[n] - created[n] for n in created], total


async def wait_gone(client: KubeClient, namespace: str) -> None:
    while True:
        try:
            await client.get(NAMESPACES, namespace)
        except NotFound:
            return
        await asyncio.sleep(0.5)


async def wait_no_pods(client: KubeClient, label_selector: str) -> None:
    while True:
        if not (await client.list(PODS, label_selector=label_selector))["items"]:
            return
        await asyncio.sleep(0.5)


def proc_stats(pid: int) -> tuple[float, int]:
    """CPU seconds (user+system) and peak RSS in bytes of a process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    cpu = (int(fields[11]) + int(fields[12])) / ticks
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return cpu, int(line.split()[1]) * 1024
    return cpu, 0


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def bench(profile: str, counts: list[int]) -> None:
    clusters = profile_clusters(profile)
    consumer, provider = clusters["consumer"], clusters["provider"]
    suffix = uuid.uuid4().hex[:5]
    cons_id, prov_id = f"bench-c{suffix}", f"bench-p{suffix}"
    gpus = str(max(counts) + 10)
    vk = subprocess.Popen(  # noqa: ASYNC220 - started once, before any timing
        [
            sys.executable,
            "-m",
            "vk",
            "--consumer-kubeconfig",
            str(consumer.spec.kubeconfig),
            "--provider-kubeconfig",
            str(provider.spec.kubeconfig),
            "--consumer-id",
            cons_id,
            "--provider-id",
            prov_id,
            "--resource",
            f"nvidia.com/gpu={gpus}",
            "--resource",
            "cpu=100000",
            "--resource",
            "memory=100Ti",
            "--resource",
            f"pods={gpus}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=open(f"/tmp/bench-vk-{suffix}.log", "w"),  # noqa: SIM115, ASYNC230
    )
    # the simulated provider has 36 GPUs; N pods with one GPU each need more nodes (kwok runs them)
    extra = [
        NodeSpec(
            name=f"bench-gpu-{suffix}-{i}",
            cpu="96",
            memory="1536Gi",
            gpus=8,
            gpu_labels={"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
        )
        for i in range(max(counts) // 8 + 2)
    ]
    provider.kubectl(
        "create",
        "-f",
        "-",
        input=json.dumps({"apiVersion": "v1", "kind": "List", "items": [node_manifest(n) for n in extra]}),
    )
    fast = ClientSettings(qps=0)
    try:
        async with (
            KubeClient.from_kubeconfig(consumer.spec.kubeconfig, settings=fast) as c,
            KubeClient.from_kubeconfig(provider.spec.kubeconfig, settings=fast) as p,
        ):
            node = f"gpuferry-{prov_id}"
            async for item in watch_objects(c, NODES, field_selector=f"metadata.name={node}"):
                if not isinstance(item, Listed) and any(
                    x["type"] == "Ready" and x["status"] == "True"
                    for x in item.object.get("status", {}).get("conditions", [])
                ):
                    break
            for n in counts:
                results = {}
                for side, client in (("direct", p), ("offloaded", c)):
                    ns = f"bench-{side}-{n}-{suffix}"
                    await client.create(
                        NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}
                    )
                    await asyncio.sleep(1.5)  # default ServiceAccount
                    results[side] = await create_and_time(client, ns, n)
                    await client.delete(NAMESPACES, ns)
                    # the pods hold their GPUs until they are gone: the next run needs them
                    await wait_gone(client, ns)
                    if side == "offloaded":  # and the twins too
                        await wait_no_pods(p, f"gpuferry.io/origin-cluster-id={cons_id}")
                cpu, rss = proc_stats(vk.pid)
                d, o = results["direct"], results["offloaded"]
                print(
                    f"N={n}: direct total {d[1]:.1f}s p50 {statistics.median(d[0]):.2f}s "
                    f"p99 {pct(d[0], 0.99):.2f}s | offloaded total {o[1]:.1f}s "
                    f"p50 {statistics.median(o[0]):.2f}s p99 {pct(o[0], 0.99):.2f}s | "
                    f"ratio {o[1] / d[1]:.2f}x | vk cpu {cpu:.1f}s peak RSS {rss / 2**20:.0f} MiB",
                    flush=True,
                )
    finally:
        vk.terminate()
        vk.wait(10)
        provider.kubectl("delete", "nodes", *[n.name for n in extra], "--wait=false")
        provider.kubectl(
            "delete", "namespaces", "-l", f"gpuferry.io/origin-cluster-id={cons_id}", "--wait=false"
        )
        consumer.kubectl("delete", "node", f"gpuferry-{prov_id}", "--ignore-not-found", "--wait=false")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--profile", default="demo")
    parser.add_argument("--pods", type=int, action="append", help="N (repeatable; default 100 and 1000)")
    args = parser.parse_args()
    asyncio.run(bench(args.profile, args.pods or [100, 1000]))


if __name__ == "__main__":
    main()
