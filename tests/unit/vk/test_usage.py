"""The provider's PodMetrics told as a kubelet's resource metrics: the rate that metrics-server
computes from two scrapes is the rate the provider measured."""

from __future__ import annotations

import copy
import random
import re

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kube.objects import RawObject
from kube.quantities import parse_quantity
from kube.times import unix_seconds
from vk.forge.usage import (
    MIN_CPU_SECONDS,
    ContainerUsage,
    CpuCounters,
    PodTexts,
    _bytes,
    _cores,
    _seconds,
    cadvisor_identity,
    cadvisor_metrics,
    cadvisor_texts,
    container_usage,
    measure,
    resource_metrics,
    resource_texts,
    stats_summary,
    summary_texts,
    summary_usage,
)

T0 = unix_seconds("2026-11-28T10:00:00Z")


def pod_metrics(name: str, at: str, window: str, **containers: tuple[str, str]) -> RawObject:
    """A PodMetrics as the provider's metrics-server lists it."""
    return {
        "kind": "PodMetrics",
        "apiVersion": "metrics.k8s.io/v1beta1",
        "metadata": {"name": name, "namespace": "ml-ml-eu", "creationTimestamp": at},
        "timestamp": at,
        "window": window,
        "containers": [
            {"name": c, "usage": {"cpu": cpu, "memory": mem}} for c, (cpu, mem) in containers.items()
        ],
    }


def consumer_pod(name: str, uid: str, started: str | None = "2026-11-28T09:59:00Z") -> RawObject:
    running = {"running": {"startedAt": started}} if started else {"waiting": {}}
    return {
        "metadata": {"name": name, "namespace": "ml", "uid": uid},
        "status": {"containerStatuses": [{"name": "main", "state": running}]},
    }


def series(text: str) -> dict[str, tuple[float, int | None]]:
    """name{labels} -> (value, timestamp in ms) of a Prometheus text exposition."""
    found = {}
    for line in text.splitlines():
        if line.startswith("#") or not line:
            continue
        m = re.fullmatch(r"(\S+?(?:\{[^}]*\})?) (\S+)(?: (\d+))?", line)
        assert m, line
        found[m[1]] = (float(m[2]), int(m[3]) if m[3] else None)
    return found


@pytest.mark.parametrize(
    ("duration", "seconds"),
    [("15.027s", 15.027), ("1m0s", 60.0), ("1m30.5s", 90.5), ("250ms", 0.25), ("", 0.0), ("10s", 10.0)],
)
def test_go_durations(duration: str, seconds: float) -> None:
    assert _seconds(duration) == pytest.approx(seconds)


def test_pod_metrics_read_as_rates_and_bytes() -> None:
    got = container_usage(
        pod_metrics(
            "trainer", "2026-11-28T10:00:00Z", "15.5s", main=("250m", "64Mi"), side=("1234567n", "100Ki")
        )
    )
    assert got == {
        "main": ContainerUsage(0.25, 64 * 2**20, T0, 15.5),
        "side": ContainerUsage(0.001234567, 102400, T0, 15.5),
    }


def test_the_counter_integrates_the_providers_rates() -> None:
    c = CpuCounters()
    key = ("uid", "main")
    # first sample: its window, or the time since the container started where shorter
    assert c.advance(key, 0.5, T0, 15.0) == pytest.approx(7.5)
    assert c.advance(("young", "main"), 0.5, T0, 15.0, started=T0 - 4) == pytest.approx(2.0)
    # the same sample again (scraped twice before the provider measured anew): unchanged
    assert c.advance(key, 0.5, T0, 15.0) == pytest.approx(7.5)
    # then the rate times the time since the last sample
    assert c.advance(key, 2.0, T0 + 15, 15.0) == pytest.approx(37.5)
    # idle is not nothing: metrics-server drops a container whose counter is 0
    assert c.advance(("idle", "main"), 0.0, T0, 15.0) == MIN_CPU_SECONDS
    # forgotten when its pod is gone, kept while it is here
    c.keep(["uid"])
    assert c.advance(("young", "main"), 1.0, T0 + 15, 15.0) == pytest.approx(15.0)
    assert c.advance(key, 2.0, T0 + 30, 15.0) == pytest.approx(67.5)


