"""A PeerNetwork object (raw dict) → a validated `PeerSpec`; errors name the field.

Pure. The API server already refuses most bad objects (the CRD's schema), but the fabric must
not trust that: objects may come from an older CRD, and some checks (CIDRs of one list
overlapping each other, pod CIDRs overlapping service CIDRs) need more than a schema.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from ipaddress import IPv4Network
from typing import Any

from netfabric.ipam import parse_cidrs
from netfabric.keys import validate_key
from netfabric.model import NetworkConfigError, SourceNatMode

__all__ = ["DEFAULT_MTU", "EndpointError", "PeerSpec", "peer_spec_from_object"]

#: 1500 (a typical underlay) - 80 (WireGuard over IPv6: 40 + 8 UDP + 32 WireGuard), as wg-quick.
DEFAULT_MTU = 1420
DEFAULT_KEEPALIVE = 25


class EndpointError(NetworkConfigError):
    """The peer's endpoint cannot be resolved to a usable IPv4 address."""


@dataclass(frozen=True)
class PeerSpec:
    """What the peer published about its network (the ``spec`` of a PeerNetwork)."""

    cluster_id: str
    pod_cidrs: tuple[IPv4Network, ...]
    service_cidrs: tuple[IPv4Network, ...]
    public_key: str
    endpoint: tuple[str, int] | None = None
    """(address or DNS name, UDP port); None when the peer dials us."""
    mtu: int = DEFAULT_MTU
    source_nat_mode: SourceNatMode = SourceNatMode.GATEWAY
    keepalive_seconds: int = DEFAULT_KEEPALIVE

    def __post_init__(self) -> None:
        validate_key(self.public_key, "spec.publicKey")
        if not 1280 <= self.mtu <= 9000:
            raise NetworkConfigError(f"{self.mtu} is outside 1280..9000", "spec.mtu")
        every = self.pod_cidrs + self.service_cidrs
        for index, network in enumerate(every):
            for other in every[:index]:
                if network.overlaps(other):
                    raise NetworkConfigError(
                        f"the peer's CIDR {network} overlaps its own {other}", "spec.serviceCIDRs"
                    )

    @property
    def cidrs(self) -> tuple[IPv4Network, ...]:
        """Pod CIDRs first, then service CIDRs (the order remaps are planned and published in)."""
        return self.pod_cidrs + self.service_cidrs


def _int(spec: Mapping[str, Any], key: str, default: int) -> int:
    value = spec.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool):
        raise NetworkConfigError(f"expected an integer, got {value!r}", f"spec.{key}")
    return value


def peer_spec_from_object(obj: Mapping[str, Any]) -> PeerSpec:
    """Validate a PeerNetwork's spec; raises `NetworkConfigError` naming ``spec.<field>``."""
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        raise NetworkConfigError("the object has no spec", "spec")
    cluster_id = spec.get("clusterID")
    if not isinstance(cluster_id, str) or not cluster_id:
        raise NetworkConfigError(f"expected a cluster id, got {cluster_id!r}", "spec.clusterID")
    pods = parse_cidrs(spec.get("podCIDRs") or [], "spec.podCIDRs")
    if not pods:
        raise NetworkConfigError("at least one pod CIDR is required", "spec.podCIDRs")
    services = parse_cidrs(spec.get("serviceCIDRs") or [], "spec.serviceCIDRs")
    key = spec.get("publicKey")
    if not isinstance(key, str):
        raise NetworkConfigError(f"expected a base64 key, got {key!r}", "spec.publicKey")
    endpoint: tuple[str, int] | None = None
    raw_endpoint = spec.get("endpoint")
    if raw_endpoint is not None:
        if not isinstance(raw_endpoint, Mapping):
            raise NetworkConfigError(f"expected {{address, port}}, got {raw_endpoint!r}", "spec.endpoint")
        address = raw_endpoint.get("address")
        port = raw_endpoint.get("port")
        if not isinstance(address, str) or not address:
            raise NetworkConfigError(f"expected an address, got {address!r}", "spec.endpoint.address")
        if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
            raise NetworkConfigError(f"expected a UDP port, got {port!r}", "spec.endpoint.port")
        endpoint = (address, port)
    mode_text = str(spec.get("sourceNatMode", "Gateway"))
    try:
        mode = SourceNatMode(mode_text.lower())
    except ValueError:
        raise NetworkConfigError(
            f"{mode_text!r} is not one of Gateway, Preserve", "spec.sourceNatMode"
        ) from None
    return PeerSpec(
        cluster_id=cluster_id,
        pod_cidrs=tuple(pods),
        service_cidrs=tuple(services),
        public_key=key,
        endpoint=endpoint,
        mtu=_int(spec, "mtu", DEFAULT_MTU),
        source_nat_mode=mode,
        keepalive_seconds=_int(spec, "keepaliveSeconds", DEFAULT_KEEPALIVE),
    )
