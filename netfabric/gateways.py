"""``python -m netfabric gateways``: the gateways of one cluster, one per PeerNetwork, in one process.

The process reads everything from objects and its own flags: the cluster's network declaration
(the ConfigMap ``kube-system/gpuferry-network``, :mod:`kube.declaration`: pod and service CIDRs,
where its gateways run and listen, the tunnel MTU) and every PeerNetwork of the cluster. For each
PeerNetwork it runs :func:`netfabric.app.run_gateway` as a named task, with the per-peer settings
that must not collide when several peers share a network namespace:

* a **slot**, kept on the PeerNetwork (annotation ``net.gpuferry.io/slot``) so that a restarted
  process gives each peer the same one: it sets the firewall mark, the routing table and, on the
  side that listens (a PeerNetwork without ``spec.endpoint``: the peer dials in), the UDP port
  ``endpointPort + slot``, published in ``status.listenPort`` for whoever tells the peer;
* an **interface name** unique on the host (wireguard-go's UAPI sockets are not per network
  namespace), a hash of the PeerNetwork's namespace and name, published in ``status.interface``.

A gateway ends when its PeerNetwork is deleted (it removes its tunnel, routes, nft table and key
first); the process keeps running for the others. Stopping the process leaves the tunnels in
place: a new process converges from the objects with the same slots.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from dataclasses import dataclass, replace
from ipaddress import IPv4Address, IPv4Network

from kube.api import GATEWAY_SLOT_ANNOTATION
from kube.clients import KubeClient
from kube.declaration import Declaration
from kube.errors import KubeError, NotFound
from kube.informers import Change, Informer
from kube.logs import object_logger
from kube.objects import ObjectKey, RawObject
from kube.objects import annotations as annotations_of
from kube.tasks import cancel_and_wait
from netfabric.app import run_gateway
from netfabric.gateway import GatewaySettings, leftovers
from netfabric.ipam import DEFAULT_POOL
from netfabric.model import ClusterNetwork, Reserved
from netfabric.nat import table_name_for
from netfabric.objects import PEERNETWORKS
from netfabric.wireguard import BackendKind

__all__ = [
    "MAX_SLOTS",
    "GatewayPlacement",
    "GatewaysSettings",
    "LeftBehind",
    "iface_name",
    "placement",
    "run_gateways",
]

logger = logging.getLogger(__name__)

MAX_SLOTS = 64
_MARK_BASE = 0x47
_TABLE_BASE = 4700


@dataclass(frozen=True, kw_only=True)
class GatewaysSettings:
    """How the gateways of this cluster run; the cluster's declaration gives the rest."""

    netns: str | None = None
    """Network namespace of the gateways (default: the declaration's ``gatewayNetns``, else this
    process's own, as in a gateway pod)."""
    gateway_ip: IPv4Address | None = None
    """The gateways' pod IP (default: the declaration's ``gatewayIP``; in a pod: its own IP)."""
    namespace: str | None = None
    """Only PeerNetworks of this namespace (default: all)."""
    only: ObjectKey | None = None
    """Only the gateway of this PeerNetwork (a process per peer, as gpuferry peer runs them on a
    machine); slots still take every PeerNetwork of the cluster into account."""
    backend: BackendKind | None = None
    pool: IPv4Network = DEFAULT_POOL
    status_interval: float = 10.0


@dataclass(frozen=True)
class GatewayPlacement:
    """Where one gateway runs and how it stays out of the others' way. Pure."""

    slot: int
    iface: str
    settings: GatewaySettings
    key_secret: str


def iface_name(key: ObjectKey, netns: str | None = None) -> str:
    """``gf<10 hex>``: unique on the host for a PeerNetwork (15 characters at most).

    With a named netns, its name is part of it: two clusters on one host (two providers of the
    same consumer, say) have PeerNetworks of the same namespace and name, and wireguard-go's
    control socket (``/var/run/wireguard/<iface>.sock``) is not per netns: the same name let
    one gateway configure, and tear down, the other's device."""
    where = f"{netns}:" if netns else ""
    return "gf" + hashlib.sha256(f"{where}{key.namespace}/{key.name}".encode()).hexdigest()[:10]


