"""The per-node agent: route the peers' CIDRs (in the local view) towards the gateway.

Every node routes the remote CIDRs' local views to the local gateway; the node that hosts the
gateway pod routes them to the pod itself, the others to that node (``next_hop``), as a
host-gateway CNI routes pod CIDRs of other nodes. Changes are planned by
`netfabric.planning.diff` and applied by `netfabric.routes.sync_routes`, which only ever touches
routes of our protocol number and verifies the result. Calling it again changes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from ipaddress import IPv4Address

from netfabric.model import Remap
from netfabric.planning import MAIN_TABLE, Op, node_routes
from netfabric.routes import sync_routes

__all__ = ["AgentSettings", "sync_node", "teardown_node"]


@dataclass(frozen=True)
class AgentSettings:
    next_hop: IPv4Address
    """The gateway's pod IP on the node that hosts it; that node's address on other nodes."""
    dev: str | None = None
    """Interface towards ``next_hop`` (the gateway pod's veth on its node); None lets the kernel pick."""
    netns: str | None = None
    table: int = MAIN_TABLE
    onlink: bool = False
    """``next_hop`` is on ``dev``'s link (the gateway pod on this node: see `Route.onlink`)."""


async def sync_node(remaps: Sequence[Remap], *, settings: AgentSettings) -> list[Op]:
    """Make this node's routes to every peer view exactly ``remaps``; returns the ops applied."""
    desired = node_routes(
        remaps, gateway_ip=settings.next_hop, dev=settings.dev, table=settings.table, onlink=settings.onlink
    )
    return await sync_routes(desired, table=settings.table, netns=settings.netns)


async def teardown_node(*, settings: AgentSettings) -> list[Op]:
    """Remove every route of ours from the node."""
    return await sync_routes((), table=settings.table, netns=settings.netns)
