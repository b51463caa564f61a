"""The network side of a peering, as pure functions: declarations, PeerNetworks, gateway slots."""

from __future__ import annotations

from typing import Any

import pytest

from peering.consumer.keys import key_updates
from peering.network import (
    PUBLIC_KEY_ANNOTATION,
    Declaration,
    DeclarationError,
    GatewayPlacement,
    declaration_from_configmap,
    free_slot,
    gateway_args,
    netns_of,
    network_ready,
    peer_network,
    slot_of,
)

KEY_A = "xTIBA5rboUvnH4htodjb6e697QjLERt1NAB4mZqp8Dg="
KEY_B = "TrMvSoP4jYQlY6RIzBgbssQqY3vxI2Pi+y71lOWWXX0="


def cm(**data: str) -> dict[str, Any]:
    return {"metadata": {"name": "gpuferry-network", "namespace": "kube-system"}, "data": data}


def test_a_full_declaration() -> None:
    d = declaration_from_configmap(
        cm(podCIDRs="10.244.0.0/16, 10.245.0.0/16", serviceCIDRs="10.96.0.0/12", gatewayNetns="gw",
           gatewayIP="10.244.0.2", endpointAddress="203.0.113.7", endpointPort="31820", mtu="1370"),
        side="provider",
    )  # fmt: skip
    assert d == Declaration(
        pod_cidrs=("10.244.0.0/16", "10.245.0.0/16"),
        service_cidrs=("10.96.0.0/12",),
        gateway_netns="gw",
        gateway_ip="10.244.0.2",
        endpoint_address="203.0.113.7",
        endpoint_port=31820,
        mtu=1370,
    )
    assert d.embedded


@pytest.mark.parametrize(
    "data,message",
    [
        ({"serviceCIDRs": "10.96.0.0/16"}, "podCIDRs is empty"),
        ({"podCIDRs": "10.244.0.1/16", "serviceCIDRs": "10.96.0.0/16"}, "'10.244.0.1/16' is not an IPv4"),
        ({"podCIDRs": "fd00::/64", "serviceCIDRs": "10.96.0.0/16"}, "is IPv6"),
        ({"podCIDRs": "10.244.0.0/16,10.244.1.0/24", "serviceCIDRs": "10.96.0.0/16"}, "overlaps"),
        ({"podCIDRs": "10.0.0.0/8", "serviceCIDRs": "10.96.0.0/16"}, "10.96.0.0/16 overlaps podCIDRs"),
        ({"podCIDRs": "10.244.0.0/16", "serviceCIDRs": "10.96.0.0/16", "gatewayIP": "10.1.0.2"},
         "gatewayIP 10.1.0.2 is not inside podCIDRs"),
        ({"podCIDRs": "10.244.0.0/16", "serviceCIDRs": "10.96.0.0/16", "endpointPort": "udp"},
         "endpointPort 'udp' is not a UDP port"),
        ({"podCIDRs": "10.244.0.0/16", "serviceCIDRs": "10.96.0.0/16", "mtu": "576"},
         "mtu '576' is not a number between 1280 and 9000"),
    ],
)
def test_bad_declarations_say_what_to_fix(data: dict[str, str], message: str) -> None:
    with pytest.raises(DeclarationError, match="consumer's network declaration") as info:
        declaration_from_configmap(cm(**data), side="consumer")
    assert message in str(info.value)


def test_no_declaration_says_how_to_make_one_or_skip_the_network() -> None:
    with pytest.raises(DeclarationError, match=r"declares no network.*or peer with --no-network"):
        declaration_from_configmap(None, side="provider")


def test_the_peer_network_describes_the_other_cluster() -> None:
    d = Declaration(pod_cidrs=("10.244.0.0/16",), service_cidrs=("10.96.0.0/16",))
    obj = peer_network(name="farm", namespace="gpuferry-system", peer_id="farm", peer=d, public_key=KEY_A,
                       endpoint=("172.31.0.2", 51820))  # fmt: skip
    assert obj["spec"] == {
        "clusterID": "farm",
        "podCIDRs": ["10.244.0.0/16"],
        "serviceCIDRs": ["10.96.0.0/16"],
        "publicKey": KEY_A,
        "endpoint": {"address": "172.31.0.2", "port": 51820},
    }
    client_side = peer_network(name="c", namespace="t", peer_id="c", peer=d, public_key=KEY_B, endpoint=None,
                               mtu=1370)  # fmt: skip
    assert "endpoint" not in client_side["spec"] and client_side["spec"]["mtu"] == 1370
    assert "mtu" not in obj["spec"]  # the CRD's default (1420) applies


def test_gateways_sharing_a_namespace_get_their_own_mark_table_port_and_interface() -> None:
    d = Declaration(
        pod_cidrs=("10.244.0.0/16",), service_cidrs=(), gateway_netns="gw", gateway_ip="10.244.0.2"
    )
    first = GatewayPlacement("farm", "a", free_slot([]), "t-a", d, listens=True)
    second = GatewayPlacement("farm", "b", free_slot([0]), "t-b", d, listens=True)
    args = [gateway_args(p) for p in (first, second)]
    for flag in ("--fwmark", "--route-table", "--listen-port", "--iface"):
        values = {a[a.index(flag) + 1] for a in args}
        assert len(values) == 2, flag
    assert [slot_of(a) for a in args] == [0, 1] and {netns_of(a) for a in args} == {"gw"}
    assert all(len(p.iface) <= 15 for p in (first, second))
    assert args[0][args[0].index("--fwmark") + 1] == "0x00470000"
    client = GatewayPlacement("c", "farm", 0, "gpuferry-system", d, listens=False)
    assert "--listen-port" not in gateway_args(client)
    with pytest.raises(DeclarationError):
        free_slot(range(64))


def test_network_ready_reads_the_gateways_condition() -> None:
    assert network_ready({}) == (None, "NotReported", "no gateway has reported on it yet")
    obj = {"status": {"conditions": [{"type": "NetworkReady", "status": "False", "reason": "NoHandshake",
                                      "message": "no handshake yet"}]}}  # fmt: skip
    assert network_ready(obj) == (False, "NoHandshake", "no handshake yet")


def pn(spec_key: str, own_key: str | None) -> dict[str, Any]:
    annotations = {PUBLIC_KEY_ANNOTATION: own_key} if own_key else {}
    return {"metadata": {"annotations": annotations}, "spec": {"publicKey": spec_key}}


def test_each_gateways_key_is_carried_into_the_other_peer_network() -> None:
    # local: the consumer's PeerNetwork (its spec holds the provider's key, its annotation the consumer's)
    assert key_updates(pn(KEY_B, KEY_A), pn(KEY_A, KEY_B)) == {}
    rotated = "0MBFSgsW8T2/1Oxt1a0Qx9uPwlaEuEOh4Xhvu8lbZUg="
    assert key_updates(pn(KEY_B, rotated), pn(KEY_A, KEY_B)) == {"remote": rotated}
    assert key_updates(pn(KEY_B, KEY_A), pn(KEY_A, rotated)) == {"local": rotated}
    assert key_updates(pn(KEY_B, None), pn(KEY_A, None)) == {}  # no gateway has reported yet
    assert key_updates(None, pn(KEY_A, KEY_B)) == {}
