"""What a scrape of the virtual node's kubelet API costs the virtual kubelet: ``/metrics/resource``
(metrics-server, every 15 s by default) and ``/metrics/cadvisor`` (Prometheus' kubelet job,
every 30 s in kube-prometheus-stack), each the usage the provider measured told of N pods
(:mod:`vk.forge.usage`), against the same samples written by ``prometheus_client`` (a collector
of metric families and ``generate_latest``, the usual way) from the pods decoded.

Synthetic and in-process: N running pods of one measured container each, as a burst's are,
held as the virtual kubelet holds them and their twins (compact :class:`kube.informers.Informer`
stores, filled through ``receive`` as a watch fills them). A scrape is what the kubelet API's
route does once the provider's PodMetrics list is in: read the pods from the stores
(``Usage.pods``: read again only where a store changed since the last scrape), decode the list's
bytes (as metrics-server gives them: CPU in nanocores, memory in KiB) with orjson as our client
does, read each twin's usage (``twin_usage``), advance the counters (``measure``), write the
text. Not in it: the HTTPS read of the list and the write of the answer. Both texts are parsed
back and compared first; a scrape is timed only where they give the same samples. Prints, per
N, the CPU of one scrape each way (the best of ``--repeat``), ours with the pods and their
texts kept from the last scrape (nothing changed), after one pod changed (the pods that changed
read again, that pod's texts made again) and with all read and made anew (every pod changed),
the ratio of the usual way to the first, and what a scrape at those intervals costs of a core
with nothing changed (issue 15: steady state at most 2 % of a core at 10,000
pods; ``bench.offload``'s virtual kubelet serves no kubelet API, so its steady state has no
scrape).

    .venv/bin/python -m bench.kubelet_scrape --pods 1000 --pods 10000
"""

from __future__ import annotations

import argparse
import datetime
import gc
import itertools
import json
import math
import time
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple, cast

import orjson
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from kube.clients import KubeClient
from kube.informers import Informer
from kube.memory import tune_gc
from kube.objects import PODS, ObjectKey, RawObject
from kube.times import unix_seconds
from kube.watching import WatchEvent
from vk.forge.usage import (
    CadvisorTexts,
    CpuCounters,
    Measured,
    PodRef,
    PodTexts,
    ResourceTexts,
    SummaryTexts,
    cadvisor_identity,
    cadvisor_metrics,
    cadvisor_texts,
    measure,
    resource_metrics,
    resource_texts,
    stats_summary,
    summary_texts,
    twin_usage,
)
from vk.kubelet.server import KubeletContext, Usage
from vk.reflection.informers import consumer_key

IMAGE = "nvcr.io/nvidia/pytorch:25.01-py3"


def pod(i: int) -> dict[str, Any]:
    """A running consumer pod of a Job, with one container started in one of a burst's few
    seconds, as the virtual kubelet's store keeps it (no managed fields)."""
    job = {"name": "train", "uid": "1f2e3d4c-5b6a-4c77-9f0e-0b0e7d3c8d2a"}
    running = {"running": {"startedAt": f"2026-11-28T10:00:{i % 60:02d}Z"}}
    status = {"name": "main", "image": IMAGE, "imageID": "", "containerID": f"containerd://{i:064x}",
              "state": running, "lastState": {}, "ready": True, "restartCount": 0}  # fmt: skip
    conditions = [{"type": kind, "status": "True", "lastTransitionTime": "2026-11-28T10:00:02Z"}
                  for kind in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady",
                               "PodScheduled")]  # fmt: skip
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"p-{i:05d}",
            "namespace": "ml-team",
            "uid": f"{i:08d}-8d2a-4c77-9f0e-1f2e3d4c5b6a",
            "resourceVersion": str(7_000_000 + i),
            "creationTimestamp": "2026-11-28T10:00:00Z",
            "labels": {
                "batch.kubernetes.io/job-name": job["name"],
                "job-name": job["name"],
                "batch.kubernetes.io/controller-uid": job["uid"],
                "controller-uid": job["uid"],
            },
            "ownerReferences": [
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    **job,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
            "finalizers": ["batch.kubernetes.io/job-tracking"],
        },
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": IMAGE,
                    "command": ["python", "train.py"],
                    "resources": {"limits": {"nvidia.com/gpu": "1"}, "requests": {"nvidia.com/gpu": "1"}},
                    "terminationMessagePath": "/dev/termination-log",
                    "imagePullPolicy": "IfNotPresent",
                }
            ],
            "restartPolicy": "Never",
            "nodeName": "gpuferry-farm",
            "schedulerName": "default-scheduler",
            "serviceAccountName": "default",
            "tolerations": [
                {"key": "virtual-node.gpuferry.io/not-allowed", "operator": "Exists", "effect": "NoExecute"}
            ],
        },
        "status": {
            "phase": "Running",
            "qosClass": "BestEffort",
            "conditions": conditions,
            "hostIP": "10.0.0.1",
            "podIP": f"10.244.{i // 250}.{i % 250}",
            "startTime": "2026-11-28T10:00:00Z",
            "containerStatuses": [status],
        },
    }


