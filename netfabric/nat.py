"""Render the gateway's nftables table for one peer tunnel; pure text, applied with ``nft -f``.

The script replaces the whole table in one transaction: ``table ip T {}`` (creates it if absent),
``delete table ip T`` (drops it with every chain), then the full new definition. Re-applying the
same script is therefore idempotent, and `render_delete` removes the table whether it exists or not.

Each side only needs its own remaps: the local view it chose for each peer CIDR. Addresses on the
wire, inside the tunnel, are always *original* addresses, as each cluster knows its own pods.

Packet walk, cluster A (pods 10.244.0.0/16) and B (pods 10.244.0.0/16). A sees B's pods as
10.70.0.0/16, B sees A's pods as 10.71.0.0/16 (each chose its own view; both overlap locally):

1. A pod 10.244.1.5 → 10.70.1.10 (B pod 10.244.1.10 in A's view). A node agent routes 10.70.0.0/16
   to A's gateway.
2. A gateway, prerouting ``steer`` (priority mangle): a new connection towards a local view gets
   the ct mark; every packet of a marked connection that does *not* come from the tunnel gets the
   fwmark, so policy routing (``ip rule fwmark … lookup <table>``, a table whose routes point at
   the tunnel) sends it to the tunnel even though, after DNAT, its destination 10.244.1.10 also
   looks like a local pod.
3. A gateway, nat chain ``prerouting`` (priority dstnat):
   ``ip daddr 10.70.0.0/16 dnat ip prefix to 10.244.0.0/16``, so the packet enters the tunnel
   as 10.244.1.5 → 10.244.1.10. No SNAT towards the tunnel: the source stays the original A
   address, which B translates with its own remap.
4. B gateway, from the tunnel: ``steer`` ct-marks the connection (iif is the tunnel); no DNAT
   (the destination is already a B original). Nat chain ``postrouting``:
   - GATEWAY mode: ``snat ip to <B gateway pod IP>`` (the address a strict CNI accepts);
   - PRESERVE mode: ``ip saddr 10.244.0.0/16 snat ip prefix to 10.71.0.0/16``, so the B pod sees
     10.71.1.5, a unique address in B's view (identity remaps need no rule).
5. The B pod replies to the gateway IP (or to 10.71.1.5, routed to the gateway by B's node agent).
   Conntrack undoes the SNAT in prerouting: 10.244.1.10 → 10.244.1.5, which again looks local,
   but the connection's ct mark gives the packet the fwmark and policy routing sends it into the
   tunnel.
6. A gateway, reply from the tunnel: conntrack undoes the DNAT of step 3, the source becomes
   10.70.1.10 and the A pod sees the answer from the address it called. No fwmark: replies coming
   from the tunnel follow the main table to local pods.

Chain ``clamp`` (forward) sets the MSS of TCP SYNs leaving through the tunnel to fit its MTU.

Assumptions the caller must meet: the gateway runs in its own network namespace (the fwmark bits
are ours there), reverse-path filtering on the tunnel is off or loose (sources from the tunnel may
overlap local pods), and one tunnel interface per peer (WireGuard allowed-ips of two peers on one
interface cannot both hold 10.244.0.0/16).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from ipaddress import IPv4Address

from netfabric.model import NetworkConfigError, Remap, SourceNatMode

__all__ = [
    "DEFAULT_FWMARK",
    "DEFAULT_FWMARK_MASK",
    "TABLE_PREFIX",
    "render_delete",
    "render_nat_table",
    "table_name_for",
]

TABLE_PREFIX = "gpuferry"
#: Marks a tunnel connection (ct mark) and its packets to route into the tunnel (fwmark): 'G'.
DEFAULT_FWMARK = 0x00470000
DEFAULT_FWMARK_MASK = 0x00FF0000

# nft accepts neither quoted table names nor keywords ('mark', 'ip', …) as names: our names all
# start with the prefix, which no keyword does.
_TABLE_RE = re.compile(rf"^{TABLE_PREFIX}(?:_[a-z0-9]+)*$")
_TABLE_MAX = 64
_IFNAME_RE = re.compile(r"^[A-Za-z0-9_.\-]{1,15}$")


def table_name_for(peer_cluster_id: str) -> str:
    """A valid, stable nft table name for a peer: ``gpuferry_<sanitised id>[_<hash>]``."""
    if not peer_cluster_id:
        raise NetworkConfigError("the peer cluster id must not be empty", "cluster_id")
    words = re.findall(r"[a-z0-9]+", peer_cluster_id.lower())
    suffix = "_".join(words)
    name = f"{TABLE_PREFIX}_{suffix}" if suffix else TABLE_PREFIX
    # Different ids may sanitise alike ('a.b' and 'a-b'); a short digest keeps them apart.
    digest = hashlib.sha256(peer_cluster_id.encode()).hexdigest()[:8]
    if suffix != peer_cluster_id or len(name) > _TABLE_MAX:
        name = f"{name[: _TABLE_MAX - 9]}_{digest}"
    return name


def _check_table_name(table_name: str) -> None:
    if not _TABLE_RE.match(table_name) or len(table_name) > _TABLE_MAX:
        raise NetworkConfigError(
            f"{table_name!r} is not a valid table name: use {TABLE_PREFIX!r} or"
            f" '{TABLE_PREFIX}_<lowercase letters/digits>' (see table_name_for), at most {_TABLE_MAX}"
            " characters",
            "table_name",
        )


def _check_mark(fwmark: int, fwmark_mask: int) -> None:
    if not 0 < fwmark_mask <= 0xFFFFFFFF:
        raise NetworkConfigError(f"{fwmark_mask:#x} is not a 32-bit mask", "fwmark_mask")
    if fwmark == 0 or fwmark & ~fwmark_mask:
        raise NetworkConfigError(
            f"{fwmark:#010x} must be non-zero and inside the mask {fwmark_mask:#010x}", "fwmark"
        )


def render_nat_table(
    table_name: str,
    *,
    tunnel_iface: str,
    remaps: Sequence[Remap],
    snat_mode: SourceNatMode = SourceNatMode.GATEWAY,
    gateway_ip: IPv4Address | None = None,
    fwmark: int = DEFAULT_FWMARK,
    fwmark_mask: int = DEFAULT_FWMARK_MASK,
) -> str:
    """The complete ``nft -f`` script for one peer's table (see the module docstring).

    ``remaps`` are the local side's views of the peer CIDRs (identity remaps included: they get
    routed but not translated). ``gateway_ip`` is required in `SourceNatMode.GATEWAY`.
    """
    _check_table_name(table_name)
    if not _IFNAME_RE.match(tunnel_iface):
        raise NetworkConfigError(
            f"{tunnel_iface!r} is not a valid interface name (1-15 of A-Z a-z 0-9 _ . -)", "tunnel_iface"
        )
    _check_mark(fwmark, fwmark_mask)
    snat_mode = SourceNatMode(snat_mode)
    if snat_mode is SourceNatMode.GATEWAY and not isinstance(gateway_ip, IPv4Address):
        raise NetworkConfigError(
            f"the gateway's IPv4 pod address is required in {snat_mode.value!r} mode, got {gateway_ip!r}",
            "gateway_ip",
        )
    for index, remap in enumerate(remaps):
        if not isinstance(remap, Remap):
            raise NetworkConfigError(f"expected a Remap, got {remap!r}", f"remaps[{index}]")
        for other_index, other in enumerate(remaps[:index]):
            for name in ("original", "local_view"):
                if getattr(remap, name).overlaps(getattr(other, name)):
                    raise NetworkConfigError(
                        f"{name} {getattr(remap, name)} overlaps {getattr(other, name)}"
                        f" (remaps[{other_index}])",
                        f"remaps[{index}]",
                    )

    iface = f'"{tunnel_iface}"'
    keep = f"{~fwmark_mask & 0xFFFFFFFF:#010x}"
    mark = f"{fwmark:#010x}"
    set_ct = f"ct mark set ct mark and {keep} or {mark}"
    views = ", ".join(str(remap.local_view) for remap in remaps)

    steer = [f"iifname {iface} ct state new {set_ct}"]
    if remaps:
        steer.append(f"iifname != {iface} ct state new ip daddr {{ {views} }} {set_ct}")
    steer.append(
        f"iifname != {iface} ct mark and {fwmark_mask:#010x} == {mark}"
        f" meta mark set meta mark and {keep} or {mark}"
    )
    dnat = [
        f"iifname != {iface} ip daddr {remap.local_view} dnat ip prefix to {remap.original}"
        for remap in remaps
        if not remap.is_identity
    ]
    if snat_mode is SourceNatMode.GATEWAY:
        snat = [f"iifname {iface} oifname != {iface} snat ip to {gateway_ip}"]
    else:
        snat = [
            f"iifname {iface} oifname != {iface} ip saddr {remap.original}"
            f" snat ip prefix to {remap.local_view}"
            for remap in remaps
            if not remap.is_identity
        ]

    # Both gateways clamp the MSS of SYNs they send into the tunnel to its MTU, so TCP in either
    # direction never needs fragmentation or path-MTU discovery across the NAT.
    clamp = [f"oifname {iface} tcp flags & (syn | rst) == syn tcp option maxseg size set rt mtu"]

    lines = [
        f"# Generated by gpuferry netfabric.nat for tunnel {tunnel_iface}; apply with `nft -f`.",
        f"# Source NAT mode: {snat_mode.value}. Re-applying replaces the whole table atomically.",
        f"table ip {table_name} {{}}",
        f"delete table ip {table_name}",
        f"table ip {table_name} {{",
    ]
    chains = (
        ("steer", "type filter hook prerouting priority mangle; policy accept;", steer),
        ("prerouting", "type nat hook prerouting priority dstnat; policy accept;", dnat),
        ("postrouting", "type nat hook postrouting priority srcnat; policy accept;", snat),
        ("clamp", "type filter hook forward priority mangle; policy accept;", clamp),
    )
    for index, (name, header, rules) in enumerate(chains):
        if index:
            lines.append("")
        lines.append(f"\tchain {name} {{")
        lines.append(f"\t\t{header}")
        lines.extend(f"\t\t{rule}" for rule in rules)
        lines.append("\t}")
    lines.append("}")
    return "\n".join(lines) + "\n"


def render_delete(table_name: str) -> str:
    """An ``nft -f`` script that removes the table, and succeeds when it is already gone."""
    _check_table_name(table_name)
    return f"table ip {table_name} {{}}\ndelete table ip {table_name}\n"
