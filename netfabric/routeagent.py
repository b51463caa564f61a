"""``python -m netfabric agent``: the route agent of one node, as the chart's DaemonSet runs it.

It routes every peer's remapped CIDRs (the ``status`` of every PeerNetwork) to the cluster's
gateway. The next hop is either fixed (``--next-hop``, the gateway processes of the local
clusters) or follows the gateway pod (``--gateway-selector``): the pod's own IP on the node that
runs it, that node's IP (the pod's ``hostIP``) on every other node, as a host-gateway CNI routes
the pod CIDRs of other nodes. When no gateway pod runs, the routes go: traffic to a peer then
fails at once rather than vanishing into a dead address. When a PeerNetwork goes, so do its
routes. Routes are ours by protocol number (`netfabric.routes`); nothing else is touched.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from ipaddress import IPv4Address, ip_address

from kube.clients import KubeClient
from kube.informers import Informer
from kube.objects import PODS, RawObject
from kube.tasks import wait_set
from netfabric.agent import AgentSettings, sync_node
from netfabric.app import remaps_from_status
from netfabric.model import Remap
from netfabric.objects import PEERNETWORKS
from netfabric.routes import NetlinkStateError, device_towards

__all__ = ["GatewayPods", "NextHop", "RouteAgent", "RouteAgentSettings", "next_hop", "wanted_remaps"]

logger = logging.getLogger(__name__)

RETRY_SECONDS = 5.0


@dataclass(frozen=True)
class GatewayPods:
    """Where the gateway pod is found: its namespace and label selector."""

    namespace: str
    selector: str


@dataclass(frozen=True, kw_only=True)
class RouteAgentSettings:
    node_name: str | None = None
    """This node (with ``gateway``): whether the gateway pod runs here."""
    next_hop: IPv4Address | None = None
    """A fixed next hop; None follows ``gateway``."""
    gateway: GatewayPods | None = None
    dev: str | None = None
    namespace: str | None = None
    """Only PeerNetworks of this namespace (default: all)."""
    netns: str | None = None


def _ready(pod: RawObject) -> bool:
    status = pod.get("status") or {}
    return status.get("phase") == "Running" and any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or []
    )


@dataclass(frozen=True)
class NextHop:
    address: IPv4Address
    local: bool
    """The gateway pod runs on this node: routed on its veth's link (`Route.onlink`)."""


def next_hop(pods: Iterable[RawObject], node_name: str | None) -> NextHop | None:
    """Where this node sends peer traffic: the gateway pod's IP on its own node, its node's IP
    elsewhere; None when no gateway pod runs. A Ready pod wins over one that is not, a newer
    one over an older one (during a rollout). Pure."""
    candidates = [
        p
        for p in pods
        if not p["metadata"].get("deletionTimestamp")
        and (p.get("status") or {}).get("phase") == "Running"
        and (p.get("status") or {}).get("podIP")
    ]
    if not candidates:
        return None
    best = max(candidates, key=lambda p: (_ready(p), p["metadata"].get("creationTimestamp") or ""))
    status = best["status"]
    here = node_name is not None and (best.get("spec") or {}).get("nodeName") == node_name
    address = status["podIP"] if here else status.get("hostIP")
    if not address:
        return None
    hop = ip_address(address)
    return NextHop(hop, here) if isinstance(hop, IPv4Address) else None


def wanted_remaps(peer_networks: Iterable[RawObject]) -> list[Remap]:
    """Every remapped CIDR the PeerNetworks publish, once each, in a stable order. Pure."""
    remaps = {r for obj in peer_networks for r in remaps_from_status(obj)}
    return sorted(remaps, key=lambda r: str(r.local_view))


class RouteAgent:
    """The informers and the one loop (see the module docstring)."""

    def __init__(self, client: KubeClient, settings: RouteAgentSettings) -> None:
        if settings.next_hop is None and settings.gateway is None:
            raise ValueError("a route agent needs a next hop or the gateway pods' selector")
        self.settings = settings
        self.peers = Informer(client, PEERNETWORKS, namespace=settings.namespace)
        self.gateways: Informer | None = None
        if settings.gateway is not None:
            self.gateways = Informer(
                client, PODS, namespace=settings.gateway.namespace, label_selector=settings.gateway.selector
            )
        self.applied: tuple[Sequence[Remap], NextHop | None] | None = None
        self._changed = asyncio.Event()
        for informer in self.informers:
            informer.add_handler(lambda _change: self._changed.set())

    @property
    def informers(self) -> list[Informer]:
        return [self.peers] + ([self.gateways] if self.gateways is not None else [])

    def desired(self) -> tuple[list[Remap], NextHop | None]:
        hop = NextHop(self.settings.next_hop, False) if self.settings.next_hop else None
        if self.gateways is not None:
            hop = next_hop(self.gateways.values(), self.settings.node_name)
        return wanted_remaps(self.peers.values()), hop

    async def _agent_settings(self, hop: NextHop | None) -> AgentSettings:
        if hop is None:
            return AgentSettings(next_hop=IPv4Address("0.0.0.0"), netns=self.settings.netns)
        if hop.local and self.settings.dev is None:
            # the pod's veth, on-link: a /32 "scope host" route to the pod (ptp) hides it as a gateway
            dev = await device_towards(hop.address, netns=self.settings.netns)
            if dev is None:
                raise NetlinkStateError(f"no route to the gateway pod {hop.address} on this node")
            return AgentSettings(next_hop=hop.address, dev=dev, onlink=True, netns=self.settings.netns)
        return AgentSettings(next_hop=hop.address, dev=self.settings.dev, netns=self.settings.netns)

    async def sync_once(self) -> bool:
        """Apply what the objects ask for, if it changed; False when applying failed."""
        remaps, hop = self.desired()
        if self.applied == (remaps, hop):
            return True
        try:
            settings = await self._agent_settings(hop)
            ops = await sync_node(remaps if hop is not None else [], settings=settings)
        except Exception:
            logger.exception("routing %d peer CIDR(s) via %s failed; retrying in %.0fs", len(remaps),
                             hop.address if hop else None, RETRY_SECONDS)  # fmt: skip
            self.applied = None
            return False
        if hop is None and remaps:
            logger.warning("no gateway pod runs: %d peer CIDR(s) unrouted until one does", len(remaps))
        via = f"{hop.address}{' (on this node)' if hop.local else ''}" if hop else "(none)"
        logger.info("node routes via %s: %s", via, ", ".join(map(str, ops)) or "unchanged")
        self.applied = (remaps, hop)
        return True

    async def serve(self) -> None:
        await asyncio.gather(*(i.synced.wait() for i in self.informers))
        while True:
            self._changed.clear()
            ok = await self.sync_once()
            if ok:
                await self._changed.wait()
            else:
                await wait_set(self._changed, RETRY_SECONDS)
