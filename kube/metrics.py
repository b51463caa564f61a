"""gpuferry's Prometheus metrics: one registry, ``gpuferry_`` names, idempotent constructors.

Every component registers its families in :data:`REGISTRY` through :func:`counter`,
:func:`gauge` and :func:`histogram`. Asking twice for the same name returns the family made the
first time (modules are imported once, but tests and several queues in one process ask again);
asking for it with a different type or labels is a programming error and raises ``ValueError``.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.registry import Collector

__all__ = ["PREFIX", "REGISTRY", "counter", "gauge", "histogram", "render", "track_gc_time"]

PREFIX = "gpuferry_"
REGISTRY = CollectorRegistry(auto_describe=True)
"""The registry every gpuferry metric lives in (served by each component's /metrics), with the
process' own CPU, memory and file descriptors (``process_*``, as every Go component of
Kubernetes serves them: dashboards of a kubelet read its ``process_resident_memory_bytes``)."""
ProcessCollector(registry=REGISTRY)

DURATION_BUCKETS: tuple[float, ...] = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)

_M = TypeVar("_M", bound=MetricWrapperBase)
_families: dict[str, tuple[MetricWrapperBase, tuple[str, ...]]] = {}
_lock = threading.Lock()


def _name(name: str) -> str:
    return name if name.startswith(PREFIX) else PREFIX + name


def _get_or_make(
    cls: type[_M], name: str, documentation: str, labelnames: Sequence[str], **kwargs: object
) -> _M:
    full = _name(name)
    labels = tuple(labelnames)
    with _lock:
        found = _families.get(full)
        if found is not None:
            family, known_labels = found
            if type(family) is not cls or known_labels != labels:
                raise ValueError(
                    f"metric {full} is already a {type(family).__name__} with labels {known_labels}; "
                    f"asked for a {cls.__name__} with labels {labels}"
                )
            assert isinstance(family, cls)
            return family
        family = cls(full, documentation, labelnames=labels, registry=REGISTRY, **kwargs)  # type: ignore[arg-type]
        _families[full] = (family, labels)
        return family


def counter(name: str, documentation: str, labelnames: Sequence[str] = ()) -> Counter:
    """A counter named ``gpuferry_<name>`` (exposed with a ``_total`` suffix)."""
    return _get_or_make(Counter, name, documentation, labelnames)


def gauge(name: str, documentation: str, labelnames: Sequence[str] = ()) -> Gauge:
    """A gauge named ``gpuferry_<name>``."""
    return _get_or_make(Gauge, name, documentation, labelnames)


def histogram(
    name: str, documentation: str, labelnames: Sequence[str] = (), buckets: Sequence[float] = DURATION_BUCKETS
) -> Histogram:
    """A histogram named ``gpuferry_<name>``; the default buckets suit durations in seconds."""
    return _get_or_make(Histogram, name, documentation, labelnames, buckets=tuple(buckets))


def render() -> bytes:
    """The text exposition of :data:`REGISTRY`, for a ``/metrics`` handler."""
    return generate_latest(REGISTRY)


class _GcTime(Collector):
    """The CPU time of Python's garbage collections, by generation: what holding many objects
    costs a process (issue 15: 4.1 % of the virtual kubelet's CPU in a burst of 10,000 pods with
    Python's thresholds), with the thresholds in force and the objects frozen out of collections
    (:func:`kube.memory.tune_gc`).

    The gc callback only adds to plain floats (no lock: a collection may start inside code that
    holds one); the counters are read from them at each scrape."""

    def __init__(self) -> None:
        self.seconds = [0.0, 0.0, 0.0]
        self.collections = [0, 0, 0]
        self._started = 0.0

    def callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.process_time()
            return
        generation = int(info.get("generation", 2))
        self.seconds[generation] += time.process_time() - self._started
        self.collections[generation] += 1

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        seconds = CounterMetricFamily(
            PREFIX + "gc_seconds",
            "CPU seconds of the process spent in Python's garbage collector, by generation.",
            labels=["generation"],
        )
        collections = CounterMetricFamily(
            PREFIX + "gc_collections", "Collections of Python's garbage collector, by generation.",
            labels=["generation"],
        )  # fmt: skip
        for generation in range(3):
            seconds.add_metric([str(generation)], self.seconds[generation])
            collections.add_metric([str(generation)], self.collections[generation])
        yield seconds
        yield collections
        thresholds = GaugeMetricFamily(
            PREFIX + "gc_threshold",
            "The garbage collector's threshold per generation (gc.get_threshold()).",
            labels=["generation"],
        )
        for generation, threshold in enumerate(gc.get_threshold()):
            thresholds.add_metric([str(generation)], threshold)
        yield thresholds
        yield GaugeMetricFamily(
            PREFIX + "gc_frozen_objects",
            "Objects left out of every collection (gc.freeze()).",
            value=gc.get_freeze_count(),
        )


_gc_time: _GcTime | None = None


def track_gc_time() -> None:
    """Count the garbage collector's CPU time in :data:`REGISTRY` (``gpuferry_gc_seconds_total``
    and ``gpuferry_gc_collections_total``, by generation), from now on. Idempotent."""
    global _gc_time
    with _lock:
        if _gc_time is not None:
            return
        _gc_time = _GcTime()
        REGISTRY.register(_gc_time)
        gc.callbacks.append(_gc_time.callback)
