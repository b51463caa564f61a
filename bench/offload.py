"""Offload throughput: N GPU pods created on the consumer until the consumer sees them Running,
against the same N pods created directly on the provider (the baseline).

Runs on the local clusters (profile "demo" by default: ``make demo`` first). The virtual kubelet
runs as its own process (``python -m vk``, its own node, which the pods select) so that its CPU
seconds and peak RSS can be read from /proc and its requests from its /metrics. Prints p50/p99
per pod, total time, the ratio to the baseline, CPU and RSS, and the virtual kubelet's requests
per pod on each cluster, by verb and resource.

Both clusters share this machine's cores, so each burst also prints what it cost the machine
(:mod:`bench.machine`): CPU per pod by process, how busy the cores were, and the writes each API
server served for it from every client. Where the cores are busy through both bursts, the time
ratio follows the ratio of that work.

``--namespaces N`` measures the other way to grow: one pod in each of N namespaces, then none.
It prints how long a plain GET takes while the virtual kubelet watches them all, and the
watches it holds and its RSS with the pods and after them.

``--services K`` puts K Services (selecting none of the pods) in each burst's namespace first, as
a team's namespace holds some: the virtual kubelet copies them to the twin namespace, and its
reconciles per pod show what the pods' changes wake among them.

``--split-cores`` puts the consumer's processes and the virtual kubelet on half of the cores and
the provider's on the other half (:mod:`bench.cores`), as two clusters run on machines of their
own; by default both share every core, and an offloaded burst waits for the sum of both clusters'
work.

``--twins`` also watches the twins on the provider and splits an offloaded pod's way from bound to
Running into its parts: to its twin (the virtual kubelet's token, Secret and twin), the twin's
binding, its Running, and status back. That watch is one more client of the provider's API
server, which the offloaded burst pays for: off by default.

A run that times out prints what it got; every run removes what it made (nodes, namespaces, the
virtual node), on Ctrl-C too.

    .venv/bin/python -m bench.offload --pods 100 --pods 1000
    .venv/bin/python -m bench.offload --namespaces 100
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Coroutine, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from bench import cores, machine
from hack.localcluster import NodeSpec, profile_clusters
from hack.localcluster.cluster import KubectlFailed
from hack.localcluster.nodes import node_manifest
from hack.localcluster.spec import PROFILE_PORT_BASES
from kube.clients import KubeClient
from kube.errors import KubeError, NotFound
from kube.objects import NAMESPACES, NODES, PODS, SERVICES, ObjectKey, RawObject
from kube.ports import free_port
from kube.settings import ClientSettings
from kube.watching import Listed, WatchEvent, present_after, watch_objects
from vk.forge.events import PROVIDER_EVENTS
from vk.forge.labels import owner_selector

TOLERATION = {"key": "virtual-node.gpuferry.io/not-allowed", "operator": "Exists", "effect": "NoExecute"}


RUN_LABEL = "bench.gpuferry.io/run"
REST_SECONDS = 5.0
"""One window of the machine's load before the bursts (the clusters' own background)."""
SETTLE_MARGIN = 5.0
"""Percentage points: the machine has settled once a window is no lower than this under the last."""
SETTLE_MAX_SECONDS = 120.0
"""The longest the bench waits for the machine to settle before the bursts."""


def pod(name: str, run: str, node: str | None = None, grace: int = 0) -> RawObject:
    """A one-GPU pod of the run ``run``. With ``node`` (offloaded), it selects that node: the
    bench's own virtual node (pods that tolerate virtual nodes could land on another one, the
    demo's, and wait there), whose twins select the run's provider nodes. Without (direct), it
    selects the run's provider nodes itself: neither path takes GPUs from the demo's grant.
    ``grace``: its terminationGracePeriodSeconds (0: it goes as soon as it is deleted; more, as
    most pods: terminating first, its twin deleted with that grace, then the pod removed)."""
    spec: dict[str, Any] = {
        "containers": [{"name": "c", "image": "cuda", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
        "tolerations": [TOLERATION],
        "terminationGracePeriodSeconds": grace,
        "nodeSelector": {"kubernetes.io/hostname": node} if node is not None else {RUN_LABEL: run},
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {RUN_LABEL: run}},
        "spec": spec,
    }


def service(name: str) -> RawObject:
    """A Service that selects none of the run's pods: what a namespace of a real team holds
    (the virtual kubelet copies each to the twin namespace while pods of the namespace run there)."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name},
        "spec": {"selector": {"app": f"not-{name}"}, "ports": [{"port": 80, "targetPort": 8080}]},
    }


BENCH_NAMESPACES = "bench=gpuferry"
"""The label selector of the namespaces the bench makes on either side (:func:`namespace`)."""


def namespace(name: str) -> RawObject:
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": name, "labels": dict([BENCH_NAMESPACES.split("=")])},
    }


class TimedOut(Exception):
    """Not every pod reached Running in time; the message says where they are."""


@dataclass(frozen=True)
class TwinTimes:
    """When the bench's watch of the provider saw an offloaded pod's twin created, bound (its
    ``nodeName``) and Running: seconds since the consumer pod's creation, on the clock of the
    consumer's watch."""

    created: float
    bound: float
    running: float


