"""The network side of a peering, as objects: declarations in, PeerNetworks and gateways out. Pure.

Each cluster declares its network in the ConfigMap ``kube-system/gpuferry-network``:

``podCIDRs``, ``serviceCIDRs``
    comma-separated IPv4 CIDRs (required for the fabric);
``gatewayNetns``, ``gatewayIP``
    embedded mode: the network namespace the local gateways run in and their pod IP;
``endpointAddress``, ``endpointPort``
    where peers reach this cluster's gateways (a provider's NodePort or LoadBalancer address;
    embedded gateways listen on ``endpointPort`` + their slot, 51820 by default);
``mtu``
    of this cluster's tunnel interfaces (default 1420: a 1500-byte underlay less WireGuard's
    worst case); lower it for an underlay that already encapsulates (e.g. 1370 over VXLAN).

A peering has one PeerNetwork on each side, each describing *the other* cluster: on the consumer
``gpuferry-system/<provider-id>`` (with the provider's endpoint: the consumer dials), on the
provider ``<tenant namespace>/<consumer-id>``. The gateway of each side (``python -m netfabric
gateway``) reconciles its PeerNetwork, chooses remaps and reports ``NetworkReady``; its key lives
in the Secret `key_secret_name` beside it, with the public key annotated on it for the peer.

Several gateways may share one network namespace (one per peer): each gets a *slot* that sets its
firewall mark, routing table and listen port, and an interface name unique on the host.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Network, ip_address, ip_network
from typing import Any

from kube.objects import GATEWAY_PUBLIC_KEY_ANNOTATION, PEERNETWORKS, RawObject

__all__ = [
    "DECLARATION_NAME",
    "DECLARATION_NAMESPACE",
    "FAILED_REASONS",
    "PUBLIC_KEY_ANNOTATION",
    "Declaration",
    "DeclarationError",
    "GatewayPlacement",
    "declaration_from_configmap",
    "free_slot",
    "gateway_args",
    "key_secret_name",
    "network_ready",
    "peer_network",
]

DECLARATION_NAMESPACE = "kube-system"
DECLARATION_NAME = "gpuferry-network"
PUBLIC_KEY_ANNOTATION = GATEWAY_PUBLIC_KEY_ANNOTATION
DEFAULT_PORT = 51820
MAX_SLOTS = 64
_MARK_BASE = 0x47


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

    @property
    def embedded(self) -> bool:
        """Whether gateways for this cluster can run here, as local processes."""
        return bool(self.gateway_netns and self.gateway_ip)


def _cidrs(text: str, key: str, where: str) -> tuple[str, ...]:
    out: list[IPv4Network] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        try:
            network = ip_network(part, strict=True)
        except ValueError as e:
            raise DeclarationError(f"{where}: {key} {part!r} is not an IPv4 network address: {e}") from None
        if not isinstance(network, IPv4Network):
            raise DeclarationError(f"{where}: {key} {part!r} is IPv6; the network fabric is IPv4 only")
        for other in out:
            if network.overlaps(other):
                raise DeclarationError(f"{where}: {key} {network} overlaps {other}")
        out.append(network)
    if not out:
        raise DeclarationError(f"{where}: {key} is empty: declare at least one CIDR")
    return tuple(map(str, out))


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
    )


def key_secret_name(peer_id: str) -> str:
    return f"gpuferry-gateway-{peer_id}"


def peer_network(
    *,
    name: str,
    namespace: str,
    peer_id: str,
    peer: Declaration,
    public_key: str,
    endpoint: tuple[str, int] | None,
    mtu: int | None = None,
) -> RawObject:
    """The PeerNetwork describing ``peer`` (the other cluster) to this side's gateway (``mtu``:
    this side's tunnel MTU, from this side's declaration)."""
    spec: dict[str, Any] = {
        "clusterID": peer_id,
        "podCIDRs": list(peer.pod_cidrs),
        "serviceCIDRs": list(peer.service_cidrs),
        "publicKey": public_key,
    }
    if endpoint is not None:
        spec["endpoint"] = {"address": endpoint[0], "port": endpoint[1]}
    if mtu is not None:
        spec["mtu"] = mtu
    return {
        "apiVersion": PEERNETWORKS.api_version,
        "kind": PEERNETWORKS.kind,
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"app.kubernetes.io/managed-by": "gpuferry", "gpuferry.io/peer": peer_id},
        },
        "spec": spec,
    }


#: NetworkReady reasons that waiting does not cure: the input must change (or the node be fixed).
FAILED_REASONS = frozenset({"InvalidConfig", "RemapPoolExhausted", "EndpointUnresolvable", "ApplyFailed"})


def network_ready(obj: Mapping[str, Any]) -> tuple[bool | None, str, str]:
    """A PeerNetwork's NetworkReady: True/False (None before its gateway reported), reason, message."""
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == "NetworkReady":
            return c.get("status") == "True", str(c.get("reason")), str(c.get("message"))
    return None, "NotReported", "no gateway has reported on it yet"


def free_slot(used: Iterable[int]) -> int:
    taken = set(used)
    for slot in range(MAX_SLOTS):
        if slot not in taken:
            return slot
    raise DeclarationError(f"{MAX_SLOTS} gateways already share this network namespace")


@dataclass(frozen=True)
class GatewayPlacement:
    """Where and how one embedded gateway runs (one cluster, one peer)."""

    cluster_id: str
    peer_id: str
    slot: int
    namespace: str
    """Of its PeerNetwork and key Secret."""
    declaration: Declaration
    listens: bool
    """A server (the provider's side) listens on a fixed port; a client dials."""

    @property
    def iface(self) -> str:
        """Unique on the host (wireguard-go's UAPI sockets are not per network namespace)."""
        digest = hashlib.sha256(f"{self.cluster_id}/{self.peer_id}".encode()).hexdigest()[:10]
        return f"gf{digest}"

    @property
    def port(self) -> int:
        return self.declaration.endpoint_port + self.slot

    @property
    def route_table(self) -> int:
        return 4700 + self.slot


def gateway_args(p: GatewayPlacement) -> list[str]:
    """``python -m netfabric`` arguments (after ``--kubeconfig``) for an embedded gateway."""
    d = p.declaration
    if not d.embedded:
        raise DeclarationError("this cluster's declaration names no gatewayNetns/gatewayIP")
    args = ["gateway", "--peer-network", f"{p.namespace}/{p.peer_id}"]
    for cidr in d.pod_cidrs:
        args += ["--pod-cidr", cidr]
    for cidr in d.service_cidrs:
        args += ["--service-cidr", cidr]
    args += [
        "--gateway-ip", str(d.gateway_ip),
        "--netns", str(d.gateway_netns),
        "--iface", p.iface,
        "--fwmark", f"{(_MARK_BASE + p.slot) << 16:#010x}",
        "--route-table", str(p.route_table),
        "--key-secret", key_secret_name(p.peer_id),
        "--status-interval", "5",
    ]  # fmt: skip
    if p.listens:
        args += ["--listen-port", str(p.port)]
    return args


def slot_of(args: Iterable[str]) -> int | None:
    """The slot an embedded gateway was started with (from its arguments)."""
    items = list(args)
    for flag, value in itertools.pairwise(items):
        if flag == "--route-table" and value.isdigit():
            return int(value) - 4700
    return None


def netns_of(args: Iterable[str]) -> str | None:
    items = list(args)
    for flag, value in itertools.pairwise(items):
        if flag == "--netns":
            return value
    return None
