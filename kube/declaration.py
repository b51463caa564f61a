"""A cluster's network declaration: the ConfigMap ``kube-system/gpuferry-network``. Pure.

Every cluster that joins the network fabric declares its network there; peering reads it to
tell each peer what this cluster's pods and Services use, and the gateways read it to know
where they run and listen:

``podCIDRs``, ``serviceCIDRs``
    comma-separated IPv4 CIDRs (required for the fabric);
``gatewayNetns``, ``gatewayIP``
    where the gateways run when they are processes on a machine (a network namespace) and the pod
    IP they use (in a gateway pod: its own namespace and pod IP);
``endpointAddress``, ``endpointPort``
    where peers reach this cluster's gateways (a provider's NodePort or LoadBalancer address; each
    gateway listens on ``endpointPort`` + its slot, 51820 by default);
``nodeCIDRs``
    where this cluster's nodes are (optional, comma-separated): the gateways refuse a peer whose
    CIDRs overlap them, or their own ``endpointAddress``, as they refuse any that overlaps their
    own addresses;
``mtu``
    of this cluster's tunnel interfaces (default 1420: a 1500-byte underlay less WireGuard's
    worst case); lower it for an underlay that already encapsulates (e.g. 1370 over VXLAN).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Network, ip_address, ip_network
from typing import Any

__all__ = [
    "DECLARATION_NAME",
    "DECLARATION_NAMESPACE",
    "DEFAULT_PORT",
    "MAX_SLOTS",
    "Declaration",
    "DeclarationError",
    "declaration_from_configmap",
    "ipv4_cidrs",
]

DECLARATION_NAMESPACE = "kube-system"
DECLARATION_NAME = "gpuferry-network"
DEFAULT_PORT = 51820
MAX_SLOTS = 64
"""Gateways that may share a network namespace (each listens on ``endpointPort`` + its slot)."""


class DeclarationError(ValueError):
    """A cluster's network declaration is missing or wrong; the message is one line for the user."""


@dataclass(frozen=True)
class Declaration:
    pod_cidrs: tuple[str, ...]
    service_cidrs: tuple[str, ...]
    gateway_netns: str | None = None
    gateway_ip: str | None = None
    endpoint_address: str | None = None
    endpoint_port: int = DEFAULT_PORT
    mtu: int | None = None
    node_cidrs: tuple[str, ...] = ()
    """Where the cluster's nodes are (optional): a peer CIDR overlapping one is refused."""

    @property
    def embedded(self) -> bool:
        """Whether gateways for this cluster can run here, as local processes."""
        return bool(self.gateway_netns and self.gateway_ip)


def ipv4_cidrs(parts: Iterable[str]) -> tuple[str, ...]:
    """IPv4 network addresses (blank parts skipped), none overlapping another; `ValueError` says
    which is wrong and why, without naming where it came from (the caller does). Pure."""
    out: list[IPv4Network] = []
    for part in (p.strip() for p in parts):
        if not part:
            continue
        try:
            network = ip_network(part, strict=True)
        except ValueError as e:
            raise ValueError(f"{part!r} is not an IPv4 network address: {e}") from None
        if not isinstance(network, IPv4Network):
            raise ValueError(f"{part!r} is IPv6; the network fabric is IPv4 only")
        for other in out:
            if network.overlaps(other):
                raise ValueError(f"{network} overlaps {other}")
        out.append(network)
    return tuple(map(str, out))


def _cidrs(text: str, key: str, where: str) -> tuple[str, ...]:
    try:
        out = ipv4_cidrs(text.split(","))
    except ValueError as e:
        raise DeclarationError(f"{where}: {key} {e}") from None
    if not out:
        raise DeclarationError(f"{where}: {key} is empty: declare at least one CIDR")
    return out


def declaration_from_configmap(cm: Mapping[str, Any] | None, *, side: str) -> Declaration:
    """Validate a declaration ConfigMap (``None``: absent); errors say what to fix, per side."""
    where = f"the {side}'s network declaration (ConfigMap {DECLARATION_NAMESPACE}/{DECLARATION_NAME})"
    if cm is None:
        raise DeclarationError(
            f"the {side} cluster declares no network: create the ConfigMap "
            f"{DECLARATION_NAMESPACE}/{DECLARATION_NAME} with podCIDRs and serviceCIDRs "
            "(see `gpuferry peer --help`), or peer with --no-network"
        )
    data = cm.get("data") or {}
    pods = _cidrs(str(data.get("podCIDRs", "")), "podCIDRs", where)
    services = _cidrs(str(data.get("serviceCIDRs", "")), "serviceCIDRs", where)
    nodes = _cidrs(str(data.get("nodeCIDRs", "")), "nodeCIDRs", where) if data.get("nodeCIDRs") else ()
    for service in services:
        for pod in pods:
            if ip_network(service).overlaps(ip_network(pod)):
                raise DeclarationError(f"{where}: serviceCIDRs {service} overlaps podCIDRs {pod}")
    gateway_ip = data.get("gatewayIP") or None
    if gateway_ip is not None:
        try:
            address = ip_address(gateway_ip)
        except ValueError:
            raise DeclarationError(f"{where}: gatewayIP {gateway_ip!r} is not an IP address") from None
        if not isinstance(address, IPv4Address) or not any(address in ip_network(p) for p in pods):
            raise DeclarationError(
                f"{where}: gatewayIP {gateway_ip} is not inside podCIDRs {', '.join(pods)}"
            )
    port_text = str(data.get("endpointPort") or DEFAULT_PORT)
    if not port_text.isdigit() or not 0 < int(port_text) < 65536 - MAX_SLOTS:
        raise DeclarationError(f"{where}: endpointPort {port_text!r} is not a UDP port")
    mtu_text = str(data.get("mtu") or "")
    if mtu_text and (not mtu_text.isdigit() or not 1280 <= int(mtu_text) <= 9000):
        raise DeclarationError(f"{where}: mtu {mtu_text!r} is not a number between 1280 and 9000")
    return Declaration(
        mtu=int(mtu_text) if mtu_text else None,
        pod_cidrs=pods,
        service_cidrs=services,
        gateway_netns=data.get("gatewayNetns") or None,
        gateway_ip=gateway_ip,
        endpoint_address=data.get("endpointAddress") or None,
        endpoint_port=int(port_text),
        node_cidrs=nodes,
    )
