"""The gateway of one cluster towards one peer: plan, bring up, inspect, tear down.

`plan_gateway` (pure) turns the local network, the peer's published spec and local settings into
everything the gateway applies: the remaps, the WireGuard device configuration, the nftables
script, the policy rule and the tunnel routes. Bad input (malformed or overlapping CIDRs, an
exhausted remap pool, a bad key) raises `NetworkConfigError` *before* anything is touched.

`gateway_up` then applies, in order: sysctls, the WireGuard interface (kernel or wireguard-go,
see `netfabric.wireguard`), the tunnel routes in the gateway's own table, the fwmark rule that
selects it, and the nftables table in one transaction. When any step fails, everything is torn
down again, so a failed apply never leaves half a fabric. Re-running it with the same input is
idempotent, and it recovers a killed wireguard-go or a rotated key by reconfiguring.

`gateway_down` removes all of it and verifies that nothing is left; it may repeat.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from ipaddress import IPv4Address, IPv4Network, ip_address

from netfabric.conditions import Condition, network_ready
from netfabric.ipam import DEFAULT_POOL, plan_remaps
from netfabric.keys import public_key
from netfabric.model import ClusterNetwork, NetworkConfigError, PeerNetwork, Remap, SourceNatMode
from netfabric.nat import DEFAULT_FWMARK, DEFAULT_FWMARK_MASK, render_nat_table, table_name_for
from netfabric.nft import apply_script, delete_table, list_tables
from netfabric.nsexec import ensure_sysctls
from netfabric.peerspec import EndpointError, PeerSpec
from netfabric.planning import Route, tunnel_routes
from netfabric.routes import (
    PolicyRule,
    delete_rule,
    ensure_rule,
    link_exists,
    observed_routes,
    observed_rules,
    sync_routes,
)
from netfabric.wgconfig import DeviceConfig, DeviceState, PeerConfig
from netfabric.wireguard import (
    Backend,
    BackendKind,
    UserspaceBackend,
    detect_backend,
    wireguard_go_pids,
)

__all__ = [
    "EndpointError",
    "GatewayPlan",
    "GatewaySettings",
    "gateway_down",
    "gateway_status",
    "gateway_up",
    "leftovers",
    "plan_gateway",
    "refuse_reserved",
    "resolve_endpoint",
]

logger = logging.getLogger(__name__)

#: What a gateway's network namespace needs: forwarding, and no reverse-path filter (sources
#: from the tunnel may overlap local pods). The chart's gateway.sysctls sets the same.
GATEWAY_SYSCTLS = {"net.ipv4.ip_forward": "1", "net.ipv4.conf.all.rp_filter": "0"}


@dataclass(frozen=True)
class GatewaySettings:
    """Local, operator-chosen settings of a gateway (one per peer)."""

    iface: str
    """Tunnel interface name (one interface per peer: allowed-ips of two peers may overlap)."""
    gateway_ip: IPv4Address
    """The gateway's own pod IP: the SNAT source in Gateway mode, the node agents' next hop."""
    netns: str | None = None
    """Network namespace (an ``ip netns`` name) to work in; None is the caller's own."""
    listen_port: int | None = None
    """UDP port to listen on: fixed for a server (behind its NodePort/LoadBalancer), None for a client."""
    mtu: int | None = None
    """Tunnel MTU; None takes the peer object's ``spec.mtu``."""
    route_table: int = 4700
    """Policy routing table holding the tunnel routes (original peer CIDRs)."""
    rule_priority: int = 4700
    fwmark: int = DEFAULT_FWMARK
    fwmark_mask: int = DEFAULT_FWMARK_MASK
    pool: IPv4Network = DEFAULT_POOL
    """Where remapped CIDRs for overlapping peer CIDRs come from."""
    backend: BackendKind | None = None
    """Force a backend; None detects (kernel WireGuard when the kernel has it)."""

    @property
    def rule(self) -> PolicyRule:
        return PolicyRule(self.fwmark, self.fwmark_mask, self.route_table, self.rule_priority)


@dataclass(frozen=True)
class GatewayPlan:
    """Everything `gateway_up` applies, computed without I/O."""

    table_name: str
    peer: PeerNetwork
    remaps: tuple[Remap, ...]
    device: DeviceConfig
    nft_script: str
    routes: tuple[Route, ...]
    mtu: int
    endpoint: str | None = field(default=None)