TWINS = "ml-team-ml-eu1"
"""The twin namespace, on the provider."""


def pod_metrics(i: int) -> dict[str, Any]:
    """Pod ``i``'s twin's PodMetrics as the provider's metrics-server lists it."""
    usage = {"cpu": f"{100_000_000 + i * 90_001}n", "memory": f"{1_048_576 + i * 64}Ki"}
    return {
        "metadata": {
            "name": f"p-{i:05d}",
            "namespace": TWINS,
            "creationTimestamp": "2026-11-28T10:15:02Z",
            "labels": {"job-name": "train", "gpuferry.io/origin": "ml-team"},
        },
        "timestamp": "2026-11-28T10:15:00Z",
        "window": "15.027s",
        "containers": [{"name": "main", "usage": usage}],
    }


def listed(n: int) -> bytes:
    """The provider's PodMetrics list of the twin namespace, as it comes over the wire."""
    return orjson.dumps({"kind": "PodMetricsList", "apiVersion": "metrics.k8s.io/v1beta1",
                         "metadata": {}, "items": [pod_metrics(i) for i in range(n)]})  # fmt: skip


def twin(i: int) -> dict[str, Any]:
    """Pod ``i``'s twin as the virtual kubelet's store of twins keeps it."""
    twin = pod(i)
    twin["metadata"].update(namespace=TWINS, uid=f"twin-{i:05d}", resourceVersion=str(900_000 + i))
    return twin


def stores(n: int) -> tuple[KubeletContext, Callable[[], None]]:
    """The consumer pods and their twins in compact stores, as the kubelet API reads them, and
    what changes one pod (the next each time: a new resourceVersion, as a label added would
    give it)."""
    local = Informer(cast(KubeClient, None), PODS, name="consumer-pods", key_of=consumer_key,
                     compact=True)  # fmt: skip
    twins = Informer(cast(KubeClient, None), PODS, name="provider-twins", compact=True,
                     key_of=lambda t: ObjectKey("ml-team", t["metadata"]["name"]))  # fmt: skip
    for i in range(n):
        local.receive(WatchEvent("ADDED", pod(i)))
        twins.receive(WatchEvent("ADDED", twin(i)))
    started = datetime.datetime.now(datetime.UTC)
    ctx = KubeletContext(node_name="gpuferry-farm", provider=cast(KubeClient, None), local_pod=local.get,
                         twin_pod=twins.get, local_keys=local.keys, local_identity=local.identity,
                         twin_identity=twins.identity, started=started,
                         followed=(local, twins))  # fmt: skip
    touched = itertools.count()

    def touch() -> None:
        i = next(touched)
        changed = pod(i % n)
        changed["metadata"]["resourceVersion"] = str(8_000_000 + i)
        local.receive(WatchEvent("MODIFIED", changed))

    return ctx, touch


def read(
    ctx: KubeletContext, body: bytes, counters: CpuCounters, kept: Usage | None
) -> tuple[tuple[PodRef, ...], list[Measured], Measured | None]:
    """What a scrape does once the list is in, up to the text: the pods from the stores (those
    of the last scrape, ``kept``'s, while the stores did not change; read anew without it), the
    list decoded, each twin's usage read, the counters advanced."""
    pods = (kept or Usage()).pods(ctx)
    usage, failures = twin_usage(pods.twins, {TWINS: orjson.loads(body)})
    if failures:  # the bench's own PodMetrics: a bug here, said in a line, not a traceback
        raise SystemExit(f"bench.kubelet_scrape: the provider's list was not read: {'; '.join(failures[:3])}")
    return pods.refs, *measure(pods.refs, usage, counters)