def twin_stages(
    bound: list[float], running: list[float], twins: list[TwinTimes | None], failure: str | None = None
) -> str:
    """The median split of an offloaded pod's way from bound to Running, over the pods whose
    twin was seen Running: to its twin, the twin's binding, the twin's Running, and back.

    Each part is the median of that part alone, so the parts need not add up to the median of
    the whole; a part may be slightly negative where one watch's delivery lags the other's.
    ``failure`` says why the watch of the twins ended early, where it did.
    """
    parts: list[tuple[float, float, float, float]] = [
        (t.created - b, t.bound - t.created, t.running - t.bound, r - t.running)
        for b, r, t in zip(bound, running, twins, strict=True)
        if t is not None
    ]
    failed = f" (the watch of the twins failed: {failure})" if failure else ""
    if not parts:
        return "no twin seen Running" + failed
    to_twin, to_bind, to_run, back = (statistics.median(column) for column in zip(*parts, strict=True))
    return (f"p50 {to_twin:.2f}s to the twin (the virtual kubelet: token, Secret, twin) + "
            f"{to_bind:.2f}s to its binding (the provider's scheduler) + {to_run:.2f}s to its "
            f"Running (the provider's node) + {back:.2f}s back (the virtual kubelet's status), "
            f"over {len(parts)} pod{'' if len(parts) == 1 else 's'}{failed}")  # fmt: skip


@dataclass
class Timed:
    """One burst: per pod, seconds from creation to Running and to bound (its ``nodeName`` seen
    by the watch: the scheduler's part), and the burst's total seconds."""

    running: list[float]
    bound: list[float]
    total: float
    machine: machine.Burst | None = None
    writes: dict[str, machine.Writes] | None = None
    """Per API server (``consumer``, ``provider``): the writes it served for the burst (a server
    whose /metrics could not be read is left out)."""
    lapses: Lapses | None = None
    """The run's provider nodes that were not Ready at some time during the burst."""
    twins: list[TwinTimes | None] | None = None
    """Offloaded: per pod, as :attr:`running`, its twin's times (``None`` where the twin was not
    seen Running)."""
    twin_failure: str | None = None
    """Offloaded: why the watch of the twins ended before the burst did, if it did."""

    def stages(self) -> str:
        """The median split of a pod's way to Running: the scheduler's binding, then the rest."""
        after = [r - b for r, b in zip(self.running, self.bound, strict=True)]
        return (f"p50 {statistics.median(self.bound):.2f}s to bound + "
                f"{statistics.median(after):.2f}s bound to Running")  # fmt: skip


async def create_and_time(
    client: KubeClient,
    pods: list[ObjectKey],
    run: str,
    node: str | None = None,
    vk: subprocess.Popen[bytes] | None = None,
    servers: dict[str, KubeClient] | None = None,
    nodes_on: KubeClient | None = None,
    twins_on: tuple[KubeClient, str] | None = None,
    grace: int = 0,
) -> Timed:
    """Create the pods ``pods`` (namespace and name) of the run ``run``, watched by its label in
    every namespace; per-pod seconds to bound and to Running, and the total seconds. With
    ``servers`` (name -> admin client), also what the burst cost the machine (CPU, and the
    writes each API server served) from the first create to the last pod Running. With
    ``nodes_on`` (the provider), which of the run's nodes were not Ready at some time in it. With
    ``twins_on`` (the provider and the consumer's cluster ID, for an offloaded burst), when each
    pod's twin was created, bound and Running there (a twin keeps its pod's name and labels)."""
    running: dict[ObjectKey, float] = {}
    bound: dict[ObjectKey, float] = {}
    created: dict[ObjectKey, float] = {}
    phases: dict[ObjectKey, str] = {}
    wanted = set(pods)
    done = asyncio.Event()

    async def watch() -> None:
        async for item in watch_objects(client, PODS, label_selector=f"{RUN_LABEL}={run}"):
            if isinstance(item, Listed) or item.key not in wanted:
                continue
            status = item.object.get("status", {})
            phases[item.key] = status.get("phase") or "?"
            if (item.object.get("spec") or {}).get("nodeName") and item.key not in bound:
                bound[item.key] = time.monotonic()
            if status.get("phase") == "Running" and item.key not in running:
                running[item.key] = time.monotonic()
                if len(running) == len(wanted):
                    done.set()
                    return

    lapses = Lapses() if nodes_on is not None else None
    twin_seen: dict[str, list[float | None]] = {}  # pod name -> [created, bound, Running]

    async def watch_twins(provider: KubeClient, consumer_id: str) -> None:
        names = {key.name for key in wanted}
        selector = f"{RUN_LABEL}={run},{owner_selector(consumer_id)}"
        async for item in watch_objects(provider, PODS, label_selector=selector):
            if isinstance(item, Listed) or item.key.name not in names:
                continue
            now = time.monotonic()
            seen = twin_seen.setdefault(item.key.name, [now, None, None])
            if seen[1] is None and (item.object.get("spec") or {}).get("nodeName"):
                seen[1] = now
            if seen[2] is None and (item.object.get("status") or {}).get("phase") == "Running":
                seen[2] = now

    async def watch_nodes(provider: KubeClient, seen: Lapses) -> None:
        async for item in watch_objects(provider, NODES, label_selector=f"{RUN_LABEL}={run}"):
            if not isinstance(item, Listed):
                seen.observe(item.object)

    watcher = asyncio.create_task(watch())
    watchers = [watcher]
    if nodes_on is not None and lapses is not None:
        watchers.append(asyncio.create_task(watch_nodes(nodes_on, lapses)))
    twin_watch = asyncio.create_task(watch_twins(*twins_on)) if twins_on is not None else None
    if twin_watch is not None:
        watchers.append(twin_watch)
    await asyncio.sleep(0.5)
    sem = asyncio.Semaphore(32)

    async def create(key: ObjectKey) -> None:
        async with sem:
            created[key] = time.monotonic()
            await client.create(PODS, pod(key.name, run, node, grace), key.namespace)

    timeout = max(120, len(pods))
    names = {vk.pid: "virtual kubelet (bench)"} if vk is not None else {}
    writes_before = {name: await machine.writes(s) for name, s in (servers or {}).items()}
    cpu_before = machine.snapshot()
    start = time.monotonic()
    try:
        await asyncio.gather(*(create(key) for key in pods))
        async with asyncio.timeout(timeout):
            while not done.is_set():
                if vk is not None and vk.poll() is not None:
                    raise TimedOut(
                        f"the virtual kubelet exited ({vk.returncode}) with {len(running)} of "
                        f"{len(pods)} pods Running"
                    )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(done.wait(), 1.0)
    except TimeoutError:
        where = Counter(phases.get(k, "not seen") for k in created if k not in running)
        raise TimedOut(
            f"{len(running)} of {len(pods)} pods Running after {timeout}s; the others: "
            + ", ".join(f"{n} {phase}" for phase, n in sorted(where.items()))
        ) from None
    finally:
        for task in watchers:
            task.cancel()
        ended = await asyncio.gather(*watchers, return_exceptions=True)
    # a watch that failed before the burst ended says why its part of the figures is missing
    twin_failure = next((str(e) or type(e).__name__ for t, e in zip(watchers, ended, strict=True)
                         if t is twin_watch and isinstance(e, Exception)), None)  # fmt: skip
    total = time.monotonic() - start
    burst = machine.snapshot().since(cpu_before, names=names)
    writes = {}
    for name, server in (servers or {}).items():
        before, after = writes_before[name], await machine.writes(server)
        if before is not None and after is not None:
            writes[name] = after - before
    twins: list[TwinTimes | None] | None = None
    if twins_on is not None:
        twins = []
        for key in created:
            created_at, bound_at, running_at = twin_seen.get(key.name, (None, None, None))
            if created_at is None or running_at is None:
                twins.append(None)
                continue
            at = created[key]
            # a twin seen first already Running was bound no later than that
            twins.append(TwinTimes(created_at - at, (bound_at or running_at) - at, running_at - at))
    # a pod seen first already Running was bound no later than that
    return Timed([running[k] - created[k] for k in created],
                 [bound.get(k, running[k]) - created[k] for k in created], total, burst, writes,
                 lapses, twins, twin_failure)  # fmt: skip


