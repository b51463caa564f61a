"""The request benchmarks' ending: 0 when done, one line and 1 when the API stops them, 130 on Ctrl-C."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from bench import client_requests, request_costs
from bench.scratch import run_bench
from kube.errors import Forbidden


async def _done() -> None:
    return None


async def _refused() -> None:
    raise Forbidden("configmaps is forbidden: User cannot create", status=403, reason="Forbidden")


async def _interrupted() -> None:
    raise KeyboardInterrupt


def test_a_run_ends_with_its_status_and_one_line_not_a_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_bench(_done()) == 0
    assert run_bench(_refused()) == 1
    assert capsys.readouterr().err == (
        "benchmark stopped: Forbidden: 403 Forbidden: configmaps is forbidden: User cannot create\n"
    )
    assert run_bench(_interrupted()) == 130
    assert capsys.readouterr().err == "stopped\n"


@pytest.mark.parametrize("cli", [request_costs.cli, client_requests.cli])
def test_an_unknown_profile_is_refused_by_name(cli: Callable[[list[str]], int],
                                               capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    with pytest.raises(SystemExit) as stopped:
        cli(["--profile", "nosuch"])
    assert stopped.value.code == 2
    assert "invalid choice: 'nosuch' (choose from 'demo'" in capsys.readouterr().err
