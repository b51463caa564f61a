"""The virtual kubelet as a real process under the faults users hit: killed with SIGKILL in the
middle of a burst and restarted, and a provider API that goes away for 30 s.

All state lives in the two API servers, so a restart must converge without losing or
duplicating a twin; a provider outage must make the node NotReady (with the Lease still renewed,
so the consumer never sees it unreachable) and must not cost a pod.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from hack.localcluster import LocalCluster
from kube.clients import KubeClient
from kube.errors import NotFound
from kube.objects import EVENTS, LEASES, NAMESPACES, NODES, PODS, RawObject
from kube.watching import Listed, watch_objects
from vk.forge.labels import ORIGIN_UID, VIRTUAL_NODE_TAINT_KEY, owner_selector

from .conftest import NamespaceFactory
from .relay import Relay, kubeconfig_via
from .waiting import condition, wait_for

pytestmark = pytest.mark.integration

H100 = "nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3"
TOLERATION = {"key": VIRTUAL_NODE_TAINT_KEY, "operator": "Exists", "effect": "NoExecute"}
LIFECYCLE_TAINTS = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")


class VkProcess:
    """``python -m vk`` as a child process, with its log in a file."""

    def __init__(self, consumer: LocalCluster, provider_kubeconfig: Path, log: Path) -> None:
        suffix = uuid.uuid4().hex[:6]
        self.consumer_id = f"cons-{suffix}"
        self.provider_id = f"prov-{suffix}"
        self.node = f"gpuferry-{self.provider_id}"
        self.log = log
        self.args = [
            sys.executable, "-m", "vk",
            "--consumer-kubeconfig", str(consumer.spec.kubeconfig),
            "--provider-kubeconfig", str(provider_kubeconfig),
            "--consumer-id", self.consumer_id,
            "--provider-id", self.provider_id,
            "--resource", "nvidia.com/gpu=8", "--resource", "cpu=64",
            "--resource", "memory=512Gi", "--resource", "pods=400",
            "--provider-node-selector", H100,
        ]  # fmt: skip
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
        self.starts += 1
        with self.log.open("ab") as out:
            out.write(f"---- start {self.starts}\n".encode())
            self.proc = subprocess.Popen(self.args, stdout=out, stderr=subprocess.STDOUT)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def assert_alive(self) -> None:
        assert self.proc is not None
        assert self.proc.poll() is None, f"the virtual kubelet exited:\n{self.tail()}"

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


@contextlib.asynccontextmanager
async def virtual_kubelet(
    consumer: LocalCluster,
    provider_kubeconfig: Path,
    consumer_client: KubeClient,
    provider_client: KubeClient,
    log: Path,
) -> AsyncIterator[VkProcess]:
    vk = VkProcess(consumer, provider_kubeconfig, log)
    vk.start()
    try:
        await wait_for(consumer_client, NODES, vk.node, schedulable, timeout=60)
        yield vk
    except BaseException:
        print(f"virtual kubelet log:\n{vk.tail(80)}")
        raise
    finally:
        vk.stop()
        for resource, name, ns in ((NODES, vk.node, None), (LEASES, vk.node, "kube-node-lease")):
            with contextlib.suppress(NotFound):
                await consumer_client.delete(resource, name, ns)
        twins = await provider_client.list(NAMESPACES, label_selector=owner_selector(vk.consumer_id))
        for ns_obj in twins["items"]:
            await provider_client.delete(NAMESPACES, ns_obj["metadata"]["name"])


def schedulable(node: RawObject) -> bool:
    """Ready, without the lifecycle controller's taints nor ours for an unreachable provider."""
    return (condition(node, "Ready") or {}).get("status") == "True" and not [
        t for t in (node.get("spec") or {}).get("taints") or []
        if t["key"] in (*LIFECYCLE_TAINTS, "gpuferry.io/provider-unreachable")
    ]


