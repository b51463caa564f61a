"""WireGuard keys: X25519 with `cryptography`, in the formats `wg` and its UAPI use.

- ``wg genkey`` prints 32 random bytes, clamped as Curve25519 requires, base64-encoded (44 chars);
  `generate_private_key` does the same.
- ``wg pubkey`` derives the public key; `public_key` does the same. X25519 clamps the scalar
  internally, so an unclamped private key gives the same public key as its clamped form.
- The UAPI socket of ``wireguard-go`` (``set=1``: ``private_key=…``, ``public_key=…``) wants keys
  as 64 lowercase hex characters: `hex_key`.

Private keys are secrets: nothing here logs them, and `validate_key` never echoes one back.
"""

from __future__ import annotations

import base64
import binascii

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from netfabric.model import NetworkConfigError

__all__ = [
    "KEY_LENGTH",
    "clamp",
    "generate_private_key",
    "hex_key",
    "public_key",
    "validate_key",
]

KEY_LENGTH = 32
_B64_LENGTH = 44  # base64 of 32 bytes: 43 characters and one '=' of padding


def clamp(raw: bytes) -> bytes:
    """Clamp a Curve25519 scalar as ``wg genkey`` does (RFC 7748 section 5)."""
    if len(raw) != KEY_LENGTH:
        raise NetworkConfigError(f"a key is {KEY_LENGTH} bytes, got {len(raw)}", "key")
    data = bytearray(raw)
    data[0] &= 248
    data[31] = (data[31] & 127) | 64
    return bytes(data)


def validate_key(b64: str, field: str = "key") -> bytes:
    """Decode a base64 WireGuard key strictly and return its 32 raw bytes.

    The error says what is wrong (type, length, alphabet, decoded size) without quoting the value,
    since it may be a private key.
    """
    if not isinstance(b64, str):
        raise NetworkConfigError(f"expected a base64 string, got {type(b64).__name__}", field)
    if len(b64) != _B64_LENGTH or not b64.endswith("=") or b64.endswith("=="):
        raise NetworkConfigError(
            f"a WireGuard key is {_B64_LENGTH} base64 characters ending in one '=', got {len(b64)}"
            " characters (as printed by `wg genkey` / `wg pubkey`)",
            field,
        )
    try:
        raw = binascii.a2b_base64(b64.encode("ascii"), strict_mode=True)
    except (binascii.Error, UnicodeEncodeError):
        raise NetworkConfigError("the key is not valid base64", field) from None
    if len(raw) != KEY_LENGTH:  # unreachable with 44 chars and one '=', kept as a guard
        raise NetworkConfigError(f"the key decodes to {len(raw)} bytes, not {KEY_LENGTH}", field)
    return raw


def generate_private_key() -> str:
    """A new private key, base64 and clamped, exactly like ``wg genkey``."""
    raw = X25519PrivateKey.generate().private_bytes_raw()
    return base64.b64encode(clamp(raw)).decode("ascii")


def public_key(private_b64: str) -> str:
    """The public key of a base64 private key, exactly like ``wg pubkey``."""
    raw = validate_key(private_b64, "private_key")
    public = X25519PrivateKey.from_private_bytes(raw).public_key().public_bytes_raw()
    return base64.b64encode(public).decode("ascii")


def hex_key(b64: str, field: str = "key") -> str:
    """A base64 key as the 64 lowercase hex characters the UAPI protocol expects."""
    return validate_key(b64, field).hex()
