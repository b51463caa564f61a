"""The fabric's Kubernetes objects: the gateway's key Secret and the PeerNetwork status.

Thin: builders are plain functions; the writes go through `kube.clients.KubeClient` with raw
dicts. The private key lives only in a Secret (``data.privateKey``, base64 of the base64 key as
``wg genkey`` prints it); the public key is derived and published in the peer's PeerNetwork.
"""

from __future__ import annotations

import base64
import contextlib
from collections.abc import Mapping
from typing import Any

from kube.clients import KubeClient
from kube.errors import AlreadyExists, NotFound
from kube.objects import PEERNETWORKS, SECRETS, ObjectKey, RawObject
from kube.patching import patch_status
from netfabric.keys import generate_private_key, validate_key

__all__ = [
    "KEY_SECRET_TYPE",
    "PEERNETWORKS",
    "delete_private_key",
    "ensure_private_key",
    "key_secret",
    "publish_public_key",
    "read_private_key",
    "rotate_private_key",
    "write_status",
]

KEY_SECRET_TYPE = "gpuferry.io/wireguard-key"
_KEY = "privateKey"


def key_secret(name: str, namespace: str, private_key: str) -> RawObject:
    """The Secret that holds a gateway's WireGuard private key."""
    validate_key(private_key, "privateKey")
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"app.kubernetes.io/part-of": "gpuferry", "app.kubernetes.io/component": "gateway"},
        },
        "type": KEY_SECRET_TYPE,
        "data": {_KEY: base64.b64encode(private_key.encode()).decode()},
    }


def _key_of(secret: Mapping[str, Any]) -> str:
    raw = (secret.get("data") or {}).get(_KEY)
    if not isinstance(raw, str):
        raise ValueError(f"Secret {ObjectKey.of(secret)} has no data.{_KEY}")
    key = base64.b64decode(raw).decode()
    validate_key(key, f"Secret {ObjectKey.of(secret)} data.{_KEY}")
    return key


async def ensure_private_key(client: KubeClient, *, namespace: str, name: str) -> str:
    """The gateway's private key: read from its Secret, or made and stored on first use."""
    try:
        return await read_private_key(client, namespace=namespace, name=name)
    except NotFound:
        pass
    with contextlib.suppress(AlreadyExists):  # another replica won the race: use its key
        await client.create(SECRETS, key_secret(name, namespace, generate_private_key()), namespace)
    return _key_of(await client.get(SECRETS, name, namespace))


async def read_private_key(client: KubeClient, *, namespace: str, name: str) -> str:
    """The key the Secret holds now (`ValueError` when it holds none that is valid)."""
    return _key_of(await client.get(SECRETS, name, namespace))


async def publish_public_key(
    client: KubeClient, *, namespace: str, name: str, key: str, annotation: str
) -> None:
    """Annotate the key Secret with its public key: what the peering hands to the peer."""
    patch = {"metadata": {"annotations": {annotation: key}}}
    await client.patch(SECRETS, name, patch, namespace)


async def delete_private_key(client: KubeClient, *, namespace: str, name: str) -> None:
    """Remove the key Secret (the peer is gone); absent already is fine."""
    with contextlib.suppress(NotFound):
        await client.delete(SECRETS, name, namespace)


async def rotate_private_key(client: KubeClient, *, namespace: str, name: str) -> str:
    """Replace the key with a new one (the gateway re-applies; the peer gets the new public key)."""
    current = await client.get(SECRETS, name, namespace)
    new_key = generate_private_key()
    body = key_secret(name, namespace, new_key)
    body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
    await client.replace(SECRETS, name, body, namespace)
    return new_key


async def write_status(client: KubeClient, obj: RawObject, status: Mapping[str, Any]) -> RawObject:
    """Merge ``status`` into the PeerNetwork's status subresource."""
    return await patch_status(client, PEERNETWORKS, ObjectKey.of(obj), status)
