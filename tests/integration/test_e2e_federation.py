"""Several providers, one GPU pool: a consumer peered with two provider clusters has two virtual
nodes, and a Job needing more GPUs than either grants spreads over both through the consumer's
own kube-scheduler. The second provider is a third real cluster, started for this module."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from hack.localcluster import LocalCluster, second_provider
from kube.clients import KubeClient
from kube.objects import JOBS, PODS

from .clirunner import Cli, cache_of
from .conftest import NamespaceFactory
from .waiting import condition, wait_for

pytestmark = pytest.mark.integration

JOB = """
apiVersion: batch/v1
kind: Job
metadata: {name: sweep}
spec:
  completions: 7
  parallelism: 7
  template:
    metadata:
      annotations: {gpuferry.io/simulate-complete-after: "3s"}
    spec:
      restartPolicy: Never
      containers:
      - name: trial
        image: nvcr.io/nvidia/pytorch:25.01-py3
        resources: {limits: {nvidia.com/gpu: "1"}}
"""


@pytest.fixture(scope="module")
def provider_b(clusters: dict[str, LocalCluster]) -> Iterator[LocalCluster]:
    import os

    cluster = second_provider(os.environ.get("GPUFERRY_TEST_PROFILE", "test"))
    reused = all(st.running for st in cluster.status())
    cluster.up(progress=lambda msg: print(msg, flush=True))
    yield cluster
    failures = cluster.crashed()
    if not reused and not os.environ.get("GPUFERRY_KEEP_CLUSTERS"):
        cluster.down()
    assert not failures, f"provider-b crashed: {failures}"


@pytest.fixture
async def cli(
    consumer: LocalCluster, provider: LocalCluster, tmp_path: Path
) -> AsyncIterator[Cli]:
    from peering.localagents import all_agents, stop_agent

    runner = Cli(consumer, provider, tmp_path / "cache")
    yield runner
    with cache_of(runner):
        for agent in all_agents():
            stop_agent(agent)


async def test_a_job_larger_than_one_provider_spreads_over_two(
    cli: Cli,
    consumer: LocalCluster,
    provider_b: LocalCluster,
    consumer_client: KubeClient,
    make_namespace: NamespaceFactory,
) -> None:
    b = str(provider_b.spec.kubeconfig)
    peers = [
        (cli.p, "gpu-farm", "nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3"),
        (b, "gpu-farm-b", "nvidia.com/gpu.product=NVIDIA-A100-SXM4-80GB"),
    ]
    for kubeconfig, provider_id, selector in peers:
        await cli.ok(
            "peer",
            "--kubeconfig",
            cli.c,
            "--remote-kubeconfig",
            kubeconfig,
            "--cluster-id",
            "ml-eu",
            "--remote-cluster-id",
            provider_id,
            "--gpus",
            "4",
            "--selector",
            selector,
            "-q",
        )
    try:
        ns = await make_namespace(consumer_client)
        out = json.loads(await cli.ok("offload", "namespace", ns, "--kubeconfig", cli.c, "-o", "json", "-q"))
        assert sorted(r["clusterID"] for r in out["remoteNamespaces"]) == ["gpu-farm", "gpu-farm-b"]

        info = json.loads(await cli.ok("info", "--kubeconfig", cli.c, "-o", "json"))
        assert info["pool"] == {"providers": 2, "ready": 2, "gpus": {"granted": 8, "used": 0, "free": 8},
                                "accelerators": {"nvidia.com/gpu": {"granted": 8, "used": 0, "free": 8}}}
        assert {p["id"]: p["gpuProduct"] for p in info["providers"]} == {
            "gpu-farm": "NVIDIA-H100-80GB-HBM3",
            "gpu-farm-b": "NVIDIA-A100-SXM4-80GB",
        }

        # 7 GPUs at once: more than either provider granted (4), less than the pool (8)
        consumer.kubectl("-n", ns, "create", "-f", "-", input=JOB)
        await wait_for(
            consumer_client,
            JOBS,
            "sweep",
            lambda j: (j.get("status") or {}).get("ready") == 7,
            namespace=ns,
            timeout=120,
        )
        pods = (await consumer_client.list(PODS, ns))["items"]
        per_node: dict[str, int] = {}
        for p in pods:
            per_node[p["spec"]["nodeName"]] = per_node.get(p["spec"]["nodeName"], 0) + 1
        assert set(per_node) == {"gpuferry-gpu-farm", "gpuferry-gpu-farm-b"} and sum(per_node.values()) == 7
        assert max(per_node.values()) <= 4
        used = json.loads(await cli.ok("info", "--kubeconfig", cli.c, "-o", "json"))["pool"]["gpus"]
        assert used == {"granted": 8, "used": 7, "free": 1}
        await wait_for(
            consumer_client,
            JOBS,
            "sweep",
            lambda j: (condition(j, "Complete") or {}).get("status") == "True",
            namespace=ns,
            timeout=120,
        )

        await cli.ok("unoffload", "namespace", ns, "--kubeconfig", cli.c, "-q")
    finally:
        for kubeconfig, _, _ in peers:
            await cli("unpeer", "--kubeconfig", cli.c, "--remote-kubeconfig", kubeconfig, "-q")
    info = json.loads(await cli.ok("info", "--kubeconfig", cli.c, "-o", "json"))
    assert info["providers"] == [] and info["pool"]["providers"] == 0
