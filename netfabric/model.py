"""Desired state of the network fabric: frozen dataclasses, validated on construction.

Pure: no I/O, no imports of other gpuferry packages. Everything here is IPv4 only; an IPv6
prefix is rejected with a clear `NetworkConfigError` rather than half-supported.

Vocabulary used across ``netfabric``:

- *original*: an address or CIDR as the cluster that owns it knows it (the peer's real pod IPs).
- *local view*: the CIDR under which the local cluster reaches a peer CIDR. It equals the original
  unless the original overlaps a local CIDR (or another peer's view), in which case the local side
  picks a free block from its remap pool and the gateway translates 1:1, host bits kept.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Network, IPv6Network, ip_network

__all__ = [
    "ClusterNetwork",
    "NetworkConfigError",
    "PeerNetwork",
    "PoolExhausted",
    "Remap",
    "Reserved",
    "SourceNatMode",
    "parse_cidr",
]

#: A CIDR broader than this (e.g. ``10.0.0.0/4``) is refused: it would swallow unrelated ranges.
MIN_PREFIXLEN = 8

_CIDR_RE = re.compile(r"^[0-9.]+/[0-9]{1,2}$")


class NetworkConfigError(ValueError):
    """Invalid network configuration; ``field`` names the offending input (e.g. ``podCIDRs[1]``).

    Raised by validation, never by I/O: the input must be fixed, retrying does not help.
    """

    def __init__(self, message: str, field: str) -> None:
        super().__init__(f"{field}: {message}")
        self.message = message
        self.field = field


class PoolExhausted(NetworkConfigError):
    """The remap pool has no free block left for a peer CIDR that needs remapping."""


class SourceNatMode(enum.StrEnum):
    """What the gateway does to the source of traffic entering the cluster from the tunnel."""

    GATEWAY = "gateway"
    """SNAT to the gateway's own pod IP: a strict CNI (Cilium anti-spoofing) accepts it. Default."""

    PRESERVE = "preserve"
    """Keep the peer's source in the local view (remapped if it overlaps); needs a tolerant CNI."""


def parse_cidr(value: object, field: str, *, min_prefixlen: int = MIN_PREFIXLEN) -> IPv4Network:
    """Parse one strict IPv4 CIDR such as ``"10.244.0.0/16"``.

    Strict means: a string, an explicit ``/prefix`` in decimal, no host bits set, IPv4 only and a
    prefix length of at least ``min_prefixlen``. Errors name ``field`` and say what is wrong.
    """
    if not isinstance(value, str):
        raise NetworkConfigError(f"expected a CIDR string like '10.244.0.0/16', got {value!r}", field)
    if _CIDR_RE.match(value) and int(value.rpartition("/")[2]) > 32:
        raise NetworkConfigError(
            f"{value!r} has prefix length /{value.rpartition('/')[2]}; an IPv4 prefix is /0 to /32", field
        )
    try:
        network = ip_network(value, strict=False)
    except ValueError:
        raise NetworkConfigError(
            f"{value!r} is not a valid CIDR (expected e.g. '10.244.0.0/16')", field
        ) from None
    if isinstance(network, IPv6Network):
        raise NetworkConfigError(f"{value!r} is IPv6; only IPv4 CIDRs are supported", field)
    if not _CIDR_RE.match(value):
        raise NetworkConfigError(
            f"{value!r} is not in address/prefix form (expected e.g. '10.244.0.0/16')", field
        )
    if str(network) != value:
        raise NetworkConfigError(
            f"{value!r} has host bits set; the network is {network} (did you mean that?)", field
        )
    if network.prefixlen < min_prefixlen:
        raise NetworkConfigError(
            f"{value!r} is too broad: prefix /{network.prefixlen} is shorter than /{min_prefixlen}", field
        )
    return network


def _check_networks(values: tuple[IPv4Network, ...], field: str) -> None:
    if not isinstance(values, tuple):
        raise NetworkConfigError(f"expected a tuple of IPv4Network, got {type(values).__name__}", field)
    for index, network in enumerate(values):
        if not isinstance(network, IPv4Network):
            raise NetworkConfigError(f"expected an IPv4Network, got {network!r}", f"{field}[{index}]")
        for other_index, other in enumerate(values[:index]):
            if network.overlaps(other):
                raise NetworkConfigError(
                    f"{network} overlaps {other} ({field}[{other_index}])", f"{field}[{index}]"
                )


