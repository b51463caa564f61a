"""What a scrape of the virtual node's kubelet API costs the virtual kubelet: ``/metrics/resource``
(metrics-server, every 15 s by default) and ``/metrics/cadvisor`` (Prometheus' kubelet job,
every 30 s in kube-prometheus-stack), each the usage the provider measured told of N pods
(:mod:`vk.forge.usage`), against the same samples written by ``prometheus_client`` (a collector
of metric families and ``generate_latest``, the usual way).

Synthetic and in-process: N running pods of one measured container each, as a burst's are. A
scrape is what the kubelet API does once the provider's PodMetrics list is in: decode its bytes
(as metrics-server gives them: CPU in nanocores, memory in KiB) with orjson as our client does,
read each twin's usage (``twin_usage``), advance the counters (``measure``), write the text. Both
ways share all but the text. Not in it: the HTTPS read of the list and the write of the answer.
Both texts are parsed back and compared first; a scrape is timed only where they give the same
samples. Prints, per N, the CPU of one scrape each way (the best of ``--repeat``), their ratio,
and what a scrape at those intervals costs of a core (issue 15: steady state at most 2 % of a
core at 10,000 pods; ``bench.offload``'s virtual kubelet serves no kubelet API, so its steady
state has no scrape).

    .venv/bin/python -m bench.kubelet_scrape --pods 1000 --pods 10000
"""

from __future__ import annotations

import argparse
import gc
import math
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import orjson
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from kube.memory import tune_gc
from kube.objects import RawObject
from kube.times import unix_seconds
from vk.forge.usage import (
    CpuCounters,
    Measured,
    PodTexts,
    cadvisor_identity,
    cadvisor_metrics,
    cadvisor_texts,
    measure,
    resource_metrics,
    resource_texts,
    twin_usage,
)

IMAGE = "nvcr.io/nvidia/pytorch:25.01-py3"
INTERVALS = {"resource": 15.0, "cadvisor": 30.0}
"""Seconds between two scrapes of each path by its usual scraper."""


def pod(i: int) -> dict[str, Any]:
    """A running consumer pod with one container, started in one of a burst's few seconds."""
    running = {"running": {"startedAt": f"2026-11-28T10:00:{i % 60:02d}Z"}}
    status = {"name": "main", "image": IMAGE, "containerID": f"containerd://{i:064x}", "state": running}
    return {
        "metadata": {
            "name": f"p-{i:05d}",
            "namespace": "ml-team",
            "uid": f"uid-{i:05d}",
            "resourceVersion": str(7_000_000 + i),
        },
        "spec": {"containers": [{"name": "main", "image": IMAGE}]},
        "status": {"phase": "Running", "qosClass": "BestEffort", "containerStatuses": [status]},
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


def read(body: bytes, twins: Mapping[str, Mapping[str, str]], pods: list[RawObject],
         counters: CpuCounters) -> tuple[list[Measured], Measured | None]:  # fmt: skip
    """What a scrape does once the list is in, up to the text: decode, read, advance."""
    usage, failures = twin_usage(twins, {TWINS: orjson.loads(body)})
    assert not failures, failures[:3]
    return measure(pods, usage, counters)


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


def cpu_best(repeat: int, run: Callable[[], object]) -> float:
    """The least CPU time of ``repeat`` runs, in seconds, each started after a full collection
    (the collector's work within a run then depends on the run, not on what ran before)."""
    times = []
    for _ in range(repeat):
        gc.collect()
        start = time.process_time()
        run()
        times.append(time.process_time() - start)
    return min(times)


def run(n: int, repeat: int) -> list[str]:
    """One line per path: ours and the library's CPU per scrape, their ratio, the share of a
    core; ours both as the virtual kubelet scrapes when no pod changed (the pods' texts kept
    from the last scrape) and when every pod did (all made anew)."""
    pods = [pod(i) for i in range(n)]
    body = listed(n)
    twins = {TWINS: {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods}}
    counters = CpuCounters()
    measured, node = read(body, twins, pods, counters)
    kept_resource, kept_cadvisor = PodTexts(resource_texts), PodTexts(cadvisor_texts)
    ways: dict[str, tuple[Callable[[], str], Callable[[], str], Callable[[], object]]] = {
        "resource": (
            lambda: resource_metrics(pods, *read(body, twins, pods, counters), False, kept_resource),
            lambda: resource_metrics(pods, *read(body, twins, pods, counters), scrape_error=False),
            lambda: library_resource(pods, *read(body, twins, pods, counters)),
        ),
        "cadvisor": (
            lambda: cadvisor_metrics(pods, read(body, twins, pods, counters)[0], False, kept_cadvisor),
            lambda: cadvisor_metrics(pods, read(body, twins, pods, counters)[0], scrape_error=False),
            lambda: library_cadvisor(pods, read(body, twins, pods, counters)[0]),
        ),
    }
    texts = {
        "resource": (
            resource_metrics(pods, measured, node, scrape_error=False),
            library_resource(pods, measured, node).decode(),
        ),
        "cadvisor": (
            cadvisor_metrics(pods, measured, scrape_error=False),
            library_cadvisor(pods, measured).decode(),
        ),
    }
    lines = []
    for path, (ours_text, theirs_text) in texts.items():
        steady, changed, library = ways[path]
        if not agree(samples(ours_text), samples(theirs_text)):
            lines.append(f"N={n} /metrics/{path}: the two texts give different samples: not timed")
            continue
        if steady() != ours_text or steady() != ours_text:  # the kept texts, made and then used
            lines.append(f"N={n} /metrics/{path}: the pods' kept texts write another text: not timed")
            continue
        ours, anew, theirs = (cpu_best(repeat, way) for way in (steady, changed, library))
        every = INTERVALS[path]
        lines.append(
            f"N={n} /metrics/{path}: ours {ours * 1000:.0f} ms of CPU per scrape ({anew * 1000:.0f} ms "
            f"after every pod changed), prometheus_client {theirs * 1000:.0f} ms ({theirs / ours:.2f}x "
            f"ours); a scrape every {every:.0f} s costs {100 * ours / every:.2f} % of a core "
            f"({len(ours_text) / 1e6:.1f} MB a scrape)"
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