def key_secret_name(peer_id: str) -> str:
    """The Secret (beside the PeerNetwork) holding this gateway's private key."""
    return f"gpuferry-gateway-{peer_id}"


def placement(
    obj: RawObject, slot: int, declaration: Declaration, settings: GatewaysSettings
) -> GatewayPlacement:
    """The settings of the gateway for PeerNetwork ``obj`` in ``slot``. Pure."""
    key = ObjectKey.of(obj)
    spec = obj.get("spec") or {}
    listens = not spec.get("endpoint")
    gateway_ip = settings.gateway_ip
    if gateway_ip is None and declaration.gateway_ip:
        gateway_ip = IPv4Address(declaration.gateway_ip)
    if gateway_ip is None:
        raise ValueError("no gateway IP: give --gateway-ip or declare gatewayIP")
    netns = settings.netns or declaration.gateway_netns
    return GatewayPlacement(
        slot=slot,
        iface=iface_name(key, netns),
        key_secret=key_secret_name(str(spec.get("clusterID") or key.name)),
        settings=GatewaySettings(
            iface=iface_name(key, netns),
            gateway_ip=gateway_ip,
            netns=netns,
            listen_port=declaration.endpoint_port + slot if listens else None,
            mtu=declaration.mtu,  # this cluster's tunnels (None: the PeerNetwork's, else 1420)
            pool=settings.pool,
            backend=settings.backend,
            fwmark=(_MARK_BASE + slot) << 16,
            route_table=_TABLE_BASE + slot,
            rule_priority=_TABLE_BASE + slot,
        ),
    )


def free_slot(used: set[int]) -> int:
    for slot in range(MAX_SLOTS):
        if slot not in used:
            return slot
    raise ValueError(f"{MAX_SLOTS} gateways already share this network namespace")


def slot_of(obj: RawObject) -> int | None:
    value = annotations_of(obj).get(GATEWAY_SLOT_ANNOTATION, "")
    return int(value) if value.isdigit() and int(value) < MAX_SLOTS else None


def declared_network(declaration: Declaration) -> ClusterNetwork:
    """The local network a declaration describes, its node CIDRs and public endpoint reserved. Pure."""
    local = ClusterNetwork.from_strings(list(declaration.pod_cidrs), list(declaration.service_cidrs))
    reserved = [Reserved(IPv4Network(c), "this cluster's node CIDR") for c in declaration.node_cidrs]
    try:
        endpoint = IPv4Address(declaration.endpoint_address or "")
    except ValueError:
        endpoint = None  # a DNS name, or none
    if endpoint is not None:
        reserved.append(Reserved(IPv4Network(endpoint), "this cluster's gateway endpoint"))
    return replace(local, reserved=tuple(reserved))


