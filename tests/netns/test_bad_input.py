"""Bad input gives a clear NetworkReady=False condition, and nothing is half-applied."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from ipaddress import IPv4Address, IPv4Network
from typing import Any

import pytest

from netfabric.conditions import Reason, network_ready
from netfabric.gateway import (
    GatewaySettings,
    gateway_down,
    gateway_status,
    gateway_up,
    leftovers,
    plan_gateway,
    resolve_endpoint,
)
from netfabric.keys import generate_private_key
from netfabric.nat import table_name_for
from netfabric.peerspec import peer_spec_from_object
from netfabric.planning import MAIN_TABLE
from netfabric.routes import observed_routes
from netfabric.wireguard import TunnelError

from .fabric import LOCAL, Fabric, Side, fabric_up, record_status, side_up
from .topology import GATEWAY_IP, WG_PORT, Topology, ping, request

REMOTE_POD1 = IPv4Address("10.64.1.10")


async def assert_nothing_applied(side: Side) -> None:
    assert await leftovers(side.settings, table_name=side.table_name) == []
    for agent in side.agents():
        assert await observed_routes(table=MAIN_TABLE, netns=agent.netns) == []


def spec_with(side: Side, **changes: Any) -> None:
    side.peer["spec"].update(changes)


@pytest.mark.parametrize(
    ("changes", "field", "words"),
    [
        ({"podCIDRs": ["10.244.0.0/16", "10.244.128.0/17"]}, "spec.podCIDRs[1]", "overlaps 10.244.0.0/16"),
        ({"serviceCIDRs": ["10.244.16.0/20"]}, "spec.serviceCIDRs", "overlaps its own 10.244.0.0/16"),
        ({"podCIDRs": ["10.244.0.1/16"]}, "spec.podCIDRs[0]", "host bits set"),
        ({"podCIDRs": ["10.244.0.0/33"]}, "spec.podCIDRs[0]", "prefix length /33"),
        ({"podCIDRs": ["not-a-cidr"]}, "spec.podCIDRs[0]", "not a valid CIDR"),
        ({"podCIDRs": ["fd00::/64"]}, "spec.podCIDRs[0]", "IPv6"),
        ({"publicKey": "c2hvcnQ="}, "spec.publicKey", "44 base64 characters"),
        ({"sourceNatMode": "Masquerade"}, "spec.sourceNatMode", "not one of Gateway, Preserve"),
        # issue 16 §4: the gateway's own WAN (172.30.0.0/30, found in its namespace) is not the peer's
        ({"podCIDRs": ["10.244.0.0/16", "172.16.0.0/12"]}, "spec.podCIDRs[1]",
         "the peer's CIDR 172.16.0.0/12 overlaps this gateway's own address range on wan (172.30.0.0/30)"),
        ({"serviceCIDRs": ["127.0.0.0/8"]}, "spec.serviceCIDRs[0]",
         "overlaps this gateway's own address range on lo (127.0.0.0/8)"),
    ],
)
async def test_bad_objects_are_refused_before_anything_is_applied(
    topo: Topology, fabric: Fabric, changes: dict[str, Any], field: str, words: str
) -> None:
    spec_with(fabric.a, **changes)
    result = await side_up(fabric.a, expect_ready=False)
    assert result.plan is None
    condition = result.status["conditions"][0]
    assert condition["type"] == "NetworkReady" and condition["status"] == "False"
    assert condition["reason"] == Reason.INVALID_CONFIG
    assert words in condition["message"] and field in condition["message"]
    assert "nothing was applied" in condition["message"]
    await assert_nothing_applied(fabric.a)


async def test_exhausted_remap_pool(topo: Topology, fabric: Fabric) -> None:
    fabric.a.settings = replace(fabric.a.settings, pool=IPv4Network("10.70.0.0/17"))
    result = await side_up(fabric.a, expect_ready=False)
    assert result.condition.reason is Reason.POOL_EXHAUSTED
    assert "remap pool 10.70.0.0/17 cannot hold" in result.condition.message
    await assert_nothing_applied(fabric.a)


async def test_unresolvable_endpoint(topo: Topology, fabric: Fabric) -> None:
    spec_with(fabric.a, endpoint={"address": "gateway.gpuferry.invalid", "port": WG_PORT})
    result = await side_up(fabric.a, expect_ready=False)
    assert result.condition.reason is Reason.ENDPOINT_UNRESOLVABLE
    assert "cannot resolve 'gateway.gpuferry.invalid'" in result.condition.message
    await assert_nothing_applied(fabric.a)


async def test_unreachable_endpoint_is_reported_not_ready(topo: Topology, fabric: Fabric) -> None:
    await side_up(fabric.b)
    spec_with(fabric.a, endpoint={"address": "172.30.0.2", "port": WG_PORT + 1})  # nobody listens
    result = await side_up(fabric.a)
    assert result.condition.reason is Reason.AWAITING_HANDSHAKE  # just applied: within the grace
    assert not ping(topo.a.ns("p1"), REMOTE_POD1, deadline=2)
    assert result.plan is not None
    state, _ = await gateway_status(result.plan, settings=fabric.a.settings)
    now = datetime.now(UTC)
    late = network_ready(state, peer_public_key=fabric.b.public_key, endpoint=result.plan.endpoint, now=now,
                         up_since=now - timedelta(seconds=60))
    assert not late.status and late.reason is Reason.NO_HANDSHAKE
    assert "no handshake with the peer at 172.30.0.2:51821 in 60s" in late.message
    # The fix is an object change and a re-apply: the tunnel then comes up.
    spec_with(fabric.a, endpoint={"address": "172.30.0.2", "port": WG_PORT})
    await side_up(fabric.a)
    assert ping(topo.a.ns("p1"), REMOTE_POD1)
    status = await record_status(fabric.a)
    assert status["conditions"][0]["status"] == "True", status


async def test_failure_midway_is_rolled_back_and_leaves_other_peers_alone(
    topo: Topology, fabric: Fabric
) -> None:
    await fabric_up(fabric)
    # A second peer on b's gateway that asks for the UDP port the first one holds: wireguard-go
    # refuses it only after its interface exists, so the rollback has something to undo.
    settings = GatewaySettings(
        iface=f"wg{topo.rid}c", gateway_ip=GATEWAY_IP, netns=topo.b.gw, listen_port=WG_PORT,
        route_table=4701, rule_priority=4701, fwmark=0x00480000, pool=IPv4Network("10.72.0.0/15"),
    )
    other = dict(fabric.b.peer, spec=dict(fabric.b.peer["spec"], clusterID=f"c-{topo.rid}"))
    spec = peer_spec_from_object(other)
    assert fabric.b.plan is not None
    plan = plan_gateway(
        LOCAL, spec, private_key=generate_private_key(), settings=settings,
        endpoint=await resolve_endpoint(spec.endpoint), taken=fabric.b.plan.peer.remapped_pod_cidrs,
    )
    with pytest.raises(TunnelError, match=r"configuring wireguard-go failed.*errno="):
        await gateway_up(plan, settings=settings)
    assert await leftovers(settings, table_name=table_name_for(spec.cluster_id)) == []
    # The first peer's tunnel is untouched.
    assert request(topo.a.ns("p1"), "http", REMOTE_POD1) == f"b-p1 {GATEWAY_IP}"
    await gateway_down(settings, table_name=table_name_for(spec.cluster_id))  # may repeat
