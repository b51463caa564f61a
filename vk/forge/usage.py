"""What the provider's metrics API says a twin uses, told as a kubelet tells it of its pods: the
resource metrics (``/metrics/resource``, which metrics-server scrapes for ``kubectl top``), the
cAdvisor metrics (``/metrics/cadvisor``, which Prometheus scrapes on every node) and the Summary
API's CPU and memory. Pure.

The provider's metrics-server gives each twin container a CPU *rate* (cores, averaged over a
window that ends at a timestamp) and a memory working set. A kubelet gives a *cumulative* CPU
counter instead, from which the consumer's metrics-server computes the rate between two of its
scrapes. :class:`CpuCounters` makes that counter from the provider's rates: each new sample adds
its rate times the time since the last one, so the rate the consumer computes is the provider's.
A container is given usage only where the provider measured it; nothing is made up for one it
did not.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kube.objects import RawObject
from kube.quantities import parse_quantity
from kube.times import rfc3339, unix_seconds

MIN_CPU_SECONDS = 1e-9
"""The least a counter starts at. metrics-server drops a container whose counter is 0 (never so
on a kubelet, where starting a process costs CPU); a twin measured idle in its first window
would be dropped with it."""


@dataclass(frozen=True)
class ContainerUsage:
    """One container's usage as the provider's metrics API gave it."""

    cpu_cores: float
    memory_bytes: int
    timestamp: float
    """Unix seconds: the end of the window the CPU rate is averaged over."""
    window: float
    """Seconds the CPU rate is averaged over."""


def _seconds(duration: str | None) -> float:
    """Seconds of a Go duration as metrics-server writes a window (``15.027s``, ``1m0s``). Pure."""
    if not duration:
        return 0.0
    total, number = 0.0, ""
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
    i = 0
    while i < len(duration):
        ch = duration[i]
        if ch.isdigit() or ch == ".":
            number += ch
            i += 1
            continue
        unit = duration[i : i + 2] if duration[i : i + 2] in units else ch
        total += float(number or 0) * units.get(unit, 0.0)
        number, i = "", i + len(unit)
    return total


def container_usage(pod_metrics: RawObject) -> dict[str, ContainerUsage]:
    """A PodMetrics object's containers, by name. Pure."""
    timestamp = unix_seconds(str(pod_metrics.get("timestamp")))
    window = _seconds(pod_metrics.get("window"))
    found = {}
    for container in pod_metrics.get("containers") or ():
        usage = container.get("usage") or {}
        if "cpu" not in usage or "memory" not in usage:
            continue
        found[container["name"]] = ContainerUsage(
            cpu_cores=float(parse_quantity(usage["cpu"])),
            memory_bytes=int(parse_quantity(usage["memory"])),
            timestamp=timestamp,
            window=window,
        )
    return found


def twin_usage(
    twins: Mapping[str, Mapping[str, str]], listed: Mapping[str, RawObject]
) -> tuple[dict[str, dict[str, ContainerUsage]], list[str]]:
    """The usage of each consumer pod (by UID) whose twin the provider measured, from
    ``listed``, the provider's PodMetrics list of each twin namespace that answered (``twins``:
    twin namespace -> twin name -> consumer pod UID); and what could not be read, a line for
    each PodMetrics (an odd one costs its pod only). Pure."""
    usage: dict[str, dict[str, ContainerUsage]] = {}
    failures = []
    for ns, result in listed.items():
        names = twins.get(ns) or {}
        for item in result.get("items") or ():
            name = str((item.get("metadata") or {}).get("name"))
            if (uid := names.get(name)) is None:
                continue
            try:
                usage[uid] = container_usage(item)
            except (ValueError, TypeError, KeyError) as exc:
                failures.append(f"{ns}/{name}: PodMetrics not readable: {exc!r}")
    return usage, failures


class CpuCounters:
    """Cumulative CPU seconds by key (a consumer pod's UID and a container name, or the node),
    advanced by each sample the provider takes. In memory only: after a restart a counter starts
    again, which metrics-server reads as the container restarted (one scrape without a figure)."""

    def __init__(self) -> None:
        self._at: dict[tuple[str, str], tuple[float, float]] = {}
        """key -> (timestamp of the last sample, CPU seconds then)."""

    def advance(self, key: tuple[str, str], cores: float, timestamp: float, window: float,
                started: float | None = None) -> float:  # fmt: skip
        """The counter of ``key`` at ``timestamp``, where the rate was ``cores`` over the
        ``window`` before it. A first sample counts its window, or the time since the container
        ``started`` if shorter; the same sample again changes nothing."""
        last = self._at.get(key)
        if last is None:
            span = window if started is None else max(0.0, min(window, timestamp - started))
            total = cores * span
        elif timestamp > last[0]:
            total = last[1] + cores * (timestamp - last[0])
        else:
            return last[1]
        total = max(total, MIN_CPU_SECONDS, last[1] if last is not None else 0.0)
        self._at[key] = (timestamp, total)
        return total

    def keep(self, uids: Iterable[str]) -> None:
        """Forget the counters of every pod but those of ``uids`` (the pods still here; one the
        provider did not measure this time keeps its counter, which a new start would lower)."""
        wanted = {*uids, NODE_KEY[0]}
        for key in [k for k in self._at if k[0] not in wanted]:
            del self._at[key]


