"""IPAM for the fabric: parse declared CIDRs and choose local views for a peer's CIDRs.

Pure and deterministic: the same inputs always give the same remaps, and remaps chosen earlier
(passed back as ``existing``) are kept while they stay valid, so a remote pod keeps its address in
the local view across gateway restarts.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from ipaddress import IPv4Network

from netfabric.model import (
    MIN_PREFIXLEN,
    ClusterNetwork,
    NetworkConfigError,
    PoolExhausted,
    Remap,
    parse_cidr,
)

__all__ = ["DEFAULT_POOL", "overlaps", "parse_cidrs", "plan_remaps"]

#: Where remapped peer CIDRs are carved from unless the operator configures another pool.
#: A /10 (64 /16s, or 4 /12s): room for several peers whose pod CIDR is the common 10.244.0.0/16
#: and whose services are kubeadm's 10.96.0.0/12 (local CIDRs inside it are skipped).
DEFAULT_POOL = IPv4Network("10.64.0.0/10")


def parse_cidrs(
    values: Iterable[str], field: str, *, min_prefixlen: int = MIN_PREFIXLEN
) -> list[IPv4Network]:
    """Parse a list of strict IPv4 CIDRs; errors name ``field[index]``.

    Besides each CIDR being valid (see `netfabric.model.parse_cidr`), the CIDRs of one list must
    not overlap each other. A bare string is refused: it is almost always a forgotten list.
    """
    if isinstance(values, str | bytes):
        raise NetworkConfigError(f"expected a list of CIDRs, got the single string {values!r}", field)
    networks: list[IPv4Network] = []
    for index, value in enumerate(values):
        network = parse_cidr(value, f"{field}[{index}]", min_prefixlen=min_prefixlen)
        for other_index, other in enumerate(networks):
            if network.overlaps(other):
                raise NetworkConfigError(
                    f"{network} overlaps {other} ({field}[{other_index}])", f"{field}[{index}]"
                )
        networks.append(network)
    return networks


def overlaps(a: IPv4Network, b: IPv4Network) -> bool:
    """Whether two CIDRs share at least one address (either may contain the other)."""
    return a.overlaps(b)


def _first_collision(candidate: IPv4Network, obstacles: Iterable[IPv4Network]) -> IPv4Network | None:
    """The colliding obstacle that reaches furthest, so the search can jump past it."""
    hits = [obstacle for obstacle in obstacles if candidate.overlaps(obstacle)]
    return max(hits, key=lambda n: int(n.broadcast_address)) if hits else None


def _free_blocks(
    pool: IPv4Network, prefixlen: int, obstacles: Sequence[IPv4Network]
) -> Iterable[IPv4Network]:
    """Aligned ``/prefixlen`` blocks inside ``pool`` that collide with no obstacle, lowest first."""
    if prefixlen < pool.prefixlen:
        return
    size = 1 << (32 - prefixlen)
    address = int(pool.network_address)
    last = int(pool.broadcast_address)
    while address + size - 1 <= last:
        candidate = IPv4Network((address, prefixlen))
        blocker = _first_collision(candidate, obstacles)
        if blocker is None:
            yield candidate
            address += size
        else:
            past = int(blocker.broadcast_address) + 1
            address = max(address + size, -(-past // size) * size)


_COUNT_LIMIT = 4096


def _exhausted(
    pool: IPv4Network,
    needing: Sequence[IPv4Network],
    blocked: Sequence[IPv4Network],
    taken_count: int,
) -> PoolExhausted:
    parts = []
    for prefixlen, needed in sorted(Counter(network.prefixlen for network in needing).items()):
        capacity = 1 << (prefixlen - pool.prefixlen) if prefixlen >= pool.prefixlen else 0
        free = 0
        for _ in _free_blocks(pool, prefixlen, blocked):
            free += 1
            if free > _COUNT_LIMIT:  # never walk a huge pool block by block
                break
        shown = f"over {_COUNT_LIMIT}" if free > _COUNT_LIMIT else str(free)
        parts.append(f"{needed} block(s) of /{prefixlen} (the pool holds {capacity}, {shown} free)")
    names = ", ".join(str(network) for network in needing)
    return PoolExhausted(
        f"remap pool {pool} cannot hold the remaps for peer CIDR(s) {names}: needed "
        + ", ".join(parts)
        + f"; free means clear of the local CIDRs, {taken_count} taken remap(s) and the peer CIDRs"
        " kept as they are. Configure a larger pool or release remaps of departed peers.",
        "pool",
    )


def plan_remaps(
    local: ClusterNetwork,
    peer_cidrs: Sequence[IPv4Network],
    *,
    pool: IPv4Network = DEFAULT_POOL,
    taken: Sequence[IPv4Network] = (),
    existing: Mapping[str, IPv4Network] | None = None,
) -> list[Remap]:
    """Choose the local view of each peer CIDR; one `Remap` per peer CIDR, in input order.

    A peer CIDR that overlaps a local CIDR (pod or service) or a ``taken`` remap (the local views
    of *other* peers) is remapped onto the lowest free block of the same size inside ``pool``: one
    that collides with no local CIDR, no taken remap, no peer CIDR kept as is and no other block
    chosen here. Any other peer CIDR maps to itself (identity remap).

    ``existing`` maps a peer CIDR (as a string) to the local view chosen for it before; that view
    is kept when it is still a free, same-size block inside the pool, so addresses stay stable.
    (A peer CIDR that no longer overlaps anything goes back to identity: it needs no NAT.)
    Raises `PoolExhausted` when the pool cannot hold every remap needed.
    """
    if not isinstance(pool, IPv4Network):
        raise NetworkConfigError(f"expected an IPv4Network, got {pool!r}", "pool")
    for index, network in enumerate(peer_cidrs):
        if not isinstance(network, IPv4Network):
            raise NetworkConfigError(f"expected an IPv4Network, got {network!r}", f"peer_cidrs[{index}]")
        for other_index, other in enumerate(peer_cidrs[:index]):
            if network.overlaps(other):
                raise NetworkConfigError(
                    f"{network} overlaps {other} (peer_cidrs[{other_index}])", f"peer_cidrs[{index}]"
                )
    existing = existing or {}
    local_cidrs = list(local.all_cidrs)
    taken_list = list(taken)

    needing = [
        network
        for network in peer_cidrs
        if any(network.overlaps(other) for other in local_cidrs + taken_list)
    ]
    identities = [network for network in peer_cidrs if network not in needing]
    blocked: list[IPv4Network] = local_cidrs + taken_list + identities

    chosen: dict[IPv4Network, IPv4Network] = {}
    # Remaps chosen before claim their blocks first, so a newcomer never steals one.
    for network in needing:
        previous = existing.get(str(network))
        if (
            isinstance(previous, IPv4Network)
            and previous.prefixlen == network.prefixlen
            and previous.subnet_of(pool)
            and _first_collision(previous, blocked) is None
        ):
            chosen[network] = previous
            blocked.append(previous)
    for network in needing:
        if network in chosen:
            continue
        block = next(iter(_free_blocks(pool, network.prefixlen, blocked)), None)
        if block is None:
            raise _exhausted(pool, needing, local_cidrs + taken_list + identities, len(taken_list))
        chosen[network] = block
        blocked.append(block)

    return [Remap(original=network, local_view=chosen.get(network, network)) for network in peer_cidrs]
