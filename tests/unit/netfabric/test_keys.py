from __future__ import annotations

import base64

import pytest

from netfabric.keys import KEY_LENGTH, clamp, generate_private_key, hex_key, public_key, validate_key
from netfabric.model import NetworkConfigError

# RFC 7748 section 6.1: Alice's (unclamped) private key and her public key.
ALICE_PRIVATE = bytes.fromhex("77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a")
ALICE_PUBLIC = bytes.fromhex("8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a")
# ... and Bob's, for a second vector.
BOB_PRIVATE = bytes.fromhex("5dab087e624a8a4b79e17f8b83800ee66f3bb1292618b6fd1c2f8b27ff88e0eb")
BOB_PUBLIC = bytes.fromhex("de9edb7d7b7dc1b4d35b61c2ece435373f8343c85b78674dadfc7e146f882b4f")


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


@pytest.mark.parametrize(
    ("private", "public"), [(ALICE_PRIVATE, ALICE_PUBLIC), (BOB_PRIVATE, BOB_PUBLIC)], ids=["alice", "bob"]
)
def test_public_key_matches_rfc7748_vectors(private: bytes, public: bytes) -> None:
    assert public_key(b64(private)) == b64(public)


@pytest.mark.parametrize("private", [ALICE_PRIVATE, BOB_PRIVATE], ids=["alice", "bob"])
def test_clamping_does_not_change_the_public_key(private: bytes) -> None:
    # WireGuard clamps private keys; X25519 clamps internally, so both forms agree.
    assert clamp(private) != private
    assert public_key(b64(clamp(private))) == public_key(b64(private))


def test_clamp_sets_the_curve25519_bits() -> None:
    clamped = clamp(b"\xff" * KEY_LENGTH)
    assert clamped[0] == 0xF8
    assert clamped[31] == 0x7F
    assert clamp(b"\x00" * KEY_LENGTH)[31] == 0x40


def test_generated_keys_look_like_wg_genkey() -> None:
    keys = {generate_private_key() for _ in range(8)}
    assert len(keys) == 8
    for key in keys:
        raw = validate_key(key)
        assert len(key) == 44
        assert raw == clamp(raw)
        assert len(validate_key(public_key(key))) == KEY_LENGTH


def test_hex_key_for_uapi() -> None:
    assert hex_key(b64(ALICE_PUBLIC)) == ALICE_PUBLIC.hex()
    assert len(hex_key(generate_private_key())) == 64


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("", "44 base64 characters"),
        (b64(b"\x01" * 31), "44 base64 characters"),
        (b64(b"\x01" * 33), "44 base64 characters"),
        ("!" * 43 + "=", "not valid base64"),
        ("é" * 43 + "=", "not valid base64"),
        (b64(b"\x01" * 32).replace("=", "A"), "ending in one '='"),
        (None, "expected a base64 string"),
    ],
)
def test_validate_key_rejects_with_a_clear_message(value: object, fragment: str) -> None:
    with pytest.raises(NetworkConfigError) as info:
        validate_key(value, "privateKey")  # type: ignore[arg-type]
    assert info.value.field == "privateKey"
    assert fragment in info.value.message


def test_errors_never_echo_the_private_key() -> None:
    secret = "A" * 43 + "!"
    with pytest.raises(NetworkConfigError) as info:
        public_key(secret)
    assert secret not in str(info.value)
    assert info.value.field == "private_key"