def decoded(refs: list[PodRef]) -> list[RawObject]:
    """The pods of ``refs``, each decoded from its store."""
    return [p for ref in refs if (p := ref.load()) is not None]


class _Families(Collector):
    """The same samples as metric families, for ``prometheus_client`` to write."""

    def __init__(self, families: Callable[[], list[Metric]]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        yield from self.families()


def library_resource(pods: list[dict[str, Any]], measured: list[Measured], node: Measured | None) -> bytes:
    """``/metrics/resource``'s samples, written by ``prometheus_client``."""

    def families() -> list[Metric]:
        start = GaugeMetricFamily(
            "container_start_time_seconds",
            "[STABLE] Start time of the container since unix epoch in seconds",
            labels=["container", "namespace", "pod"],
        )
        for p in pods:
            for cs in p["status"]["containerStatuses"]:
                start.add_metric(
                    [cs["name"], p["metadata"]["namespace"], p["metadata"]["name"]],
                    round(unix_seconds(cs["state"]["running"]["startedAt"])),
                )
        cpu = CounterMetricFamily(
            "container_cpu_usage_seconds",
            "[STABLE] Cumulative cpu time consumed by the container in core-seconds",
            labels=["container", "namespace", "pod"],
        )
        memory = GaugeMetricFamily(
            "container_memory_working_set_bytes",
            "[STABLE] Current working set of the container in bytes",
            labels=["container", "namespace", "pod"],
        )
        for m in measured:
            cpu.add_metric([m.container, m.namespace, m.pod], m.cpu_seconds, timestamp=m.timestamp)
            memory.add_metric([m.container, m.namespace, m.pod], m.memory_bytes, timestamp=m.timestamp)
        pod_cpu = CounterMetricFamily(
            "pod_cpu_usage_seconds",
            "[STABLE] Cumulative cpu time consumed by the pod in core-seconds",
            labels=["namespace", "pod"],
        )
        pod_memory = GaugeMetricFamily(
            "pod_memory_working_set_bytes",
            "[STABLE] Current working set of the pod in bytes",
            labels=["namespace", "pod"],
        )
        for m in measured:  # one container a pod: the pod's figures are its container's
            pod_cpu.add_metric([m.namespace, m.pod], m.cpu_seconds, timestamp=m.timestamp)
            pod_memory.add_metric([m.namespace, m.pod], m.memory_bytes, timestamp=m.timestamp)
        found: list[Metric] = [start, cpu, memory, pod_cpu, pod_memory]
        if node is not None:
            node_cpu = CounterMetricFamily(
                "node_cpu_usage_seconds", "[STABLE] Cumulative cpu time consumed by the node in core-seconds"
            )
            node_cpu.add_metric([], node.cpu_seconds, timestamp=node.timestamp)
            node_memory = GaugeMetricFamily(
                "node_memory_working_set_bytes", "[STABLE] Current working set of the node in bytes"
            )
            node_memory.add_metric([], node.memory_bytes, timestamp=node.timestamp)
            found += [node_cpu, node_memory]
        found.append(
            GaugeMetricFamily(
                "resource_scrape_error",
                "[STABLE] 1 if there was an error while getting container metrics, 0 otherwise",
                value=0,
            )
        )
        return found

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(families))
    return generate_latest(registry)


