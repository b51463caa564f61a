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

import datetime
import functools
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Generic, NamedTuple, TypeVar

from kube.objects import RawObject
from kube.quantities import parse_quantity
from kube.times import rfc3339, unix_seconds

MIN_CPU_SECONDS = 1e-9
"""The least a counter starts at. metrics-server drops a container whose counter is 0 (never so
on a kubelet, where starting a process costs CPU); a twin measured idle in its first window
would be dropped with it."""


class ContainerUsage(NamedTuple):
    """One container's usage as the provider's metrics API gave it. A tuple: a scrape of 10,000
    pods makes 10,000 of them."""

    cpu_cores: float
    memory_bytes: int
    timestamp: float
    """Unix seconds: the end of the window the CPU rate is averaged over."""
    window: float
    """Seconds the CPU rate is averaged over."""


@functools.lru_cache(maxsize=256)
def _seconds(duration: str | None) -> float:
    """Seconds of a Go duration as metrics-server writes a window (``15.027s``, ``1m0s``): the
    same few on every PodMetrics, parsed once. Pure."""
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


_PLAIN_QUANTITY = re.compile(r"([0-9]{1,15})([numkMG]|[KMG]i|)")
"""What metrics-server writes (``123456789n``, ``1048576Ki``): an integer and a suffix. Anything
else goes through :func:`kube.quantities.parse_quantity`."""
_PER_CORE = {"n": 1e9, "u": 1e6, "m": 1e3, "": 1.0}
"""Divisors that make cores of a plain CPU quantity: a division by an exact power of ten is
rounded once, to the float nearest the exact value, as ``float(parse_quantity(...))`` is."""
_BYTES = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30}


def _cores(quantity: str) -> float:
    """CPU cores of a quantity. Pure."""
    plain = _PLAIN_QUANTITY.fullmatch(quantity)
    if plain is not None and (per := _PER_CORE.get(plain[2])) is not None:
        return int(plain[1]) / per
    return float(parse_quantity(quantity))


def _bytes(quantity: str) -> int:
    """Bytes of a memory quantity. Pure."""
    plain = _PLAIN_QUANTITY.fullmatch(quantity)
    if plain is not None and (times := _BYTES.get(plain[2])) is not None:
        return int(plain[1]) * times
    return int(parse_quantity(quantity))


