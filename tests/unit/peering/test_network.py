"""The network side of a peering, as pure functions: declarations and what gateways report.
(What crosses between the clusters is in test_exchange.py; gateway slots in tests/unit/netfabric.)"""

from __future__ import annotations

from typing import Any

import pytest

from peering.network import (
    Declaration,
    DeclarationError,
    declaration_from_configmap,
    network_ready,
)
from peering.provider.networks import accepted_network


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
        (
            {"podCIDRs": "10.244.0.0/16", "serviceCIDRs": "10.96.0.0/16", "gatewayIP": "10.1.0.2"},
            "gatewayIP 10.1.0.2 is not inside podCIDRs",
        ),
        (
            {"podCIDRs": "10.244.0.0/16", "serviceCIDRs": "10.96.0.0/16", "endpointPort": "udp"},
            "endpointPort 'udp' is not a UDP port",
        ),
        (
            {"podCIDRs": "10.244.0.0/16", "serviceCIDRs": "10.96.0.0/16", "mtu": "576"},
            "mtu '576' is not a number between 1280 and 9000",
        ),
    ],
)
def test_bad_declarations_say_what_to_fix(data: dict[str, str], message: str) -> None:
    with pytest.raises(DeclarationError, match="consumer's network declaration") as info:
        declaration_from_configmap(cm(**data), side="consumer")
    assert message in str(info.value)


def test_no_declaration_says_how_to_make_one_or_skip_the_network() -> None:
    with pytest.raises(DeclarationError, match=r"declares no network.*or peer with --no-network"):
        declaration_from_configmap(None, side="provider")


def test_network_ready_reads_the_gateways_condition() -> None:
    assert network_ready({}) == (None, "NotReported", "no gateway has reported on it yet")
    obj = {"status": {"conditions": [{"type": "NetworkReady", "status": "False", "reason": "NoHandshake",
                                      "message": "no handshake yet"}]}}  # fmt: skip
    assert network_ready(obj) == (False, "NoHandshake", "no handshake yet")


def test_the_provider_routes_the_cidrs_it_accepted_and_takes_only_the_key_from_the_consumer() -> None:
    """Issue 16 §4: what the consumer writes later into spec.network changes its key, not its CIDRs."""
    key = "A" * 43 + "="
    first = {
        "spec": {
            "network": {"podCIDRs": ["10.244.0.0/16"], "serviceCIDRs": ["10.96.0.0/16"], "publicKey": key}
        }
    }
    assert accepted_network(first) == (
        {"podCIDRs": ["10.244.0.0/16"], "serviceCIDRs": ["10.96.0.0/16"], "publicKey": key},
        None,
    )
    rotated = {
        **first,
        "status": {"acceptedNetwork": {"podCIDRs": ["10.244.0.0/16"], "serviceCIDRs": ["10.96.0.0/16"]}},
    }
    rotated["spec"] = {"network": {**first["spec"]["network"], "publicKey": "B" * 43 + "="}}
    assert accepted_network(rotated)[0]["publicKey"] == "B" * 43 + "="  # type: ignore[index]
    hostile = {**rotated, "spec": {"network": {"podCIDRs": ["172.16.0.0/12"], "publicKey": key}}}
    routed, why = accepted_network(hostile)
    assert routed == {"podCIDRs": ["10.244.0.0/16"], "serviceCIDRs": ["10.96.0.0/16"], "publicKey": key}
    assert why == (
        "the consumer asks for pod CIDRs 172.16.0.0/12 and Service CIDRs none; the provider routes "
        "the accepted 10.244.0.0/16 and 10.96.0.0/16 (a provider operator approves new CIDRs by "
        "writing them into the Tenant's status.acceptedNetwork)"
    )
    assert accepted_network({"spec": {}}) == (None, None)
