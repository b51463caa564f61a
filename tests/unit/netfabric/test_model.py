from __future__ import annotations

from ipaddress import IPv4Address, IPv4Network

import pytest

from netfabric.model import (
    ClusterNetwork,
    NetworkConfigError,
    PeerNetwork,
    PoolExhausted,
    Remap,
    SourceNatMode,
    parse_cidr,
)

N = IPv4Network
A = IPv4Address


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("10.244.0.0/16", N("10.244.0.0/16")),
        ("10.96.0.0/12", N("10.96.0.0/12")),
        ("192.168.1.7/32", N("192.168.1.7/32")),
    ],
)
def test_parse_cidr_accepts_strict_ipv4(value: str, expected: IPv4Network) -> None:
    assert parse_cidr(value, "podCIDRs[0]") == expected


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("10.244.0.0/33", "/0 to /32"),
        ("10.244.1.0/16", "host bits set; the network is 10.244.0.0/16"),
        ("abc", "not a valid CIDR"),
        ("", "not a valid CIDR"),
        ("10.244.0.0", "address/prefix form"),
        ("10.0.0.0/255.0.0.0", "address/prefix form"),
        (" 10.244.0.0/16", "not a valid CIDR"),
        ("fd00::/64", "IPv6"),
        ("16.0.0.0/4", "too broad"),
        ("0.0.0.0/0", "too broad"),
        (16, "expected a CIDR string"),
        (None, "expected a CIDR string"),
    ],
)
def test_parse_cidr_rejects_with_field_and_reason(value: object, fragment: str) -> None:
    with pytest.raises(NetworkConfigError) as info:
        parse_cidr(value, "podCIDRs[0]")
    assert info.value.field == "podCIDRs[0]"
    assert fragment in info.value.message
    assert str(info.value).startswith("podCIDRs[0]: ")


def test_parse_cidr_min_prefixlen_is_configurable() -> None:
    assert parse_cidr("16.0.0.0/4", "pool", min_prefixlen=4) == N("16.0.0.0/4")


def test_pool_exhausted_is_a_network_config_error() -> None:
    assert issubclass(PoolExhausted, NetworkConfigError)
    assert issubclass(NetworkConfigError, ValueError)


@pytest.mark.parametrize(
    ("original", "view", "ip", "translated"),
    [
        ("10.244.0.0/16", "10.70.0.0/16", "10.244.1.10", "10.70.1.10"),
        ("10.244.0.0/16", "10.70.0.0/16", "10.244.0.0", "10.70.0.0"),
        ("10.244.0.0/16", "10.70.0.0/16", "10.244.255.255", "10.70.255.255"),
        ("10.96.0.0/12", "10.80.0.0/12", "10.100.3.4", "10.84.3.4"),
        ("172.16.5.0/24", "172.16.5.0/24", "172.16.5.9", "172.16.5.9"),
    ],
)
def test_remap_translate_and_reverse_round_trip(original: str, view: str, ip: str, translated: str) -> None:
    remap = Remap(original=N(original), local_view=N(view))
    assert remap.translate(A(ip)) == A(translated)
    assert remap.reverse(A(translated)) == A(ip)
    assert remap.reverse(remap.translate(A(ip))) == A(ip)


def test_remap_refuses_addresses_outside_it() -> None:
    remap = Remap(original=N("10.244.0.0/16"), local_view=N("10.70.0.0/16"))
    with pytest.raises(NetworkConfigError, match=r"10\.70\.1\.10 is not inside 10\.244\.0\.0/16"):
        remap.translate(A("10.70.1.10"))
    with pytest.raises(NetworkConfigError, match=r"not inside 10\.70\.0\.0/16"):
        remap.reverse(A("10.244.1.10"))


def test_remap_requires_equal_prefix_lengths() -> None:
    with pytest.raises(NetworkConfigError) as info:
        Remap(original=N("10.244.0.0/16"), local_view=N("10.70.0.0/17"))
    assert info.value.field == "local_view"


def test_remap_identity() -> None:
    assert Remap(N("10.1.0.0/16"), N("10.1.0.0/16")).is_identity
    assert not Remap(N("10.1.0.0/16"), N("10.2.0.0/16")).is_identity


def test_source_nat_mode_values() -> None:
    assert SourceNatMode("gateway") is SourceNatMode.GATEWAY
    assert SourceNatMode("preserve") is SourceNatMode.PRESERVE


def test_cluster_network_from_strings_names_the_field() -> None:
    network = ClusterNetwork.from_strings(["10.244.0.0/16"], ["10.96.0.0/12"])
    assert network.all_cidrs == (N("10.244.0.0/16"), N("10.96.0.0/12"))
    with pytest.raises(NetworkConfigError) as info:
        ClusterNetwork.from_strings(["10.244.0.0/16"], ["10.96.0.0/12", "10.97.0.1/16"])
    assert info.value.field == "service_cidrs[1]"


@pytest.mark.parametrize(
    ("pods", "services", "field"),
    [
        ((), (), "pod_cidrs"),
        ((N("10.244.0.0/16"), N("10.244.1.0/24")), (), "pod_cidrs[1]"),
        ((N("10.244.0.0/16"),), (N("10.244.128.0/20"),), "service_cidrs[0]"),
    ],
)
def test_cluster_network_rejects_inconsistent_cidrs(
    pods: tuple[IPv4Network, ...], services: tuple[IPv4Network, ...], field: str
) -> None:
    with pytest.raises(NetworkConfigError) as info:
        ClusterNetwork(pod_cidrs=pods, service_cidrs=services)
    assert info.value.field == field


def test_peer_network_remaps_pair_originals_with_views() -> None:
    peer = PeerNetwork(
        cluster_id="provider-a",
        pod_cidrs=(N("10.244.0.0/16"),),
        service_cidrs=(N("10.96.0.0/16"),),
        remapped_pod_cidrs=(N("10.70.0.0/16"),),
        remapped_service_cidrs=(N("10.96.0.0/16"),),
    )
    assert peer.remaps == (
        Remap(N("10.244.0.0/16"), N("10.70.0.0/16")),
        Remap(N("10.96.0.0/16"), N("10.96.0.0/16")),
    )


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"cluster_id": " "}, "cluster_id"),
        ({"remapped_pod_cidrs": ()}, "remapped_pod_cidrs"),
        ({"remapped_pod_cidrs": (N("10.70.0.0/17"),)}, "remapped_pod_cidrs[0]"),
        ({"remapped_service_cidrs": (N("10.70.0.0/16"),)}, "remapped_pod_cidrs+remapped_service_cidrs[1]"),
    ],
)
def test_peer_network_validation(kwargs: dict[str, object], field: str) -> None:
    values: dict[str, object] = {
        "cluster_id": "provider-a",
        "pod_cidrs": (N("10.244.0.0/16"),),
        "service_cidrs": (N("10.96.0.0/16"),),
        "remapped_pod_cidrs": (N("10.70.0.0/16"),),
        "remapped_service_cidrs": (N("10.71.0.0/16"),),
    }
    values.update(kwargs)
    with pytest.raises(NetworkConfigError) as info:
        PeerNetwork(**values)  # type: ignore[arg-type]
    assert info.value.field == field
