"""Recovery: a killed gateway process and rotated keys bring the tunnel back without manual steps."""

from __future__ import annotations

import os
import signal
import time
from ipaddress import IPv4Address

from netfabric.gateway import gateway_status
from netfabric.keys import generate_private_key
from netfabric.wgconfig import parse_endpoint
from netfabric.wireguard import wireguard_go_pids

from .fabric import Fabric, Side, fabric_up, record_status, side_up
from .topology import GATEWAY_IP, WAN, Topology, ping, request

REMOTE_POD1 = IPv4Address("10.64.1.10")


def kill_gateway_process(side: Side) -> None:
    pids = wireguard_go_pids(side.settings.iface, netns=side.settings.netns)
    assert len(pids) == 1, pids
    os.kill(pids[0], signal.SIGKILL)
    for _ in range(100):
        if not wireguard_go_pids(side.settings.iface, netns=side.settings.netns):
            return
        time.sleep(0.02)
    raise AssertionError(f"wireguard-go {pids[0]} survived SIGKILL")


def wait_for_traffic(client_ns: str, *, within: float) -> float:
    """Seconds until an ICMP round trip succeeds again (fails after ``within``)."""
    start = time.monotonic()
    while time.monotonic() - start < within:
        if ping(client_ns, REMOTE_POD1, deadline=2):
            return time.monotonic() - start
    raise AssertionError(f"no traffic from {client_ns} to {REMOTE_POD1} within {within}s")


async def test_consumer_gateway_killed_and_restarted(topo: Topology, fabric: Fabric) -> None:
    await fabric_up(fabric)
    assert ping(topo.a.ns("p1"), REMOTE_POD1)

    kill_gateway_process(fabric.a)
    assert not ping(topo.a.ns("p1"), REMOTE_POD1, deadline=1)
    assert fabric.a.plan is not None
    _, condition = await gateway_status(fabric.a.plan, settings=fabric.a.settings)
    assert not condition.status and condition.reason == "TunnelDown"

    await side_up(fabric.a)  # what the gateway's reconcile loop does on its next pass
    wait_for_traffic(topo.a.ns("p1"), within=10)
    # The provider, which cannot dial the consumer, is reachable back through the new session.
    assert request(topo.b.ns("p1"), "http", REMOTE_POD1) == f"a-p1 {GATEWAY_IP}"


async def test_provider_gateway_killed_and_restarted(topo: Topology, fabric: Fabric) -> None:
    await fabric_up(fabric)
    assert ping(topo.a.ns("p1"), REMOTE_POD1)
    # The status pass records where the client was last seen from (status.peerEndpoint).
    status = await record_status(fabric.b)
    assert parse_endpoint(status["peerEndpoint"])[0] == WAN["a"]
    assert status["conditions"][0]["status"] == "True"
    assert status["backend"] in ("kernel", "userspace")
    assert status["remappedPodCIDRs"] == ["10.64.0.0/16"] and status["gatewayAddress"] == str(GATEWAY_IP)

    kill_gateway_process(fabric.b)
    assert not ping(topo.a.ns("p1"), REMOTE_POD1, deadline=1)
    await side_up(fabric.b)
    # The restarted server dials the client at once: no wait for the client's rekey timeout.
    assert wait_for_traffic(topo.a.ns("p1"), within=10) < 5
    assert request(topo.b.ns("p1"), "http", REMOTE_POD1) == f"a-p1 {GATEWAY_IP}"


async def test_key_rotation_on_either_side(topo: Topology, fabric: Fabric) -> None:
    await fabric_up(fabric)
    assert ping(topo.a.ns("p1"), REMOTE_POD1)

    for side in (fabric.a, fabric.b):
        old = side.public_key
        side.private_key = generate_private_key()
        fabric.publish()  # the new public key reaches the peer's PeerNetwork
        await side_up(side)
        await side_up(fabric.b if side is fabric.a else fabric.a)
        wait_for_traffic(topo.a.ns("p1"), within=10)
        assert request(topo.b.ns("p1"), "http", REMOTE_POD1) == f"a-p1 {GATEWAY_IP}"
        for each in fabric.sides:
            assert each.plan is not None
            state, condition = await gateway_status(each.plan, settings=each.settings)
            assert condition.status, condition.message
            assert state is not None
            assert [peer.public_key for peer in state.peers] == [each.peer["spec"]["publicKey"]]
            assert old not in {state.public_key, *(peer.public_key for peer in state.peers)}