def test_two_scrapes_give_metrics_server_the_providers_rate() -> None:
    counters = CpuCounters()
    pods = [consumer_pod("trainer", "u1"), consumer_pod("other", "u2")]
    scrapes = []
    for at, cpu in (("2026-11-28T10:00:00Z", "500m"), ("2026-11-28T10:00:15Z", "1500m")):
        usage = {"u1": container_usage(pod_metrics("trainer", at, "15s", main=(cpu, "2Gi")))}
        measured, node = measure(pods, usage, counters)
        scrapes.append(series(resource_metrics(pods, measured, node, scrape_error=False)))
    cpu_key = 'container_cpu_usage_seconds_total{container="main",namespace="ml",pod="trainer"}'
    (c1, t1), (c2, t2) = scrapes[0][cpu_key], scrapes[1][cpu_key]
    assert t1 is not None and t2 is not None and t2 - t1 == 15000
    assert (c2 - c1) / ((t2 - t1) / 1000) == pytest.approx(1.5)  # what metrics-server computes
    mem = scrapes[1]['container_memory_working_set_bytes{container="main",namespace="ml",pod="trainer"}']
    assert mem == (2 * 2**30, t2)
    # the node: the sum of its pods, a counter that only grows
    (n1, _), (n2, nt2) = (
        scrapes[0]["node_cpu_usage_seconds_total"],
        scrapes[1]["node_cpu_usage_seconds_total"],
    )
    assert (n2 - n1) / 15 == pytest.approx(1.5) and nt2 == t2
    assert scrapes[1]["node_memory_working_set_bytes"][0] == 2 * 2**30
    # a pod the provider did not measure gets a start time and no usage, never a made-up one
    assert 'container_start_time_seconds{container="main",namespace="ml",pod="other"}' in scrapes[1]
    assert not [k for k in scrapes[1] if "usage" in k and 'pod="other"' in k]
    assert scrapes[1]["resource_scrape_error"] == (0.0, None)


def test_a_scrape_the_provider_failed_does_not_start_the_counters_again() -> None:
    """A read of the provider that failed (nothing measured this time) keeps the counters: one
    started again would go down, which metrics-server takes for an error."""
    counters = CpuCounters()
    pods = [consumer_pod("trainer", "u1")]
    first = {"u1": container_usage(pod_metrics("trainer", "2026-11-28T10:00:00Z", "15s", main=("1", "1Gi")))}
    (m1,), _ = measure(pods, first, counters)
    assert measure(pods, {}, counters) == ([], None)
    later = {"u1": container_usage(pod_metrics("trainer", "2026-11-28T10:00:30Z", "15s", main=("1", "1Gi")))}
    (m2,), _ = measure(pods, later, counters)
    assert m2.cpu_seconds == pytest.approx(m1.cpu_seconds + 30)


def test_nothing_measured_means_no_usage_and_a_failure_says_so() -> None:
    pods = [consumer_pod("trainer", "u1"), consumer_pod("waiting", "u3", started=None)]
    measured, node = measure(pods, {}, CpuCounters())
    assert (measured, node) == ([], None)
    got = series(resource_metrics(pods, measured, node, scrape_error=True))
    assert got == {
        'container_start_time_seconds{container="main",namespace="ml",pod="trainer"}': (
            unix_seconds("2026-11-28T09:59:00Z"),
            None,
        ),
        "resource_scrape_error": (1.0, None),
    }


def test_summary_usage_is_the_summary_apis_shape() -> None:
    counters = CpuCounters()
    usage = {"u1": container_usage(pod_metrics("trainer", "2026-11-28T10:00:00Z", "10s", main=("2", "1Gi")))}
    (m,), _ = measure([consumer_pod("trainer", "u1")], usage, counters)
    assert summary_usage(m) == {
        "cpu": {
            "time": "2026-11-28T10:00:00Z",
            "usageNanoCores": 2_000_000_000,
            "usageCoreNanoSeconds": 20_000_000_000,
        },
        "memory": {"time": "2026-11-28T10:00:00Z", "workingSetBytes": 2**30},
    }


def running_pod(name: str, uid: str, qos: str, container_id: str | None) -> RawObject:
    """A consumer pod whose twin runs one container, ``main``, as status back writes it."""
    pod = consumer_pod(name, uid)
    (status,) = pod["status"]["containerStatuses"]
    status["image"] = "docker.io/library/python:3.11-slim"
    if container_id:
        status["containerID"] = container_id
    pod["status"]["qosClass"] = qos
    pod["spec"] = {"containers": [{"name": "main", "image": "python:3.11-slim"}]}
    return pod