def namespaces_left(left: frozenset[str], item: WatchEvent | Listed) -> frozenset[str]:
    """Of the namespaces ``left`` to go, those still there after ``item`` of a watch of
    namespaces. Pure."""
    if isinstance(item, Listed):
        return left & {key.name for key in item.keys}
    return left - {item.key.name} if item.type == "DELETED" else left


async def wait_gone(client: KubeClient, names: list[str], timeout: float = 300.0) -> None:
    """Until the namespaces ``names`` (the bench's, labelled by :func:`namespace`) are gone,
    watched; :class:`TimedOut` naming those left after ``timeout`` seconds."""
    left = frozenset(names)
    try:
        async with asyncio.timeout(timeout):
            async for item in watch_objects(client, NAMESPACES, label_selector=BENCH_NAMESPACES):
                left = namespaces_left(left, item)
                if not left:
                    return
    except TimeoutError:
        raise TimedOut(f"{len(left)} of {len(names)} namespaces still there after {timeout:.0f} s: "
                       f"{some(sorted(left))}") from None  # fmt: skip


def gone_timeout(pods: int) -> float:
    """How long the bench waits for a burst's namespace, or its twins, to go: 300 s, and 0.1 s
    per pod beyond 3000 (the 10,000 pods of a burst took just over 300 s to go with the
    provider on one core, its Leases keeping that core 68 % busy, on 2026-11-27)."""
    return max(300.0, pods / 10)


def some(names: list[str], shown: int = 5) -> str:
    """The first ``shown`` of ``names``, and how many more."""
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


async def wait_no_pods(client: KubeClient, label_selector: str, timeout: float = 300.0) -> None:
    """Until no pod matches ``label_selector`` (an offloaded burst's twins), watched;
    :class:`TimedOut` naming those left after ``timeout`` seconds."""
    present: frozenset[ObjectKey] = frozenset()
    try:
        async with asyncio.timeout(timeout):
            async for item in watch_objects(client, PODS, label_selector=label_selector):
                present = present_after(present, item)
                if not present and (isinstance(item, Listed) or item.type == "DELETED"):
                    return
    except TimeoutError:
        raise TimedOut(f"{len(present)} twins still there after {timeout:.0f} s: "
                       f"{some(sorted(f'{k.namespace}/{k.name}' for k in present))}") from None  # fmt: skip


def cpu_split(pid: int) -> tuple[float, float]:
    """CPU seconds in user space and in the kernel of a process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / ticks, int(fields[12]) / ticks


def proc_stats(pid: int) -> tuple[float, int]:
    """CPU seconds (user+system) and peak RSS in bytes of a process."""
    cpu = sum(cpu_split(pid))
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return cpu, int(line.split()[1]) * 1024
    return cpu, 0


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


Requests = dict[tuple[str, str, str, str], float]
"""(what, server, a, b) -> count, from the virtual kubelet's /metrics: ("requests", server, verb,
resource) for the requests it sent, ("events", server, resource, type) for the objects its
list+watch loops received."""

_VK_COUNTERS = {
    "gpuferry_api_requests_total": ("requests", "verb", "resource"),
    "gpuferry_watch_events_total": ("events", "resource", "type"),
}
_VK_WORK = "gpuferry_queue_work_duration_seconds_count"
"""Keys a work queue's workers processed, by queue: the reconciles."""
_VK_GC = "gpuferry_gc_seconds_total"
"""CPU seconds in Python's garbage collector, by generation."""


