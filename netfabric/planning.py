"""Plan route changes: desired routes versus routes observed in the kernel, as a list of ops.

Pure: `diff` compares values and never touches netlink; an applier (``links.py``) executes the
ops with idempotent ``ensure_*`` calls. Routes are keyed as the kernel keys IPv4 routes: by
table, destination and metric. Only routes carrying our ``protocol`` number are ever deleted, so
routes installed by the CNI, the kernel or an operator are left alone (unless one of ours must
take its key, which is a replace).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Network

from netfabric.model import NetworkConfigError, Remap

__all__ = [
    "MAIN_TABLE",
    "RTPROT_GPUFERRY",
    "Action",
    "Op",
    "Route",
    "diff",
    "node_routes",
    "tunnel_routes",
]

MAIN_TABLE = 254
#: Route protocol number that marks our routes (``ip route … proto 71``); 'G' again.
RTPROT_GPUFERRY = 71

_IFNAME_MAX = 15


@dataclass(frozen=True)
class Route:
    """One IPv4 route: ``dest`` via ``gateway`` and/or out of ``dev``, in ``table``."""

    dest: IPv4Network
    gateway: IPv4Address | None = None
    dev: str | None = None
    table: int = MAIN_TABLE
    metric: int = 0
    protocol: int = RTPROT_GPUFERRY
    onlink: bool = False
    """The gateway is on ``dev``'s link whatever routes say: a pod behind a ``scope host`` /32
    route (the ptp CNI's) is otherwise ignored as a next hop (the kernel treats it as local)."""

    def __post_init__(self) -> None:
        if self.onlink and (self.gateway is None or self.dev is None):
            raise NetworkConfigError(f"route to {self.dest}: onlink needs a gateway and a device", "onlink")
        if not isinstance(self.dest, IPv4Network):
            raise NetworkConfigError(f"expected an IPv4Network, got {self.dest!r}", "dest")
        if self.gateway is None and self.dev is None:
            raise NetworkConfigError(f"route to {self.dest} needs a gateway, a device or both", "gateway")
        if self.gateway is not None and not isinstance(self.gateway, IPv4Address):
            raise NetworkConfigError(f"expected an IPv4Address, got {self.gateway!r}", "gateway")
        if self.dev is not None and not 0 < len(self.dev) <= _IFNAME_MAX:
            raise NetworkConfigError(f"{self.dev!r} is not a valid interface name", "dev")
        if not 0 < self.table < 2**32:
            raise NetworkConfigError(f"{self.table} is not a routing table id", "table")
        if not 0 <= self.metric < 2**32:
            raise NetworkConfigError(f"{self.metric} is not a route metric", "metric")
        if not 0 <= self.protocol < 256:
            raise NetworkConfigError(f"{self.protocol} is not a route protocol number", "protocol")

    @property
    def key(self) -> tuple[int, IPv4Network, int]:
        """What identifies a route in the kernel: at most one route per key."""
        return (self.table, self.dest, self.metric)


class Action(enum.StrEnum):
    ADD = "add"
    REPLACE = "replace"
    DELETE = "delete"


@dataclass(frozen=True)
class Op:
    """One change to make; ``route`` is the route to install, or the one to delete."""

    action: Action
    route: Route

    def __str__(self) -> str:
        route = self.route
        via = f" via {route.gateway}" if route.gateway else ""
        dev = f" dev {route.dev}" if route.dev else ""
        return f"{self.action.value} {route.dest}{via}{dev} table {route.table} metric {route.metric}"


def _sort_key(route: Route) -> tuple[int, int, int, int]:
    return (route.table, int(route.dest.network_address), route.dest.prefixlen, route.metric)


def diff(desired: Iterable[Route], observed: Iterable[Route], *, protocol: int = RTPROT_GPUFERRY) -> list[Op]:
    """The ops that turn ``observed`` into ``desired``; empty when they already agree.

    - a desired route whose key is not observed: ``ADD``;
    - a desired route whose key is observed with other attributes: ``REPLACE``;
    - an observed route of ours (``protocol``) whose key is not desired: ``DELETE``.

    Adds and replaces come first and deletes last (so traffic moves before the old path goes),
    each group sorted by table, destination and metric: the output is deterministic.
    """
    wanted: dict[tuple[int, IPv4Network, int], Route] = {}
    for route in desired:
        if route.key in wanted:
            raise NetworkConfigError(
                f"two desired routes to {route.dest} in table {route.table} with metric {route.metric}",
                "desired",
            )
        wanted[route.key] = route
    present: dict[tuple[int, IPv4Network, int], Route] = {}
    for route in observed:
        present[route.key] = route

    changes: list[Op] = []
    for route in sorted(wanted.values(), key=_sort_key):
        current = present.get(route.key)
        if current is None:
            changes.append(Op(Action.ADD, route))
        elif current != route:
            changes.append(Op(Action.REPLACE, route))
    stale = [route for key, route in present.items() if key not in wanted and route.protocol == protocol]
    changes.extend(Op(Action.DELETE, route) for route in sorted(stale, key=_sort_key))
    return changes


def node_routes(
    remaps: Sequence[Remap],
    *,
    gateway_ip: IPv4Address,
    dev: str | None = None,
    table: int = MAIN_TABLE,
    onlink: bool = False,
) -> list[Route]:
    """What a node agent wants: every peer CIDR's local view via the local gateway's pod IP."""
    return [
        Route(dest=remap.local_view, gateway=gateway_ip, dev=dev, table=table, onlink=onlink)
        for remap in remaps
    ]


def tunnel_routes(remaps: Sequence[Remap], *, tunnel_iface: str, table: int) -> list[Route]:
    """What the gateway wants in its policy table (``ip rule fwmark … lookup table``).

    Packets reach this table after the prefix DNAT, so they carry *original* peer addresses.
    """
    if table == MAIN_TABLE:
        raise NetworkConfigError(
            "tunnel routes hold original peer CIDRs that overlap local ones: they need their own"
            " table, not the main table",
            "table",
        )
    return [Route(dest=remap.original, dev=tunnel_iface, table=table) for remap in remaps]