def test_cadvisor_metrics_are_what_prometheus_reads_of_a_container() -> None:
    """The series and labels kube-prometheus' recording rules and dashboards read
    (``container_cpu_usage_seconds_total{image!=""}``, ``container_memory_working_set_bytes``
    by namespace, pod and container): the rate Prometheus computes from two scrapes is the
    provider's, and the text parses as Prometheus' own parser reads it."""
    counters = CpuCounters()
    pods = [running_pod("trainer", "u1", "Guaranteed", "containerd://abc123"),
            running_pod("kwokish", "u2", "BestEffort", None)]  # fmt: skip
    scrapes = []
    for at, cpu in (("2026-11-28T10:00:00Z", "500m"), ("2026-11-28T10:00:30Z", "2")):
        usage = {"u1": container_usage(pod_metrics("trainer", at, "15s", main=(cpu, "2Gi")))}
        measured, _ = measure(pods, usage, counters)
        text = cadvisor_metrics(pods, measured, scrape_error=False)
        families = {f.name: f for f in text_string_to_metric_families(text)}
        assert set(families) == {"container_cpu_usage_seconds", "container_memory_working_set_bytes",
                                 "container_start_time_seconds", "container_scrape_error"}  # fmt: skip
        scrapes.append(series(text))
    trainer = ('container="main",{}id="/kubepods/podu1/abc123",image="docker.io/library/python:3.11-slim",'
               'name="abc123",namespace="ml",pod="trainer"')  # fmt: skip
    cpu_key = "container_cpu_usage_seconds_total{" + trainer.format('cpu="total",') + "}"
    (c1, t1), (c2, t2) = scrapes[0][cpu_key], scrapes[1][cpu_key]
    assert t1 is not None and t2 is not None and t2 - t1 == 30_000
    assert (c2 - c1) / 30 == pytest.approx(2.0)  # rate() over the two samples
    assert scrapes[1]["container_memory_working_set_bytes{" + trainer.format("") + "}"] == (2 * 2**30, t2)
    assert scrapes[1]["container_start_time_seconds{" + trainer.format("") + "}"] == (
        unix_seconds("2026-11-28T09:59:00Z"),
        None,
    )
    # a container with no runtime ID (kwok's) and no usage measured: its start time, under its
    # pod's cgroup, and no usage, never a made-up one
    kwokish = (
        'container_start_time_seconds{container="main",id="/kubepods/besteffort/podu2",'
        'image="docker.io/library/python:3.11-slim",name="",namespace="ml",pod="kwokish"}'
    )
    assert kwokish in scrapes[1]
    assert [k for k in scrapes[1] if 'pod="kwokish"' in k] == [kwokish]
    assert scrapes[1]["container_scrape_error"] == (0.0, None)


def test_cadvisor_metrics_of_nothing_measured_say_the_scrape_failed() -> None:
    pods = [running_pod("trainer", "u1", "Burstable", "containerd://abc123")]
    text = cadvisor_metrics(pods, [], scrape_error=True)
    assert list(series(text)) == [
        'container_start_time_seconds{container="main",id="/kubepods/burstable/podu1/abc123",'
        'image="docker.io/library/python:3.11-slim",name="abc123",namespace="ml",pod="trainer"}',
        "container_scrape_error",
    ]
    assert series(text)["container_scrape_error"] == (1.0, None)
    # no status image yet: the spec's
    del pods[0]["status"]["containerStatuses"][0]["image"]
    assert cadvisor_identity(pods[0], "main")["image"] == "python:3.11-slim"


def test_a_pods_resource_metrics_are_its_containers_added_up() -> None:
    """``pod_cpu_usage_seconds_total`` and ``pod_memory_working_set_bytes`` (STABLE on a
    kubelet's ``/metrics/resource``): the rate over two scrapes is the sum of the containers'
    rates; a pod the provider did not measure has none."""
    counters = CpuCounters()
    trainer = consumer_pod("trainer", "u1")
    trainer["status"]["containerStatuses"].append(
        {"name": "side", "state": {"running": {"startedAt": "2026-11-28T09:59:00Z"}}}
    )
    pods = [trainer, consumer_pod("other", "u2")]
    scrapes = []
    for at, main_cpu in (("2026-11-28T10:00:00Z", "500m"), ("2026-11-28T10:00:20Z", "1")):
        usage = {
            "u1": container_usage(
                pod_metrics("trainer", at, "15s", main=(main_cpu, "2Gi"), side=("250m", "1Gi"))
            )
        }
        measured, node = measure(pods, usage, counters)
        scrapes.append(series(resource_metrics(pods, measured, node, scrape_error=False)))
    (c1, t1), (c2, t2) = (s['pod_cpu_usage_seconds_total{namespace="ml",pod="trainer"}'] for s in scrapes)
    assert t1 is not None and t2 is not None and (c2 - c1) / ((t2 - t1) / 1000) == pytest.approx(1.25)
    assert scrapes[1]['pod_memory_working_set_bytes{namespace="ml",pod="trainer"}'] == (3 * 2**30, t2)
    assert not [k for k in scrapes[1] if k.startswith("pod_") and 'pod="other"' in k]