def parse_vk_metrics(text: str) -> Requests:
    """The request and watch-event counters of a /metrics text. Pure."""
    out: Requests = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if (known := _VK_COUNTERS.get(sample.name)) is not None:
                what, a, b = known
                labels = sample.labels
                key = (what, labels["server"], labels[a], labels[b])
                out[key] = out.get(key, 0.0) + sample.value
            elif sample.name == _VK_WORK:
                out[("work", "", sample.labels["queue"], "")] = sample.value
            elif sample.name == _VK_GC:
                out[("gc", "", sample.labels["generation"], "")] = sample.value
    return out


def cpu_shares(
    before: Requests, after: Requests, user: tuple[float, float], system: tuple[float, float]
) -> str:
    """Where the virtual kubelet's CPU went between two readings: user space against the kernel
    (``user`` and ``system``: seconds at each reading, from /proc), and Python's garbage
    collector (from its /metrics). Pure."""
    used = (user[1] - user[0]) + (system[1] - system[0])
    if used <= 0:
        return "no CPU used"
    collected = sum(v - before.get(k, 0.0) for k, v in after.items() if k[0] == "gc")
    return (f"{(user[1] - user[0]) / used * 100:.0f} % in user space, "
            f"{collected / used * 100:.1f} % in the garbage collector")  # fmt: skip


def reconciles_per_pod(before: Requests, after: Requests, pods: int, stage: str = "") -> str:
    """The reconciles per pod, by queue, most first (under 0.005 per pod left out); ``stage``
    (e.g. ``"Running to gone"``) says which part of the pods' life, where not the way to Running.
    Pure."""
    counts = {k[2]: (v - before.get(k, 0.0)) / pods for k, v in after.items() if k[0] == "work"}
    counts = {k: v for k, v in counts.items() if v >= 0.005}
    detail = ", ".join(f"{k} {v:.2f}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1]))
    said = f", {stage}" if stage else ""
    return f"  vk: {sum(counts.values()):.2f} reconciles per pod{said} ({detail or 'none'})"


async def requests_sent(port: int) -> Requests:
    async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}/metrics") as resp:
        return parse_vk_metrics(await resp.text())


