"""The route agent's routes on a node whose CNI routes each pod by a ``scope host`` /32 (the ptp
plugin, as on the local clusters' real nodes): a route *via* the gateway pod only works on-link
through the pod's veth; without it the kernel ignores the gateway and asks for the peer address
itself on the veth, which nobody answers."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from ipaddress import IPv4Address, IPv4Network

import pytest

from netfabric.agent import AgentSettings, sync_node, teardown_node
from netfabric.model import Remap
from netfabric.routes import device_towards

from .topology import ns_exec, sh

GATEWAY_POD = "10.244.10.6"
REMAP = Remap(IPv4Network("10.244.0.0/16"), IPv4Network("10.64.0.0/16"))


@pytest.fixture
def node() -> Iterator[tuple[str, str]]:
    """A node namespace and a gateway "pod" namespace joined by a veth, routed as ptp does."""
    rid = uuid.uuid4().hex[:6]
    node, pod, veth = f"gfrt{rid}n", f"gfrt{rid}p", f"vrt{rid}"
    sh("ip", "netns", "add", node)
    sh("ip", "netns", "add", pod)
    try:
        sh("ip", "-n", node, "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", pod)
        ns_exec(node, "ip", "addr", "add", "10.244.10.1/32", "dev", veth)
        ns_exec(node, "ip", "link", "set", veth, "up")
        ns_exec(node, "ip", "route", "add", f"{GATEWAY_POD}/32", "dev", veth, "scope", "host")
        ns_exec(pod, "ip", "addr", "add", f"{GATEWAY_POD}/24", "dev", "eth0")
        ns_exec(pod, "ip", "link", "set", "eth0", "up")
        ns_exec(pod, "ip", "link", "set", "lo", "up")
        yield node, veth
    finally:
        sh("ip", "netns", "del", node, check=False)
        sh("ip", "netns", "del", pod, check=False)


def route_get(netns: str, address: str) -> str:
    return ns_exec(netns, "ip", "route", "get", address).stdout


async def test_the_gateway_pod_on_this_node_is_routed_on_link(node: tuple[str, str]) -> None:
    netns, veth = node
    assert await device_towards(IPv4Address(GATEWAY_POD), netns=netns) == veth
    settings = AgentSettings(next_hop=IPv4Address(GATEWAY_POD), dev=veth, onlink=True, netns=netns)
    assert len(await sync_node([REMAP], settings=settings)) == 1
    assert f"via {GATEWAY_POD} dev {veth}" in route_get(netns, "10.64.20.7")
    assert await sync_node([REMAP], settings=settings) == []  # read back as it was made: nothing to do
    # and the pod answers for its address on that link: the node learns its MAC
    ns_exec(netns, "ping", "-c", "1", "-W", "2", GATEWAY_POD)
    assert "lladdr" in ns_exec(netns, "ip", "neigh", "show", GATEWAY_POD).stdout
    await teardown_node(settings=settings)
    assert "10.64.0.0/16" not in ns_exec(netns, "ip", "route").stdout


async def test_without_on_link_a_gateway_behind_a_host_route_is_ignored(node: tuple[str, str]) -> None:
    """Why the agent asks for on-link: the same route made plainly loses its gateway."""
    netns, _ = node
    plain = AgentSettings(next_hop=IPv4Address(GATEWAY_POD), netns=netns)
    await sync_node([REMAP], settings=plain)
    assert "via" not in route_get(netns, "10.64.20.7")
    await teardown_node(settings=plain)
