"""Carries each gateway's public key to the peer, so that a rotated key recovers the tunnel.

A peering has a PeerNetwork on each side (see :mod:`peering.network`); each side's gateway
annotates the one it reconciles with its own public key. The consumer agent can read and patch
both (the provider's lives in the tenant namespace, where the consumer's scoped identity may
patch PeerNetworks), so for every VirtualNode it watches the pair and copies each gateway's key
into the *other* object's ``spec.publicKey``. The gateway there sees a new generation and
reconfigures its peer: a key rotated on either side needs no manual step.
"""

from __future__ import annotations

import asyncio
from typing import Any

from kube.clients import KubeClient
from kube.objects import PEERNETWORKS, ObjectKey, RawObject
from kube.objects import annotations as annotations_of
from kube.watching import WatchEvent, watch_objects

from ..network import PUBLIC_KEY_ANNOTATION
from .grants import PerVirtualNode

__all__ = ["KeyExchange", "key_updates"]


def _own_key(obj: RawObject | None) -> str | None:
    return annotations_of(obj or {}).get(PUBLIC_KEY_ANNOTATION)


def key_updates(local: RawObject | None, remote: RawObject | None) -> dict[str, str]:
    """Which object needs which peer key: ``{"local"|"remote": key}``. Pure.

    ``local`` is the consumer's PeerNetwork (describing the provider), ``remote`` the provider's.
    """
    updates: dict[str, str] = {}
    if local is None or remote is None:
        return updates
    for target, source in (("local", remote), ("remote", local)):
        key = _own_key(source)
        obj = local if target == "local" else remote
        if key and (obj.get("spec") or {}).get("publicKey") != key:
            updates[target] = key
    return updates


class KeyExchange(PerVirtualNode):
    task_name = "exchange_gateway_keys"

    async def follow(self, key: ObjectKey, spec: dict[str, Any], tenant: KubeClient, log: Any) -> None:
        provider_id, consumer_id = spec["providerClusterID"], spec["consumerClusterID"]
        where = {
            "local": (self.consumer, key.namespace, provider_id),
            "remote": (tenant, spec["tenantNamespace"], consumer_id),
        }
        latest: dict[str, RawObject | None] = {"local": None, "remote": None}
        changed = asyncio.Event()

        async def watch(side: str) -> None:
            client, namespace, name = where[side]
            async for item in watch_objects(
                client, PEERNETWORKS, namespace=namespace, field_selector=f"metadata.name={name}"
            ):
                if isinstance(item, WatchEvent):
                    latest[side] = None if item.type == "DELETED" else item.object
                elif not item.keys:
                    latest[side] = None
                changed.set()

        async def sync() -> None:
            while True:
                await changed.wait()
                changed.clear()
                for side, peer_key in key_updates(latest["local"], latest["remote"]).items():
                    client, namespace, name = where[side]
                    await client.patch(PEERNETWORKS, name, {"spec": {"publicKey": peer_key}}, namespace)
                    log.info("gateway key carried to the %s PeerNetwork %s/%s", side, namespace, name)

        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(watch("local"), name=f"watch local PeerNetwork {provider_id}")
                group.create_task(watch("remote"), name=f"watch remote PeerNetwork {consumer_id}")
                group.create_task(sync(), name="sync gateway keys")
        except ExceptionGroup as group_error:  # the first failure, retried by PerVirtualNode
            raise group_error.exceptions[0] from group_error