def per_pod(
    before: Requests, after: Requests, pods: int, sides: dict[str, str], stage: str = ""
) -> list[str]:
    """Per cluster: the requests per pod by verb and resource, then the watch events received per
    pod by resource and type, most first (a line each; under 0.005 per pod left out); ``stage``
    as for :func:`reconciles_per_pod`. Pure."""
    said = f", {stage}" if stage else ""
    lines = []
    for what, unit in (("requests", "requests"), ("events", "watch events received")):
        for server, side in sides.items():
            counts = {
                f"{a} {b}": (after[k] - before.get(k, 0.0)) / pods
                for k in after
                if k[0] == what and k[1] == server and (a := k[2]) != "watch" and (b := k[3])
            }
            counts = {k: v for k, v in counts.items() if v >= 0.005}
            total = sum(counts.values())
            detail = ", ".join(f"{k} {v:.2f}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1]))
            lines.append(f"  {side}: {total:.2f} {unit} per pod{said} ({detail or 'none'})")
    return lines


def vk_command(
    consumer: Any, provider: Any, cons_id: str, prov_id: str, gpus: str, port: int, resync: float,
    run: str, workers: int | None = None, provider_events: str = "all",
) -> list[str]:
    return [
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
        "--metrics-port",
        str(port),
        "--resync-seconds",
        str(resync),
        # twins go to the run's provider nodes only, as the direct pods do
        "--provider-node-selector",
        f"{RUN_LABEL}={run}",
        *(["--workers", str(workers)] if workers else []),
        "--provider-events",
        provider_events,
    ]


async def wait_ready(client: KubeClient, node: str, vk: subprocess.Popen[bytes], log: str) -> None:
    async with asyncio.timeout(120):
        async for item in watch_objects(client, NODES, field_selector=f"metadata.name={node}"):
            if vk.poll() is not None:
                raise TimedOut(f"the virtual kubelet exited ({vk.returncode}): see {log}")
            if not isinstance(item, Listed) and any(
                x["type"] == "Ready" and x["status"] == "True"
                for x in item.object.get("status", {}).get("conditions", [])
            ):
                return


LIFECYCLE_TAINTS = "node.kubernetes.io/"
"""The prefix of the taints the node lifecycle controller keeps in step with a node's conditions
(not-ready, unreachable, the pressures, unschedulable)."""


def node_ready(node: RawObject) -> bool:
    """Whether ``node`` says Ready. Pure."""
    conditions = (node.get("status") or {}).get("conditions") or ()
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


class Lapses:
    """The run's provider nodes seen other than Ready while a burst ran. A node whose Lease kwok
    did not renew within the node lifecycle controller's grace period (50 s) is marked Unknown,
    and every pod on it NotReady: the simulated provider starved, which no real one's kubelets
    do (each renews its own Lease). A burst with lapses is timed against a provider that was not
    healthy. Fed by a watch of the nodes; pure."""

    def __init__(self) -> None:
        self.seen: set[str] = set()
        self.lapsed: set[str] = set()

    def observe(self, node: RawObject) -> None:
        name = str((node.get("metadata") or {}).get("name", ""))
        self.seen.add(name)
        if not node_ready(node):
            self.lapsed.add(name)

    def summary(self) -> str:
        return f"{len(self.lapsed)} of {len(self.seen)}"


def schedulable(node: RawObject) -> bool:
    """Whether ``node`` says Ready and carries none of the node lifecycle controller's taints.
    Pure. A node is created with ``node.kubernetes.io/not-ready`` (the NodeTaint admission), and
    the controller takes it off some time after the node turns Ready: 4.7 nodes a second with its
    default client (20 requests/s) on this machine, so 1252 new nodes said Ready in seconds and
    took 270 s to accept a pod."""
    taints = (node.get("spec") or {}).get("taints") or ()
    lifecycle = any(str(t.get("key", "")).startswith(LIFECYCLE_TAINTS) for t in taints)
    return node_ready(node) and not lifecycle


def schedulable_count(nodes: list[RawObject]) -> int:
    """How many of ``nodes`` are :func:`schedulable`. Pure."""
    return sum(schedulable(n) for n in nodes)


async def wait_nodes_ready(client: KubeClient, suffix: str, count: int, timeout: float = 300.0) -> float:
    """Until the run's ``count`` provider nodes are Ready and untainted; the seconds it took.
    kwok readies a thousand of them over some seconds and the node lifecycle controller untaints
    them after; a burst started before would time the direct pods against fewer nodes and against
    that controller's node updates (each one a pass of every Node watcher, the provider
    controller's GPU pool among them). Watched, not listed again and again: a list of 1252 nodes
    each second is load on the server the bench waits to settle."""
    start = time.monotonic()
    state: dict[str, bool] = {}
    said, shown = -1, 0.0
    try:
        async with asyncio.timeout(timeout):
            async for item in watch_objects(client, NODES, label_selector=f"{RUN_LABEL}={suffix}"):
                if isinstance(item, Listed):
                    state = {name: v for name, v in state.items() if ObjectKey(None, name) in item.keys}
                elif item.type == "DELETED":
                    state.pop(item.key.name, None)
                else:
                    state[item.key.name] = schedulable(item.object)
                ready = sum(state.values())
                took = time.monotonic() - start
                if ready >= count:
                    print(f"provider nodes Ready and untainted: all {count} after {took:.0f} s", flush=True)
                    return took
                if ready != said and ready and took - shown >= 1.0:
                    print(f"provider nodes Ready and untainted: {ready} of {count}", flush=True)
                    said, shown = ready, took
    except TimeoutError:
        raise TimedOut(
            f"{sum(state.values())} of the run's {count} provider nodes Ready and untainted after "
            f"{timeout:.0f}s"
        ) from None
    raise AssertionError("unreachable: the watch is endless")


OURS = ("python -m peering", "python -m vk", "virtual kubelet")
"""How gpuferry's own processes are named in the machine's figures (bench.machine.component_of)."""


def rest_shares(by: Mapping[str, float], seconds: float, top: int = 4) -> list[tuple[str, float]]:
    """Percent of a core per component over ``seconds``: the ``top`` busiest, then gpuferry's own
    (its controllers, the bench's virtual kubelet) wherever they rank, for they are what the
    project answers for. Pure."""
    ranked = sorted(by.items(), key=lambda item: -item[1])
    ours = [(k, v) for k, v in ranked[top:] if k.startswith(OURS)]
    return [(k, v / seconds * 100) for k, v in [*ranked[:top], *ours]]


def settled(previous: float | None, busy: float, margin: float = SETTLE_MARGIN) -> bool:
    """Whether a window ``busy`` % busy shows the machine's load no longer falling: no more than
    ``margin`` points under the window before. Pure."""
    return previous is not None and busy >= previous - margin


async def settle(vk: subprocess.Popen[bytes]) -> machine.Burst:
    """Windows of REST_SECONDS until the load stops falling, at most SETTLE_MAX_SECONDS; the last
    window. New nodes are not the end of their cost: kwok leases them, and the direct burst, first,
    would pay for what is left of their start."""
    previous: float | None = None
    deadline = time.monotonic() + SETTLE_MAX_SECONDS
    while True:
        before = machine.snapshot()
        await asyncio.sleep(REST_SECONDS)
        window = machine.snapshot().since(before, names={vk.pid: "virtual kubelet (bench)"})
        busy = window.busy / window.total * 100
        if settled(previous, busy) or time.monotonic() > deadline:
            return window
        if previous is not None:
            print(f"machine settling: cores {busy:.0f} % busy", flush=True)
        previous = busy


async def throughput(
    c: KubeClient,
    p: KubeClient,
    counts: list[int],
    *,
    node: str,
    cons_id: str,
    suffix: str,
    vk: subprocess.Popen[bytes],
    port: int,
    idle: float,
    services: int = 0,
    twins: bool = False,
    grace: int = 0,
) -> None:
    sides = {c.base_url.split("://", 1)[1]: "consumer", p.base_url.split("://", 1)[1]: "provider"}
    at_rest = await settle(vk)
    shown = rest_shares(at_rest.by, REST_SECONDS)
    print(f"machine at rest, before the bursts: cores {at_rest.busy / at_rest.total * 100:.0f} % busy "
          f"({', '.join(f'{k} {v:.1f} %' for k, v in shown)} of a core)", flush=True)  # fmt: skip
    if services:
        print(f"each burst's namespace holds {services} Services, selecting none of its pods", flush=True)
    if grace:
        print(f"the pods have a grace period of {grace} s: deleted, each is terminating first", flush=True)
    for n in counts:
        results = {}
        lines: list[str] = []
        offload_cpu = steady = 0.0
        gone: Requests = {}
        split_gone = (0.0, 0.0)
        running_rss = 0
        for side, client in (("direct", p), ("offloaded", c)):
            ns = f"bench-{side}-{n}-{suffix}"
            await client.create(NAMESPACES, namespace(ns))  # labelled: the final cleanup finds it
            for i in range(services):
                await client.create(SERVICES, service(f"svc-{i}"), ns)
            await asyncio.sleep(1.5)  # default ServiceAccount
            before = await requests_sent(port)
            cpu_before = proc_stats(vk.pid)[0]
            split_before = cpu_split(vk.pid)
            try:
                keys = [ObjectKey(ns, f"p-{i:05d}") for i in range(n)]
                results[side] = await create_and_time(
                    client, keys, suffix, node if side == "offloaded" else None, vk,
                    servers={"consumer": c, "provider": p}, nodes_on=p,
                    twins_on=(p, cons_id) if side == "offloaded" and twins else None, grace=grace,
                )
                at_running, cpu_running = await requests_sent(port), proc_stats(vk.pid)[0]
                if side == "offloaded" and idle > 0:
                    # nothing changes now: what the virtual kubelet spends holding N pods
                    # (its resync period is the window: one full resync falls inside it)
                    await asyncio.sleep(2)
                    idle_start, start = proc_stats(vk.pid)[0], time.monotonic()
                    await asyncio.sleep(idle)
                    steady = (proc_stats(vk.pid)[0] - idle_start) / (time.monotonic() - start)
                    running_rss = rss_now(vk.pid)
            finally:
                alive = vk.poll() is None
                after = await requests_sent(port) if alive else {}
                await client.delete(NAMESPACES, ns)
                # the pods hold their GPUs until they are gone: the next run needs them
                await wait_gone(client, [ns], timeout=gone_timeout(n))
                if side == "offloaded" and alive:  # and the twins too
                    await wait_no_pods(p, owner_selector(cons_id), timeout=gone_timeout(n))
                    await asyncio.sleep(1)  # the last token Secrets' deletions
                    gone = await requests_sent(port) if vk.poll() is None else {}
                    split_gone = cpu_split(vk.pid) if gone else split_before
            if not alive:
                raise TimedOut(f"the virtual kubelet exited ({vk.returncode}) during the {side} run")
            if side == "offloaded":
                lines = per_pod(before, at_running, n, sides)
                lines.append(reconciles_per_pod(before, at_running, n))
                if idle > 0:  # the resync's share: what it passes over finding nothing to do
                    window = f"in the {idle:.0f} s idle window"
                    lines.append(reconciles_per_pod(at_running, after, n, window))
                if gone:  # the other half of a pod's life: its deletion on both sides
                    stage = "Running to gone"
                    lines += per_pod(after, gone, n, sides, stage)
                    lines.append(reconciles_per_pod(after, gone, n, stage))
                # the pods' whole life on the node, create to gone, less the idle window
                offload_cpu = proc_stats(vk.pid)[0] - cpu_before - steady * idle
                to_running = (cpu_running - cpu_before) / n * 1000
                lines.insert(0, f"  vk: {offload_cpu / n * 1000:.1f} ms CPU per pod offloaded (create to "
                                f"gone; {to_running:.1f} ms to Running)")  # fmt: skip
                if gone:
                    shares = cpu_shares(before, gone, (split_before[0], split_gone[0]),
                                        (split_before[1], split_gone[1]))  # fmt: skip
                    window = f" (the {idle:.0f} s idle window in it)" if idle > 0 else ""
                    lines.insert(1, f"  vk: of its CPU from create to gone{window}, {shares}")
                if idle > 0:
                    lines.insert(1, f"  vk steady state with {n} pods Running: {steady * 100:.2f} % of a "
                                    f"core over {idle:.0f} s (one resync in it), RSS "
                                    f"{running_rss / 2**20:.0f} MiB")  # fmt: skip
        cpu, rss = proc_stats(vk.pid)
        d, o = results["direct"], results["offloaded"]
        print(
            f"N={n}: direct total {d.total:.1f}s p50 {statistics.median(d.running):.2f}s "
            f"p99 {pct(d.running, 0.99):.2f}s | offloaded total {o.total:.1f}s "
            f"p50 {statistics.median(o.running):.2f}s p99 {pct(o.running, 0.99):.2f}s | "
            f"ratio {o.total / d.total:.2f}x | vk cpu {cpu:.1f}s peak RSS {rss / 2**20:.0f} MiB",
            flush=True,
        )
        lines.insert(0, f"  where the time goes: direct {d.stages()} (the provider's scheduler, then its "
                        f"node); offloaded {o.stages()} (the consumer's scheduler, then the virtual "
                        "kubelet, the provider's scheduler and node)")  # fmt: skip
        if o.twins is not None:
            lines.insert(1, "  offloaded, bound to Running: "
                            + twin_stages(o.bound, o.running, o.twins, o.twin_failure))
        lines[1:1] = machine_lines(d, o, n)
        for line in lines:
            print(line, flush=True)


def machine_lines(direct: Timed, offloaded: Timed, n: int) -> list[str]:
    """The work each burst made, on the whole machine, to its last pod Running (see
    :mod:`bench.machine`)."""
    lines = []
    for side, timed in (("direct", direct), ("offloaded", offloaded)):
        if timed.machine is not None:
            lines.append(f"  machine, {side}: {timed.machine.summary(n, always=OURS)}")
    if direct.machine is not None and offloaded.machine is not None and direct.machine.busy > 0:
        lines.append(f"  machine: the offloaded burst's CPU per pod is "
                     f"{offloaded.machine.busy / direct.machine.busy:.2f}x the direct one's (the time "
                     f"ratio follows it where the cores are busy through both)")  # fmt: skip
    for side, timed in (("direct", direct), ("offloaded", offloaded)):
        if timed.lapses is not None:
            lines.append(f"  provider nodes not Ready at some time in the {side} burst: "
                         f"{timed.lapses.summary()} (a node whose Lease kwok did not renew in time is "
                         "marked Unknown, and its pods NotReady)")  # fmt: skip
    for side, timed in (("direct", direct), ("offloaded", offloaded)):
        if timed.writes:
            served = "; ".join(f"{name} {machine.per_pod(done, n)}" for name, done in timed.writes.items())
            lines.append(f"  API server writes per pod, {side}, all clients, Leases aside: {served}")
    return lines


async def watches_held(port: int) -> int:
    async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}/metrics") as resp:
        text = await resp.text()
    return int(
        sum(
            s.value
            for f in text_string_to_metric_families(text)
            for s in f.samples
            if s.name == "gpuferry_vk_namespace_watches"
        )
    )


