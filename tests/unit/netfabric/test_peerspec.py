from __future__ import annotations

from dataclasses import replace
from ipaddress import IPv4Address, IPv4Network
from typing import Any

import pytest

from kube.declaration import DeclarationError, declaration_from_configmap
from netfabric.gateway import GatewaySettings, plan_gateway, refuse_reserved
from netfabric.gateways import declared_network
from netfabric.keys import generate_private_key, public_key
from netfabric.model import ClusterNetwork, NetworkConfigError, PoolExhausted, Reserved, SourceNatMode
from netfabric.peerspec import PeerSpec, peer_spec_from_object

KEY = public_key(generate_private_key())
PRIVATE = generate_private_key()
LOCAL = ClusterNetwork.from_strings(["10.244.0.0/16"], ["10.96.0.0/16"])
# the pool these tests were written against (two /16s); the default is larger
SETTINGS = GatewaySettings(
    iface="gf-b", gateway_ip=IPv4Address("10.244.2.5"), listen_port=51820, pool=IPv4Network("10.70.0.0/15")
)


def obj(**spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "clusterID": "provider-1",
        "podCIDRs": ["10.244.0.0/16"],
        "serviceCIDRs": ["10.96.0.0/16"],
        "publicKey": KEY,
        "endpoint": {"address": "192.0.2.7", "port": 31820},
    }
    base.update(spec)
    return {"spec": {k: v for k, v in base.items() if v is not None}}


def test_defaults_and_modes() -> None:
    spec = peer_spec_from_object(obj())
    assert spec.cidrs == (IPv4Network("10.244.0.0/16"), IPv4Network("10.96.0.0/16"))
    assert spec.endpoint == ("192.0.2.7", 31820)
    assert (spec.mtu, spec.keepalive_seconds, spec.source_nat_mode) == (1420, 25, SourceNatMode.GATEWAY)
    assert peer_spec_from_object(obj(sourceNatMode="Preserve")).source_nat_mode is SourceNatMode.PRESERVE
    assert peer_spec_from_object(obj(endpoint=None)).endpoint is None


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"clusterID": ""}, "spec.clusterID"),
        ({"podCIDRs": []}, "spec.podCIDRs"),
        ({"podCIDRs": "10.244.0.0/16"}, "spec.podCIDRs"),
        ({"podCIDRs": ["10.244.0.0/16", "10.244.1.0/24"]}, "spec.podCIDRs[1]"),
        ({"serviceCIDRs": ["10.244.0.0/24"]}, "spec.serviceCIDRs"),
        ({"publicKey": 5}, "spec.publicKey"),
        ({"endpoint": {"address": "", "port": 1}}, "spec.endpoint.address"),
        ({"endpoint": {"address": "gw", "port": 0}}, "spec.endpoint.port"),
        ({"mtu": 576}, "spec.mtu"),
        ({"mtu": "1420"}, "spec.mtu"),
        ({"sourceNatMode": "Masquerade"}, "spec.sourceNatMode"),
    ],
)
def test_bad_specs_name_the_field(spec: dict[str, Any], field: str) -> None:
    with pytest.raises(NetworkConfigError) as caught:
        peer_spec_from_object(obj(**spec))
    assert caught.value.field == field


def plan(spec: PeerSpec, **kwargs: Any) -> Any:
    return plan_gateway(LOCAL, spec, private_key=PRIVATE, settings=kwargs.pop("settings", SETTINGS), **kwargs)


def test_plan_remaps_overlaps_and_routes_originals_to_the_tunnel() -> None:
    result = plan(peer_spec_from_object(obj()), endpoint=(IPv4Address("192.0.2.7"), 31820))
    assert [(str(r.original), str(r.local_view)) for r in result.remaps] == [
        ("10.244.0.0/16", "10.70.0.0/16"),
        ("10.96.0.0/16", "10.71.0.0/16"),
    ]
    assert result.peer.remapped_pod_cidrs == (IPv4Network("10.70.0.0/16"),)
    assert [str(r.dest) for r in result.routes] == ["10.244.0.0/16", "10.96.0.0/16"]
    assert {r.table for r in result.routes} == {SETTINGS.route_table}
    peer = result.device.peers[0]
    assert peer.allowed_ips == (IPv4Network("10.244.0.0/16"), IPv4Network("10.96.0.0/16"))
    assert result.endpoint == "192.0.2.7:31820"
    assert "snat ip to 10.244.2.5" in result.nft_script
    assert result.table_name == "gpuferry_provider_1_" + result.table_name.rsplit("_", 1)[1]


