"""Object loggers, JSON log lines, and the shared metrics registry."""

from __future__ import annotations

import gc
import io
import logging
from collections.abc import Iterator

import orjson
import pytest
from prometheus_client import Counter, Gauge

from kube import metrics
from kube.logs import object_logger, setup_logging
from kube.objects import ObjectKey
from kube.settings import LoggingSettings


@pytest.fixture
def restore_root() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def test_object_logger_prefixes_and_tags(caplog: pytest.LogCaptureFixture) -> None:
    log = object_logger(logging.getLogger("vk.pods"), "Pod", ObjectKey("team-a", "train"))
    log.warning("twin %s missing", "train-x", extra={"reason": "Deleted"})
    (record,) = caplog.records
    assert record.getMessage() == "Pod team-a/train: twin train-x missing"
    assert record.object_kind == "Pod" and record.object_key == "team-a/train"  # type: ignore[attr-defined]
    assert record.reason == "Deleted"  # type: ignore[attr-defined]


def test_json_lines(restore_root: None) -> None:
    out = io.StringIO()
    handler = setup_logging(LoggingSettings(format="json", level="debug"), stream=out)
    assert logging.getLogger().level == logging.DEBUG
    object_logger(logging.getLogger("vk.node"), "Node", ObjectKey(None, "gpuferry-p1")).info("ready")
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        logging.getLogger("vk.node").exception("failed")
    first, second = (orjson.loads(line) for line in out.getvalue().splitlines())
    assert first["message"] == "Node gpuferry-p1: ready"
    assert (first["kind"], first["key"], first["level"], first["logger"]) == (
        "Node",
        "gpuferry-p1",
        "INFO",
        "vk.node",
    )
    assert "RuntimeError: boom" in second["exc"]
    # set up again: the previous handler is replaced, not doubled
    again = setup_logging(LoggingSettings(), stream=io.StringIO())
    assert handler not in logging.getLogger().handlers and again in logging.getLogger().handlers


def test_text_lines(restore_root: None) -> None:
    out = io.StringIO()
    setup_logging(LoggingSettings(format="text"), stream=out)
    logging.getLogger("peering").info("peered with %s", "provider-1")
    assert out.getvalue().rstrip().endswith("INFO    peering: peered with provider-1")


def test_metrics_are_prefixed_shared_and_guarded() -> None:
    adds = metrics.counter("test_things_added", "Things added.", ["queue"])
    assert isinstance(adds, Counter)
    assert metrics.counter("gpuferry_test_things_added", "Again.", ["queue"]) is adds
    adds.labels("q").inc(3)
    assert metrics.REGISTRY.get_sample_value("gpuferry_test_things_added_total", {"queue": "q"}) == 3
    with pytest.raises(ValueError, match="already a Counter"):
        metrics.gauge("test_things_added", "Clash.", ["queue"])
    with pytest.raises(ValueError, match="labels"):
        metrics.counter("test_things_added", "Other labels.", ["queue", "kind"])
    depth = metrics.gauge("test_depth", "Depth.")
    assert isinstance(depth, Gauge)
    depth.set(4)
    assert b"gpuferry_test_depth 4.0" in metrics.render()
    metrics.histogram("test_seconds", "Durations.").observe(0.2)
    assert metrics.REGISTRY.get_sample_value("gpuferry_test_seconds_count") == 1


def test_queue_metrics_are_registered() -> None:
    import kube.queueing  # noqa: F401  (registers its families on import)

    text = metrics.render().decode()
    for family in (
        "gpuferry_queue_depth",
        "gpuferry_queue_adds_total",
        "gpuferry_queue_retries_total",
        "gpuferry_queue_work_duration_seconds",
    ):
        assert f"# TYPE {family.removesuffix('_total')}" in text


def test_garbage_collections_are_counted_with_their_cpu_time() -> None:
    metrics.track_gc_time()
    metrics.track_gc_time()  # once only: a second collector would clash in the registry

    def sample(name: str) -> float:
        value = metrics.REGISTRY.get_sample_value(name, {"generation": "2"})
        assert value is not None, name
        return value

    held = [[i] for i in range(200_000)]  # something for the collection to go through
    gc.disable()  # no collection of its own in between: the one asked for is counted
    try:
        collections, seconds = sample("gpuferry_gc_collections_total"), sample("gpuferry_gc_seconds_total")
        gc.collect()
        assert sample("gpuferry_gc_collections_total") == collections + 1
        assert sample("gpuferry_gc_seconds_total") > seconds
    finally:
        gc.enable()
    assert len(held) == 200_000


def test_the_collectors_thresholds_and_frozen_objects_are_served() -> None:
    metrics.track_gc_time()
    before = gc.get_threshold()
    try:
        gc.set_threshold(1234, 11, 12)
        gc.freeze()
        served = {
            g: metrics.REGISTRY.get_sample_value("gpuferry_gc_threshold", {"generation": g}) for g in "012"
        }
        assert served == {"0": 1234, "1": 11, "2": 12}
        assert metrics.REGISTRY.get_sample_value("gpuferry_gc_frozen_objects") == gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
    assert metrics.REGISTRY.get_sample_value("gpuferry_gc_frozen_objects") == 0
