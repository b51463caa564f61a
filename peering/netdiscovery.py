"""What ``gpuferry install`` finds out about a cluster's network, for the chart's values. Pure.

* **Pod CIDRs**: the API has no object for the cluster CIDR (a flag of kube-controller-manager),
  only each node's ``spec.podCIDRs``. Their smallest common supernet, widened to a /16 at least,
  is the guess (a node added later gets its /24 from the same cluster CIDR); ``--pod-cidr`` says
  otherwise.
* **Service CIDRs**: the ServiceCIDR objects (``networking.k8s.io/v1``, Kubernetes 1.33 and
  later), IPv4 ones.
* **The endpoint** peers dial on a provider: a node's InternalIP (the gateway's Service is a
  NodePort), a real node's first: kwok-simulated nodes have no network.

An existing declaration (the ConfigMap ``kube-system/gpuferry-network``) wins over every guess.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from ipaddress import IPv4Network, ip_network
from typing import Any

__all__ = ["DiscoveredNetwork", "endpoint_address", "pod_cidrs", "service_cidrs"]

WIDEST_GUESS = 16
FAKE_NODE_ANNOTATION = "kwok.x-k8s.io/node"


@dataclass(frozen=True)
class DiscoveredNetwork:
    pod_cidrs: tuple[str, ...]
    service_cidrs: tuple[str, ...]
    endpoint_address: str | None
    how: tuple[str, ...]
    """One line per value: where it came from (for the progress output)."""


def _ipv4(texts: Iterable[str]) -> list[IPv4Network]:
    out = []
    for text in texts:
        try:
            network = ip_network(text, strict=False)
        except ValueError:
            continue
        if isinstance(network, IPv4Network):
            out.append(network)
    return out


def pod_cidrs(nodes: Sequence[Mapping[str, Any]]) -> list[str]:
    """The nodes' pod CIDRs, as one supernet at least /16 wide; [] when no node has one."""
    found = _ipv4(c for n in nodes for c in ((n.get("spec") or {}).get("podCIDRs") or []))
    if not found:
        return []
    prefix = min(WIDEST_GUESS, *(n.prefixlen for n in found))
    while True:
        supernets = {n.supernet(new_prefix=prefix) if n.prefixlen > prefix else n for n in found}
        if len(supernets) == 1:
            return [str(supernets.pop())]
        prefix -= 1


def service_cidrs(objects: Sequence[Mapping[str, Any]]) -> list[str]:
    """The IPv4 CIDRs of the ServiceCIDR objects, the default one (``kubernetes``) first."""
    ordered = sorted(objects, key=lambda o: (o["metadata"]["name"] != "kubernetes", o["metadata"]["name"]))
    out: list[str] = []
    for obj in ordered:
        for network in _ipv4((obj.get("spec") or {}).get("cidrs") or []):
            if str(network) not in out:
                out.append(str(network))
    return out


def _ready(node: Mapping[str, Any]) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (node.get("status") or {}).get("conditions") or []
    )


def endpoint_address(nodes: Sequence[Mapping[str, Any]]) -> str | None:
    """A Ready real node's InternalIP (ExternalIP when it has one: peers may be elsewhere)."""
    real = [
        n
        for n in nodes
        if not ((n["metadata"].get("annotations") or {}).get(FAKE_NODE_ANNOTATION)) and _ready(n)
    ]
    for kind in ("ExternalIP", "InternalIP"):
        for node in sorted(real, key=lambda n: n["metadata"]["name"]):
            for address in (node.get("status") or {}).get("addresses") or []:
                if address.get("type") == kind and _ipv4([f"{address.get('address')}/32"]):
                    return str(address["address"])
    return None
