"""The fabric between two clusters that both use 10.244.0.0/16: traffic, source NAT, teardown."""

from __future__ import annotations

from ipaddress import IPv4Address

from netfabric.agent import sync_node
from netfabric.conditions import Reason
from netfabric.gateway import gateway_status, leftovers
from netfabric.planning import MAIN_TABLE
from netfabric.routes import observed_routes, sync_routes
from netfabric.uapi import socket_path
from netfabric.wireguard import BackendKind, wireguard_go_pids

from .fabric import Fabric, fabric_down, fabric_up, side_up
from .topology import GATEWAY_IP, POD1_IP, POD2_IP, Topology, antispoof_drops, ns_exec, ping, request

# Each side chose 10.64.0.0/16 (the first block of the default pool) as its view of the other's
# pod CIDR 10.244.0.0/16, so 10.244.1.10 over there is 10.64.1.10 here, on both sides.
REMOTE_POD1 = IPv4Address("10.64.1.10")


async def test_both_directions_through_remapped_addresses(topo: Topology, fabric: Fabric) -> None:
    await fabric_up(fabric)
    assert fabric.a.plan is not None and fabric.b.plan is not None
    for side in fabric.sides:
        assert [(str(r.original), str(r.local_view)) for r in side.plan.remaps] == [  # type: ignore[union-attr]
            ("10.244.0.0/16", "10.64.0.0/16"),
            ("10.96.0.0/16", "10.65.0.0/16"),
        ]

    for here, there in ((topo.a, topo.b), (topo.b, topo.a)):
        client = here.ns("p1")  # 10.244.1.10, the same address as the pod it calls
        assert ping(client, REMOTE_POD1), f"ICMP {here.name} -> {there.name} failed"
        # The remote pod answers and saw its own cluster's gateway as the source.
        assert request(client, "tcp", REMOTE_POD1) == f"{there.name}-p1 {GATEWAY_IP} ping"
        assert request(client, "http", REMOTE_POD1) == f"{there.name}-p1 {GATEWAY_IP}"
        # The same pod IP inside the local cluster is still the local pod: no collision.
        assert request(here.ns("p2"), "http", POD1_IP) == f"{here.name}-p1 {POD2_IP}"
        assert request(here.ns("p2"), "http", REMOTE_POD1) == f"{there.name}-p1 {GATEWAY_IP}"
    assert antispoof_drops(topo) == 0

    for side in fabric.sides:
        assert side.plan is not None
        state, condition = await gateway_status(side.plan, settings=side.settings)
        assert condition.status, condition.message
        assert condition.reason is Reason.HANDSHAKE_RECENT
        assert state is not None and state.peers[0].rx_bytes > 0 and state.peers[0].tx_bytes > 0
        assert state.public_key == side.public_key


async def test_without_source_remapping_the_strict_cni_drops_it(topo: Topology, fabric: Fabric) -> None:
    fabric.publish(b_mode="Preserve")  # b keeps a's (remapped) source address
    await fabric_up(fabric)
    before = antispoof_drops(topo)
    assert request(topo.a.ns("p1"), "http", REMOTE_POD1, timeout=2) is None
    assert antispoof_drops(topo) > before, "the request failed, but not at the anti-spoofing rule"
    # Towards a pod the rule does not guard (on the other node), the preserved source is visible:
    # a's 10.244.1.10 as b sees it, 10.64.1.10. The tunnel itself works.
    assert request(topo.a.ns("p1"), "http", IPv4Address("10.64.2.10")) == f"b-p2 {REMOTE_POD1}"

    # Switching b back to Gateway mode is a plain re-apply, and the same request passes.
    fabric.publish(b_mode="Gateway")
    await side_up(fabric.b)
    assert request(topo.a.ns("p1"), "http", REMOTE_POD1) == f"b-p1 {GATEWAY_IP}"


async def test_teardown_leaves_nothing(topo: Topology, fabric: Fabric) -> None:
    await fabric_up(fabric)
    assert ping(topo.a.ns("p1"), REMOTE_POD1)
    for side in fabric.sides:
        assert await leftovers(side.settings, table_name=side.table_name) != []
        assert wireguard_go_pids(side.settings.iface, netns=side.settings.netns)

    await fabric_down(fabric)
    for side in fabric.sides:
        assert await leftovers(side.settings, table_name=side.table_name) == []
        assert not socket_path(side.settings.iface).exists()
        for agent in side.agents():
            assert await observed_routes(table=MAIN_TABLE, netns=agent.netns) == []
    assert not ping(topo.a.ns("p1"), REMOTE_POD1, deadline=1)
    await fabric_down(fabric)  # may repeat


async def test_backend_is_detected_without_asking(topo: Topology, fabric: Fabric) -> None:
    from netfabric.wireguard import detect_backend, kernel_wireguard_available

    backend = await detect_backend(netns=topo.a.gw)
    kernel = await kernel_wireguard_available(netns=topo.a.gw)
    assert backend.kind is (BackendKind.KERNEL if kernel else BackendKind.USERSPACE)


async def test_reapply_changes_nothing_and_mtu_follows_the_object(topo: Topology, fabric: Fabric) -> None:
    await fabric_up(fabric)
    assert ping(topo.a.ns("p1"), REMOTE_POD1)
    side = fabric.a
    assert side.plan is not None
    for agent in side.agents():
        assert await sync_node(side.plan.remaps, settings=agent) == []
    settings = side.settings
    assert await sync_routes(side.plan.routes, table=settings.route_table, netns=settings.netns) == []
    pid = wireguard_go_pids(side.settings.iface, netns=side.settings.netns)

    side.peer["spec"]["mtu"] = 1380
    await side_up(side)
    link = ns_exec(side.cluster.gw, "ip", "-o", "link", "show", side.settings.iface).stdout
    assert " mtu 1380 " in link
    # Same process, same session: the peer's traffic never stopped.
    assert wireguard_go_pids(side.settings.iface, netns=side.settings.netns) == pid
    assert request(topo.b.ns("p1"), "http", REMOTE_POD1) == f"a-p1 {GATEWAY_IP}"
