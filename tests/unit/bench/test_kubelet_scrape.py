"""The kubelet-scrape bench times our text and prometheus_client's only where they agree."""

from __future__ import annotations

from bench.kubelet_scrape import agree, library_cadvisor, pod, pod_metrics, run, same_summary, samples
from vk.forge.usage import CpuCounters, cadvisor_metrics, container_usage, measure


def test_the_bench_times_both_ways_of_each_path_and_they_agree() -> None:
    lines = run(32, 1)
    assert [line.split(":")[0] for line in lines] == [
        "N=32 /metrics/resource",
        "N=32 /metrics/cadvisor",
        "N=32 /stats/summary",
    ]
    assert all("ms of CPU per scrape" in line and "after a pod changed" in line and "% of a core" in line
               for line in lines), lines  # fmt: skip


def test_a_sample_the_two_texts_differ_on_is_seen() -> None:
    pods = [pod(i) for i in range(3)]
    usage = {p["metadata"]["uid"]: container_usage(pod_metrics(i)) for i, p in enumerate(pods)}
    measured, _ = measure(pods, usage, CpuCounters())
    ours = samples(cadvisor_metrics(pods, measured, scrape_error=False))
    assert agree(ours, samples(library_cadvisor(pods, measured).decode()))
    assert not agree(ours, samples(cadvisor_metrics(pods, measured[1:], scrape_error=False)))
    off = dict(ours)
    key = next(k for k in off if k[0] == "container_memory_working_set_bytes")
    off[key] += 1
    assert not agree(ours, off)


def test_two_summaries_differ_where_their_json_does() -> None:
    assert same_summary('{"a": [1, {"b": 2}]}', '{"a":[1,{"b":2}]}')
    assert not same_summary('{"a": [1, {"b": 2}]}', '{"a":[1,{"b":3}]}')
    one, two = '{"podRef": {"name": "p-1"}, "cpu": 1}', '{"podRef": {"name": "p-2"}, "cpu": 2}'
    assert same_summary(f'{{"pods": [{one}, {two}]}}', f'{{"pods": [{two}, {one}]}}')  # another order
    assert not same_summary(f'{{"pods": [{one}, {two}]}}', f'{{"pods": [{two}, {two}]}}')
