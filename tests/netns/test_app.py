"""The gateway process's logic (GatewayRunner) and the agent's view of PeerNetwork status."""

from __future__ import annotations

import asyncio
from ipaddress import IPv4Address
from typing import Any

from netfabric.agent import sync_node, teardown_node
from netfabric.app import GatewayRunner, remaps_from_status
from netfabric.gateway import leftovers

from .fabric import LOCAL, Fabric, Side
from .test_lifecycle import kill_gateway_process
from .topology import GATEWAY_IP, Topology, ping, request

REMOTE_POD1 = IPv4Address("10.64.1.10")


def as_object(side: Side, generation: int, status: dict[str, Any]) -> dict[str, Any]:
    return {
        **side.peer,
        "metadata": {"name": "peer", "namespace": "tenant", "generation": generation},
        "status": status,
    }


async def until_ready(runner: GatewayRunner, side: Side, generation: int, status: dict[str, Any]) -> None:
    for _ in range(50):
        status.update(await runner.on_object(as_object(side, generation, status)))
        if status["conditions"][0]["status"] == "True":
            return
        await asyncio.sleep(0.1)
    raise AssertionError(status)


async def test_runner_reconciles_refreshes_recovers_and_tears_down(topo: Topology, fabric: Fabric) -> None:
    runners = {
        side.cluster.name: GatewayRunner(local=LOCAL, settings=side.settings, private_key=side.private_key)
        for side in fabric.sides
    }
    statuses: dict[str, dict[str, Any]] = {"a": {}, "b": {}}
    for side in (fabric.b, fabric.a):
        name = side.cluster.name
        statuses[name].update(await runners[name].on_object(as_object(side, 1, statuses[name])))
        assert statuses[name]["remappedPodCIDRs"] == ["10.64.0.0/16"]
        # The node agents learn the remaps from the published status alone.
        for agent in side.agents():
            await sync_node(remaps_from_status(as_object(side, 1, statuses[name])), settings=agent)
    # The persistent keepalive starts the handshake without any traffic.
    await until_ready(runners["a"], fabric.a, 1, statuses["a"])
    await until_ready(runners["b"], fabric.b, 1, statuses["b"])
    assert statuses["b"]["peerEndpoint"].startswith("172.30.0.1:")
    assert request(topo.a.ns("p1"), "http", REMOTE_POD1) == f"b-p1 {GATEWAY_IP}"

    # A refresh that finds the tunnel gone re-applies it: the process restarts by itself.
    kill_gateway_process(fabric.b)
    statuses["b"].update(await runners["b"].on_object(as_object(fabric.b, 1, statuses["b"])))
    assert ping(topo.a.ns("p1"), REMOTE_POD1)

    # A spec change (new generation) is applied: here a bad one, refused with nothing touched.
    fabric.a.peer["spec"]["podCIDRs"] = ["10.244.0.1/16"]
    refused = await runners["a"].on_object(as_object(fabric.a, 2, statuses["a"]))
    assert refused["conditions"][0]["reason"] == "InvalidConfig"
    assert "has host bits set" in refused["conditions"][0]["message"]
    assert ping(topo.a.ns("p1"), REMOTE_POD1)  # the last good configuration stays in place

    for side in fabric.sides:
        await runners[side.cluster.name].on_deleted(as_object(side, 2, statuses[side.cluster.name]))
        for agent in side.agents():
            await teardown_node(settings=agent)
        assert await leftovers(side.settings, table_name=side.table_name) == []
    assert not ping(topo.a.ns("p1"), REMOTE_POD1, deadline=1)