def library_cadvisor(pods: list[dict[str, Any]], measured: list[Measured]) -> bytes:
    """``/metrics/cadvisor``'s samples, written by ``prometheus_client``."""
    by_key = {(p["metadata"]["namespace"], p["metadata"]["name"]): p for p in pods}
    names = ["container", "id", "image", "name", "namespace", "pod"]

    def families() -> list[Metric]:
        cpu = CounterMetricFamily(
            "container_cpu_usage_seconds",
            "Cumulative cpu time consumed in seconds.",
            labels=["container", "cpu", *names[1:]],
        )
        memory = GaugeMetricFamily(
            "container_memory_working_set_bytes", "Current working set in bytes.", labels=names
        )
        for m in measured:
            ident = cadvisor_identity(by_key[(m.namespace, m.pod)], m.container)
            values = [ident[n] for n in names]
            cpu.add_metric([values[0], "total", *values[1:]], m.cpu_seconds, timestamp=m.timestamp)
            memory.add_metric(values, m.memory_bytes, timestamp=m.timestamp)
        start = GaugeMetricFamily(
            "container_start_time_seconds",
            "Start time of the container since unix epoch in seconds.",
            labels=names,
        )
        for p in pods:
            for cs in p["status"]["containerStatuses"]:
                ident = cadvisor_identity(p, cs["name"])
                start.add_metric([ident[n] for n in names], unix_seconds(cs["state"]["running"]["startedAt"]))
        error = GaugeMetricFamily(
            "container_scrape_error",
            "1 if there was an error while getting container metrics, 0 otherwise",
            value=0,
        )
        return [cpu, memory, start, error]

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(families))
    return generate_latest(registry)


Samples = dict[tuple[str, tuple[tuple[str, str], ...], float | None], float]


def samples(text: str) -> Samples:
    """Every sample of a text exposition: (name, labels, timestamp) -> value."""
    found = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            at = None if s.timestamp is None else round(float(s.timestamp), 3)
            found[(s.name, tuple(sorted(s.labels.items())), at)] = float(s.value)
    return found


def agree(ours: Samples, theirs: Samples) -> bool:
    """The same series with the same values, to 14 digits (ours writes 15, the library all)."""
    return ours.keys() == theirs.keys() and all(
        math.isclose(v, theirs[k], rel_tol=1e-14, abs_tol=1e-300) for k, v in ours.items()
    )


def cpu_best(repeat: int, run: Callable[[], object], before: Callable[[], None] | None = None) -> float:
    """The least CPU time of ``repeat`` runs, in seconds, each started after ``before`` (not
    timed) and a full collection (the collector's work within a run then depends on the run,
    not on what ran before)."""
    times = []
    for _ in range(repeat):
        if before is not None:
            before()
        gc.collect()
        start = time.process_time()
        run()
        times.append(time.process_time() - start)
    return min(times)


class Path(NamedTuple):
    """One path of the kubelet API, scraped three ways."""

    route: str
    every: float
    """Seconds between two scrapes by its usual scraper."""
    baseline: str
    """What the usual way is."""
    ours: str
    theirs: str
    """One scrape's answer each way, compared first."""
    same: Callable[[str, str], bool]
    steady: Callable[[], str]
    """A scrape by the virtual kubelet, the pods' parts kept from the last one."""
    touch: Callable[[], None]
    """Changes one pod in the store: the next scrape reads the node's pods again, and makes
    that pod's parts again."""
    anew: Callable[[], str]
    """The same, every pod's parts made anew (as after every pod changed)."""
    usual: Callable[[], object]


def same_samples(ours: str, theirs: str) -> bool:
    return agree(samples(ours), samples(theirs))


def same_summary(ours: str, theirs: str) -> bool:
    """The same Summary, whatever the order of its pods (a pod that changed is listed last,
    as its store files it again)."""

    def read(text: str) -> Any:
        found = orjson.loads(text)
        if isinstance(found, dict) and isinstance(found.get("pods"), list):
            found["pods"] = sorted(found["pods"], key=lambda p: orjson.dumps(p.get("podRef")))
        return found

    return bool(read(ours) == read(theirs))