@dataclass(frozen=True)
class Measured:
    """A consumer container's usage, its counter advanced."""

    namespace: str
    pod: str
    container: str
    cpu_seconds: float
    cpu_cores: float
    memory_bytes: int
    timestamp: float


NODE_KEY = ("", "node")


def measure(
    pods: Iterable[RawObject],
    usage: Mapping[str, Mapping[str, ContainerUsage]],
    counters: CpuCounters,
) -> tuple[list[Measured], Measured | None]:
    """Each container of the consumer ``pods`` that the provider measured (``usage``: by
    consumer pod UID, then container name), and the node's total (None: nothing measured).
    Advances ``counters`` and forgets those of pods gone. Pure but for ``counters``."""
    measured: list[Measured] = []
    kept: list[str] = []
    for pod in pods:
        meta = pod["metadata"]
        uid = str(meta.get("uid"))
        kept.append(uid)
        containers = usage.get(uid) or {}
        started = _started(pod)
        for name, u in sorted(containers.items()):
            seconds = counters.advance((uid, name), u.cpu_cores, u.timestamp, u.window, started.get(name))
            measured.append(
                Measured(
                    str(meta.get("namespace")),
                    meta["name"],
                    name,
                    seconds,
                    u.cpu_cores,
                    u.memory_bytes,
                    u.timestamp,
                )
            )
    counters.keep(kept)
    if not measured:
        return measured, None
    at = max(m.timestamp for m in measured)
    cores = sum(m.cpu_cores for m in measured)
    window = max((u.window for c in usage.values() for u in c.values()), default=0.0)
    seconds = counters.advance(NODE_KEY, cores, at, window)
    node = Measured("", "", "", seconds, cores, sum(m.memory_bytes for m in measured), at)
    return measured, node


_start_seconds = functools.lru_cache(maxsize=4096)(unix_seconds)
"""Start times parsed once: a scrape reads every container's, and a node's pods started within a
few thousand seconds (at the API's one-second resolution) share them."""


def _started(pod: RawObject) -> dict[str, float]:
    """Unix start time of each running container of ``pod``. Pure."""
    found = {}
    for cs in (pod.get("status") or {}).get("containerStatuses") or ():
        started = ((cs.get("state") or {}).get("running") or {}).get("startedAt")
        if started:
            found[cs["name"]] = _start_seconds(str(started))
    return found


def label_value(value: str) -> str:
    """``value`` escaped for a label in Prometheus' text format. Pure."""
    if "\\" not in value and '"' not in value and "\n" not in value:
        return value  # names, images, IDs: nearly always
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def label_block(labels: Mapping[str, str]) -> str:
    """What a sample has between its braces, in the order of ``labels``. Pure."""
    return ",".join(f'{k}="{label_value(v)}"' for k, v in labels.items())


def sample_line(name: str, block: str, value: float, timestamp: float | None = None) -> str:
    """One sample in Prometheus' text format, its labels a :func:`label_block` (``timestamp`` in
    Unix seconds, written in ms). A scrape of 10,000 pods writes 30,000 of them: a container's
    block is made once and used for each of its series. Pure."""
    at = f" {int(timestamp * 1000)}" if timestamp is not None else ""
    return f"{name}{{{block}}} {value:.15g}{at}" if block else f"{name} {value:.15g}{at}"


def series_line(name: str, labels: Mapping[str, str], value: float, timestamp: float | None = None) -> str:
    """One sample in Prometheus' text format. Pure."""
    return sample_line(name, label_block(labels), value, timestamp)


CONTAINER_USAGE: list[tuple[str, str, str, Callable[[Measured], float]]] = [
    ("container_cpu_usage_seconds_total", "counter",
     "Cumulative cpu time consumed by the container in core-seconds", lambda m: m.cpu_seconds),
    ("container_memory_working_set_bytes", "gauge",
     "Current working set of the container in bytes", lambda m: m.memory_bytes),
]  # fmt: skip
"""A container's usage series as the kubelet names and describes them."""

