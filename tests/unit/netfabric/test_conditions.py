from __future__ import annotations

from datetime import UTC, datetime, timedelta
from ipaddress import IPv4Network

from netfabric.conditions import Reason, config_error_condition, network_ready, status_body
from netfabric.keys import generate_private_key, public_key
from netfabric.model import NetworkConfigError, PoolExhausted, Remap
from netfabric.peerspec import EndpointError
from netfabric.wgconfig import DeviceState, PeerState

NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
PEER = public_key(generate_private_key())


def state(handshake: datetime | None, key: str = PEER) -> DeviceState:
    peer = PeerState(
        public_key=key, endpoint="192.0.2.1:51820", last_handshake=handshake, rx_bytes=7, tx_bytes=9
    )
    return DeviceState(public_key=None, listen_port=51820, fwmark=0, peers=(peer,))


def ready(device: DeviceState | None, up_since: datetime | None = None) -> tuple[bool, Reason, str]:
    c = network_ready(device, peer_public_key=PEER, endpoint="192.0.2.1:51820", now=NOW, up_since=up_since)
    return c.status, c.reason, c.message


def test_fresh_handshake_is_ready() -> None:
    ok, reason, message = ready(state(NOW - timedelta(seconds=30)))
    assert ok and reason is Reason.HANDSHAKE_RECENT
    assert "30s ago" in message and "received 7 bytes, sent 9" in message


def test_stale_missing_and_absent() -> None:
    assert ready(state(NOW - timedelta(seconds=181)))[:2] == (False, Reason.HANDSHAKE_STALE)
    assert ready(state(None), up_since=NOW - timedelta(seconds=5))[:2] == (False, Reason.AWAITING_HANDSHAKE)
    ok, reason, message = ready(state(None), up_since=NOW - timedelta(seconds=60))
    assert (ok, reason) == (False, Reason.NO_HANDSHAKE)
    assert "at 192.0.2.1:51820 in 60s" in message
    assert ready(None)[:2] == (False, Reason.TUNNEL_DOWN)
    other = public_key(generate_private_key())
    assert ready(state(NOW, key=other))[:2] == (False, Reason.TUNNEL_DOWN)


def test_config_errors_map_to_reasons() -> None:
    assert config_error_condition(PoolExhausted("full", "pool")).reason is Reason.POOL_EXHAUSTED
    assert config_error_condition(EndpointError("no", "spec.endpoint")).reason is Reason.ENDPOINT_UNRESOLVABLE
    bad = config_error_condition(NetworkConfigError("bad", "spec.podCIDRs[0]"))
    assert bad.reason is Reason.INVALID_CONFIG and not bad.status
    assert bad.message == "spec.podCIDRs[0]: bad; nothing was applied"


def test_status_body_and_transition_time_kept() -> None:
    remaps = [
        Remap(IPv4Network("10.244.0.0/16"), IPv4Network("10.70.0.0/16")),
        Remap(IPv4Network("10.96.0.0/16"), IPv4Network("10.71.0.0/16")),
    ]
    condition = network_ready(state(NOW), peer_public_key=PEER, endpoint=None, now=NOW)
    previous = [{"type": "NetworkReady", "status": "True", "lastTransitionTime": "2025-01-01T00:00:00Z"}]
    body = status_body(
        remaps=remaps, pod_count=1, gateway_address="10.244.2.5", state=state(NOW), peer_public_key=PEER,
        condition=condition, now=NOW, previous_conditions=previous,
    )
    assert body["remappedPodCIDRs"] == ["10.70.0.0/16"]
    assert body["remappedServiceCIDRs"] == ["10.71.0.0/16"]
    assert body["gatewayAddress"] == "10.244.2.5"
    assert body["bytes"] == {"received": 7, "sent": 9}
    assert body["peerEndpoint"] == "192.0.2.1:51820"
    assert body["latestHandshake"] == "2026-01-01T12:00:00Z"
    assert body["conditions"][0]["lastTransitionTime"] == "2025-01-01T00:00:00Z"
    flipped = status_body(
        remaps=remaps, pod_count=1, gateway_address=None, state=None, peer_public_key=PEER,
        condition=network_ready(None, peer_public_key=PEER, endpoint=None, now=NOW), now=NOW,
        previous_conditions=previous,
    )
    assert flipped["conditions"][0]["lastTransitionTime"] == "2026-01-01T12:00:00Z"
    assert flipped["conditions"][0]["reason"] == "TunnelDown"