def container_usage(pod_metrics: RawObject) -> dict[str, ContainerUsage]:
    """A PodMetrics object's containers, by name. Pure."""
    timestamp = _unix(str(pod_metrics.get("timestamp")))
    window = _seconds(pod_metrics.get("window"))
    found = {}
    for container in pod_metrics.get("containers") or ():
        usage = container.get("usage") or {}
        if "cpu" not in usage or "memory" not in usage:
            continue
        found[container["name"]] = ContainerUsage(
            _cores(usage["cpu"]), _bytes(usage["memory"]), timestamp, window
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

    def __contains__(self, key: tuple[str, str]) -> bool:
        return key in self._at

    def keep(self, uids: Iterable[str]) -> None:
        """Forget the counters of every pod but those of ``uids`` (the pods still here; one the
        provider did not measure this time keeps its counter, which a new start would lower)."""
        wanted = {*uids, NODE_KEY[0]}
        for key in [k for k in self._at if k[0] not in wanted]:
            del self._at[key]


class Measured(NamedTuple):
    """A consumer container's usage, its counter advanced (a tuple: a scrape makes one per
    container)."""

    namespace: str
    pod: str
    container: str
    cpu_seconds: float
    cpu_cores: float
    memory_bytes: int
    timestamp: float


NODE_KEY = ("", "node")


class PodRef(NamedTuple):
    """A consumer pod as a scrape first needs it: its namespace, name, UID and resourceVersion,
    which the virtual kubelet's pod store keeps without decoding the pod; ``load`` decodes it
    (None: gone since). A scrape loads only a pod whose texts must be made again or whose
    container is measured for the first time: one of 10,000 pods that changed nothing loads
    none, where decoding each from the compact store took 16 µs a pod."""

    namespace: str
    name: str
    uid: str | None
    version: str | None
    load: Callable[[], RawObject | None]

    @classmethod
    def of(cls, pod: RawObject) -> PodRef:
        """A pod already decoded."""
        meta = pod["metadata"]
        return cls(str(meta.get("namespace")), meta["name"], meta.get("uid"), meta.get("resourceVersion"),
                   lambda: pod)  # fmt: skip


PodLike = RawObject | PodRef
"""A pod as the builders take it: decoded, or to be decoded if needed."""


def pod_refs(pods: Iterable[PodLike]) -> list[PodRef]:
    """``pods`` as references. Pure."""
    return [p if isinstance(p, PodRef) else PodRef.of(p) for p in pods]


def measure(
    pods: Iterable[PodLike],
    usage: Mapping[str, Mapping[str, ContainerUsage]],
    counters: CpuCounters,
) -> tuple[list[Measured], Measured | None]:
    """Each container of the consumer ``pods`` that the provider measured (``usage``: by
    consumer pod UID, then container name), and the node's total (None: nothing measured).
    Advances ``counters`` and forgets those of pods gone. A pod is loaded only for a
    container's first sample (its start time). Pure but for ``counters``."""
    measured: list[Measured] = []
    kept: list[str] = []
    for ref in pod_refs(pods):
        uid = str(ref.uid)
        kept.append(uid)
        containers = usage.get(uid)
        if not containers:
            continue
        started: dict[str, float] | None = None  # read for a container's first sample only
        for container, u in sorted(containers.items()) if len(containers) > 1 else containers.items():
            key = (uid, container)
            if started is None and key not in counters:
                pod = ref.load()
                started = _started(pod) if pod is not None else {}
            since = started.get(container) if started is not None else None
            seconds = counters.advance(key, u.cpu_cores, u.timestamp, u.window, since)
            measured.append(
                Measured(
                    ref.namespace, ref.name, container, seconds, u.cpu_cores, u.memory_bytes, u.timestamp
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


_unix = functools.lru_cache(maxsize=4096)(unix_seconds)
"""Times parsed once: a scrape reads every container's start and every PodMetrics' timestamp, and
a node's pods started within a few thousand seconds (at the API's one-second resolution) and
were measured at the same few instants."""


def _started(pod: RawObject) -> dict[str, float]:
    """Unix start time of each running container of ``pod``. Pure."""
    found = {}
    for cs in (pod.get("status") or {}).get("containerStatuses") or ():
        started = ((cs.get("state") or {}).get("running") or {}).get("startedAt")
        if started:
            found[cs["name"]] = _unix(str(started))
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


CONTAINER_USAGE: list[tuple[str, str, str, int]] = [
    ("container_cpu_usage_seconds_total", "counter",
     "Cumulative cpu time consumed by the container in core-seconds", 0),
    ("container_memory_working_set_bytes", "gauge", "Current working set of the container in bytes", 1),
]  # fmt: skip
"""A container's usage series as the kubelet names and describes them, and which of its
:func:`usage_values` each gives."""

POD_USAGE: list[tuple[str, str, str, int]] = [
    ("pod_cpu_usage_seconds_total", "counter", "Cumulative cpu time consumed by the pod in core-seconds", 0),
    ("pod_memory_working_set_bytes", "gauge", "Current working set of the pod in bytes", 1),
]  # fmt: skip
"""A pod's usage series as the kubelet names and describes them: here its containers' added up
(:func:`pod_total`, as the Summary API's pod figures), the provider measuring containers."""


def usage_values(m: Measured) -> tuple[str, str]:
    """The CPU counter and the working set of ``m``, written as samples' values. Pure."""
    return f"{m.cpu_seconds:.15g}", f"{m.memory_bytes:.15g}"


T = TypeVar("T")


class PodTexts(Generic[T]):
    """What a text writes of each pod that changes only when the pod does (its label blocks and
    start times), made by ``make`` once per version of the pod (its UID and resourceVersion)
    and kept for the next scrape; those of pods a scrape no longer lists are dropped. A scrape
    of 10,000 pods, none of which changed, makes none. A pod without a UID or resourceVersion
    gets its texts made each time.

    A tuple of :class:`PodRef` given again (the same object), as the kubelet API gives the
    node's pods while its stores do not change, is answered with the last scrape's answer: its
    refs hold the same UIDs and versions, and the stores the same pods."""

    def __init__(self, make: Callable[[RawObject], T]) -> None:
        self._make = make
        self._held: dict[str, tuple[str | None, T]] = {}
        self._last: tuple[tuple[PodRef, ...], dict[tuple[str, str], tuple[PodRef, T]]] | None = None

    def __len__(self) -> int:
        """How many pods' texts are kept."""
        return len(self._held)

    def scrape(self, pods: Iterable[PodLike]) -> dict[tuple[str, str], tuple[PodRef, T]]:
        """Each of ``pods`` and its texts, by namespace and name (a pod gone before it could be
        loaded is left out). Not to be changed: it may be given again."""
        last = self._last
        if last is not None and last[0] is pods:
            return last[1]
        held: dict[str, tuple[str | None, T]] = self._held
        kept: dict[str, tuple[str | None, T]] = {}
        found = {}
        for ref in pod_refs(pods):
            uid, version = ref.uid, ref.version
            texts = held.get(uid) if uid and version else None
            if texts is None or texts[0] != version:
                if (pod := ref.load()) is None:
                    continue
                texts = (version, self._make(pod))
            if uid and version:
                kept[uid] = texts
            found[(ref.namespace, ref.name)] = (ref, texts[1])
        self._held = kept
        self._last = (pods, found) if isinstance(pods, tuple) else None
        return found


class _Stamps(dict[float, int]):
    """Sample timestamps in ms, each worked out once: a scrape's samples share a few (the
    provider measures a node's pods at once)."""

    def __missing__(self, timestamp: float) -> int:
        self[timestamp] = found = int(timestamp * 1000)
        return found


class ResourceTexts(NamedTuple):
    """What ``/metrics/resource`` writes of a pod that changes only with the pod."""

    starts: list[str]
    """The start-time lines of its running containers, by container name."""
    containers: dict[str, str]
    """Each running container's label block."""
    pod: str
    """The pod's label block."""


def _resource_block(container: str, namespace: str, pod: str) -> str:
    """A container's labels in ``/metrics/resource``. Pure."""
    return (f'container="{label_value(container)}",namespace="{label_value(namespace)}",'
            f'pod="{label_value(pod)}"')  # fmt: skip


def _pod_block(namespace: str, pod: str) -> str:
    """A pod's labels in ``/metrics/resource``. Pure."""
    return f'namespace="{label_value(namespace)}",pod="{label_value(pod)}"'


def resource_texts(pod: RawObject) -> ResourceTexts:
    """What ``/metrics/resource`` writes of ``pod`` but its usage. Pure."""
    meta = pod["metadata"]
    namespace, name = str(meta.get("namespace")), meta["name"]
    containers, starts = {}, []
    for container, started in sorted(_started(pod).items()):
        block = containers[container] = _resource_block(container, namespace, name)
        starts.append(f"container_start_time_seconds{{{block}}} {round(started)}")
    return ResourceTexts(starts, containers, _pod_block(namespace, name))


def resource_metrics(
    pods: Iterable[PodLike],
    measured: Iterable[Measured],
    node: Measured | None,
    scrape_error: bool,
    texts: PodTexts[ResourceTexts] | None = None,
) -> str:
    """The kubelet's ``/metrics/resource`` text: start times of the running containers of
    ``pods``, then the usage ``measured``, each pod's (its containers' added up), the node's,
    and whether reading the provider failed. Pure but for ``texts``, the pods' texts kept from
    the last scrape (none: all made anew).

    Written for 10,000 pods every 15 s (50,000 lines): what changes only with a pod is made
    once for it, each timestamp once, and each series is one comprehension."""
    measured = list(measured)
    by_key = (texts if texts is not None else PodTexts(resource_texts)).scrape(pods)
    stamps = _Stamps()
    lines = [
        "# HELP container_start_time_seconds [STABLE] Start time of the container since unix epoch "
        "in seconds",
        "# TYPE container_start_time_seconds gauge",
    ]
    for _, pod_texts in by_key.values():
        lines += pod_texts.starts
    rows = []  # a container's label block, its values written, its timestamp
    by_pod: dict[tuple[str, str], list[tuple[Measured, tuple[str, str]]]] = {}
    for m in measured:
        key = (m.namespace, m.pod)
        found = by_key.get(key)
        block = found[1].containers.get(m.container) if found is not None else None
        values = usage_values(m)
        rows.append((block or _resource_block(m.container, m.namespace, m.pod), values, stamps[m.timestamp]))
        by_pod.setdefault(key, []).append((m, values))
    for name, kind, help_, i in CONTAINER_USAGE if rows else ():
        lines += [f"# HELP {name} [STABLE] {help_}", f"# TYPE {name} {kind}"]
        lines += [f"{name}{{{block}}} {values[i]} {at}" for block, values, at in rows]
    totals = []
    for (namespace, name), ms in by_pod.items():
        total: Measured | None = ms[0][0]
        values = ms[0][1]  # one container: the pod's figures are its, already written
        if len(ms) > 1 and (total := pod_total(m for m, _ in ms)) is not None:
            values = usage_values(total)
        assert total is not None
        found = by_key.get((namespace, name))
        block = found[1].pod if found is not None else _pod_block(namespace, name)
        totals.append((block, values, stamps[total.timestamp]))
    for name, kind, help_, i in POD_USAGE if totals else ():
        lines += [f"# HELP {name} [STABLE] {help_}", f"# TYPE {name} {kind}"]
        lines += [f"{name}{{{block}}} {values[i]} {at}" for block, values, at in totals]
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


def cadvisor_blocks(pod: RawObject, container: str) -> tuple[str, str]:
    """A container's cAdvisor label block, without and with ``cpu="total"`` (which sorts
    between ``container`` and ``id``). Pure."""
    labels = cadvisor_identity(pod, container)
    head = f'container="{label_value(labels.pop("container"))}"'
    rest = label_block(labels)
    return f"{head},{rest}", f'{head},cpu="total",{rest}'


class CadvisorTexts(NamedTuple):
    """What ``/metrics/cadvisor`` writes of a pod that changes only with the pod."""

    starts: list[str]
    """The start-time lines of its running containers, by container name."""
    containers: dict[str, tuple[str, str]]
    """Each running container's label blocks (:func:`cadvisor_blocks`)."""


def cadvisor_texts(pod: RawObject) -> CadvisorTexts:
    """What ``/metrics/cadvisor`` writes of ``pod`` but its usage. Pure."""
    containers, starts = {}, []
    for container, started in sorted(_started(pod).items()):
        blocks = containers[container] = cadvisor_blocks(pod, container)
        starts.append(f"container_start_time_seconds{{{blocks[0]}}} {started:.15g}")
    return CadvisorTexts(starts, containers)


def cadvisor_metrics(
    pods: Iterable[PodLike],
    measured: Iterable[Measured],
    scrape_error: bool,
    texts: PodTexts[CadvisorTexts] | None = None,
) -> str:
    """The kubelet's ``/metrics/cadvisor`` text for ``pods``: each running container's start
    time, the CPU counter and working set the provider measured (none for a container it did
    not: never made up), and whether reading the provider failed. The series and labels that
    Prometheus' kubelet scrape and its usual dashboards and recording rules read
    (``container_cpu_usage_seconds_total{image!=""}``, ``container_memory_working_set_bytes``
    with ``container`` and ``image``); nothing of the node's machine, which has none. Pure but
    for ``texts``, the pods' texts kept from the last scrape (none: all made anew)."""
    by_key = (texts if texts is not None else PodTexts(cadvisor_texts)).scrape(pods)
    stamps = _Stamps()
    tails = []
    for m in measured:
        if (found := by_key.get((m.namespace, m.pod))) is None:
            continue  # not a pod of this node's
        ref, pod_texts = found
        blocks = pod_texts.containers.get(m.container)
        if blocks is None:  # measured, not running (as the pod was when its texts were made)
            if (pod := ref.load()) is None:
                continue
            blocks = cadvisor_blocks(pod, m.container)
        tails.append((m, blocks, stamps[m.timestamp]))
    lines = []
    for name, kind, help_, with_cpu, value in CADVISOR_USAGE:
        lines += [f"# HELP {name} {help_}", f"# TYPE {name} {kind}"]
        lines += [f"{name}{{{blocks[with_cpu]}}} {value(m):.15g} {at}" for m, blocks, at in tails]
    lines += [
        "# HELP container_start_time_seconds Start time of the container since unix epoch in seconds.",
        "# TYPE container_start_time_seconds gauge",
    ]
    for _, pod_texts in by_key.values():
        lines += pod_texts.starts
    lines += [
        "# HELP container_scrape_error 1 if there was an error while getting container metrics, 0 otherwise",
        "# TYPE container_scrape_error gauge",
        f"container_scrape_error {int(scrape_error)}",
    ]
    return "\n".join(lines) + "\n"


_rfc3339 = functools.lru_cache(maxsize=256)(rfc3339)
"""A sample's time as the API writes it, worked out once: a scrape's samples share a few."""


def summary_usage(m: Measured) -> dict[str, Any]:
    """The Summary API's ``cpu`` and ``memory`` of a container (or a pod, or the node). Pure."""
    at = _rfc3339(m.timestamp)
    return {
        "cpu": {
            "time": at,
            "usageNanoCores": round(m.cpu_cores * 1e9),
            "usageCoreNanoSeconds": round(m.cpu_seconds * 1e9),
        },
        "memory": {"time": at, "workingSetBytes": m.memory_bytes},
    }


class SummaryTexts(NamedTuple):
    """What the Summary API says of a pod that changes only with the pod (never changed once
    made: a scrape copies what it adds usage to)."""

    head: RawObject
    """Its ``podRef`` and ``startTime``."""
    containers: list[RawObject]
    """Each container's ``name`` and ``startTime`` (while running), in its statuses' order."""


def summary_texts(pod: RawObject) -> SummaryTexts:
    """What the Summary API says of ``pod`` but its usage. Pure."""
    meta, status = pod["metadata"], pod.get("status") or {}
    head: RawObject = {
        "podRef": {"name": meta["name"], "namespace": meta.get("namespace"), "uid": meta.get("uid")}
    }
    if status.get("startTime"):
        head["startTime"] = status["startTime"]
    containers = []
    for cs in status.get("containerStatuses") or ():
        started = ((cs.get("state") or {}).get("running") or {}).get("startedAt")
        containers.append({"name": cs["name"], **({"startTime": started} if started else {})})
    return SummaryTexts(head, containers)


def stats_summary(
    node_name: str,
    started: datetime.datetime | float,
    pods: Iterable[PodLike],
    measured: Iterable[Measured],
    node: Measured | None,
    texts: PodTexts[SummaryTexts] | None = None,
) -> RawObject:
    """The Summary API (``/stats/summary``) of the node ``node_name`` (its process ``started``)
    and its ``pods``: identities and start times, and CPU and memory where the
    provider measured a container (``measured``), a pod's its containers' added up, the node's
    (``node``). Pure but for ``texts``, the pods' parts kept from the last scrape (none: all
    made anew); OpenTelemetry's kubeletstats receiver reads this every 10 s by default."""
    by_container = {(m.namespace, m.pod, m.container): m for m in measured}
    pod_stats = []
    for (namespace, name), (_, found) in (
        (texts if texts is not None else PodTexts(summary_texts)).scrape(pods).items()
    ):
        containers, ours = [], []
        usage: dict[str, Any] = {}
        for entry in found.containers:
            if (m := by_container.get((namespace, name, entry["name"]))) is not None:
                usage = summary_usage(m)
                entry = {**entry, **usage}
                ours.append(m)
            containers.append(entry)
        stats = {**found.head, "containers": containers}
        if len(ours) > 1 and (total := pod_total(ours)) is not None:
            usage = summary_usage(total)
        stats.update(usage)  # one container measured: the pod's figures are its
        pod_stats.append(stats)
    node_stats: RawObject = {"nodeName": node_name, "startTime": rfc3339(started), "systemContainers": []}
    if node is not None:
        node_stats.update(summary_usage(node))
    return {"node": node_stats, "pods": pod_stats}


def pod_total(measured: Iterable[Measured]) -> Measured | None:
    """A pod's containers added up (None: none measured). Pure."""
    ms = list(measured)
    if not ms:
        return None
    return Measured(ms[0].namespace, ms[0].pod, "", sum(m.cpu_seconds for m in ms),
                    sum(m.cpu_cores for m in ms), sum(m.memory_bytes for m in ms),
                    max(m.timestamp for m in ms))  # fmt: skip
