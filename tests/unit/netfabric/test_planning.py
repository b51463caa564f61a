from __future__ import annotations

from ipaddress import IPv4Address, IPv4Network

import pytest

from netfabric.model import NetworkConfigError, Remap
from netfabric.planning import (
    MAIN_TABLE,
    RTPROT_GPUFERRY,
    Action,
    Op,
    Route,
    diff,
    node_routes,
    tunnel_routes,
)

N = IPv4Network
A = IPv4Address
GW = A("10.244.3.4")
REMAPS = [Remap(N("10.244.0.0/16"), N("10.70.0.0/16")), Remap(N("192.168.0.0/24"), N("192.168.0.0/24"))]


def route(dest: str, gateway: str | None = "10.244.3.4", **kwargs: object) -> Route:
    return Route(dest=N(dest), gateway=A(gateway) if gateway else None, **kwargs)  # type: ignore[arg-type]


def test_equal_sets_give_an_empty_diff() -> None:
    routes = [route("10.70.0.0/16"), route("192.168.0.0/24")]
    assert diff(routes, list(reversed(routes))) == []
    assert diff([], []) == []


def test_missing_routes_are_added() -> None:
    assert diff([route("10.70.0.0/16")], []) == [Op(Action.ADD, route("10.70.0.0/16"))]


def test_changed_routes_are_replaced() -> None:
    desired = [route("10.70.0.0/16", "10.244.9.9")]
    assert diff(desired, [route("10.70.0.0/16")]) == [Op(Action.REPLACE, desired[0])]


def test_a_foreign_route_on_our_key_is_replaced() -> None:
    foreign = route("10.70.0.0/16", dev="eth0", protocol=4)
    assert diff([route("10.70.0.0/16")], [foreign]) == [Op(Action.REPLACE, route("10.70.0.0/16"))]


def test_stale_routes_of_ours_are_deleted_foreign_ones_kept() -> None:
    stale = route("10.71.0.0/16")
    foreign = route("10.244.0.0/16", None, dev="cilium_host", protocol=2)
    assert diff([], [stale, foreign]) == [Op(Action.DELETE, stale)]


def test_keys_include_table_and_metric() -> None:
    main = route("10.70.0.0/16")
    policy = route("10.70.0.0/16", table=100)
    backup = route("10.70.0.0/16", metric=50)
    assert diff([main, policy, backup], [main]) == [
        Op(Action.ADD, policy),
        Op(Action.ADD, backup),
    ]


def test_order_is_adds_and_replaces_then_deletes_sorted() -> None:
    observed = [route("10.9.0.0/16"), route("10.1.0.0/16"), route("10.5.0.0/16", "10.244.0.1")]
    desired = [route("10.5.0.0/16"), route("10.3.0.0/16")]
    assert [str(op) for op in diff(desired, observed)] == [
        "add 10.3.0.0/16 via 10.244.3.4 table 254 metric 0",
        "replace 10.5.0.0/16 via 10.244.3.4 table 254 metric 0",
        "delete 10.1.0.0/16 via 10.244.3.4 table 254 metric 0",
        "delete 10.9.0.0/16 via 10.244.3.4 table 254 metric 0",
    ]


def test_applying_the_diff_converges() -> None:
    observed = {r.key: r for r in [route("10.1.0.0/16"), route("10.5.0.0/16", "10.244.0.1")]}
    desired = [route("10.5.0.0/16"), route("10.3.0.0/16", None, dev="gf-b")]
    for op in diff(desired, observed.values()):
        if op.action is Action.DELETE:
            del observed[op.route.key]
        else:
            observed[op.route.key] = op.route
    assert diff(desired, observed.values()) == []


def test_duplicate_desired_keys_are_refused() -> None:
    with pytest.raises(NetworkConfigError, match=r"two desired routes to 10\.70\.0\.0/16"):
        diff([route("10.70.0.0/16"), route("10.70.0.0/16", "10.244.0.1")], [])


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"gateway": None}, "gateway"),
        ({"dev": "x" * 16}, "dev"),
        ({"table": 0}, "table"),
        ({"metric": -1}, "metric"),
        ({"protocol": 256}, "protocol"),
    ],
)
def test_route_validation(kwargs: dict[str, object], field: str) -> None:
    values: dict[str, object] = {"dest": N("10.70.0.0/16"), "gateway": GW}
    values.update(kwargs)
    with pytest.raises(NetworkConfigError) as info:
        Route(**values)  # type: ignore[arg-type]
    assert info.value.field == field


def test_node_routes_point_local_views_at_the_gateway() -> None:
    assert node_routes(REMAPS, gateway_ip=GW) == [
        Route(N("10.70.0.0/16"), gateway=GW, table=MAIN_TABLE, protocol=RTPROT_GPUFERRY),
        Route(N("192.168.0.0/24"), gateway=GW),
    ]


def test_tunnel_routes_use_originals_in_their_own_table() -> None:
    assert tunnel_routes(REMAPS, tunnel_iface="gf-b", table=100) == [
        Route(N("10.244.0.0/16"), dev="gf-b", table=100),
        Route(N("192.168.0.0/24"), dev="gf-b", table=100),
    ]
    with pytest.raises(NetworkConfigError) as info:
        tunnel_routes(REMAPS, tunnel_iface="gf-b", table=MAIN_TABLE)
    assert info.value.field == "table"