def rss_now(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


async def many_namespaces(
    c: KubeClient, count: int, *, node: str, suffix: str, vk: subprocess.Popen[bytes], port: int
) -> None:
    """One pod in each of ``count`` namespaces, then none: GETs meanwhile, watches, RSS."""
    names = [f"bench-ns-{i:03d}-{suffix}" for i in range(count)]

    async def get_latency() -> float:
        samples = []
        for _ in range(20):
            start = time.monotonic()
            await c.get(NAMESPACES, names[0])
            samples.append(time.monotonic() - start)
        return statistics.median(samples)

    try:
        for ns in names:
            await c.create(NAMESPACES, namespace(ns))
        await asyncio.sleep(1.5)
        base_rss = rss_now(vk.pid)
        timed = await create_and_time(c, [ObjectKey(ns, "p") for ns in names], suffix, node, vk)
        await asyncio.sleep(2)
        held, rss, latency = await watches_held(port), rss_now(vk.pid), await get_latency()
        print(
            f"{count} namespaces, one pod each: all Running in {timed.total:.1f}s "
            f"(p99 {pct(timed.running, 0.99):.2f}s) | vk holds {held} watches, "
            f"RSS {rss / 2**20:.0f} MiB (before the pods {base_rss / 2**20:.0f} MiB) | "
            f"GET p50 {latency * 1000:.1f} ms",
            flush=True,
        )
        for ns in names:
            await c.delete(PODS, "p", ns, grace_period_seconds=0)
        async with asyncio.timeout(120):
            while await watches_held(port) > 0:  # noqa: ASYNC110 - its /metrics, not an event
                await asyncio.sleep(0.5)
        await asyncio.sleep(2)
        held, rss = await watches_held(port), rss_now(vk.pid)
        print(
            f"  pods gone: vk holds {held} watches, RSS {rss / 2**20:.0f} MiB | "
            f"GET p50 {await get_latency() * 1000:.1f} ms",
            flush=True,
        )
    except TimeoutError:
        raise TimedOut(f"after the pods went, {await watches_held(port)} watches still held") from None
    else:
        # the namespace controller empties each namespace of every type it serves: left to run in
        # the background, that kept both API servers busy well into whatever the machine ran next
        start = time.monotonic()
        for ns in names:
            await c.delete(NAMESPACES, ns)
        await wait_gone(c, names)
        print(f"  namespaces gone after {time.monotonic() - start:.1f} s", flush=True)
    finally:
        for ns in names:
            with contextlib.suppress(NotFound):
                await c.delete(NAMESPACES, ns)


async def bench(
    profile: str, counts: list[int], namespaces: int | None, idle: float, workers: int | None = None,
    services: int = 0, split_cores: bool = False, twins: bool = False, grace: int = 0,
    provider_events: str = "all",
) -> None:
    clusters = profile_clusters(profile)
    consumer, provider = clusters["consumer"], clusters["provider"]
    suffix = uuid.uuid4().hex[:5]
    cons_id, prov_id = f"bench-c{suffix}", f"bench-p{suffix}"
    node = f"gpuferry-{prov_id}"
    most = max([*counts, namespaces or 0])
    gpus = str(most + 10)
    port = free_port()
    log = f"/tmp/bench-vk-{suffix}.log"
    resync = max(idle, 1.0) if idle else 300.0
    vk = subprocess.Popen(  # noqa: ASYNC220 - started once, before any timing
        vk_command(consumer, provider, cons_id, prov_id, gpus, port, resync, suffix, workers,
                   provider_events=provider_events),
        stdout=subprocess.DEVNULL,
        stderr=open(log, "w"),  # noqa: SIM115, ASYNC230
    )
    # the simulated provider has 36 GPUs; N pods with one GPU each need more nodes (kwok runs them).
    # Their own product, which no grant of the demo selects: an H100 label put them in the demo's
    # grant, whose node labels and free block then changed with each run (and its kubelet restarted)
    extra = [
        NodeSpec(
            name=f"bench-gpu-{suffix}-{i}",
            cpu="96",
            memory="1536Gi",
            gpus=8,
            gpu_labels={"nvidia.com/gpu.product": "NVIDIA-H200", RUN_LABEL: suffix},
        )
        for i in range(most // 8 + 2)
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
            await wait_ready(c, node, vk, log)
            await wait_nodes_ready(p, suffix, len(extra))
            with contextlib.ExitStack() as stack:
                if split_cores:
                    stack.enter_context(cores_split(consumer, provider, vk))
                if counts:
                    await throughput(c, p, counts, node=node, cons_id=cons_id, suffix=suffix, vk=vk,
                                     port=port, idle=idle, services=services, twins=twins,
                                     grace=grace)  # fmt: skip
                if namespaces:
                    await many_namespaces(c, namespaces, node=node, suffix=suffix, vk=vk, port=port)
    finally:
        vk.terminate()
        vk.wait(10)
        # the namespaces are waited for: their deletion keeps both API servers busy for a while,
        # and a run started next (this bench's, say) would measure it
        cleanup(
            (provider, ("delete", "nodes", "-l", f"bench.gpuferry.io/run={suffix}", "--wait=false")),
            (
                provider,
                ("delete", "namespaces", "-l", owner_selector(cons_id), "--timeout=100s"),
            ),
            (
                consumer,
                ("delete", "namespaces", "-l", BENCH_NAMESPACES, "--ignore-not-found", "--timeout=100s"),
            ),
            (consumer, ("delete", "node", node, "--ignore-not-found", "--wait=false")),
        )


@contextlib.contextmanager
def cores_split(consumer: Any, provider: Any, vk: subprocess.Popen[bytes]) -> Iterator[None]:
    """The consumer's processes and the bench's virtual kubelet on the first half of the cores,
    the provider's on the other (:mod:`bench.cores`), for the block."""
    ours, theirs = cores.split(sorted(os.sched_getaffinity(0)), 2)
    groups = [(consumer.processes() | {vk.pid}, ours), (provider.processes(), theirs)]
    with cores.pinned(groups) as threads:
        print(f"cores split: the consumer's processes and the virtual kubelet ({threads[0]} threads) on "
              f"CPU {','.join(map(str, sorted(ours)))}, the provider's ({threads[1]} threads) on CPU "
              f"{','.join(map(str, sorted(theirs)))}", flush=True)  # fmt: skip
        yield


def cleanup(*steps: tuple[Any, tuple[str, ...]]) -> None:
    """Every step, whatever the one before did; what could not be removed is said, with the
    command that removes it."""
    for cluster, args in steps:
        try:
            cluster.kubectl(*args)
        except (subprocess.TimeoutExpired, KubectlFailed) as exc:
            print(
                f"cleanup: kubectl {' '.join(args)} on {cluster.spec.name} did not finish "
                f"({type(exc).__name__}): run it again with --kubeconfig {cluster.spec.kubeconfig}",
                file=sys.stderr,
            )


async def _stoppable(run: Coroutine[Any, Any, None]) -> None:
    """``run``, cancelled by SIGINT or SIGTERM, so that its clean-up runs either way (also when
    started in the background by a shell, which starts it with SIGINT ignored)."""
    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, task.cancel)
    await run


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--profile", default="demo", choices=sorted(PROFILE_PORT_BASES),
                        help="local clusters to use (default: demo; make demo first)")  # fmt: skip
    parser.add_argument("--pods", type=int, action="append", help="N (repeatable; default 100 and 1000)")
    parser.add_argument("--namespaces", type=int, help="one pod in each of N namespaces, then none")
    parser.add_argument(
        "--idle",
        type=float,
        default=30.0,
        help="seconds to measure the virtual kubelet's CPU with the N pods Running and nothing "
        "changing (its resync period is set to this, so one full resync falls inside; 0: skip)",
    )
    parser.add_argument(
        "--workers", type=int, help="the virtual kubelet's --workers (pods reconciled at once; default 16)"
    )
    parser.add_argument(
        "--services", type=int, default=0,
        help="Services (selecting none of the pods) in each burst's namespace, made before its pods "
        "(default 0); the virtual kubelet copies them to the twin namespace",
    )
    parser.add_argument(
        "--split-cores", action="store_true",
        help="the consumer's processes (and the bench's virtual kubelet) on half of the cores, the "
        "provider's on the other half, as two clusters run on machines of their own; by default "
        "they share every core",
    )
    parser.add_argument(
        "--twins", action="store_true",
        help="also watch the twins on the provider, and split an offloaded pod's way from bound to "
        "Running into its parts (to its twin, the twin's binding, its Running, status back); the "
        "watch is one more client of the provider's API server, which the offloaded burst pays for",
    )
    parser.add_argument(
        "--grace", type=int, default=0,
        help="the pods' terminationGracePeriodSeconds (default 0: deleted, a pod goes at once; "
        "with more, as most pods have, it is terminating first, its twin is deleted with the same "
        "grace, and the virtual kubelet removes it once its twin is gone: one more request)",
    )
    parser.add_argument(
        "--provider-events", choices=PROVIDER_EVENTS, default="all",
        help="the virtual kubelet's --provider-events: which provider Events about twins it copies "
        "onto their pods (default all: here the provider's scheduler's, one per pod; warnings: none "
        "while all goes well)",
    )
    args = parser.parse_args()
    if args.split_cores and len(os.sched_getaffinity(0)) < 2:
        parser.error("--split-cores needs 2 CPUs or more: this process may run on "
                     f"{len(os.sched_getaffinity(0))}")  # fmt: skip
    if args.idle < 0:
        parser.error("--idle must be 0 or more")
    if args.services < 0:
        parser.error("--services must be 0 or more")
    if args.grace < 0:
        parser.error("--grace must be 0 or more")
    if args.workers is not None and args.workers < 1:
        parser.error("--workers must be 1 or more")
    counts = args.pods or ([] if args.namespaces else [100, 1000])
    try:
        asyncio.run(_stoppable(bench(args.profile, counts, args.namespaces, args.idle, args.workers,
                                          args.services, args.split_cores, args.twins, args.grace,
                                          args.provider_events)))
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("interrupted: what the benchmark made is removed", file=sys.stderr)
        sys.exit(130)
    except (TimedOut, TimeoutError, KubeError, aiohttp.ClientError, OSError) as exc:
        print(f"benchmark stopped: {str(exc) or type(exc).__name__}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