def paths(n: int) -> list[Path]:
    """``/metrics/resource``, ``/metrics/cadvisor`` and ``/stats/summary`` of N pods."""
    ctx, touch = stores(n)
    body = listed(n)
    counters = CpuCounters()
    refs, measured, node = read(ctx, body, counters, None)
    pods = decoded(refs)
    kept_pods = {route: Usage() for route in ("resource", "cadvisor", "summary")}
    kept_resource, kept_cadvisor = PodTexts(resource_texts), PodTexts(cadvisor_texts)
    kept_summary = PodTexts(summary_texts)

    def resource(kept: PodTexts[ResourceTexts] | None) -> str:
        refs, measured, node = read(ctx, body, counters, kept_pods["resource"] if kept is not None else None)
        return resource_metrics(refs, measured, node, False, kept)

    def cadvisor(kept: PodTexts[CadvisorTexts] | None) -> str:
        refs, measured, _ = read(ctx, body, counters, kept_pods["cadvisor"] if kept is not None else None)
        return cadvisor_metrics(refs, measured, False, kept)

    def summary(kept: PodTexts[SummaryTexts] | None) -> str:
        refs, measured, node = read(ctx, body, counters, kept_pods["summary"] if kept is not None else None)
        return orjson.dumps(stats_summary(ctx.node_name, ctx.started, refs, measured, node, kept)).decode()

    def resource_library() -> bytes:
        refs, measured, node = read(ctx, body, counters, None)
        return library_resource(decoded(refs), measured, node)

    def cadvisor_library() -> bytes:
        refs, measured, _ = read(ctx, body, counters, None)
        return library_cadvisor(decoded(refs), measured)

    def summary_decoded() -> str:
        refs, measured, node = read(ctx, body, counters, None)
        return json.dumps(stats_summary(ctx.node_name, ctx.started, decoded(refs), measured, node))

    library = "prometheus_client"
    summary_now = stats_summary(ctx.node_name, ctx.started, pods, measured, node)
    return [
        Path("/metrics/resource", 15.0, library, resource_metrics(pods, measured, node, scrape_error=False),
             library_resource(pods, measured, node).decode(), same_samples,
             lambda: resource(kept_resource), touch, lambda: resource(None), resource_library),
        Path("/metrics/cadvisor", 30.0, library, cadvisor_metrics(pods, measured, scrape_error=False),
             library_cadvisor(pods, measured).decode(), same_samples,
             lambda: cadvisor(kept_cadvisor), touch, lambda: cadvisor(None), cadvisor_library),
        Path("/stats/summary", 10.0, "each pod decoded and the standard json",
             orjson.dumps(summary_now).decode(), json.dumps(summary_now), same_summary,
             lambda: summary(kept_summary), touch, lambda: summary(None), summary_decoded),
    ]  # fmt: skip


def run(n: int, repeat: int) -> list[str]:
    """One line per path: ours and the usual way's CPU per scrape, their ratio, the share of a
    core; ours as the virtual kubelet scrapes when no pod changed (the pods and their parts kept
    from the last scrape), when one did (the pods that changed read again, that pod's parts made
    again) and when every pod did (all read and made anew). ``/stats/summary``'s usual scraper is
    OpenTelemetry's kubeletstats receiver (every 10 s by default)."""
    lines = []
    for path in paths(n):
        if not path.same(path.ours, path.theirs):
            lines.append(f"N={n} {path.route}: the two ways give different answers: not timed")
            continue
        kept = [path.steady(), path.steady()]  # the kept parts, made and then used
        path.touch()
        kept.append(path.steady())  # a pod changed (its resourceVersion, not what is written of it)
        if any(not path.same(answer, path.ours) for answer in kept):
            lines.append(f"N={n} {path.route}: the pods' kept parts give another answer: not timed")
            continue
        ours, one = cpu_best(repeat, path.steady), cpu_best(repeat, path.steady, before=path.touch)
        anew, theirs = cpu_best(repeat, path.anew), cpu_best(repeat, path.usual)
        lines.append(
            f"N={n} {path.route}: ours {ours * 1000:.0f} ms of CPU per scrape ({one * 1000:.0f} ms "
            f"after a pod changed, {anew * 1000:.0f} after every pod changed), {path.baseline} "
            f"{theirs * 1000:.0f} ms ({theirs / ours:.2f}x "
            f"ours); a scrape every {path.every:.0f} s costs {100 * ours / path.every:.2f} % of a core "
            f"({len(path.ours) / 1e6:.1f} MB a scrape)"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pods", type=int, action="append", help="N (repeatable; default 1000 and 10000)")
    parser.add_argument("--repeat", type=int, default=7, help="scrapes timed each way, the best printed (7)")
    args = parser.parse_args()
    tune_gc()  # the collector's settings of the virtual kubelet, whose scrapes these are
    for n in args.pods or [1000, 10000]:
        if n < 1:
            parser.error(f"--pods must be at least 1, not {n}")
        for line in run(n, max(1, args.repeat)):
            print(line, flush=True)


if __name__ == "__main__":
    main()