POD_USAGE: list[tuple[str, str, str, Callable[[Measured], float]]] = [
    ("pod_cpu_usage_seconds_total", "counter",
     "Cumulative cpu time consumed by the pod in core-seconds", lambda m: m.cpu_seconds),
    ("pod_memory_working_set_bytes", "gauge",
     "Current working set of the pod in bytes", lambda m: m.memory_bytes),
]  # fmt: skip
"""A pod's usage series as the kubelet names and describes them: here its containers' added up
(:func:`pod_total`, as the Summary API's pod figures), the provider measuring containers."""


def resource_metrics(
    pods: Iterable[RawObject], measured: Iterable[Measured], node: Measured | None, scrape_error: bool
) -> str:
    """The kubelet's ``/metrics/resource`` text: start times of the running containers of
    ``pods``, then the usage ``measured``, each pod's (its containers' added up), the node's,
    and whether reading the provider failed. Pure."""
    measured = list(measured)
    blocks: dict[tuple[str, str, str], str] = {}

    def block(namespace: str, pod: str, container: str) -> str:
        found = blocks.get((namespace, pod, container))
        if found is None:
            found = label_block({"container": container, "namespace": namespace, "pod": pod})
            blocks[(namespace, pod, container)] = found
        return found

    lines = [
        "# HELP container_start_time_seconds [STABLE] Start time of the container since unix epoch "
        "in seconds",
        "# TYPE container_start_time_seconds gauge",
    ]
    for pod in pods:
        meta = pod["metadata"]
        for name, started in sorted(_started(pod).items()):
            labels = block(str(meta.get("namespace")), meta["name"], name)
            lines.append(sample_line("container_start_time_seconds", labels, round(started)))
    for name, kind, help_, value in CONTAINER_USAGE if measured else ():
        lines += [f"# HELP {name} [STABLE] {help_}", f"# TYPE {name} {kind}"]
        for m in measured:
            lines.append(sample_line(name, block(m.namespace, m.pod, m.container), value(m), m.timestamp))
    by_pod: dict[tuple[str, str], list[Measured]] = {}
    for m in measured:
        by_pod.setdefault((m.namespace, m.pod), []).append(m)
    totals = [(total, label_block({"namespace": total.namespace, "pod": total.pod}))
              for ms in by_pod.values() if (total := pod_total(ms)) is not None]  # fmt: skip
    for name, kind, help_, value in POD_USAGE if totals else ():
        lines += [f"# HELP {name} [STABLE] {help_}", f"# TYPE {name} {kind}"]
        for p, labels in totals:
            lines.append(sample_line(name, labels, value(p), p.timestamp))
    if node is not None:
        lines += [
            "# HELP node_cpu_usage_seconds_total [STABLE] Cumulative cpu time consumed by the node in "
            "core-seconds",
            "# TYPE node_cpu_usage_seconds_total counter",
            series_line("node_cpu_usage_seconds_total", {}, node.cpu_seconds, node.timestamp),
            "# HELP node_memory_working_set_bytes [STABLE] Current working set of the node in bytes",
            "# TYPE node_memory_working_set_bytes gauge",
            series_line("node_memory_working_set_bytes", {}, node.memory_bytes, node.timestamp),
        ]
    lines += [
        "# HELP resource_scrape_error [STABLE] 1 if there was an error while getting container metrics, "
        "0 otherwise",
        "# TYPE resource_scrape_error gauge",
        f"resource_scrape_error {int(scrape_error)}",
    ]
    return "\n".join(lines) + "\n"


QOS_CGROUPS = {
    "Guaranteed": "/kubepods",
    "Burstable": "/kubepods/burstable",
    "BestEffort": "/kubepods/besteffort",
}
"""Where a kubelet with the cgroupfs driver puts a pod's cgroup, by its QoS class."""

CADVISOR_USAGE: list[tuple[str, str, str, bool, Callable[[Measured], float]]] = [
    ("container_cpu_usage_seconds_total", "counter", "Cumulative cpu time consumed in seconds.",
     True, lambda m: m.cpu_seconds),
    ("container_memory_working_set_bytes", "gauge", "Current working set in bytes.", False,
     lambda m: m.memory_bytes),
]  # fmt: skip
"""A container's usage series as cAdvisor names and describes them, and whether the series has
the label ``cpu="total"``."""