def refuse_reserved(local: ClusterNetwork, spec: PeerSpec) -> None:
    """Refuse a peer CIDR that overlaps a range of this side outside its pod and Service CIDRs.
    A peer CIDR that overlaps a local pod or Service CIDR is remapped instead: it is reached under
    another view and nothing of this side is routed away. Pure; raises `NetworkConfigError`
    naming the field."""
    fields = [("spec.podCIDRs", i, c) for i, c in enumerate(spec.pod_cidrs)]
    fields += [("spec.serviceCIDRs", i, c) for i, c in enumerate(spec.service_cidrs)]
    for field_name, index, cidr in fields:
        if any(cidr.overlaps(own) for own in local.all_cidrs):
            continue  # remapped
        for reserved in local.reserved:
            if cidr.overlaps(reserved.network):
                raise NetworkConfigError(
                    f"the peer's CIDR {cidr} overlaps {reserved.what} ({reserved.network}): routing it "
                    "to the tunnel would hand this side's own traffic to the peer",
                    f"{field_name}[{index}]",
                )


def plan_gateway(
    local: ClusterNetwork,
    spec: PeerSpec,
    *,
    private_key: str,
    settings: GatewaySettings,
    endpoint: tuple[IPv4Address, int] | None = None,
    taken: Sequence[IPv4Network] = (),
    existing: Mapping[str, IPv4Network] | None = None,
    last_seen: tuple[IPv4Address, int] | None = None,
) -> GatewayPlan:
    """Plan the gateway for one peer (pure); raises `NetworkConfigError` on bad input.

    ``endpoint`` is the peer's endpoint already resolved (see `resolve_endpoint`); ``taken`` the
    local views of other peers; ``existing`` the remaps published before (kept when still valid).
    ``last_seen`` is where a peer that publishes no endpoint (a client) was last seen from
    (``status.peerEndpoint``): a restarted server dials it at once instead of waiting until the
    client notices the lost session (keepalive timeout + rekey timeout, about 15 s).
    """
    if not isinstance(settings.gateway_ip, IPv4Address) or not any(
        settings.gateway_ip in network for network in local.pod_cidrs
    ):
        raise NetworkConfigError(
            f"the gateway's pod IP {settings.gateway_ip} is not inside the local pod CIDRs"
            f" {', '.join(map(str, local.pod_cidrs))}",
            "gateway_ip",
        )
    refuse_reserved(local, spec)
    remaps = tuple(plan_remaps(local, spec.cidrs, pool=settings.pool, taken=taken, existing=existing))
    count = len(spec.pod_cidrs)
    peer = PeerNetwork(
        cluster_id=spec.cluster_id,
        pod_cidrs=spec.pod_cidrs,
        service_cidrs=spec.service_cidrs,
        remapped_pod_cidrs=tuple(r.local_view for r in remaps[:count]),
        remapped_service_cidrs=tuple(r.local_view for r in remaps[count:]),
    )
    device = DeviceConfig(
        private_key=private_key,
        listen_port=settings.listen_port,
        peers=(
            PeerConfig(
                public_key=spec.public_key,
                allowed_ips=spec.cidrs,
                endpoint=endpoint or last_seen,
                keepalive_seconds=spec.keepalive_seconds,
            ),
        ),
    )
    if public_key(private_key) == spec.public_key:
        raise NetworkConfigError("the peer's public key is our own: keys were mixed up", "spec.publicKey")
    table_name = table_name_for(spec.cluster_id)
    script = render_nat_table(
        table_name,
        tunnel_iface=settings.iface,
        remaps=remaps,
        snat_mode=spec.source_nat_mode,
        gateway_ip=settings.gateway_ip if spec.source_nat_mode is SourceNatMode.GATEWAY else None,
        fwmark=settings.fwmark,
        fwmark_mask=settings.fwmark_mask,
    )
    routes = tuple(tunnel_routes(remaps, tunnel_iface=settings.iface, table=settings.route_table))
    return GatewayPlan(
        table_name=table_name,
        peer=peer,
        remaps=remaps,
        device=device,
        nft_script=script,
        routes=routes,
        mtu=settings.mtu or spec.mtu,
        endpoint=f"{endpoint[0]}:{endpoint[1]}" if endpoint else None,
    )


