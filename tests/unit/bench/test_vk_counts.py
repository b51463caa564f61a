"""The bench reads the virtual kubelet's request and watch-event counters and prints them per pod."""

from __future__ import annotations

import os
import time

from bench.offload import (
    Lapses,
    cpu_shares,
    cpu_split,
    parse_vk_metrics,
    per_pod,
    proc_stats,
    reconciles_per_pod,
    rest_shares,
    schedulable_count,
    settled,
)

TEXT = """\
# HELP gpuferry_api_requests_total Requests sent to API servers.
# TYPE gpuferry_api_requests_total counter
gpuferry_api_requests_total{verb="create",resource="pods",server="127.0.0.1:2"} 210.0
gpuferry_api_requests_total{verb="patch",resource="pods/status",server="127.0.0.1:1"} 100.0
gpuferry_api_requests_total{verb="watch",resource="pods",server="127.0.0.1:1"} 3.0
# HELP gpuferry_watch_events_total Objects received by list+watch loops.
# TYPE gpuferry_watch_events_total counter
gpuferry_watch_events_total{resource="pods",type="MODIFIED",server="127.0.0.1:2"} 300.0
gpuferry_watch_events_total{resource="pods",type="ADDED",server="127.0.0.1:2"} 110.0
gpuferry_watch_events_total{resource="pods",type="ADDED",server="127.0.0.1:1"} 100.0
gpuferry_watch_events_total{resource="events",type="BOOKMARK",server="127.0.0.1:1"} 0.2
# HELP gpuferry_queue_work_duration_seconds Time spent processing one key.
# TYPE gpuferry_queue_work_duration_seconds histogram
gpuferry_queue_work_duration_seconds_bucket{queue="sync_pods_to_remote",le="+Inf"} 320.0
gpuferry_queue_work_duration_seconds_count{queue="sync_pods_to_remote"} 320.0
gpuferry_queue_work_duration_seconds_sum{queue="sync_pods_to_remote"} 12.5
gpuferry_queue_work_duration_seconds_count{queue="sync_status_from_remote"} 800.0
gpuferry_queue_work_duration_seconds_count{queue="sync_services_to_remote"} 0.0
# HELP gpuferry_gc_seconds_total CPU seconds of the process spent in Python's garbage collector.
# TYPE gpuferry_gc_seconds_total counter
gpuferry_gc_seconds_total{generation="0"} 0.5
gpuferry_gc_seconds_total{generation="2"} 1.5
# HELP gpuferry_gc_collections_total Collections of Python's garbage collector, by generation.
# TYPE gpuferry_gc_collections_total counter
gpuferry_gc_collections_total{generation="0"} 900.0
# HELP gpuferry_other_total Not ours to count.
# TYPE gpuferry_other_total counter
gpuferry_other_total{server="127.0.0.1:1"} 5.0
"""


def test_both_counters_are_read_by_server_and_nothing_else() -> None:
    counts = parse_vk_metrics(TEXT)
    assert counts[("requests", "127.0.0.1:2", "create", "pods")] == 210
    assert counts[("events", "127.0.0.1:2", "pods", "MODIFIED")] == 300
    assert counts[("events", "127.0.0.1:1", "pods", "ADDED")] == 100
    assert counts[("work", "", "sync_pods_to_remote", "")] == 320
    assert counts[("gc", "", "2", "")] == 1.5
    assert len(counts) == 12


def test_per_pod_lines_requests_then_events_per_cluster_watches_and_crumbs_left_out() -> None:
    before = parse_vk_metrics(TEXT.replace("210.0", "10.0").replace("110.0", "10.0"))
    after = parse_vk_metrics(TEXT)
    lines = per_pod(before, after, 100, {"127.0.0.1:1": "consumer", "127.0.0.1:2": "provider"})
    assert lines == [
        "  consumer: 0.00 requests per pod (none)",
        "  provider: 2.00 requests per pod (create pods 2.00)",
        "  consumer: 0.00 watch events received per pod (none)",
        "  provider: 1.00 watch events received per pod (pods ADDED 1.00)",
    ]
    lines = per_pod({}, after, 100, {"127.0.0.1:1": "consumer", "127.0.0.1:2": "provider"})
    assert lines[0] == "  consumer: 1.00 requests per pod (patch pods/status 1.00)"
    assert lines[3] == "  provider: 4.10 watch events received per pod (pods MODIFIED 3.00, pods ADDED 1.10)"


def test_reconciles_per_pod_by_queue_most_first() -> None:
    before = parse_vk_metrics(TEXT.replace("} 320.0", "} 20.0").replace("} 800.0", "} 0.0"))
    after = parse_vk_metrics(TEXT)
    assert reconciles_per_pod(before, after, 100) == (
        "  vk: 11.00 reconciles per pod (sync_status_from_remote 8.00, sync_pods_to_remote 3.00)"
    )
    assert reconciles_per_pod(after, after, 100) == "  vk: 0.00 reconciles per pod (none)"


