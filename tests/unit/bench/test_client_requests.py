"""The client benchmark's arithmetic: CPU per request of a pass, and the two clients' medians."""

from __future__ import annotations

import pytest

from bench.client_requests import cpu_per_request, summary


def test_a_pass_makes_three_requests_per_object() -> None:
    assert cpu_per_request(1.2, 1000) == pytest.approx(0.4)


def test_the_summary_compares_medians_not_means() -> None:
    line = summary([0.30, 0.40, 1.00], [0.90, 1.20, 1.00])
    assert line.startswith("CPU per request: gpuferry's client 0.400 ms, kubernetes-asyncio 1.000 ms: 2.50x")
    assert "0.300/0.900 0.400/1.200 1.000/1.000" in line