def cadvisor_identity(pod: RawObject, container: str) -> dict[str, str]:
    """The labels cAdvisor (in a kubelet) gives a container of ``pod``, but for ``cpu``: the
    container's name, its cgroup as a kubelet with the cgroupfs driver names it from the pod's
    UID, QoS class and container ID (``id``), its image as its status gives it (else its spec),
    its runtime ID (``name``; empty for a container that has none, as kwok's), the pod's
    namespace and name. Sorted by label name, as cAdvisor writes them. Pure."""
    meta, status, spec = pod["metadata"], pod.get("status") or {}, pod.get("spec") or {}
    kinds = ("containers", "initContainers", "ephemeralContainers")
    found: RawObject = next((cs for kind in kinds for cs in status.get(f"{kind[:-1]}Statuses") or ()
                             if cs.get("name") == container), {})  # fmt: skip
    runtime_id = str(found.get("containerID") or "").partition("://")[2]
    spec_image = next((c.get("image") for kind in kinds for c in spec.get(kind) or ()
                       if c.get("name") == container), None)  # fmt: skip
    cgroup = f"{QOS_CGROUPS.get(str(status.get('qosClass')), '/kubepods/burstable')}/pod{meta.get('uid')}"
    return {
        "container": container,
        "id": f"{cgroup}/{runtime_id}" if runtime_id else cgroup,
        "image": str(found.get("image") or spec_image or ""),
        "name": runtime_id,
        "namespace": str(meta.get("namespace")),
        "pod": str(meta["name"]),
    }


def cadvisor_metrics(pods: Iterable[RawObject], measured: Iterable[Measured], scrape_error: bool) -> str:
    """The kubelet's ``/metrics/cadvisor`` text for ``pods``: each running container's start
    time, the CPU counter and working set the provider measured (none for a container it did
    not: never made up), and whether reading the provider failed. The series and labels that
    Prometheus' kubelet scrape and its usual dashboards and recording rules read
    (``container_cpu_usage_seconds_total{image!=""}``, ``container_memory_working_set_bytes``
    with ``container`` and ``image``); nothing of the node's machine, which has none. Pure."""
    pods = list(pods)
    by_key = {(str(p["metadata"].get("namespace")), p["metadata"]["name"]): p for p in pods}
    measured = [m for m in measured if (m.namespace, m.pod) in by_key]
    blocks: dict[tuple[str, str, str], tuple[str, str]] = {}

    def block(pod: RawObject, container: str, with_cpu: bool) -> str:
        key = (str(pod["metadata"].get("namespace")), pod["metadata"]["name"], container)
        found = blocks.get(key)
        if found is None:
            labels = cadvisor_identity(pod, container)
            head = f'container="{label_value(labels.pop("container"))}"'
            rest = label_block(labels)  # the labels after ``cpu`` in cAdvisor's (sorted) order
            found = blocks[key] = (f"{head},{rest}", f'{head},cpu="total",{rest}')
        return found[with_cpu]

    lines = []
    for name, kind, help_, with_cpu, value in CADVISOR_USAGE:
        lines += [f"# HELP {name} {help_}", f"# TYPE {name} {kind}"]
        for m in measured:
            labels = block(by_key[(m.namespace, m.pod)], m.container, with_cpu)
            lines.append(sample_line(name, labels, value(m), m.timestamp))
    lines += [
        "# HELP container_start_time_seconds Start time of the container since unix epoch in seconds.",
        "# TYPE container_start_time_seconds gauge",
    ]
    for pod in pods:
        for container, started in sorted(_started(pod).items()):
            lines.append(sample_line("container_start_time_seconds", block(pod, container, False), started))
    lines += [
        "# HELP container_scrape_error 1 if there was an error while getting container metrics, 0 otherwise",
        "# TYPE container_scrape_error gauge",
        f"container_scrape_error {int(scrape_error)}",
    ]
    return "\n".join(lines) + "\n"


def summary_usage(m: Measured) -> dict[str, Any]:
    """The Summary API's ``cpu`` and ``memory`` of a container (or a pod, or the node). Pure."""
    at = rfc3339(m.timestamp)
    return {
        "cpu": {
            "time": at,
            "usageNanoCores": round(m.cpu_cores * 1e9),
            "usageCoreNanoSeconds": round(m.cpu_seconds * 1e9),
        },
        "memory": {"time": at, "workingSetBytes": m.memory_bytes},
    }


def pod_total(measured: Iterable[Measured]) -> Measured | None:
    """A pod's containers added up (None: none measured). Pure."""
    ms = list(measured)
    if not ms:
        return None
    return Measured(ms[0].namespace, ms[0].pod, "", sum(m.cpu_seconds for m in ms),
                    sum(m.cpu_cores for m in ms), sum(m.memory_bytes for m in ms),
                    max(m.timestamp for m in ms))  # fmt: skip