async def resolve_endpoint(endpoint: tuple[str, int] | None) -> tuple[IPv4Address, int] | None:
    """An endpoint's address as IPv4 (DNS names resolved once); `EndpointError` if it cannot be."""
    if endpoint is None:
        return None
    host, port = endpoint
    try:
        address = ip_address(host)
    except ValueError:
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(
                host, port, family=socket.AF_INET, type=socket.SOCK_DGRAM
            )
        except OSError as e:
            raise EndpointError(f"cannot resolve {host!r}: {e}", "spec.endpoint.address") from e
        address = ip_address(infos[0][4][0])
    if not isinstance(address, IPv4Address):
        raise EndpointError(f"{host!r} is not an IPv4 endpoint", "spec.endpoint.address")
    if address.is_unspecified or address.is_multicast:
        raise EndpointError(f"{host!r} cannot be a peer's endpoint", "spec.endpoint.address")
    return address, port


async def _backend(settings: GatewaySettings) -> Backend:
    return await detect_backend(netns=settings.netns, prefer=settings.backend)


async def gateway_up(plan: GatewayPlan, *, settings: GatewaySettings) -> Backend:
    """Apply ``plan``; on any failure tear everything down and re-raise. Returns the backend."""
    netns = settings.netns
    try:
        backend = await _backend(settings)
        # only what differs is written: in a gateway pod /proc/sys is read-only and the pod's
        # securityContext.sysctls set them (conf.default too, so that the tunnel inherits it)
        await ensure_sysctls(GATEWAY_SYSCTLS, netns=netns)
        await backend.ensure(settings.iface, plan.device, mtu=plan.mtu)
        # Sources from the tunnel may overlap local pods: no reverse-path filter on it.
        await ensure_sysctls({f"net.ipv4.conf.{settings.iface}.rp_filter": "0"}, netns=netns)
        await sync_routes(plan.routes, table=settings.route_table, netns=netns)
        await ensure_rule(settings.rule, netns=netns)
        await apply_script(plan.nft_script, netns=netns)
    except BaseException:
        logger.exception("bringing up the gateway %s failed; tearing it down", settings.iface)
        await asyncio.shield(gateway_down(settings, table_name=plan.table_name))
        raise
    logger.info(
        "gateway %s up with %s WireGuard: %s",
        settings.iface,
        backend.kind.value,
        ", ".join(f"{r.original}->{r.local_view}" for r in plan.remaps),
    )
    return backend


async def gateway_down(settings: GatewaySettings, *, table_name: str) -> None:
    """Remove the nft table, the rule, the tunnel routes and the interface (and wireguard-go)."""
    netns = settings.netns
    errors: list[Exception] = []
    steps = (
        delete_table(table_name, netns=netns),
        delete_rule(settings.rule, netns=netns),
        sync_routes((), table=settings.route_table, netns=netns),
        # Deleting the link ends wireguard-go too; this handles kernel links and stray processes.
        UserspaceBackend(netns=netns).remove(settings.iface),
    )
    for step in steps:
        try:
            await step
        except Exception as e:  # keep going: remove as much as possible, then report
            errors.append(e)
    if errors:
        raise ExceptionGroup(f"tearing down gateway {settings.iface} left things behind", errors)


async def leftovers(settings: GatewaySettings, *, table_name: str) -> list[str]:
    """What of a gateway is still there (empty after a clean `gateway_down`)."""
    netns = settings.netns
    found = []
    if await link_exists(settings.iface, netns=netns):
        found.append(f"interface {settings.iface}")
    if table_name in await list_tables(netns=netns):
        found.append(f"nft table {table_name}")
    if settings.rule in await observed_rules(netns=netns):
        found.append(f"ip rule {settings.rule}")
    for route in await observed_routes(table=settings.route_table, netns=netns):
        found.append(f"route {route.dest} table {route.table}")
    for pid in wireguard_go_pids(settings.iface, netns=netns):
        found.append(f"wireguard-go pid {pid}")
    return found


async def gateway_status(
    plan: GatewayPlan,
    *,
    settings: GatewaySettings,
    up_since: datetime | None = None,
    backend: Backend | None = None,
) -> tuple[DeviceState | None, Condition]:
    """The device state and the ``NetworkReady`` condition it gives.

    Pass the ``backend`` `gateway_up` returned: detecting it again probes the kernel with a
    throwaway link, which a periodic status pass should not do.
    """
    backend = backend or await _backend(settings)
    state = await backend.state(settings.iface)
    condition = network_ready(
        state,
        peer_public_key=plan.device.peers[0].public_key,
        endpoint=plan.endpoint,
        now=datetime.now(UTC),
        up_since=up_since,
    )
    return state, condition