def pinned_pod(name: str, node: str, resources: dict[str, str]) -> RawObject:
    """A pod that tolerates the virtual node and may only land on ``node``."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "containers": [{"name": "main", "image": "trainer:1", "resources": {"limits": resources}}],
            "nodeSelector": {"kubernetes.io/hostname": node},
            "tolerations": [TOLERATION],
            "terminationGracePeriodSeconds": 0,
        },
    }


class TwinLedger:
    """Every twin the provider ever had for one consumer, from a watch started before the test."""

    def __init__(self, client: KubeClient, consumer_id: str) -> None:
        self.client = client
        self.selector = owner_selector(consumer_id)
        self.created: dict[str, str] = {}  # twin uid -> origin uid
        self.deleted: set[str] = set()
        self.listed = asyncio.Event()
        self.on_created: Callable[[], None] = lambda: None
        self.task = asyncio.create_task(self._watch(), name="twin ledger")

    async def _watch(self) -> None:
        async for item in watch_objects(self.client, PODS, label_selector=self.selector):
            if isinstance(item, Listed):
                self.listed.set()
                continue
            meta = item.object["metadata"]
            if item.type == "DELETED":
                self.deleted.add(meta["uid"])
            else:
                self.created.setdefault(meta["uid"], (meta.get("labels") or {}).get(ORIGIN_UID, ""))
                self.on_created()

    async def close(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)


async def wait_all_running(client: KubeClient, namespace: str, count: int, timeout: float) -> list[RawObject]:
    async def check() -> list[RawObject]:
        while True:
            pods = (await client.list(PODS, namespace=namespace))["items"]
            if len(pods) == count and all((p.get("status") or {}).get("phase") == "Running" for p in pods):
                return list(pods)
            await asyncio.sleep(0.5)

    try:
        return await asyncio.wait_for(check(), timeout)
    except TimeoutError:
        pods = (await client.list(PODS, namespace=namespace))["items"]
        phases: dict[str, int] = {}
        for p in pods:
            phase = (p.get("status") or {}).get("phase", "?")
            phases[phase] = phases.get(phase, 0) + 1
        raise AssertionError(f"not all {count} pods Running after {timeout}s: {phases}") from None


async def test_killed_mid_burst_and_restarted_every_pod_runs_exactly_once(
    consumer: LocalCluster,
    provider: LocalCluster,
    consumer_client: KubeClient,
    provider_client: KubeClient,
    make_namespace: NamespaceFactory,
    tmp_path: Path,
) -> None:
    ns = await make_namespace(consumer_client)
    async with virtual_kubelet(
        consumer, provider.spec.kubeconfig, consumer_client, provider_client, tmp_path / "vk.log"
    ) as vk:
        ledger = TwinLedger(provider_client, vk.consumer_id)
        first_twin = asyncio.Event()
        ledger.on_created = first_twin.set
        try:
            await asyncio.wait_for(ledger.listed.wait(), 10)
            names = [f"burst-{i:03d}" for i in range(300)]
            await asyncio.gather(
                *(consumer_client.create(PODS, pinned_pod(n, vk.node, {"cpu": "100m"}), ns) for n in names)
            )
            # kill it as soon as the first twins exist: most of the burst is still in flight
            try:
                await asyncio.wait_for(first_twin.wait(), 60)
            except TimeoutError:
                raise AssertionError(f"no twin was created:\n{vk.tail()}") from None
            vk.kill()
            pods = (await consumer_client.list(PODS, namespace=ns))["items"]
            running_at_kill = sum((p.get("status") or {}).get("phase") == "Running" for p in pods)
            assert running_at_kill < len(names), "the burst was over before the kill: nothing tested"

            restarted = time.monotonic()
            vk.start()
            pods = await wait_all_running(consumer_client, ns, len(names), timeout=120)
            vk.assert_alive()
            # a figure, not an assertion (timing on a shared 2-core machine): the issue asks < 30 s
            print(f"{len(names)} pods, killed with {running_at_kill} Running: all Running "
                  f"{time.monotonic() - restarted:.1f}s after the restart")
            await asyncio.sleep(2)  # let any duplicate the restart might have made show up

            consumer_uids = {p["metadata"]["uid"] for p in pods}
            origins = list(ledger.created.values())
            assert len(ledger.created) == len(names), (
                f"{len(ledger.created)} twins created for {len(names)} pods (killed with "
                f"{running_at_kill} Running)"
            )
            assert sorted(origins) == sorted(consumer_uids), "one twin per consumer pod, no more, no less"
            assert not ledger.deleted, f"twins were deleted and recreated: {len(ledger.deleted)}"
            twins = (await provider_client.list(PODS, label_selector=owner_selector(vk.consumer_id)))["items"]
            assert all((t.get("status") or {}).get("phase") == "Running" for t in twins)
            assert {t["metadata"]["uid"] for t in twins} == set(ledger.created)
        finally:
            await ledger.close()


async def test_provider_outage_longer_than_the_eviction_timeout_costs_no_pod(
    consumer: LocalCluster,
    provider: LocalCluster,
    consumer_client: KubeClient,
    provider_client: KubeClient,
    make_namespace: NamespaceFactory,
    tmp_path: Path,
) -> None:
    """The provider's API server unreachable for 30 s, while the pods tolerate a not-ready or
    unreachable node for 5 s only (what ``--default-not-ready-toleration-seconds=5`` would give
    every pod): nothing is evicted, a new pod waits rather than land on the node, and on return a
    twin that finished meanwhile reports it and a twin deleted meanwhile fails its pod."""
    ns = await make_namespace(consumer_client)
    relay = Relay(provider.spec.ports.apiserver)
    await relay.start()
    via = kubeconfig_via(provider.spec.kubeconfig, f"https://127.0.0.1:{relay.port}", tmp_path)
    short = [{"key": f"node.kubernetes.io/{k}", "operator": "Exists", "effect": "NoExecute",
              "tolerationSeconds": 5} for k in ("not-ready", "unreachable")]  # fmt: skip
    try:
        log = tmp_path / "vk.log"
        async with virtual_kubelet(consumer, via, consumer_client, provider_client, log) as vk:
            names = ["runs-on", "finishes", "loses-twin"]
            for n in names:
                pod = pinned_pod(n, vk.node, {"nvidia.com/gpu": "1"})
                pod["spec"]["tolerations"] += short
                if n == "finishes":
                    pod["metadata"]["annotations"] = {"gpuferry.io/simulate-complete-after": "12s"}
                await consumer_client.create(PODS, pod, ns)
            running = await wait_all_running(consumer_client, ns, 3, timeout=60)
            before = {p["metadata"]["name"]: p for p in running}
            twins_before = {origin(t): t for t in await twins_of(provider_client, vk.consumer_id)}
            assert set(twins_before) == {p["metadata"]["uid"] for p in before.values()}

            gone: list[str] = []
            watcher = asyncio.create_task(_record_deletions(consumer_client, ns, gone))
            try:
                await relay.stop()
                cut = time.monotonic()
                node = await wait_for(
                    consumer_client,
                    NODES,
                    vk.node,
                    lambda n: (condition(n, "Ready") or {}).get("reason") == "ProviderUnreachable",
                    timeout=30,
                )
                assert (condition(node, "Ready") or {})["status"] == "True", "Ready=False would evict"
                assert (condition(node, "ProviderReachable") or {})["status"] == "False"
                assert UNREACHABLE in {(t["key"], t["effect"]) for t in node["spec"].get("taints") or []}
                # meanwhile on the provider (not through the relay): one twin deleted
                lost = twins_before[before["loses-twin"]["metadata"]["uid"]]
                await provider_client.delete(PODS, lost["metadata"]["name"], lost["metadata"]["namespace"],
                                             grace_period_seconds=0)  # fmt: skip
                # a new pod for this node waits: NoSchedule
                late = pinned_pod("late", vk.node, {"nvidia.com/gpu": "1"})
                await consumer_client.create(PODS, late, ns)
                # a debugger asked meanwhile: the consumer's API server takes it, and the twin
                # is to get it once the provider answers (a connection refused is no refusal)
                consumer.kubectl("-n", ns, "debug", "runs-on", "--image=busybox", "-c", "dbg",
                                 "--profile=baseline")  # fmt: skip
                await asyncio.sleep(max(0.0, 30 - (time.monotonic() - cut)))
                node = await consumer_client.get(NODES, vk.node)
                taints = {t["key"] for t in node["spec"].get("taints") or []}
                assert not {t for t in taints if t.startswith("node.kubernetes.io/")}, taints
                waiting = await consumer_client.get(PODS, "late", ns)
                assert not waiting["spec"].get("nodeName"), "scheduled onto a node whose provider is away"
                vk.assert_alive()

                await relay.start()
                back = time.monotonic()
                await wait_for(consumer_client, NODES, vk.node, schedulable, timeout=60)
                phases = {"runs-on": "Running", "finishes": "Succeeded", "loses-twin": "Failed"}
                phases["late"] = "Running"

                async def converged() -> dict[str, RawObject]:
                    while True:
                        listed = (await consumer_client.list(PODS, ns))["items"]
                        pods = {p["metadata"]["name"]: p for p in listed}
                        if {n: (p.get("status") or {}).get("phase") for n, p in pods.items()} == phases:
                            return pods
                        await asyncio.sleep(0.5)

                after = await asyncio.wait_for(converged(), timeout=60)
                kept = twins_before[before["runs-on"]["metadata"]["uid"]]["metadata"]
                debugged = await wait_for(
                    provider_client, PODS, kept["name"],
                    lambda t: [c["name"] for c in t["spec"].get("ephemeralContainers") or []] == ["dbg"],
                    namespace=kept["namespace"], timeout=60,
                )  # fmt: skip
                print(f"debugger on the twin {time.monotonic() - back:.1f}s after the provider came back")
                refused = "reason=EphemeralContainerRejected"
                refusals = await consumer_client.list(EVENTS, ns, field_selector=refused)
                assert not refusals["items"], refusals["items"]
                assert debugged["spec"]["ephemeralContainers"][0]["image"] == "busybox"
            finally:
                watcher.cancel()
                await asyncio.gather(watcher, return_exceptions=True)

            assert not gone, f"consumer pods deleted or evicted during the outage: {gone}"
            assert all(after[n]["metadata"]["uid"] == before[n]["metadata"]["uid"] for n in names)
            lost_status = after["loses-twin"]["status"]
            assert lost_status["reason"] == "ProviderPodDeleted", lost_status
            # nothing created twice: the kept twins are the same, the lost one was not made again
            twins_after = {origin(t): t for t in await twins_of(provider_client, vk.consumer_id)}
            for n in ("runs-on", "finishes"):
                uid = before[n]["metadata"]["uid"]
                assert twins_after[uid]["metadata"]["uid"] == twins_before[uid]["metadata"]["uid"]
            assert before["loses-twin"]["metadata"]["uid"] not in twins_after
            assert len(twins_after) == 3  # with the late pod's
    finally:
        await relay.stop()


UNREACHABLE = ("gpuferry.io/provider-unreachable", "NoSchedule")


def origin(twin: RawObject) -> str:
    return str(twin["metadata"]["labels"][ORIGIN_UID])


async def twins_of(client: KubeClient, consumer_id: str) -> list[RawObject]:
    return list((await client.list(PODS, label_selector=owner_selector(consumer_id)))["items"])


async def _record_deletions(client: KubeClient, namespace: str, out: list[str]) -> None:
    async for item in watch_objects(client, PODS, namespace=namespace):
        if isinstance(item, Listed):
            continue
        obj: dict[str, Any] = item.object
        if item.type == "DELETED" or obj["metadata"].get("deletionTimestamp"):
            out.append(f"{item.type} {obj['metadata']['name']}")
