"""Tunnel health as data: the ``NetworkReady`` condition and the PeerNetwork status body.

Pure. WireGuard re-handshakes at least every two minutes while a peer is alive (rekey after 120 s,
and the persistent keepalive keeps a silent tunnel talking); a session older than 180 s is
rejected by the protocol itself. So the tunnel is ready when the last handshake is at most
``HANDSHAKE_FRESH`` old, and not ready — with a message naming the endpoint — otherwise.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from kube import api
from kube.times import rfc3339
from netfabric.model import NetworkConfigError, PoolExhausted, Remap
from netfabric.peerspec import EndpointError
from netfabric.wgconfig import DeviceState

__all__ = [
    "HANDSHAKE_FRESH",
    "NETWORK_READY",
    "Condition",
    "Reason",
    "config_error_condition",
    "network_ready",
    "status_body",
]

NETWORK_READY = api.NETWORK_READY
#: WireGuard's REJECT_AFTER_TIME: a session older than this carries no traffic.
HANDSHAKE_FRESH = timedelta(seconds=180)


class Reason(enum.StrEnum):
    AWAITING_PEER_KEY = "AwaitingPeerKey"
    HANDSHAKE_RECENT = "HandshakeRecent"
    AWAITING_HANDSHAKE = "AwaitingHandshake"
    NO_HANDSHAKE = "NoHandshake"
    HANDSHAKE_STALE = "HandshakeStale"
    TUNNEL_DOWN = "TunnelDown"
    INVALID_CONFIG = "InvalidConfig"
    POOL_EXHAUSTED = "RemapPoolExhausted"
    ENDPOINT_UNRESOLVABLE = "EndpointUnresolvable"
    APPLY_FAILED = "ApplyFailed"


@dataclass(frozen=True)
class Condition:
    """A metav1.Condition without its transition time (`as_dict` adds it)."""

    type: str
    status: bool
    reason: Reason
    message: str

    def as_dict(self, *, now: datetime, previous: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The condition as the API wants it; keeps the previous transition time if unchanged."""
        status = "True" if self.status else "False"
        since = now
        if previous and previous.get("status") == status and previous.get("lastTransitionTime"):
            return {
                "type": self.type,
                "status": status,
                "lastTransitionTime": previous["lastTransitionTime"],
                "reason": self.reason.value,
                "message": self.message,
            }
        return {
            "type": self.type,
            "status": status,
            "lastTransitionTime": rfc3339(since),
            "reason": self.reason.value,
            "message": self.message,
        }


def network_ready(
    state: DeviceState | None,
    *,
    peer_public_key: str,
    endpoint: str | None,
    now: datetime,
    up_since: datetime | None = None,
    grace: timedelta = timedelta(seconds=15),
) -> Condition:
    """``NetworkReady`` from the device state: True only with a fresh handshake with the peer.

    ``up_since`` is when the tunnel was (re)configured: within ``grace`` of it, a missing handshake
    reads as ``AwaitingHandshake`` rather than a failure.
    """
    where = f" at {endpoint}" if endpoint else " (it dials us: no endpoint known here)"
    if state is None:
        return Condition(NETWORK_READY, False, Reason.TUNNEL_DOWN, "the tunnel interface does not exist")
    peer = next((p for p in state.peers if p.public_key == peer_public_key), None)
    if peer is None:
        return Condition(
            NETWORK_READY, False, Reason.TUNNEL_DOWN, "the tunnel is not configured with the peer's key"
        )
    if peer.last_handshake is None:
        if up_since is not None and now - up_since < grace:
            return Condition(
                NETWORK_READY, False, Reason.AWAITING_HANDSHAKE, f"waiting for a first handshake{where}"
            )
        age = f" in {int((now - up_since).total_seconds())}s" if up_since else ""
        return Condition(
            NETWORK_READY,
            False,
            Reason.NO_HANDSHAKE,
            f"no handshake with the peer{where}{age}: is the endpoint reachable over UDP and are the"
            " public keys current on both sides?",
        )
    age_seconds = int((now - peer.last_handshake).total_seconds())
    if now - peer.last_handshake > HANDSHAKE_FRESH:
        return Condition(
            NETWORK_READY,
            False,
            Reason.HANDSHAKE_STALE,
            f"last handshake with the peer{where} was {age_seconds}s ago (more than"
            f" {int(HANDSHAKE_FRESH.total_seconds())}s)",
        )
    return Condition(
        NETWORK_READY,
        True,
        Reason.HANDSHAKE_RECENT,
        f"handshake {age_seconds}s ago with the peer{where}; received {peer.rx_bytes} bytes,"
        f" sent {peer.tx_bytes}",
    )


def config_error_condition(error: Exception) -> Condition:
    """``NetworkReady=False`` for input that cannot be applied (nothing was applied)."""
    if isinstance(error, EndpointError):
        reason = Reason.ENDPOINT_UNRESOLVABLE
    elif isinstance(error, PoolExhausted):
        reason = Reason.POOL_EXHAUSTED
    elif isinstance(error, NetworkConfigError):
        reason = Reason.INVALID_CONFIG
    else:
        reason = Reason.APPLY_FAILED
    return Condition(NETWORK_READY, False, reason, f"{error}; nothing was applied")


def status_body(
    *,
    remaps: Sequence[Remap],
    pod_count: int,
    gateway_address: str | None,
    state: DeviceState | None,
    peer_public_key: str,
    condition: Condition,
    now: datetime,
    previous_conditions: Sequence[Mapping[str, Any]] = (),
    backend: str | None = None,
) -> dict[str, Any]:
    """The PeerNetwork ``status`` to write: remapped CIDRs, gateway, handshake, bytes, condition.

    ``remaps`` are the peer's pod CIDRs first (``pod_count`` of them), then its service CIDRs.
    """
    peer = next((p for p in (state.peers if state else ()) if p.public_key == peer_public_key), None)
    previous = next((c for c in previous_conditions if c.get("type") == condition.type), None)
    body: dict[str, Any] = {
        "remappedPodCIDRs": [str(r.local_view) for r in remaps[:pod_count]],
        "remappedServiceCIDRs": [str(r.local_view) for r in remaps[pod_count:]],
        "conditions": [condition.as_dict(now=now, previous=previous)],
    }
    if gateway_address:
        body["gatewayAddress"] = gateway_address
    if backend:
        body["backend"] = backend
    if peer is not None:
        body["bytes"] = {"received": peer.rx_bytes, "sent": peer.tx_bytes}
        if peer.endpoint:
            body["peerEndpoint"] = peer.endpoint
        if peer.last_handshake is not None:
            body["latestHandshake"] = rfc3339(peer.last_handshake)
    return body