def test_the_deletion_half_says_so_in_each_line() -> None:
    before = parse_vk_metrics(TEXT.replace("} 320.0", "} 20.0").replace("210.0", "10.0"))
    after = parse_vk_metrics(TEXT)
    sides = {"127.0.0.1:1": "consumer", "127.0.0.1:2": "provider"}
    lines = per_pod(before, after, 100, sides, "Running to gone")
    assert lines[1] == "  provider: 2.00 requests per pod, Running to gone (create pods 2.00)"
    assert reconciles_per_pod(before, after, 100, "Running to gone") == (
        "  vk: 3.00 reconciles per pod, Running to gone (sync_pods_to_remote 3.00)"
    )


def test_only_nodes_ready_and_free_of_lifecycle_taints_count() -> None:
    def node(*conditions: tuple[str, str], taints: tuple[str, ...] = ()) -> dict[str, object]:
        return {
            "spec": {"taints": [{"key": k, "effect": "NoSchedule"} for k in taints]},
            "status": {"conditions": [{"type": t, "status": s} for t, s in conditions]},
        }

    nodes = [
        node(("Ready", "True")),
        node(("MemoryPressure", "False"), ("Ready", "True")),
        node(("Ready", "True"), taints=("example.com/dedicated",)),
        node(("Ready", "True"), taints=("node.kubernetes.io/not-ready",)),
        node(("Ready", "True"), taints=("node.kubernetes.io/unschedulable",)),
        node(("Ready", "False")),
        node(("Ready", "Unknown")),
        node(),
        {},
    ]
    assert schedulable_count(nodes) == 3, "Ready, and no taint the node lifecycle controller keeps"


def test_the_machine_has_settled_once_its_load_stops_falling() -> None:
    assert not settled(None, 20.0), "one window tells no trend"
    assert not settled(68.0, 50.0)
    assert not settled(50.0, 44.9)
    assert settled(50.0, 45.0)
    assert settled(30.0, 41.0), "a load that rises again is no longer falling"


def test_the_rest_line_names_gpuferrys_own_processes_wherever_they_rank() -> None:
    by = {"kube-apiserver (provider)": 3.0, "kwok (provider)": 0.8, "etcd (provider)": 0.7,
          "kube-controller-manager (provider)": 0.6, "python -m peering.provider": 0.1,
          "kube-scheduler (provider)": 0.5, "virtual kubelet (bench)": 0.02}  # fmt: skip
    shown = rest_shares(by, 5.0)
    assert [k for k, _ in shown] == [
        "kube-apiserver (provider)", "kwok (provider)", "etcd (provider)",
        "kube-controller-manager (provider)", "python -m peering.provider", "virtual kubelet (bench)",
    ]  # fmt: skip
    assert shown[0][1] == 60.0 and round(shown[4][1], 6) == 2.0
    alone = {"python -m peering.provider": 1.0}
    assert [k for k, _ in rest_shares(alone, 5.0)] == ["python -m peering.provider"]


def test_a_node_seen_other_than_ready_during_a_burst_has_lapsed() -> None:
    def node(name: str, ready: str) -> dict[str, object]:
        return {"metadata": {"name": name}, "status": {"conditions": [{"type": "Ready", "status": ready}]}}

    lapses = Lapses()
    seen = [node("a", "True"), node("b", "True"), node("b", "Unknown"), node("b", "True"), node("c", "False")]
    for one in seen:
        lapses.observe(one)
    assert lapses.lapsed == {"b", "c"}, "a node Ready again later still lapsed during the burst"
    assert lapses.summary() == "2 of 3"


def test_cpu_shares_user_space_and_the_garbage_collector_over_the_window() -> None:
    before = parse_vk_metrics(TEXT.replace("} 1.5", "} 0.5").replace("} 0.5\n", "} 0.0\n", 1))
    after = parse_vk_metrics(TEXT)
    assert before[("gc", "", "0", "")] == 0.0 and before[("gc", "", "2", "")] == 0.5
    # 1.5 s collected (0.5 + 1.0) of 20 s used, 18 of them in user space
    assert cpu_shares(before, after, (2.0, 20.0), (1.0, 3.0)) == (
        "90 % in user space, 7.5 % in the garbage collector"
    )
    assert cpu_shares(after, after, (5.0, 5.0), (1.0, 1.0)) == "no CPU used"


def test_this_processs_own_cpu_split_and_peak_rss_from_proc() -> None:
    deadline = time.process_time() + 0.05
    while time.process_time() < deadline:  # some user-space CPU to read (its children have none)
        pass
    user, system = cpu_split(os.getpid())
    cpu, rss = proc_stats(os.getpid())
    assert user >= 0.05 and system >= 0
    assert cpu >= user + system
    assert rss > 10 * 2**20
