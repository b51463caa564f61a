"""The fabric's long-lived processes: one gateway per peer, one route agent per node.

- ``run_gateway`` (like Liqo, one gateway process per peer): watches its PeerNetwork, reconciles
  it when its spec changes (`netfabric.reconciling.reconcile_peer`), refreshes its status every
  ``status_interval`` seconds (handshake age, bytes, where the peer was last seen), and removes
  the tunnel when the PeerNetwork is deleted. Its private key lives in a Secret
  (`netfabric.objects.ensure_private_key`); its public key is logged and annotated on the
  PeerNetwork (``net.gpuferry.io/local-public-key``) for the peering to hand to the peer.
- the route agent (`netfabric.routeagent`) routes every remapped CIDR of their status to the
  gateway; ``remaps_from_status`` reads them.

Both are restart-safe: the tunnel and routes outlive the process, and a new process converges
from the objects. `GatewayRunner` is the part with the logic; the ``run_*`` functions wire it to
watches and status writes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from ipaddress import IPv4Network
from typing import Any

from kube.api import GATEWAY_PUBLIC_KEY_ANNOTATION
from kube.clients import KubeClient
from kube.errors import KubeError
from kube.logs import object_logger
from kube.objects import ObjectKey, RawObject
from kube.tasks import run_supervised
from kube.watching import WatchEvent, watch_objects
from netfabric.conditions import NETWORK_READY, Reason
from netfabric.gateway import GatewayPlan, GatewaySettings, gateway_down
from netfabric.keys import public_key
from netfabric.model import ClusterNetwork, Remap
from netfabric.nat import table_name_for
from netfabric.objects import (
    PEERNETWORKS,
    delete_private_key,
    ensure_private_key,
    publish_public_key,
    read_private_key,
    write_status,
)
from netfabric.reconciling import reconcile_peer, refresh_status
from netfabric.wireguard import Backend

__all__ = ["PUBLIC_KEY_ANNOTATION", "GatewayRunner", "remaps_from_status", "run_gateway"]

logger = logging.getLogger(__name__)

PUBLIC_KEY_ANNOTATION = GATEWAY_PUBLIC_KEY_ANNOTATION


AWAITING_REFRESH = 1.0
"""Seconds between status passes while an applied tunnel awaits its handshake."""


def _ready(status: Mapping[str, Any]) -> bool:
    return any(
        c.get("type") == NETWORK_READY and c.get("status") == "True" for c in status.get("conditions") or []
    )


def remaps_from_status(obj: Mapping[str, Any]) -> list[Remap]:
    """The remaps a PeerNetwork's status publishes (what node agents route); [] when unreadable."""
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    remaps: list[Remap] = []
    for originals, views in (
        (spec.get("podCIDRs") or [], status.get("remappedPodCIDRs") or []),
        (spec.get("serviceCIDRs") or [], status.get("remappedServiceCIDRs") or []),
    ):
        if len(originals) != len(views):
            return []  # not (yet) reconciled for this spec
        try:
            remaps.extend(
                Remap(IPv4Network(o), IPv4Network(v)) for o, v in zip(originals, views, strict=True)
            )
        except ValueError:
            return []
    return remaps


