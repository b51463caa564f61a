"""Idempotent netlink changes that verify themselves: routes, policy rules, link MTU and state.

Typed ``ensure_*`` wrappers over pyroute2's `AsyncIPRoute`. Each one tolerates the change being
there already (EEXIST) or gone already (ENOENT/ESRCH), then reads the kernel back and raises
`NetlinkStateError` when what it sees is not what was asked. The namespace is an argument (an
``ip netns`` name, or None for the caller's own), so tests run them in throwaway namespaces.

Route diffs are planned by `netfabric.planning.diff` (pure); `sync_routes` applies them.
"""

from __future__ import annotations

import asyncio
import errno
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from ipaddress import IPv4Address, IPv4Network
from socket import AF_INET
from typing import Any

from pyroute2 import AsyncIPRoute
from pyroute2.netlink.exceptions import NetlinkError

from netfabric.planning import RTPROT_GPUFERRY, Action, Op, Route, diff

__all__ = [
    "NetlinkStateError",
    "PolicyRule",
    "delete_link",
    "delete_rule",
    "ensure_link",
    "ensure_rule",
    "link_exists",
    "observed_routes",
    "observed_rules",
    "own_networks",
    "sync_routes",
]

_GONE = {errno.ENOENT, errno.ESRCH, errno.ENODEV, errno.EADDRNOTAVAIL}


class NetlinkStateError(RuntimeError):
    """The kernel does not show what an ``ensure_*`` call just asked for."""


@dataclass(frozen=True)
class PolicyRule:
    """``ip rule add fwmark MARK/MASK lookup TABLE priority PRIORITY``."""

    fwmark: int
    fwmask: int
    table: int
    priority: int


RTNH_F_ONLINK = 4


async def device_towards(address: IPv4Address, *, netns: str | None = None) -> str | None:
    """The interface the main table sends ``address`` out of (``ip route get``); None if none."""
    async with _open(netns) as ipr:
        try:
            replies = list(await ipr.route("get", dst=str(address)))  # a list, not an iterator
        except NetlinkError:
            return None
        names = await _names(ipr)
        for message in replies:
            oif = message.get("oif")
            if oif is not None:
                return names.get(int(oif))
    return None


async def own_networks(*, netns: str | None = None) -> list[tuple[IPv4Network, str]]:
    """Every IPv4 address of the namespace as its network (``172.31.0.2/24`` → ``172.31.0.0/24``),
    with the interface that holds it (``ip -4 addr``)."""
    async with _open(netns) as ipr:
        names = await _names(ipr)
        found: list[tuple[IPv4Network, str]] = []
        async for message in await ipr.get_addr(family=AF_INET):
            address = message.get("IFA_ADDRESS") or message.get("IFA_LOCAL")
            if not address:
                continue
            network = IPv4Network(f"{address}/{message['prefixlen']}", strict=False)
            found.append((network, names.get(int(message["index"]), "?")))
    return found


def _open(netns: str | None) -> AsyncIPRoute:
    return AsyncIPRoute(netns=netns) if netns else AsyncIPRoute()


async def _index(ipr: AsyncIPRoute, ifname: str) -> int | None:
    found = await ipr.link_lookup(ifname=ifname)
    return int(found[0]) if found else None


async def link_exists(ifname: str, *, netns: str | None = None) -> bool:
    async with _open(netns) as ipr:
        return await _index(ipr, ifname) is not None


async def ensure_link(
    ifname: str, *, mtu: int | None = None, up: bool = True, netns: str | None = None
) -> int:
    """Set an existing link's MTU and state; returns its index. Verifies both."""
    async with _open(netns) as ipr:
        index = await _index(ipr, ifname)
        if index is None:
            raise NetlinkStateError(f"no interface {ifname!r} in netns {netns or '(own)'}")
        changes: dict[str, Any] = {}
        if mtu is not None:
            changes["mtu"] = mtu
        changes["state"] = "up" if up else "down"
        await ipr.link("set", index=index, **changes)
        (link,) = await ipr.link("get", index=index)
        if mtu is not None and link.get("mtu") != mtu:
            raise NetlinkStateError(f"{ifname}: MTU is {link.get('mtu')} after setting {mtu}")
        if bool(link["flags"] & 1) != up:
            raise NetlinkStateError(f"{ifname}: still {'down' if up else 'up'}")
        return index


