"""Several providers, one GPU pool: a consumer peered with two provider clusters has two virtual
nodes, and a Job needing more GPUs than either grants spreads over both through the consumer's
own kube-scheduler. The second provider is a third real cluster, started for this module."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from hack.localcluster import LocalCluster, second_provider
from kube.api import PROVIDER_LABEL
from kube.clients import KubeClient
from kube.objects import JOBS, NAMESPACEOFFLOADINGS, PODS, RawObject
from peering.admission import OFFLOADING_NAME

from .clirunner import Cli, cache_of
from .conftest import NamespaceFactory
from .relay import Relay, kubeconfig_via
from .waiting import condition, wait_for, wait_for_deletion

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


async def peer(cli: Cli, kubeconfig: str, provider_id: str, *extra: str) -> None:
    """``gpuferry peer`` of ml-eu with ``provider_id`` (reached with ``kubeconfig``), quiet."""
    await cli.ok("peer", "--kubeconfig", cli.c, "--remote-kubeconfig", kubeconfig, "--cluster-id", "ml-eu",
                 "--remote-cluster-id", provider_id, "-q", *extra)  # fmt: skip


@pytest.fixture
async def cli(consumer: LocalCluster, provider: LocalCluster, tmp_path: Path) -> AsyncIterator[Cli]:
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
        await peer(cli, kubeconfig, provider_id, "--gpus", "4", "--selector", selector)
    try:
        ns = await make_namespace(consumer_client)
        out = json.loads(await cli.ok("offload", "namespace", ns, "--kubeconfig", cli.c, "-o", "json", "-q"))
        assert sorted(r["clusterID"] for r in out["remoteNamespaces"]) == ["gpu-farm", "gpu-farm-b"]

        info = json.loads(await cli.ok("info", "--kubeconfig", cli.c, "-o", "json"))
        assert info["pool"] == {
            "providers": 2,
            "ready": 2,
            "gpus": {"granted": 8, "used": 0, "free": 8},
            "accelerators": {"nvidia.com/gpu": {"granted": 8, "used": 0, "free": 8}},
        }
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


def entry_of(offloading: RawObject, provider_id: str) -> dict[str, Any]:
    entries = (offloading.get("status") or {}).get("remoteNamespaces") or []
    return next((e for e in entries if e["clusterID"] == provider_id), {})


def phases(offloading: dict[str, Any]) -> dict[str, str]:
    return {e["clusterID"]: e["phase"] for e in offloading["remoteNamespaces"]}


async def test_a_provider_that_does_not_answer_holds_no_offload_and_costs_no_pod(
    cli: Cli,
    consumer: LocalCluster,
    provider: LocalCluster,
    provider_b: LocalCluster,
    consumer_client: KubeClient,
    make_namespace: NamespaceFactory,
    tmp_path: Path,
) -> None:
    """Two providers, each reached through a relay this test can cut. One does not answer: the
    offloadings' status says so at once; `gpuferry offload namespace` (run again, or for a new
    namespace) finishes with the other and names it. None answers: it fails, and the namespace
    offloaded before stays so with its pod (the CLI used to delete an offloading it could not
    settle: its pods left the virtual nodes), and an unoffload names the providers that hold it.
    Both back: the namespace offloaded meanwhile gets its second twin namespace, and the one
    unoffloaded meanwhile is released."""
    relays = {
        "gpu-farm": Relay(provider.spec.ports.apiserver),
        "gpu-farm-b": Relay(provider_b.spec.ports.apiserver),
    }
    clusters = {"gpu-farm": provider, "gpu-farm-b": provider_b}
    kubeconfigs: dict[str, str] = {}
    for provider_id, relay in relays.items():
        await relay.start()
        (tmp_path / provider_id).mkdir()
        via = f"https://127.0.0.1:{relay.port}"
        kubeconfigs[provider_id] = str(
            kubeconfig_via(clusters[provider_id].spec.kubeconfig, via, tmp_path / provider_id)
        )

    async def reason_of(ns: str, provider_id: str, reason: str) -> None:
        await wait_for(
            consumer_client,
            NAMESPACEOFFLOADINGS,
            OFFLOADING_NAME,
            lambda o: entry_of(o, provider_id).get("reason") == reason,
            namespace=ns,
            timeout=30,
        )

    try:
        for provider_id, kubeconfig in kubeconfigs.items():
            await peer(cli, kubeconfig, provider_id, "--gpus", "2", "--no-network")
        ns = await make_namespace(consumer_client)
        await cli.ok("offload", "namespace", ns, "--kubeconfig", cli.c, "-q")
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "stays"},
            "spec": {
                "nodeSelector": {PROVIDER_LABEL: "gpu-farm"},
                "containers": [
                    {"name": "c", "image": "cuda", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
                ],
            },
        }
        await consumer_client.create(PODS, pod, ns)
        running = await wait_for(
            consumer_client,
            PODS,
            "stays",
            lambda p: p["status"].get("phase") == "Running",
            namespace=ns,
            timeout=60,
        )

        await relays["gpu-farm-b"].stop()
        # its virtual kubelet taints its node; the offloading says so then, not at its resync
        await reason_of(ns, "gpu-farm-b", "ProviderUnreachable")
        code, out, err = await cli(
            "offload", "namespace", ns, "--kubeconfig", cli.c, "-o", "json", "--timeout", "60"
        )
        assert code == 0 and "Traceback" not in err, err
        assert "gpu-farm-b does not answer" in err
        print(f"offload again, gpu-farm-b away:\n{err}")
        again = json.loads(out)
        assert phases(again) == {"gpu-farm": "Ready", "gpu-farm-b": "Pending"}
        assert entry_of({"status": again}, "gpu-farm-b")["remoteNamespace"]  # the one it gave is kept
        late = await make_namespace(consumer_client)
        out = await cli.ok(
            "offload", "namespace", late, "--kubeconfig", cli.c, "-o", "json", "--timeout", "60"
        )
        assert phases(json.loads(out)) == {"gpu-farm": "Ready", "gpu-farm-b": "Pending"}
        info = json.loads(await cli.ok("info", "--kubeconfig", cli.c, "-o", "json"))
        [said] = [o for o in info["offloadedNamespaces"] if o["namespace"] == late]
        assert {r["provider"]: (r["phase"], r.get("reason")) for r in said["remoteNamespaces"]} == {
            "gpu-farm": ("Ready", None),
            "gpu-farm-b": ("Pending", "ProviderUnreachable"),
        }

        await relays["gpu-farm"].stop()
        await reason_of(ns, "gpu-farm", "ProviderUnreachable")
        code, out, err = await cli("offload", "namespace", ns, "--kubeconfig", cli.c, "--timeout", "5", "-q")
        assert code != 0 and "Traceback" not in err, err
        assert "stays offloaded" in err
        print(f"offload again, both away:\n{err}")
        kept = await consumer_client.get(NAMESPACEOFFLOADINGS, OFFLOADING_NAME, ns)
        assert not kept["metadata"].get("deletionTimestamp")
        still = await consumer_client.get(PODS, "stays", ns)
        assert still["metadata"]["uid"] == running["metadata"]["uid"]
        assert not still["metadata"].get("deletionTimestamp") and still["status"]["phase"] == "Running"
        # an unoffload meanwhile cannot withdraw the twins: it says which providers hold it
        code, out, err = await cli(
            "unoffload", "namespace", ns, "--kubeconfig", cli.c, "--timeout", "5", "-q"
        )
        assert code != 0 and "Traceback" not in err, err
        assert "gpu-farm, gpu-farm-b do not answer" in err
        print(f"unoffload, both away:\n{err}")

        for relay in relays.values():
            await relay.start()
        # both back: the namespace offloaded in the outage gets its second twin namespace, and
        # the one unoffloaded in it is released
        await wait_for(
            consumer_client,
            NAMESPACEOFFLOADINGS,
            OFFLOADING_NAME,
            lambda o: (o.get("status") or {}).get("phase") == "Ready",
            namespace=late,
            timeout=60,
        )
        await wait_for_deletion(consumer_client, NAMESPACEOFFLOADINGS, OFFLOADING_NAME, ns, timeout=60)
        await cli.ok("unoffload", "namespace", late, "--kubeconfig", cli.c, "-q")
    finally:
        for relay in relays.values():
            if relay.server is None:
                await relay.start()
        for kubeconfig in kubeconfigs.values():
            await cli("unpeer", "--kubeconfig", cli.c, "--remote-kubeconfig", kubeconfig, "-q")
        for relay in relays.values():
            await relay.stop()