class Gateways:
    """One task per PeerNetwork (see the module docstring)."""

    def __init__(self, client: KubeClient, declaration: Declaration, settings: GatewaysSettings) -> None:
        self.client = client
        self.declaration = declaration
        self.settings = settings
        self.local = declared_network(declaration)
        # every PeerNetwork of the cluster: slots are shared by all the gateways of its namespace
        self.informer = Informer(client, PEERNETWORKS)
        self.tasks: dict[ObjectKey, asyncio.Task[None]] = {}
        self.slots: dict[ObjectKey, int] = {}
        self.ended: set[ObjectKey] = set()
        self.left: list[str] = []
        self._changed = asyncio.Event()
        self.informer.add_handler(self._on_change)

    def _on_change(self, change: Change) -> None:
        self._changed.set()

    async def _slot(self, obj: RawObject) -> int:
        key = ObjectKey.of(obj)
        if key in self.slots:
            return self.slots[key]
        found = slot_of(obj)
        taken = set(self.slots.values())
        if found is None or found in taken:
            found = free_slot(taken | {s for o in self.informer.values() if (s := slot_of(o)) is not None})
            patch = {"metadata": {"annotations": {GATEWAY_SLOT_ANNOTATION: str(found)}}}
            await self.client.patch(PEERNETWORKS, key.name, patch, key.namespace)
        self.slots[key] = found
        return found

    def _start(self, obj: RawObject, slot: int) -> None:
        key = ObjectKey.of(obj)
        where = placement(obj, slot, self.declaration, self.settings)
        log = object_logger(logger, "PeerNetwork", key)
        listening = f", listening on {where.settings.listen_port}" if where.settings.listen_port else ""
        log.info(
            "gateway in slot %d: %s, netns %s%s",
            slot,
            where.iface,
            where.settings.netns or "(own)",
            listening,
        )

        async def gateway() -> None:
            try:
                await run_gateway(
                    self.client,
                    key,
                    local=self.local,
                    settings=where.settings,
                    key_secret=where.key_secret,
                    status_interval=self.settings.status_interval,
                )
                # the PeerNetwork went and the tunnel was removed: check that nothing is left
                table = table_name_for(str(obj["spec"]["clusterID"]))
                left = await leftovers(where.settings, table_name=table)
                for thing in left:
                    log.error("left behind: %s", thing)
                self.left.extend(left)
                if not left:
                    log.info("torn down: nothing left")
            finally:
                self.slots.pop(key, None)
                self.tasks.pop(key, None)
                self.ended.add(key)
                self._changed.set()

        self.tasks[key] = asyncio.create_task(gateway(), name=f"gateway {key}")

    async def _reconcile(self) -> None:
        for key, obj in self.informer.items():
            if key in self.tasks or (obj.get("metadata") or {}).get("deletionTimestamp"):
                continue
            if self.settings.only is not None and key != self.settings.only:
                continue
            if self.settings.namespace is not None and key.namespace != self.settings.namespace:
                continue
            try:
                slot = await self._slot(obj)
            except NotFound:
                continue
            except (KubeError, ValueError) as e:
                object_logger(logger, "PeerNetwork", key).error("no slot for its gateway: %s", e)
                continue
            self._start(obj, slot)

    async def run(self, *, watch: bool = True) -> None:
        """Run until stopped, or with ``settings.only`` until that gateway is torn down.
        ``watch=False``: the informer is run by someone else (a :class:`kube.manager.Manager`,
        whose ``/readyz`` then waits for it)."""
        watcher = asyncio.create_task(self.informer.run(), name="watch-peernetworks") if watch else None
        waiting: asyncio.Task[bool] | None = None
        try:
            await self.informer.synced.wait()
            while True:
                if self.settings.only is not None and self.settings.only in self.ended:
                    return  # its one gateway is done (its PeerNetwork went)
                await self._reconcile()
                self._changed.clear()
                waiting = asyncio.create_task(self._changed.wait())
                done, _ = await asyncio.wait(
                    [waiting, *([watcher] if watcher else [])], return_when=asyncio.FIRST_COMPLETED
                )
                if watcher is not None and watcher in done:
                    watcher.result()  # a permanent watch error ends the process
                    return
        finally:
            tasks = [t for t in (watcher, waiting) if t is not None] + list(self.tasks.values())
            await cancel_and_wait(tasks, logger=logger)

    async def serve(self, *, watch: bool = True) -> None:
        """:meth:`run`, then raise LeftBehind when a teardown left anything."""
        await self.run(watch=watch)
        if self.left:
            raise LeftBehind("; ".join(self.left))


class LeftBehind(Exception):
    """A gateway's teardown left things behind (listed in the log)."""


async def run_gateways(client: KubeClient, declaration: Declaration, settings: GatewaysSettings) -> None:
    """Run until stopped; with ``settings.only``, until that gateway is torn down (raises
    LeftBehind when its teardown left anything)."""
    await Gateways(client, declaration, settings).serve()
