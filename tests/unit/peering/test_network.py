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


def test_network_ready_reads_the_gateways_condition() -> None:
    assert network_ready({}) == (None, "NotReported", "no gateway has reported on it yet")
    obj = {"status": {"conditions": [{"type": "NetworkReady", "status": "False", "reason": "NoHandshake",
                                      "message": "no handshake yet"}]}}  # fmt: skip
    assert network_ready(obj) == (False, "NoHandshake", "no handshake yet")