@dataclass(frozen=True)
class Remap:
    """A 1:1 prefix mapping of a peer CIDR (``original``) onto its ``local_view``.

    Host bits are kept: with 10.244.0.0/16 → 10.70.0.0/16, 10.244.1.10 ↔ 10.70.1.10. An identity
    remap (``original == local_view``) is how a non-overlapping peer CIDR is represented.
    """

    original: IPv4Network
    local_view: IPv4Network

    def __post_init__(self) -> None:
        for name in ("original", "local_view"):
            if not isinstance(getattr(self, name), IPv4Network):
                raise NetworkConfigError(f"expected an IPv4Network, got {getattr(self, name)!r}", name)
        if self.original.prefixlen != self.local_view.prefixlen:
            raise NetworkConfigError(
                f"{self.local_view} must have the same prefix length as {self.original}"
                f" (/{self.original.prefixlen}) for a 1:1 mapping",
                "local_view",
            )

    @property
    def is_identity(self) -> bool:
        return self.original == self.local_view

    def translate(self, ip: IPv4Address) -> IPv4Address:
        """Original address → the same host in the local view."""
        return self._move(ip, self.original, self.local_view)

    def reverse(self, ip: IPv4Address) -> IPv4Address:
        """Local-view address → the same host in the original CIDR."""
        return self._move(ip, self.local_view, self.original)

    @staticmethod
    def _move(ip: IPv4Address, source: IPv4Network, target: IPv4Network) -> IPv4Address:
        if ip not in source:
            raise NetworkConfigError(f"{ip} is not inside {source}", "ip")
        host_bits = int(ip) & int(source.hostmask)
        return IPv4Address(int(target.network_address) | host_bits)


@dataclass(frozen=True)
class Reserved:
    """An address range of this side that is not a pod or Service CIDR: the gateway's own
    addresses, its public endpoint, the nodes. A peer CIDR that overlaps one is refused: routing
    it to the tunnel would hand this side's own traffic to the peer (issue 16 §4)."""

    network: IPv4Network
    what: str
    """What it is, for the refusal (e.g. ``the gateway's address on wan``)."""


@dataclass(frozen=True)
class ClusterNetwork:
    """The local cluster's own address space, as declared by its operator."""

    pod_cidrs: tuple[IPv4Network, ...]
    service_cidrs: tuple[IPv4Network, ...] = ()
    reserved: tuple[Reserved, ...] = ()
    """Ranges of this side outside its pod and Service CIDRs (see `Reserved`)."""

    def __post_init__(self) -> None:
        _check_networks(self.pod_cidrs, "pod_cidrs")
        _check_networks(self.service_cidrs, "service_cidrs")
        if not self.pod_cidrs:
            raise NetworkConfigError("at least one pod CIDR is required", "pod_cidrs")
        for index, service in enumerate(self.service_cidrs):
            for pod in self.pod_cidrs:
                if service.overlaps(pod):
                    raise NetworkConfigError(
                        f"{service} overlaps the pod CIDR {pod}", f"service_cidrs[{index}]"
                    )

    @classmethod
    def from_strings(cls, pod_cidrs: list[str], service_cidrs: list[str]) -> ClusterNetwork:
        """Build from user input, with errors naming ``pod_cidrs[i]`` / ``service_cidrs[i]``."""
        return cls(
            pod_cidrs=tuple(parse_cidr(v, f"pod_cidrs[{i}]") for i, v in enumerate(pod_cidrs)),
            service_cidrs=tuple(parse_cidr(v, f"service_cidrs[{i}]") for i, v in enumerate(service_cidrs)),
        )

    @property
    def all_cidrs(self) -> tuple[IPv4Network, ...]:
        return self.pod_cidrs + self.service_cidrs


@dataclass(frozen=True)
class PeerNetwork:
    """A peer cluster's address space and how the local side sees it.

    ``remapped_pod_cidrs[i]`` is the local view of ``pod_cidrs[i]`` (likewise for services); it
    equals the original when no remapping was needed.
    """

    cluster_id: str
    pod_cidrs: tuple[IPv4Network, ...]
    service_cidrs: tuple[IPv4Network, ...]
    remapped_pod_cidrs: tuple[IPv4Network, ...]
    remapped_service_cidrs: tuple[IPv4Network, ...]

    def __post_init__(self) -> None:
        if not self.cluster_id or not self.cluster_id.strip():
            raise NetworkConfigError("the peer cluster id must not be empty", "cluster_id")
        for field in ("pod_cidrs", "service_cidrs", "remapped_pod_cidrs", "remapped_service_cidrs"):
            _check_networks(getattr(self, field), field)
        _check_networks(self.pod_cidrs + self.service_cidrs, "pod_cidrs+service_cidrs")
        _check_networks(
            self.remapped_pod_cidrs + self.remapped_service_cidrs,
            "remapped_pod_cidrs+remapped_service_cidrs",
        )
        for originals, views, field in (
            (self.pod_cidrs, self.remapped_pod_cidrs, "remapped_pod_cidrs"),
            (self.service_cidrs, self.remapped_service_cidrs, "remapped_service_cidrs"),
        ):
            if len(originals) != len(views):
                raise NetworkConfigError(
                    f"has {len(views)} entries but there are {len(originals)} original CIDRs", field
                )
            for index, (original, view) in enumerate(zip(originals, views, strict=True)):
                if original.prefixlen != view.prefixlen:
                    raise NetworkConfigError(
                        f"{view} must have the prefix length of {original} (/{original.prefixlen})",
                        f"{field}[{index}]",
                    )

    @property
    def remaps(self) -> tuple[Remap, ...]:
        """Every peer CIDR (pods first, then services) with its local view."""
        return tuple(
            Remap(original=original, local_view=view)
            for original, view in zip(
                self.pod_cidrs + self.service_cidrs,
                self.remapped_pod_cidrs + self.remapped_service_cidrs,
                strict=True,
            )
        )
