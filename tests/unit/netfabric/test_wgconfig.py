from __future__ import annotations

import base64
from datetime import UTC, datetime
from ipaddress import IPv4Address, IPv4Network

import pytest

from netfabric.keys import generate_private_key, public_key
from netfabric.model import NetworkConfigError
from netfabric.wgconfig import (
    DeviceConfig,
    PeerConfig,
    UapiError,
    parse_endpoint,
    parse_get,
    render_set,
)

PRIVATE = generate_private_key()
PEER = public_key(generate_private_key())
OTHER = public_key(generate_private_key())


def hexkey(b64: str) -> str:
    return base64.b64decode(b64).hex()


def config(**peer: object) -> DeviceConfig:
    return DeviceConfig(
        private_key=PRIVATE,
        listen_port=51820,
        peers=(
            PeerConfig(
                public_key=PEER,
                allowed_ips=(IPv4Network("10.244.0.0/16"), IPv4Network("10.96.0.0/16")),
                endpoint=(IPv4Address("192.0.2.1"), 51820),
                **peer,  # type: ignore[arg-type]
            ),
        ),
    )


def test_render_set_updates_peers_in_place_and_removes_others() -> None:
    text = render_set(config(), remove_peers=[OTHER, PEER])
    assert text.endswith("\n\n")
    assert text.splitlines()[:-1] == [
        "set=1",
        f"private_key={hexkey(PRIVATE)}",
        "listen_port=51820",
        "fwmark=0",
        f"public_key={hexkey(OTHER)}",
        "remove=true",
        f"public_key={hexkey(PEER)}",
        "endpoint=192.0.2.1:51820",
        "persistent_keepalive_interval=25",
        "replace_allowed_ips=true",
        "allowed_ip=10.244.0.0/16",
        "allowed_ip=10.96.0.0/16",
    ]
    assert "replace_peers" not in text  # would drop the session of a peer that stays


def test_client_without_listen_port_or_endpoint() -> None:
    text = render_set(DeviceConfig(private_key=PRIVATE, peers=(PeerConfig(PEER, allowed_ips=()),)))
    assert "listen_port" not in text and "endpoint" not in text


def test_parse_get() -> None:
    answer = (
        f"private_key={hexkey(PRIVATE)}\nlisten_port=51820\nfwmark=0\n"
        f"public_key={hexkey(PEER)}\nendpoint=192.0.2.1:40000\nlast_handshake_time_sec=1700000000\n"
        "last_handshake_time_nsec=500000000\ntx_bytes=100\nrx_bytes=200\n"
        "persistent_keepalive_interval=25\nprotocol_version=1\nallowed_ip=10.244.0.0/16\n"
        f"public_key={hexkey(OTHER)}\nlast_handshake_time_sec=0\nlast_handshake_time_nsec=0\n"
        "errno=0\n\n"
    )
    state = parse_get(answer)
    assert state.public_key == public_key(PRIVATE)
    assert state.listen_port == 51820
    first, second = state.peers
    assert first.public_key == PEER and first.endpoint == "192.0.2.1:40000"
    assert first.last_handshake == datetime.fromtimestamp(1700000000.5, tz=UTC)
    assert (first.rx_bytes, first.tx_bytes, first.keepalive_seconds) == (200, 100, 25)
    assert first.allowed_ips == (IPv4Network("10.244.0.0/16"),)
    assert second.public_key == OTHER and second.last_handshake is None


def test_parse_get_errors() -> None:
    with pytest.raises(UapiError, match="errno=1") as caught:
        parse_get("errno=1\n\n")
    assert caught.value.errno == 1
    with pytest.raises(UapiError, match="without an errno"):
        parse_get("listen_port=1\n\n")


@pytest.mark.parametrize(
    "make",
    [
        lambda: PeerConfig("short", allowed_ips=()),
        lambda: PeerConfig(PEER, allowed_ips=(), endpoint=(IPv4Address("192.0.2.1"), 0)),
        lambda: DeviceConfig(private_key=PRIVATE, listen_port=70000),
        lambda: PeerConfig(PEER, allowed_ips=(), keepalive_seconds=-1),
    ],
)
def test_invalid_values_are_refused(make: object) -> None:
    with pytest.raises(NetworkConfigError):
        make()  # type: ignore[operator]


def test_parse_endpoint() -> None:
    assert parse_endpoint("192.0.2.1:51820") == (IPv4Address("192.0.2.1"), 51820)
    for bad in ("192.0.2.1", "[::1]:51820", "host:1", "192.0.2.1:x"):
        with pytest.raises(NetworkConfigError):
            parse_endpoint(bad)
