"""Pod addresses as the consumer sees them. Pure.

When the two clusters' pod CIDRs overlap, the network fabric gives the provider's pods a
remapped CIDR in the consumer's view (a 1:1 prefix NAT) and publishes it in the PeerNetwork
object for that provider: ``spec.podCIDRs`` (the provider's own) and, index for index,
``status.remappedPodCIDRs``. :func:`remapper` turns that pair into the function the pod reflector
applies to a twin's ``podIP``: the same host part in the remapped prefix. An address outside the
provider's pod CIDRs (host-network pods) and a pair that does not line up are left as they are.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from ipaddress import IPv4Address, IPv4Network, ip_address, ip_network

__all__ = ["identity", "remapper"]


def identity(ip: str) -> str:
    return ip


def remapper(pod_cidrs: Sequence[str], remapped: Sequence[str]) -> Callable[[str], str]:
    """``ip -> ip in the consumer's view`` for a provider's ``pod_cidrs`` remapped to ``remapped``."""
    pairs: list[tuple[IPv4Network, IPv4Network]] = []
    for original, local in zip(pod_cidrs, remapped, strict=False):
        try:
            a, b = ip_network(original, strict=False), ip_network(local, strict=False)
        except ValueError:
            continue
        if isinstance(a, IPv4Network) and isinstance(b, IPv4Network) and a.prefixlen == b.prefixlen:
            pairs.append((a, b))
    if not pairs:
        return identity

    def remap(ip: str) -> str:
        try:
            address = ip_address(ip)
        except ValueError:
            return ip
        if not isinstance(address, IPv4Address):
            return ip
        for original, local in pairs:
            if address in original:
                return str(local.network_address + (int(address) - int(original.network_address)))
        return ip

    return remap