def test_plan_keeps_published_remaps_and_uses_last_seen_endpoint() -> None:
    spec = peer_spec_from_object(obj(endpoint=None))
    kept = plan(spec, existing={"10.244.0.0/16": IPv4Network("10.71.0.0/16")})
    assert kept.peer.remapped_pod_cidrs == (IPv4Network("10.71.0.0/16"),)
    assert kept.peer.remapped_service_cidrs == (IPv4Network("10.70.0.0/16"),)
    seen = plan(spec, last_seen=(IPv4Address("198.51.100.4"), 40000))
    assert seen.device.peers[0].endpoint == (IPv4Address("198.51.100.4"), 40000)


def test_plan_refuses_bad_local_settings_and_exhausted_pools() -> None:
    spec = peer_spec_from_object(obj())
    with pytest.raises(NetworkConfigError, match="not inside the local pod CIDRs"):
        plan(spec, settings=GatewaySettings(iface="gf-b", gateway_ip=IPv4Address("192.168.0.1")))
    with pytest.raises(PoolExhausted):
        plan(
            spec,
            settings=GatewaySettings(
                iface="gf-b", gateway_ip=IPv4Address("10.244.2.5"), pool=IPv4Network("10.70.0.0/16")
            ),
        )
    with pytest.raises(NetworkConfigError, match="our own"):
        plan(peer_spec_from_object(obj(publicKey=public_key(PRIVATE))))


def test_a_peer_cidr_over_this_sides_own_ranges_is_refused_unless_it_is_remapped() -> None:
    """Issue 16 §4: a consumer that claimed 172.16.0.0/12 had the provider's gateway route its own
    WAN to the tunnel. Ranges outside the local pod and Service CIDRs are refused by name; a peer
    CIDR that overlaps a local CIDR is remapped (reached under another view), as before."""
    wan = Reserved(IPv4Network("172.31.0.0/24"), "this gateway's own address range on wan")
    local = replace(
        LOCAL, reserved=(wan, Reserved(IPv4Network("192.168.7.0/24"), "this cluster's node CIDR"))
    )
    with pytest.raises(NetworkConfigError) as caught:
        plan_gateway(local, peer_spec_from_object(obj(podCIDRs=["10.244.0.0/16", "172.16.0.0/12"])),
                     private_key=PRIVATE, settings=SETTINGS)  # fmt: skip
    assert caught.value.field == "spec.podCIDRs[1]"
    assert caught.value.message == (
        "the peer's CIDR 172.16.0.0/12 overlaps this gateway's own address range on wan (172.31.0.0/24): "
        "routing it to the tunnel would hand this side's own traffic to the peer"
    )
    with pytest.raises(
        NetworkConfigError, match=r"overlaps this cluster's node CIDR \(192.168.7.0/24\)"
    ) as caught:
        refuse_reserved(local, peer_spec_from_object(obj(serviceCIDRs=["192.168.0.0/16"])))
    assert caught.value.field == "spec.serviceCIDRs[0]"
    # beside, not over: planned; the usual 10.244/16 overlap with local pods: remapped, not refused
    fine = plan_gateway(local, peer_spec_from_object(obj(podCIDRs=["10.244.0.0/16", "172.30.0.0/16"])),
                        private_key=PRIVATE, settings=SETTINGS)  # fmt: skip
    assert [str(r.original) for r in fine.remaps][:2] == ["10.244.0.0/16", "172.30.0.0/16"]
    over_local = replace(LOCAL, reserved=(Reserved(IPv4Network("10.0.0.0/8"), "this cluster's node CIDR"),))
    assert plan_gateway(
        over_local, peer_spec_from_object(obj()), private_key=PRIVATE, settings=SETTINGS
    ).remaps


def test_a_declaration_reserves_its_node_cidrs_and_its_endpoint() -> None:
    declared = declaration_from_configmap(
        {"data": {"podCIDRs": "10.244.0.0/16", "serviceCIDRs": "10.96.0.0/16", "nodeCIDRs": "172.31.0.0/24",
                  "endpointAddress": "203.0.113.9"}}, side="provider")  # fmt: skip
    assert [(str(r.network), r.what) for r in declared_network(declared).reserved] == [
        ("172.31.0.0/24", "this cluster's node CIDR"),
        ("203.0.113.9/32", "this cluster's gateway endpoint"),
    ]
    named = declaration_from_configmap(
        {
            "data": {
                "podCIDRs": "10.244.0.0/16",
                "serviceCIDRs": "10.96.0.0/16",
                "endpointAddress": "gw.example.com",
            }
        },
        side="provider",
    )
    assert declared_network(named).reserved == ()  # a DNS name: nothing to reserve by address
    with pytest.raises(DeclarationError, match=r"nodeCIDRs '172\.31\.0\.1/24' is not an IPv4 network"):
        declaration_from_configmap(
            {
                "data": {
                    "podCIDRs": "10.244.0.0/16",
                    "serviceCIDRs": "10.96.0.0/16",
                    "nodeCIDRs": "172.31.0.1/24",
                }
            },
            side="provider",
        )