@dataclass
class GatewayRunner:
    """The gateway for one PeerNetwork: reconcile on spec changes, refresh status, tear down."""

    local: ClusterNetwork
    settings: GatewaySettings
    private_key: str
    plan: GatewayPlan | None = None
    backend: Backend | None = None
    applied_generation: int | None = None
    up_since: datetime | None = None
    table_name: str | None = field(default=None)

    async def on_object(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """The status to write for the object as it is now (reconciles when its spec changed)."""
        generation = (obj.get("metadata") or {}).get("generation")
        if self.plan is None or generation != self.applied_generation:
            result = await reconcile_peer(
                obj, local=self.local, private_key=self.private_key, settings=self.settings
            )
            self.applied_generation = generation
            if result.plan is not None:
                self.plan, self.up_since, self.backend = result.plan, datetime.now(UTC), result.backend
                self.table_name = result.plan.table_name
            return result.status
        result = await refresh_status(
            obj, self.plan, settings=self.settings, up_since=self.up_since, backend=self.backend
        )
        if result.condition.reason is Reason.TUNNEL_DOWN:  # wireguard-go died, or someone removed it
            self.plan = None
            return await self.on_object(obj)
        return result.status

    async def on_deleted(self, obj: Mapping[str, Any]) -> None:
        """Remove the tunnel, its routes, rules and nft table."""
        cluster_id = (obj.get("spec") or {}).get("clusterID")
        table = self.table_name or (table_name_for(cluster_id) if isinstance(cluster_id, str) else None)
        if table is not None:
            await gateway_down(self.settings, table_name=table)
        self.plan = self.backend = None
        self.applied_generation = None


def _placement_status(settings: GatewaySettings) -> dict[str, Any]:
    """What the gateway publishes of where it runs: its interface and, when the peer dials in,
    the UDP port it listens on (for whoever tells the peer where to dial)."""
    out: dict[str, Any] = {"interface": settings.iface}
    if settings.listen_port is not None:
        out["listenPort"] = settings.listen_port
    return out


async def _watch_latest(
    client: KubeClient, key: ObjectKey, latest: dict[str, RawObject | None], changed: asyncio.Event
) -> None:
    """Keep ``latest["object"]`` current (None once deleted) and ``latest["last"]`` (last seen)."""
    async for event in watch_objects(
        client, PEERNETWORKS, namespace=key.namespace, field_selector=f"metadata.name={key.name}"
    ):
        if isinstance(event, WatchEvent):
            latest["object"] = None if event.type == "DELETED" else event.object
            latest["last"] = event.object
            changed.set()
        elif key not in event.keys:
            latest["object"] = None
            changed.set()


async def run_gateway(
    client: KubeClient,
    key: ObjectKey,
    *,
    local: ClusterNetwork,
    settings: GatewaySettings,
    key_secret: str,
    status_interval: float = 10.0,
) -> None:
    """Run the gateway for the PeerNetwork ``key`` until it is deleted (then tear down and return).

    A spec change (new ``metadata.generation``) is reconciled at once; otherwise the status is
    refreshed every ``status_interval`` seconds. Status writes (which the watch sees as changes)
    do not trigger more work.
    """
    if key.namespace is None:
        raise ValueError("a PeerNetwork is namespaced")
    namespace = key.namespace
    log = object_logger(logger, "PeerNetwork", key)
    private_key = await ensure_private_key(client, namespace=key.namespace, name=key_secret)
    own_key = public_key(private_key)
    await publish_public_key(
        client, namespace=key.namespace, name=key_secret, key=own_key, annotation=PUBLIC_KEY_ANNOTATION
    )
    log.info("gateway public key %s", own_key)
    runner = GatewayRunner(local=local, settings=settings, private_key=private_key)
    latest: dict[str, RawObject | None] = {}
    changed = asyncio.Event()
    clock = asyncio.get_running_loop().time

    async def reconcile_loop() -> None:
        nonlocal own_key
        next_refresh = 0.0
        while True:
            if "object" not in latest:
                await changed.wait()
            else:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(max(0.0, next_refresh - clock())):
                        await changed.wait()
            changed.clear()
            obj = latest.get("object")
            if obj is None:
                if "last" in latest:
                    log.info("PeerNetwork deleted: removing the tunnel and the key")
                    await runner.on_deleted(latest["last"] or {})
                    await delete_private_key(client, namespace=namespace, name=key_secret)
                    return
                continue
            generation = (obj.get("metadata") or {}).get("generation")
            if generation == runner.applied_generation and clock() < next_refresh:
                continue  # our own status write, or a metadata change: wait for the next refresh
            try:  # a rotated key (the Secret replaced) is applied on the next pass
                current = await read_private_key(client, namespace=namespace, name=key_secret)
            except (KubeError, ValueError) as e:
                log.warning("reading the key Secret %s failed (kept the key in use): %s", key_secret, e)
                current = runner.private_key
            if current != runner.private_key:
                runner.private_key, runner.plan, own_key = current, None, public_key(current)
                log.info("key rotated: new public key %s", own_key)
                try:  # (the PeerNetwork's annotation, below, is what reaches the peer)
                    await publish_public_key(
                        client,
                        namespace=namespace,
                        name=key_secret,
                        key=own_key,
                        annotation=PUBLIC_KEY_ANNOTATION,
                    )
                except KubeError as e:
                    log.warning("annotating the key Secret %s failed: %s", key_secret, e)
            status = {**await runner.on_object(obj), **_placement_status(settings)}
            if isinstance(generation, int):  # what the status (and its NetworkReady) is about
                status = {**status, "observedGeneration": generation}
            # a tunnel applied but not shaken hands yet is looked at every second, so that
            # NetworkReady turns True about when the handshake happens, not a status interval later
            waiting = runner.plan is not None and not _ready(status)
            next_refresh = clock() + (min(AWAITING_REFRESH, status_interval) if waiting else status_interval)
            try:
                annotations = (obj.get("metadata") or {}).get("annotations") or {}
                if annotations.get(PUBLIC_KEY_ANNOTATION) != own_key:
                    patch = {"metadata": {"annotations": {PUBLIC_KEY_ANNOTATION: own_key}}}
                    await client.patch(PEERNETWORKS, key.name, patch, key.namespace)
                await write_status(client, obj, status)
            except KubeError as e:
                log.warning("writing the status failed (retried on the next pass): %s", e)

    await run_supervised(
        {"watch": _watch_latest(client, key, latest, changed), "reconcile": reconcile_loop()},
        logger=logger,
    )