def test_an_ephemeral_containers_cadvisor_labels_come_from_its_own_status() -> None:
    """A debugger the provider measured (``kubectl debug``) is labelled with its own image and
    runtime ID, not left without an image (which dashboards filter out)."""
    pod = running_pod("trainer", "u1", "Burstable", "containerd://abc123")
    pod["spec"]["ephemeralContainers"] = [{"name": "debugger", "image": "busybox"}]
    pod["status"]["ephemeralContainerStatuses"] = [
        {"name": "debugger", "image": "docker.io/library/busybox:latest", "containerID": "containerd://dbg1"}
    ]
    assert cadvisor_identity(pod, "debugger") == {
        "container": "debugger",
        "id": "/kubepods/burstable/podu1/dbg1",
        "image": "docker.io/library/busybox:latest",
        "name": "dbg1",
        "namespace": "ml",
        "pod": "trainer",
    }
    del pod["status"]["ephemeralContainerStatuses"]
    assert cadvisor_identity(pod, "debugger")["image"] == "busybox"


def test_usage_quantities_read_exactly_as_parse_quantity_reads_them() -> None:
    """metrics-server's forms (``123456789n``, ``1048576Ki``) take a short way; its figures are
    the float nearest the exact quantity, as ``parse_quantity``'s, and any other form goes
    that way (a refused one is refused both ways)."""
    rng = random.Random(15)
    cpu = [f"{rng.randrange(10 ** rng.randrange(1, 16))}{suffix}" for suffix in ("n", "u", "m", "")
           for _ in range(500)]  # fmt: skip
    cpu += ["0", "1", "250m", "999999999999999n", "1.5", "2e3", "1k", "0.5m", "+1"]
    for text in cpu:
        assert _cores(text) == float(parse_quantity(text)), text
    memory = [f"{rng.randrange(10 ** rng.randrange(1, 16))}{suffix}"
              for suffix in ("", "k", "M", "G", "Ki", "Mi", "Gi") for _ in range(200)]  # fmt: skip
    memory += ["1Ti", "1.5Gi", "1e3", "64Mi", "1000m"]
    for text in memory:
        assert _bytes(text) == int(parse_quantity(text)), text
    for bad in ("lots", "", "1.5GB", "-", "1Kb"):
        with pytest.raises(ValueError):
            _cores(bad)
        with pytest.raises(ValueError):
            _bytes(bad)


def test_kept_texts_are_made_again_for_a_pod_that_changed_and_dropped_for_one_gone() -> None:
    """The virtual kubelet keeps each pod's label blocks and start times between scrapes: a
    pod that changed (a new resourceVersion: here its container restarted) is written as it is
    now, one without a resourceVersion is written anew each time, and one gone is forgotten."""
    kept = PodTexts(resource_texts)
    trainer, other = consumer_pod("trainer", "u1"), consumer_pod("other", "u2")
    trainer["metadata"]["resourceVersion"], other["metadata"]["resourceVersion"] = "11", "12"
    loose = consumer_pod("loose", "u3")  # no resourceVersion
    usage = {"u1": container_usage(pod_metrics("trainer", "2026-11-28T10:00:00Z", "15s", main=("1", "1Gi")))}
    counters = CpuCounters()
    first = resource_metrics([trainer, other, loose], *measure([trainer], usage, counters), False, kept)
    assert first == resource_metrics([trainer, other, loose], *measure([trainer], usage, counters), False)
    assert len(kept) == 2
    restarted, moved = copy.deepcopy(trainer), copy.deepcopy(loose)
    restarted["metadata"]["resourceVersion"] = "21"
    for pod in (restarted, moved):
        pod["status"]["containerStatuses"][0]["state"]["running"]["startedAt"] = "2026-11-28T10:05:00Z"
    again = series(resource_metrics([restarted, other, moved], [], None, False, kept))
    for name in ("trainer", "loose"):
        start = again[f'container_start_time_seconds{{container="main",namespace="ml",pod="{name}"}}']
        assert start == (unix_seconds("2026-11-28T10:05:00Z"), None), name
    resource_metrics([other], [], None, False, kept)
    assert len(kept) == 1
    # the same for cAdvisor's
    kept_cadvisor = PodTexts(cadvisor_texts)
    pod = running_pod("trainer", "u1", "Burstable", "containerd://abc123")
    pod["metadata"]["resourceVersion"] = "11"
    assert cadvisor_metrics([pod], [], False, kept_cadvisor) == cadvisor_metrics([pod], [], False)
    pod = copy.deepcopy(pod)
    pod["metadata"]["resourceVersion"] = "12"
    pod["status"]["containerStatuses"][0]["containerID"] = "containerd://def456"
    text = cadvisor_metrics([pod], [], False, kept_cadvisor)
    assert "podu1/def456" in text and "abc123" not in text, text


