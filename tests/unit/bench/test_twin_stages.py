"""The bench splits an offloaded pod's way from bound to Running into its twin's stages."""

from __future__ import annotations

import re

from bench.offload import TwinTimes, twin_stages


def _parts(line: str) -> list[float]:
    return [float(x) for x in re.findall(r"(-?\d+\.\d+)s", line)]


def test_each_stage_is_the_median_of_its_own_part() -> None:
    # bound at 1 s; twin created, bound, Running; Running on the consumer
    bound = [1.0, 1.0, 1.0]
    running = [5.0, 6.0, 9.0]
    twins: list[TwinTimes | None] = [
        TwinTimes(2.0, 2.5, 4.0),  # 1.0, 0.5, 1.5, 1.0
        TwinTimes(3.0, 3.1, 5.0),  # 2.0, 0.1, 1.9, 1.0
        TwinTimes(5.0, 5.2, 8.5),  # 4.0, 0.2, 3.3, 0.5
    ]
    line = twin_stages(bound, running, twins)
    assert _parts(line) == [2.0, 0.2, 1.9, 1.0]
    assert line.endswith("over 3 pods")


def test_pods_whose_twin_was_not_seen_running_are_left_out() -> None:
    line = twin_stages([1.0, 1.0], [3.0, 50.0], [TwinTimes(1.5, 1.6, 2.5), None])
    assert _parts(line) == [0.5, 0.1, 0.9, 0.5]
    assert line.endswith("over 1 pod")


def test_no_twin_seen() -> None:
    assert twin_stages([1.0], [2.0], [None]) == "no twin seen Running"


def test_a_lagging_watch_shows_as_a_negative_part() -> None:
    # the provider's watch saw the twin before the consumer's watch saw the binding
    line = twin_stages([1.0], [2.0], [TwinTimes(0.9, 1.2, 1.8)])
    assert _parts(line)[0] == -0.1


def test_a_failed_twin_watch_says_why() -> None:
    assert twin_stages([1.0], [2.0], [None], "403 Forbidden") == (
        "no twin seen Running (the watch of the twins failed: 403 Forbidden)"
    )
    line = twin_stages([1.0, 1.0], [3.0, 50.0], [TwinTimes(1.5, 1.6, 2.5), None], "connection reset")
    assert line.endswith("over 1 pod (the watch of the twins failed: connection reset)")
