"""The informer-store bench replays each pod's life through both stores and leaves them empty."""

from __future__ import annotations

import sys

import pytest

from bench.informer_store import main, measure, one_way, pod, stages


def test_a_pods_life_is_bound_started_running_deleted_gone() -> None:
    life = stages(pod(7))
    assert [kind for kind, _ in life] == ["ADDED", "MODIFIED", "MODIFIED", "MODIFIED", "DELETED"]
    phases = [obj["status"]["phase"] for _, obj in life]
    assert phases == ["Pending", "Pending", "Running", "Running", "Running"]
    assert "deletionTimestamp" in life[3][1]["metadata"]
    versions = [int(obj["metadata"]["resourceVersion"]) for _, obj in life]
    assert versions == sorted(set(versions))  # each event a newer version


def test_each_store_holds_every_pod_running_and_a_compact_one_less() -> None:
    # 1000 pods: beside the last 128 changed, kept as dicts, the others' packed bytes
    cpu_dicts, held_dicts = one_way(1000, 16, compact=False)
    cpu_compact, held_compact = one_way(1000, 16, compact=True)
    assert cpu_dicts > 0 and cpu_compact > 0
    assert held_dicts > 8 * 1024, held_dicts  # a pod as a dict: ~14 KiB
    assert held_compact < held_dicts / 3, (held_compact, held_dicts)


def test_the_bench_prints_both_ways_and_their_ratios() -> None:
    line = measure(100, 8)
    assert line.startswith("N=100, 8 in flight: dicts "), line
    assert line.count("x)") == 2, line


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--pods", "0"], "--pods must be at least 1, not 0"),
        (["--in-flight", "0"], "--in-flight must be at least 1, not 0"),
    ],
)
def test_what_cannot_be_replayed_is_a_usage_error(
    argv: list[str], says: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "argv", ["informer_store", *argv])
    with pytest.raises(SystemExit) as exited:
        main()
    assert exited.value.code == 2 and says in capsys.readouterr().err