async def delete_link(ifname: str, *, netns: str | None = None) -> None:
    """Delete a link; fine when it is gone already. Verifies it is gone."""
    async with _open(netns) as ipr:
        index = await _index(ipr, ifname)
        if index is not None:
            try:
                await ipr.link("del", index=index)
            except NetlinkError as e:
                if e.code not in _GONE:
                    raise
        for _ in range(50):
            if await _index(ipr, ifname) is None:
                return
            await asyncio.sleep(0.02)
    raise NetlinkStateError(f"{ifname}: still present after delete")


def _route_from(message: Any, index_names: dict[int, str]) -> Route | None:
    if message["family"] != AF_INET:
        return None
    dest = message.get("dst") or "0.0.0.0"
    gateway = message.get("gateway")
    oif = message.get("oif")
    return Route(
        dest=IPv4Network(f"{dest}/{message['dst_len']}"),
        gateway=IPv4Address(gateway) if gateway else None,
        dev=index_names.get(oif) if oif is not None else None,
        table=int(message.get("table") or message["table"]),
        metric=int(message.get("priority") or 0),
        protocol=int(message["proto"]),
        onlink=bool(gateway and oif is not None and int(message.get("flags") or 0) & RTNH_F_ONLINK),
    )


async def _names(ipr: AsyncIPRoute) -> dict[int, str]:
    return {int(link["index"]): str(link.get("ifname")) async for link in await ipr.link("dump")}


async def observed_routes(
    *, table: int, netns: str | None = None, protocol: int | None = RTPROT_GPUFERRY
) -> list[Route]:
    """IPv4 unicast routes of ``table`` (only those of ``protocol`` unless it is None)."""
    async with _open(netns) as ipr:
        names = await _names(ipr)
        routes = []
        async for message in await ipr.route("dump", family=AF_INET, table=table):
            if message.get("table") != table or message["type"] != 1:  # RTN_UNICAST
                continue
            route = _route_from(message, names)
            if route is not None and (protocol is None or route.protocol == protocol):
                routes.append(route)
        return routes


def _route_args(route: Route, names: dict[str, int]) -> dict[str, Any]:
    args: dict[str, Any] = {
        "dst": str(route.dest),
        "table": route.table,
        "proto": route.protocol,
        "priority": route.metric,
    }
    if route.gateway is not None:
        args["gateway"] = str(route.gateway)
    if route.dev is not None:
        if route.dev not in names:
            raise NetlinkStateError(f"route to {route.dest}: no interface {route.dev!r}")
        args["oif"] = names[route.dev]
    if route.onlink:
        args["flags"] = RTNH_F_ONLINK
    return args


def _same(route: Route, seen: Route) -> bool:
    return (
        route.key == seen.key
        and route.gateway == seen.gateway
        and (route.dev is None or route.dev == seen.dev)
        and route.protocol == seen.protocol
        and route.onlink == seen.onlink
    )


