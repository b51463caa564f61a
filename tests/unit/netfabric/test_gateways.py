"""Gateways sharing a network namespace: each PeerNetwork gets its own slot (firewall mark,
routing table, listen port when the peer dials in) and a host-unique interface. Pure."""

from __future__ import annotations

from ipaddress import IPv4Address
from typing import Any

import pytest

from kube.declaration import Declaration
from kube.objects import ObjectKey
from netfabric.gateways import GatewaysSettings, free_slot, iface_name, placement, slot_of

DECLARED = Declaration(
    pod_cidrs=("10.244.0.0/16",),
    service_cidrs=("10.96.0.0/16",),
    gateway_netns="gw",
    gateway_ip="10.244.0.2",
    endpoint_port=51820,
    mtu=1380,
)


def peer_network(name: str, namespace: str, *, dials: bool, slot: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "clusterID": name,
        "podCIDRs": ["10.244.0.0/16"],
        "serviceCIDRs": ["10.96.0.0/16"],
    }
    if dials:
        spec["endpoint"] = {"address": "172.31.0.2", "port": 51820}
    annotations = {"net.gpuferry.io/slot": slot} if slot is not None else {}
    return {"metadata": {"name": name, "namespace": namespace, "annotations": annotations}, "spec": spec}


def test_two_gateways_in_one_namespace_never_share_a_mark_table_port_or_interface() -> None:
    first = placement(peer_network("a", "gpuferry-tenant-a", dials=False), 0, DECLARED, GatewaysSettings())
    second = placement(peer_network("b", "gpuferry-tenant-b", dials=False), 1, DECLARED, GatewaysSettings())
    pair = (first.settings, second.settings)
    for attribute in ("fwmark", "route_table", "rule_priority", "listen_port", "iface"):
        assert getattr(pair[0], attribute) != getattr(pair[1], attribute), attribute
    assert first.settings.fwmark == 0x00470000 and first.settings.listen_port == 51820
    assert second.settings.listen_port == 51821 and second.settings.route_table == 4701
    assert all(len(p.iface) <= 15 for p in (first, second))
    assert first.settings.netns == "gw" and first.settings.gateway_ip == IPv4Address("10.244.0.2")
    assert first.settings.mtu == 1380, "the cluster's declared MTU"
    assert first.key_secret == "gpuferry-gateway-a"


def test_a_gateway_that_dials_listens_on_no_port_and_flags_win_over_the_declaration() -> None:
    client = placement(
        peer_network("farm", "gpuferry-system", dials=True),
        3,
        DECLARED,
        GatewaysSettings(netns="other", gateway_ip=IPv4Address("10.244.9.9")),
    )
    assert client.settings.listen_port is None
    assert client.settings.netns == "other" and client.settings.gateway_ip == IPv4Address("10.244.9.9")
    nowhere = Declaration(pod_cidrs=("10.244.0.0/16",), service_cidrs=("10.96.0.0/16",))
    with pytest.raises(ValueError, match="no gateway IP"):
        placement(peer_network("farm", "gpuferry-system", dials=True), 0, nowhere, GatewaysSettings())


def test_slots_are_kept_on_the_object_and_the_lowest_free_one_is_taken() -> None:
    assert slot_of(peer_network("a", "n", dials=False, slot="7")) == 7
    assert slot_of(peer_network("a", "n", dials=False)) is None
    assert slot_of(peer_network("a", "n", dials=False, slot="x")) is None
    assert slot_of(peer_network("a", "n", dials=False, slot="64")) is None, "out of range"
    assert free_slot(set()) == 0 and free_slot({0, 1, 3}) == 2
    with pytest.raises(ValueError):
        free_slot(set(range(64)))
    assert iface_name(ObjectKey("a", "b")) != iface_name(ObjectKey("b", "a"))


def test_two_clusters_on_one_host_never_share_an_interface_name() -> None:
    """Two providers of one consumer both have gpuferry-tenant-ml-eu/ml-eu; wireguard-go's
    control socket is per name, not per netns: the federation test's gateways once collided."""
    key = ObjectKey("gpuferry-tenant-ml-eu", "ml-eu")
    assert iface_name(key, "gf-test-provider") != iface_name(key, "gf-test-provider-b")
    assert iface_name(key) == iface_name(key, None), "in its own netns the name is as before"
    assert len(iface_name(key, "gf-test-provider-b")) <= 15
