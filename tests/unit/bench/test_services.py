"""The bench's ``--services K``: K Services in each burst's namespace that select none of its pods
(they are copied to the twin namespace, and no endpoint of theirs changes with the burst)."""

from __future__ import annotations

import sys

import pytest

from bench.offload import main, pod, service


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def test_the_services_select_none_of_the_pods_of_either_path() -> None:
    for i in range(3):
        svc = service(f"svc-{i}")
        assert svc["kind"] == "Service" and svc["metadata"]["name"] == f"svc-{i}"
        for p in (pod("p-00001", "ab12c"), pod("p-00001", "ab12c", node="gpuferry-bench-p1")):
            assert not selects(svc["spec"]["selector"], p["metadata"]["labels"])
        assert svc["spec"]["selector"], "a selector, as a team's Services have (an empty slice of it)"


@pytest.mark.parametrize("option", ["--services", "--grace"])
def test_a_negative_count_is_a_clear_error(
    option: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "argv", ["bench.offload", "--pods", "10", option, "-1"])
    with pytest.raises(SystemExit) as exited:
        main()
    assert exited.value.code == 2
    assert f"{option} must be 0 or more" in capsys.readouterr().err
