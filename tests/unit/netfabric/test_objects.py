from __future__ import annotations

import base64

import pytest

from netfabric.keys import generate_private_key
from netfabric.model import NetworkConfigError
from netfabric.objects import KEY_SECRET_TYPE, PEERNETWORKS, _key_of, key_secret


def test_key_secret_round_trip() -> None:
    key = generate_private_key()
    secret = key_secret("gateway-key", "gpuferry", key)
    assert secret["type"] == KEY_SECRET_TYPE
    assert secret["metadata"] == {
        "name": "gateway-key",
        "namespace": "gpuferry",
        "labels": {"app.kubernetes.io/part-of": "gpuferry", "app.kubernetes.io/component": "gateway"},
    }
    assert base64.b64decode(secret["data"]["privateKey"]).decode() == key
    assert _key_of(secret) == key


def test_bad_keys_are_refused() -> None:
    with pytest.raises(NetworkConfigError):
        key_secret("k", "ns", "not a key")
    short = base64.b64encode(b"x").decode()
    broken = {"metadata": {"name": "k", "namespace": "ns"}, "data": {"privateKey": short}}
    with pytest.raises(NetworkConfigError):
        _key_of(broken)
    with pytest.raises(ValueError, match=r"no data\.privateKey"):
        _key_of({"metadata": {"name": "k", "namespace": "ns"}})


def test_peernetwork_resource_paths() -> None:
    assert PEERNETWORKS.path("tenant", "p", "status") == (
        "/apis/net.gpuferry.io/v1alpha1/namespaces/tenant/peernetworks/p/status"
    )