def test_the_summary_api_adds_up_each_pod_and_keeps_what_changes_only_with_it() -> None:
    """``/stats/summary`` (OpenTelemetry's kubeletstats receiver, every 10 s): each container's
    start time and usage, a pod's its containers' added up, one not measured without usage;
    with the pods' parts kept between scrapes, a pod that changed is told as it is now, and
    a scrape's usage never leaks into the next (the kept parts are not written to)."""
    trainer = consumer_pod("trainer", "u1")
    trainer["metadata"]["resourceVersion"] = "7"
    trainer["status"]["startTime"] = "2026-11-28T09:58:59Z"
    trainer["status"]["containerStatuses"].append({"name": "side", "state": {"waiting": {}}})
    other = consumer_pod("other", "u2")
    other["metadata"]["resourceVersion"] = "8"
    kept, counters = PodTexts(summary_texts), CpuCounters()

    def scrape(pods: list[RawObject], at: str, cpu: str | None) -> RawObject:
        measured_here = {"main": (cpu, "1Gi")} if cpu else {}
        usage = {"u1": container_usage(pod_metrics("trainer", at, "10s", **measured_here))}
        measured, node = measure(pods, usage, counters)
        found = stats_summary("gpuferry-farm", T0 - 60, pods, measured, node, kept)
        assert found == stats_summary("gpuferry-farm", T0 - 60, pods, measured, node), "kept parts differ"
        return found

    first = scrape([trainer, other], "2026-11-28T10:00:00Z", "2")
    frozen = copy.deepcopy(first)
    assert (
        first["node"]["nodeName"] == "gpuferry-farm" and first["node"]["startTime"] == "2026-11-28T09:59:00Z"
    )
    pods = {p["podRef"]["name"]: p for p in first["pods"]}
    assert pods["trainer"]["podRef"] == {"name": "trainer", "namespace": "ml", "uid": "u1"}
    assert pods["trainer"]["startTime"] == "2026-11-28T09:58:59Z"
    main, side = pods["trainer"]["containers"]
    assert main["startTime"] == "2026-11-28T09:59:00Z" and main["cpu"]["usageNanoCores"] == 2_000_000_000
    assert side == {"name": "side"}  # waiting, not measured: neither a start time nor usage
    assert pods["trainer"]["memory"]["workingSetBytes"] == 2**30
    assert "cpu" not in pods["other"] and "cpu" not in pods["other"]["containers"][0]
    # the provider measured it again, then not at all: no usage left from the scrape before
    again = scrape([trainer, other], "2026-11-28T10:00:10Z", "500m")
    assert again["pods"][0]["containers"][0]["cpu"]["usageNanoCores"] == 500_000_000
    unmeasured = scrape([trainer, other], "2026-11-28T10:00:20Z", None)
    assert "cpu" not in unmeasured["pods"][0]["containers"][0] and "cpu" not in unmeasured["pods"][0]
    restarted = copy.deepcopy(trainer)
    restarted["metadata"]["resourceVersion"] = "9"
    restarted["status"]["containerStatuses"][1]["state"] = {"running": {"startedAt": "2026-11-28T10:00:05Z"}}
    second = scrape([restarted, other], "2026-11-28T10:00:30Z", "250m")
    (trainer_now,) = (p for p in second["pods"] if p["podRef"]["name"] == "trainer")
    assert trainer_now["containers"][1] == {"name": "side", "startTime": "2026-11-28T10:00:05Z"}
    assert trainer_now["cpu"]["usageNanoCores"] == 250_000_000
    assert first == frozen  # the first scrape's answer, untouched by the second
