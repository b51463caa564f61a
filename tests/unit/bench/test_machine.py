"""The benchmark's whole-machine figures: names of processes, API server writes, CPU over a burst."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import pytest

from bench.machine import Snapshot, component_of, parse_writes, per_pod, snapshot, writes
from kube.clients import KubeClient
from kube.kubeconfigs import Connection

METRICS = """\
# HELP apiserver_request_total Counter of apiserver requests
# TYPE apiserver_request_total counter
apiserver_request_total{code="201",resource="pods",subresource="",verb="POST"} 100
apiserver_request_total{code="409",resource="pods",subresource="",verb="POST"} 3
apiserver_request_total{code="201",resource="pods",subresource="binding",verb="POST"} 100
apiserver_request_total{code="200",resource="pods",subresource="status",verb="PATCH"} 120
apiserver_request_total{code="200",resource="pods",subresource="",verb="LIST"} 7
apiserver_request_total{code="200",resource="pods",subresource="",verb="WATCH"} 9
apiserver_request_total{code="200",resource="leases",subresource="",verb="PUT"} 5000
apiserver_request_total{code="200",resource="nodes",subresource="",verb="APPLY"} 2
"""


def test_writes_count_every_answer_of_a_write_verb_by_resource_and_subresource() -> None:
    writes = parse_writes(METRICS)
    assert writes == Counter(
        {"POST pods": 103, "POST pods/binding": 100, "PATCH pods/status": 120, "APPLY nodes": 2}
    )


def test_reads_and_lease_heartbeats_are_not_writes_of_the_burst() -> None:
    writes = parse_writes(METRICS)
    assert not any(k.startswith(("LIST", "WATCH", "GET")) for k in writes)
    assert "PUT leases" not in writes


def test_writes_per_pod_most_first_and_tiny_ones_left_out() -> None:
    done = Counter({"POST pods": 100, "PATCH pods/status": 150, "APPLY nodes": 0.4})
    assert per_pod(done, 100) == "2.50 (PATCH pods/status 1.50, POST pods 1.00)"
    assert per_pod(Counter(), 100) == "0.00 (none)"


@pytest.mark.parametrize(
    ("argv", "name"),
    [
        (["/c/k8s/bin/kube-apiserver", "--tls-cert-file=/root/.cache/gpuferry/run/demo/consumer/pki/a.crt"],
         "kube-apiserver (consumer)"),
        (["/c/etcd/bin/etcd", "--data-dir=/root/.cache/gpuferry/run/test/provider/etcd"], "etcd (provider)"),
        (["/work/.venv/bin/python", "-m", "vk", "--consumer-kubeconfig", "/x"], "python -m vk"),
        (["python3", "-m", "peering.provider"], "python -m peering.provider"),
        (["/usr/bin/containerd-shim-runc-v2", "-namespace", "k8s.io"], "containerd-shim-runc-v2"),
        ([], "kernel"),
    ],
)
def test_a_process_is_named_by_its_binary_and_its_cluster(argv: list[str], name: str) -> None:
    assert component_of(argv) == name


def test_a_burst_counts_what_each_process_spent_and_names_the_ones_asked_for() -> None:
    before = Snapshot(
        busy=10.0, total=40.0, processes={1: ("etcd (consumer)", 5.0), 2: ("python -m vk", 1.0)}
    )
    after = Snapshot(
        busy=13.0,
        total=44.0,
        processes={1: ("etcd (consumer)", 5.5), 2: ("python -m vk", 2.0), 3: ("kwok (provider)", 0.25)},
    )
    burst = after.since(before, names={2: "virtual kubelet (bench)"})
    assert burst.busy == pytest.approx(3.0)
    assert burst.by == Counter(
        {"virtual kubelet (bench)": 1.0, "etcd (consumer)": 0.5, "kwok (provider)": 0.25}
    )
    assert burst.summary(100) == (
        "30.0 ms CPU per pod, cores 75 % busy "
        "(virtual kubelet (bench) 10.0, etcd (consumer) 5.0, kwok (provider) 2.5 ms)"
    )
    # gpuferry's own processes are shown wherever they rank
    only = "30.0 ms CPU per pod, cores 75 % busy (virtual kubelet (bench) 10.0 ms)"
    assert burst.summary(100, top=1) == only
    assert burst.summary(100, top=1, always=("kwok",)) == (
        "30.0 ms CPU per pod, cores 75 % busy (virtual kubelet (bench) 10.0, kwok (provider) 2.5 ms)"
    )


def test_this_process_shows_in_a_snapshot_of_the_real_proc() -> None:
    sum(i * i for i in range(200_000))  # some CPU of our own
    now = snapshot(Path("/proc"))
    assert now.total >= now.busy > 0
    assert os.getpid() in now.processes
    assert now.processes[os.getpid()][1] > 0


async def test_an_api_server_whose_metrics_cannot_be_read_gives_no_writes_and_says_so(
    capsys: pytest.CaptureFixture[str],
) -> None:
    async with KubeClient(Connection(server="https://127.0.0.1:1")) as unreachable:
        assert await writes(unreachable) is None
    assert "API server writes not counted: https://127.0.0.1:1/metrics" in capsys.readouterr().err
