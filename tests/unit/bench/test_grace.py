"""The bench's ``--grace S``: its pods' terminationGracePeriodSeconds, so that "Running to gone"
can be measured as most pods go (terminating first), not only at once."""

from __future__ import annotations

import sys

import pytest

from bench.offload import main, pod


def test_pods_go_at_once_by_default_and_take_the_grace_asked_for() -> None:
    for node in (None, "gpuferry-bench-p1"):
        assert pod("p-00001", "ab12c", node)["spec"]["terminationGracePeriodSeconds"] == 0
        assert pod("p-00001", "ab12c", node, grace=30)["spec"]["terminationGracePeriodSeconds"] == 30


def test_a_negative_grace_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "argv", ["bench.offload", "--pods", "10", "--grace", "-1"])
    with pytest.raises(SystemExit) as exited:
        main()
    assert exited.value.code == 2
    assert "--grace must be 0 or more" in capsys.readouterr().err