async def sync_routes(
    desired: Sequence[Route], *, table: int, netns: str | None = None, protocol: int = RTPROT_GPUFERRY
) -> list[Op]:
    """Make our routes (``protocol``) in ``table`` exactly ``desired``; returns the ops applied.

    Calling it again with the same input applies nothing. After applying, the table is read back
    and every desired route must be there as asked, and no other route of ours may remain.
    """
    for route in desired:
        if route.table != table or route.protocol != protocol:
            raise ValueError(f"route {route} is not in table {table} with protocol {protocol}")
    observed = await observed_routes(table=table, netns=netns, protocol=None)
    # A desired route without a device lets the kernel pick it: compare without the device.
    loose = {route.key for route in desired if route.dev is None}
    observed = [replace(r, dev=None) if r.key in loose else r for r in observed]
    # Routes of others with a key we need are replaced; others of theirs are not ours to delete.
    ops = diff(desired, observed, protocol=protocol)
    async with _open(netns) as ipr:
        names = {name: index for index, name in (await _names(ipr)).items()}
        for op in ops:
            args = _route_args(op.route, names)
            try:
                if op.action is Action.DELETE:
                    await ipr.route("del", **args)
                else:
                    await ipr.route("replace", **args)
            except NetlinkError as e:
                if not (op.action is Action.DELETE and e.code in _GONE):
                    raise NetlinkStateError(f"{op}: {e}") from e
    await _verify_routes(desired, table=table, netns=netns, protocol=protocol)
    return ops


async def _verify_routes(desired: Iterable[Route], *, table: int, netns: str | None, protocol: int) -> None:
    wanted = list(desired)
    for _ in range(50):
        seen = await observed_routes(table=table, netns=netns, protocol=None)
        by_key = {route.key: route for route in seen}
        missing = [r for r in wanted if r.key not in by_key or not _same(r, by_key[r.key])]
        extra = [r for r in seen if r.protocol == protocol and r.key not in {w.key for w in wanted}]
        if not missing and not extra:
            return
        await asyncio.sleep(0.02)
    raise NetlinkStateError(
        f"table {table}: routes not as asked; missing {[str(r.dest) for r in missing]},"
        f" unexpected {[str(r.dest) for r in extra]}"
    )


async def observed_rules(*, netns: str | None = None) -> list[PolicyRule]:
    """IPv4 fwmark rules (the only kind we make)."""
    async with _open(netns) as ipr:
        rules = []
        async for message in await ipr.rule("dump", family=AF_INET):
            fwmark = message.get("fwmark")
            if fwmark:
                rules.append(
                    PolicyRule(
                        fwmark=int(fwmark),
                        fwmask=int(message.get("fwmask") or 0xFFFFFFFF),
                        table=int(message.get("table") or message["table"]),
                        priority=int(message.get("priority") or 0),
                    )
                )
        return rules


async def ensure_rule(rule: PolicyRule, *, netns: str | None = None) -> None:
    """Add the rule unless present (an exact twin counts); verifies it is there."""
    if rule not in await observed_rules(netns=netns):
        async with _open(netns) as ipr:
            try:
                await ipr.rule(
                    "add",
                    family=AF_INET,
                    fwmark=rule.fwmark,
                    fwmask=rule.fwmask,
                    table=rule.table,
                    priority=rule.priority,
                )
            except NetlinkError as e:
                if e.code != errno.EEXIST:
                    raise NetlinkStateError(f"ip rule {rule}: {e}") from e
    if rule not in await observed_rules(netns=netns):
        raise NetlinkStateError(f"ip rule {rule} is not visible after adding it")


async def delete_rule(rule: PolicyRule, *, netns: str | None = None) -> None:
    """Delete every copy of the rule; fine when there is none. Verifies none is left."""
    async with _open(netns) as ipr:
        for _ in range(8):
            if rule not in await observed_rules(netns=netns):
                return
            try:
                await ipr.rule(
                    "del",
                    family=AF_INET,
                    fwmark=rule.fwmark,
                    fwmask=rule.fwmask,
                    table=rule.table,
                    priority=rule.priority,
                )
            except NetlinkError as e:
                if e.code not in _GONE:
                    raise NetlinkStateError(f"ip rule del {rule}: {e}") from e
    if rule in await observed_rules(netns=netns):
        raise NetlinkStateError(f"ip rule {rule} is still there after deleting it")
