"""PeerNetwork object → plan → apply → status: one pass of the gateway's reconcile loop.

`reconcile_peer` takes the object as the API server returns it (a raw dict) and returns the
status to write (`netfabric.objects.write_status`). It never raises for bad input or a failed
apply: those become ``NetworkReady=False`` with a reason and a message, as an operator reads
them in ``kubectl get pnet``. Bad input is refused before anything is touched; a failed apply has
already been rolled back by `gateway_up`. Remaps published earlier in ``status`` are kept, so a
remote pod keeps its address across gateway restarts, and ``status.peerEndpoint`` (where a
client peer was last seen from) lets a restarted server dial it at once.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from ipaddress import IPv4Address, IPv4Network
from typing import Any

from netfabric.conditions import NETWORK_READY, Condition, Reason, config_error_condition, status_body
from netfabric.gateway import (
    GatewayPlan,
    GatewaySettings,
    gateway_status,
    gateway_up,
    plan_gateway,
    resolve_endpoint,
)
from netfabric.model import ClusterNetwork, NetworkConfigError, Reserved
from netfabric.peerspec import peer_spec_from_object
from netfabric.routes import own_networks
from netfabric.wgconfig import parse_endpoint
from netfabric.wireguard import Backend, detect_backend

__all__ = ["Reconciled", "reconcile_peer", "refresh_status"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Reconciled:
    status: dict[str, Any]
    """The status to merge into the PeerNetwork."""
    plan: GatewayPlan | None
    """What was applied; None when nothing was (see the condition)."""
    condition: Condition
    backend: Backend | None = None
    """The WireGuard backend in use (pass it to the next `refresh_status`)."""


def _previous(obj: Mapping[str, Any]) -> tuple[dict[str, IPv4Network], tuple[IPv4Address, int] | None]:
    """Remaps and the peer's last endpoint from an earlier status; whatever is unreadable is ignored."""
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    existing: dict[str, IPv4Network] = {}
    for originals, views in (
        (spec.get("podCIDRs") or [], status.get("remappedPodCIDRs") or []),
        (spec.get("serviceCIDRs") or [], status.get("remappedServiceCIDRs") or []),
    ):
        for original, view in zip(originals, views, strict=False):
            try:
                existing[str(original)] = IPv4Network(view)
            except ValueError:
                continue
    last_seen = None
    if isinstance(status.get("peerEndpoint"), str):
        try:
            last_seen = parse_endpoint(status["peerEndpoint"])
        except NetworkConfigError:
            last_seen = None
    return existing, last_seen


async def with_own_addresses(local: ClusterNetwork, *, netns: str | None) -> ClusterNetwork:
    """``local`` with the gateway namespace's own address ranges reserved (those outside the
    local pod and Service CIDRs: a WAN, the loopback, a node's network in host mode)."""
    own = tuple(
        Reserved(network, f"this gateway's own address range on {ifname}")
        for network, ifname in await own_networks(netns=netns)
        if not any(network.subnet_of(cidr) for cidr in local.all_cidrs)
    )
    return replace(local, reserved=local.reserved + own)


def _conditions(obj: Mapping[str, Any]) -> Sequence[Mapping[str, Any]]:
    return list((obj.get("status") or {}).get("conditions") or [])


async def reconcile_peer(
    obj: Mapping[str, Any],
    *,
    local: ClusterNetwork,
    private_key: str,
    settings: GatewaySettings,
    taken: Sequence[IPv4Network] = (),
) -> Reconciled:
    """Bring the gateway for this peer to what the object says; returns the status to write."""
    now = datetime.now(UTC)
    existing, last_seen = _previous(obj)
    if not (obj.get("spec") or {}).get("publicKey"):
        # the peering fills the peer's key in once the peer's gateway has one: nothing to apply yet
        condition = Condition(NETWORK_READY, False, Reason.AWAITING_PEER_KEY,
                              "waiting for the peer gateway's public key (spec.publicKey)")  # fmt: skip
        return Reconciled({"conditions": [condition.as_dict(now=now)]}, None, condition)
    try:
        spec = peer_spec_from_object(obj)
        endpoint = await resolve_endpoint(spec.endpoint)
        local = await with_own_addresses(local, netns=settings.netns)
        plan = plan_gateway(
            local,
            spec,
            private_key=private_key,
            settings=settings,
            endpoint=endpoint,
            taken=taken,
            existing=existing,
            last_seen=last_seen,
        )
    except NetworkConfigError as e:
        condition = config_error_condition(e)
        logger.warning("PeerNetwork refused: %s", condition.message)
        return Reconciled({"conditions": [condition.as_dict(now=now)]}, None, condition)
    try:
        backend = await gateway_up(plan, settings=settings)
    except Exception as e:  # rolled back by gateway_up; reported, retried on the next pass
        message = f"applying the gateway failed and was rolled back: {e}"
        condition = Condition(NETWORK_READY, False, Reason.APPLY_FAILED, message)
        return Reconciled({"conditions": [condition.as_dict(now=now)]}, None, condition)
    return await refresh_status(obj, plan, settings=settings, up_since=now, backend=backend)


async def refresh_status(
    obj: Mapping[str, Any],
    plan: GatewayPlan,
    *,
    settings: GatewaySettings,
    up_since: datetime | None,
    backend: Backend | None = None,
) -> Reconciled:
    """The status of an applied gateway (what a periodic status pass writes)."""
    now = datetime.now(UTC)
    backend = backend or await detect_backend(netns=settings.netns, prefer=settings.backend)
    state, condition = await gateway_status(plan, settings=settings, up_since=up_since, backend=backend)
    status = status_body(
        remaps=plan.remaps,
        pod_count=len(plan.peer.pod_cidrs),
        gateway_address=str(settings.gateway_ip),
        state=state,
        peer_public_key=plan.device.peers[0].public_key,
        condition=condition,
        now=now,
        previous_conditions=_conditions(obj),
        backend=backend.kind.value,
    )
    return Reconciled(status, plan, condition, backend)
