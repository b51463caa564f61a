"""``python -m vk`` as a process against the real clusters: ``/healthz``, ``/readyz`` and
``/metrics`` without credentials (ready once its informers listed and its Node is registered),
status back in a queue of its own, and a graceful stop on SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from hack.localcluster import LocalCluster
from kube.clients import KubeClient
from kube.errors import NotFound
from kube.objects import LEASES, NAMESPACES, NODES, PODS, RawObject
from kube.ports import free_port
from vk.forge.labels import VIRTUAL_NODE_TAINT_KEY, owner_selector

from .conftest import NamespaceFactory
from .waiting import condition, wait_for

pytestmark = pytest.mark.integration

H100_SELECTOR = "nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3"


@dataclass
class Process:
    proc: asyncio.subprocess.Process
    port: int
    node: str
    consumer_id: str
    log: Path

    async def get(self, path: str) -> tuple[int, str]:
        """A plain HTTP GET of the probe port: no certificate, no token."""
        url = f"http://127.0.0.1:{self.port}{path}"
        async with aiohttp.ClientSession() as session, session.get(url) as answer:
            return answer.status, await answer.text()

    async def until(self, path: str, accept: Callable[[int, str], bool], timeout: float = 60) -> str:
        """Poll ``path`` until ``accept(status, text)``; the last answer in the error otherwise."""
        last: tuple[int, str] | str = "no answer"
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while loop.time() < deadline:
            with contextlib.suppress(aiohttp.ClientConnectionError):
                last = await self.get(path)
                if accept(*last):
                    return last[1]
            assert self.proc.returncode is None, f"the virtual kubelet exited {self.proc.returncode}"
            await asyncio.sleep(0.2)
        raise AssertionError(f"GET {path}: {last!r} after {timeout}s")

    async def metrics(self) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
        status, text = await self.get("/metrics")
        assert status == 200
        return {(s.name, frozenset(s.labels.items())): s.value
                for family in text_string_to_metric_families(text) for s in family.samples}  # fmt: skip

    def output(self) -> str:
        return self.log.read_text(errors="replace")


@pytest.fixture
async def process(
    consumer: LocalCluster, provider: LocalCluster, consumer_client: KubeClient,
    provider_client: KubeClient, tmp_path: Path,
) -> AsyncIterator[Process]:  # fmt: skip
    """``python -m vk`` with flags (an admin identity on the provider), probes on a free port."""
    suffix = uuid.uuid4().hex[:6]
    consumer_id, provider_id = f"cons-{suffix}", f"proc-{suffix}"
    port = free_port()
    args = [sys.executable, "-m", "vk", "--consumer-kubeconfig", str(consumer.spec.kubeconfig),
            "--provider-kubeconfig", str(provider.spec.kubeconfig), "--consumer-id", consumer_id,
            "--provider-id", provider_id, "--resource", "nvidia.com/gpu=8", "--resource", "pods=110",
            "--provider-node-selector", H100_SELECTOR, "--probe-port", str(port)]  # fmt: skip
    path = tmp_path / "vk.log"
    with path.open("wb") as log:
        proc = await asyncio.create_subprocess_exec(*args, stdout=log, stderr=subprocess.STDOUT)
    running = Process(proc, port, f"gpuferry-{provider_id}", consumer_id, path)
    try:
        yield running
    except BaseException:
        print(running.output()[-6000:])
        raise
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        for resource, name, ns in ((NODES, running.node, None), (LEASES, running.node, "kube-node-lease")):
            with contextlib.suppress(NotFound):
                await consumer_client.delete(resource, name, ns)
        twins = await provider_client.list(NAMESPACES, label_selector=owner_selector(consumer_id))
        for twin_ns in twins["items"]:
            await provider_client.delete(NAMESPACES, twin_ns["metadata"]["name"])


async def test_probes_are_served_without_credentials_and_ready_once_the_node_is_registered(
    process: Process, consumer_client: KubeClient
) -> None:
    await process.until("/healthz", lambda status, _: status == 200, timeout=30)
    text = await process.until("/readyz?verbose", lambda status, _: status == 200)
    for check in ("informer-consumer-pods", "informer-provider-twins", "node-registered", "twins-listed"):
        assert f"[+]{check} ok" in text, text
    node = await consumer_client.get(NODES, process.node)  # ready means registered
    assert node["status"]["capacity"]["nvidia.com/gpu"] == "8"
    status, text = await process.get("/healthz?verbose")
    assert status == 200  # its checks: one per root task, each alive
    assert "[+]reconcile-sync_status_from_remote ok" in text and "[+]node-lease ok" in text, text


async def test_status_back_has_a_queue_of_its_own_in_the_metrics(
    process: Process, consumer_client: KubeClient, make_namespace: NamespaceFactory
) -> None:
    await process.until("/readyz", lambda status, _: status == 200)
    ns = await make_namespace(consumer_client)
    pod: RawObject = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "train"},
        "spec": {
            "nodeName": process.node,
            "containers": [{"name": "c", "image": "cuda", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
            "tolerations": [{"key": VIRTUAL_NODE_TAINT_KEY, "operator": "Exists"}],
        },
    }
    await consumer_client.create(PODS, pod, ns)
    await wait_for(consumer_client, PODS, "train", lambda p: p["status"].get("phase") == "Running",
                   namespace=ns, timeout=60)  # fmt: skip
    metrics = await process.metrics()

    def reconciled(queue: str, outcome: str) -> float:
        labels = frozenset({("queue", queue), ("outcome", outcome)})
        return metrics.get(("gpuferry_reconcile_total", labels), 0)

    assert reconciled("sync_status_from_remote", "done") >= 1, "the status came back through its own queue"
    assert reconciled("sync_pods_to_remote", "done") >= 1
    for queue in ("sync_pods_to_remote", "sync_status_from_remote"):
        assert ("gpuferry_queue_depth", frozenset({("queue", queue)})) in metrics
    running = ("gpuferry_vk_pods", frozenset({("side", "consumer"), ("phase", "Running")}))
    assert metrics[running] == 1
    # what its garbage collector cost it so far, and the collector as `python -m vk` tuned it:
    # the youngest generation looked at every 10,000 objects, what start-up made frozen out
    # (with so high a threshold, a short run may not have collected at all yet)
    for generation in "012":
        labels = frozenset({("generation", generation)})
        assert ("gpuferry_gc_collections_total", labels) in metrics
        assert ("gpuferry_gc_seconds_total", labels) in metrics
    assert metrics[("gpuferry_gc_threshold", frozenset({("generation", "0")}))] == 10_000
    assert metrics[("gpuferry_gc_frozen_objects", frozenset())] > 10_000, "modules and classes"


async def test_sigterm_stops_it_gracefully(process: Process, consumer_client: KubeClient) -> None:
    await process.until("/readyz", lambda status, _: status == 200)
    await wait_for(consumer_client, LEASES, process.node, lambda _: True, namespace="kube-node-lease")
    process.proc.send_signal(signal.SIGTERM)
    code = await asyncio.wait_for(process.proc.wait(), 30)
    output = process.output()
    assert code == 128 + signal.SIGTERM, output[-3000:]
    assert "SIGTERM received: stopping" in output
    assert "Traceback" not in output and "root task" not in output, output[-3000:]
    with pytest.raises(aiohttp.ClientConnectionError):
        await process.get("/healthz")  # the probe server went with it
    # a stopped kubelet's Node stays (its Lease lapses, and the node turns Unknown in time)
    node = await consumer_client.get(NODES, process.node)
    assert (condition(node, "Ready") or {}).get("status") == "True"
