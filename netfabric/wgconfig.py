"""WireGuard device configuration and state as values, and the UAPI text protocol for them.

Pure: builds the ``set=1`` request text of the cross-platform userspace API (the one
``wireguard-go`` serves on ``/var/run/wireguard/<iface>.sock``) and parses the ``get=1`` answer.
The socket I/O lives in `netfabric.uapi`; the kernel backend turns the same values into netlink
attributes (`netfabric.wireguard`).

Protocol (https://www.wireguard.com/xplatform/): a request is ``set=1`` or ``get=1`` followed by
``key=value`` lines and an empty line; the answer ends with ``errno=N`` and an empty line. Keys
are 64 lowercase hex characters; a ``public_key=`` line starts a peer section.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from ipaddress import IPv4Address, IPv4Network, ip_address, ip_network

from netfabric.keys import hex_key, public_key, validate_key
from netfabric.model import NetworkConfigError

__all__ = [
    "DeviceConfig",
    "DeviceState",
    "PeerConfig",
    "PeerState",
    "UapiError",
    "parse_get",
    "render_set",
]


class UapiError(RuntimeError):
    """The device answered a request with a non-zero errno (or not in the protocol at all)."""

    def __init__(self, message: str, errno: int | None = None) -> None:
        super().__init__(message)
        self.errno = errno


@dataclass(frozen=True)
class PeerConfig:
    """One WireGuard peer: the remote gateway."""

    public_key: str
    """Base64 public key of the peer (as ``wg pubkey`` prints it)."""
    allowed_ips: tuple[IPv4Network, ...]
    """Inner addresses the peer may send from and we route to it: its *original* CIDRs."""
    endpoint: tuple[IPv4Address, int] | None = None
    """Where to reach the peer; None for a client that dials us (the server side)."""
    keepalive_seconds: int = 25
    """Persistent keepalive; 0 disables it. Keeps NAT mappings open and the handshake fresh."""

    def __post_init__(self) -> None:
        validate_key(self.public_key, "publicKey")
        if self.endpoint is not None:
            address, port = self.endpoint
            if not isinstance(address, IPv4Address):
                raise NetworkConfigError(f"expected a resolved IPv4 address, got {address!r}", "endpoint")
            if not 0 < port < 65536:
                raise NetworkConfigError(f"{port} is not a UDP port", "endpoint.port")
        if not 0 <= self.keepalive_seconds <= 65535:
            raise NetworkConfigError(f"{self.keepalive_seconds} is not a keepalive interval", "keepalive")


@dataclass(frozen=True)
class DeviceConfig:
    """The whole desired configuration of one WireGuard interface (one peer per interface)."""

    private_key: str
    listen_port: int | None = None
    """UDP port to listen on; None lets the device choose (a client needs no fixed port)."""
    fwmark: int = 0
    peers: tuple[PeerConfig, ...] = field(default=())

    def __post_init__(self) -> None:
        validate_key(self.private_key, "privateKey")
        if self.listen_port is not None and not 0 < self.listen_port < 65536:
            raise NetworkConfigError(f"{self.listen_port} is not a UDP port", "listenPort")
        if not 0 <= self.fwmark < 2**32:
            raise NetworkConfigError(f"{self.fwmark} is not a 32-bit mark", "fwmark")


@dataclass(frozen=True)
class PeerState:
    """One peer as the device reports it."""

    public_key: str
    endpoint: str | None = None
    last_handshake: datetime | None = None
    rx_bytes: int = 0
    tx_bytes: int = 0
    keepalive_seconds: int = 0
    allowed_ips: tuple[IPv4Network, ...] = ()


@dataclass(frozen=True)
class DeviceState:
    """A device as ``get=1`` reports it (the private key is never kept, only its public key)."""

    public_key: str | None
    listen_port: int
    fwmark: int
    peers: tuple[PeerState, ...]


def render_set(config: DeviceConfig, *, remove_peers: Sequence[str] = ()) -> str:
    """The ``set=1`` request that makes the device ``config``.

    Peers are updated in place, not replaced: a peer whose key stays keeps its session and the
    endpoint it roamed to, so re-applying the same configuration does not interrupt traffic.
    ``remove_peers`` (base64 keys the device has now) are removed unless ``config`` keeps them.
    """
    lines = ["set=1", f"private_key={hex_key(config.private_key, 'privateKey')}"]
    if config.listen_port is not None:
        lines.append(f"listen_port={config.listen_port}")
    lines.append(f"fwmark={config.fwmark}")
    kept = {peer.public_key for peer in config.peers}
    for key in remove_peers:
        if key not in kept:
            lines.append(f"public_key={hex_key(key, 'publicKey')}")
            lines.append("remove=true")
    for peer in config.peers:
        lines.append(f"public_key={hex_key(peer.public_key, 'publicKey')}")
        if peer.endpoint is not None:
            lines.append(f"endpoint={peer.endpoint[0]}:{peer.endpoint[1]}")
        lines.append(f"persistent_keepalive_interval={peer.keepalive_seconds}")
        lines.append("replace_allowed_ips=true")
        lines.extend(f"allowed_ip={network}" for network in peer.allowed_ips)
    return "\n".join(lines) + "\n\n"


def _b64(hex_value: str, name: str) -> str:
    try:
        raw = bytes.fromhex(hex_value)
    except ValueError:
        raise UapiError(f"{name} is not hex in the device's answer") from None
    return base64.b64encode(raw).decode("ascii")


def parse_errno(lines: Sequence[str]) -> int:
    """The errno of an answer; raises `UapiError` when the answer has none."""
    for line in reversed(lines):
        if line.startswith("errno="):
            try:
                return int(line.partition("=")[2])
            except ValueError:
                break
    raise UapiError(f"the device answered without an errno line: {list(lines)[-3:]!r}")


def parse_get(text: str) -> DeviceState:
    """Parse a ``get=1`` answer; raises `UapiError` when its errno is not 0."""
    lines = [line for line in text.split("\n") if line]
    errno = parse_errno(lines)
    if errno:
        raise UapiError(f"get=1 failed with errno={errno}", errno)
    device: dict[str, str] = {}
    peers: list[dict[str, list[str]]] = []
    for line in lines:
        key, sep, value = line.partition("=")
        if not sep:
            raise UapiError(f"unexpected line in the device's answer: {line!r}")
        if key == "errno":
            continue
        if key == "public_key":
            peers.append({})
        if peers:
            peers[-1].setdefault(key, []).append(value)
        else:
            device[key] = value
    public: str | None = None
    if "private_key" in device:
        public = public_key(_b64(device["private_key"], "private_key"))
    states = []
    for peer in peers:
        seconds = int(peer.get("last_handshake_time_sec", ["0"])[0])
        nanos = int(peer.get("last_handshake_time_nsec", ["0"])[0])
        handshake = datetime.fromtimestamp(seconds + nanos / 1e9, tz=UTC) if seconds or nanos else None
        allowed: list[IPv4Network] = []
        for value in peer.get("allowed_ip", []):
            network = ip_network(value, strict=False)
            if isinstance(network, IPv4Network):
                allowed.append(network)
        states.append(
            PeerState(
                public_key=_b64(peer["public_key"][0], "public_key"),
                endpoint=peer.get("endpoint", [None])[0],
                last_handshake=handshake,
                rx_bytes=int(peer.get("rx_bytes", ["0"])[0]),
                tx_bytes=int(peer.get("tx_bytes", ["0"])[0]),
                keepalive_seconds=int(peer.get("persistent_keepalive_interval", ["0"])[0]),
                allowed_ips=tuple(allowed),
            )
        )
    return DeviceState(
        public_key=public,
        listen_port=int(device.get("listen_port", "0")),
        fwmark=int(device.get("fwmark", "0")),
        peers=tuple(states),
    )


def parse_endpoint(value: str) -> tuple[IPv4Address, int]:
    """``'192.0.2.1:51820'`` → (address, port); the inverse of what `render_set` writes."""
    host, sep, port = value.rpartition(":")
    try:
        address = ip_address(host) if sep else None
    except ValueError:
        address = None
    if not isinstance(address, IPv4Address) or not port.isdigit():
        raise NetworkConfigError(f"{value!r} is not an IPv4 address:port", "endpoint")
    return address, int(port)
