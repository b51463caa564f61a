"""The request-cost benchmark's arithmetic: a pass's CPU less the same time at rest, per request."""

from __future__ import annotations

from collections import Counter

import pytest

from bench.machine import Burst
from bench.request_costs import Cost, at_rest, net_cost, summary, token_request


def test_the_rest_is_subtracted_for_as_long_as_the_pass_lasted() -> None:
    rest = Burst(busy=1.0, total=10.0, by=Counter({"kube-apiserver (consumer)": 0.5, "etcd (consumer)": 0.1}))
    work = Burst(busy=3.0, total=4.0, by=Counter({"kube-apiserver (consumer)": 1.5, "etcd (consumer)": 0.3,
                                                  "kube-apiserver (provider)": 9.0}))  # fmt: skip
    # a 2 s pass against 5 s at rest: 0.4 of the rest's CPU is background, over 1000 requests
    got = net_cost(work, rest, 5.0, 2.0, 1000, "consumer")
    assert got.apiserver == pytest.approx(1.3)
    assert got.etcd == pytest.approx(0.26)
    assert got.machine == pytest.approx(2.6)


def test_a_pass_quieter_than_rest_costs_nothing_not_less() -> None:
    rest = Burst(busy=5.0, total=10.0, by=Counter({"kube-apiserver (provider)": 5.0}))
    got = net_cost(Burst(busy=1.0, total=2.0, by=Counter()), rest, 1.0, 1.0, 10, "provider")
    assert got == Cost(apiserver=0.0, etcd=0.0, machine=0.0)


def test_the_summary_takes_medians_and_compares_a_token_with_a_secret() -> None:
    lines = summary({
        "token": [Cost(1.0, 0.3, 2.0), Cost(1.2, 0.2, 9.0), Cost(0.8, 0.4, 1.8)],
        "secret": [Cost(1.1, 0.3, 1.0)],
        "configmap": [],
    })  # fmt: skip
    assert lines == [
        "token: the API server 1.00 ms, etcd 0.30 ms, the machine 2.00 ms of CPU per request "
        "(medians of 3 rounds)",
        "secret: the API server 1.10 ms, etcd 0.30 ms, the machine 1.00 ms of CPU per request (1 round)",
        "a kubelet's TokenRequest costs the machine 2.00 ms, 2.00x a Secret's creation (1.00 ms)",
    ]


def test_the_rest_line_gives_shares_of_a_core() -> None:
    rest = Burst(busy=1.0, total=10.0, by=Counter({"etcd (provider)": 0.35, "kwok (provider)": 0.1}))
    line = at_rest(rest, 5.0)
    assert line == "at rest over 5s: cores 10 % busy (etcd (provider) 7.0 %, kwok (provider) 2.0 % of a core)"


def test_a_token_is_bound_to_its_pod_as_a_kubelet_binds_it() -> None:
    body = token_request({"metadata": {"name": "p", "uid": "u-1"}})
    assert body["spec"]["boundObjectRef"] == {"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "u-1"}
    assert body["spec"]["expirationSeconds"] == 3607
