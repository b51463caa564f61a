"""Keeps the virtual node's DRA ResourceSlices and DeviceClasses in line with its grant.

:class:`DeviceMirror` is told the grant's ``status.devices`` (from the GPUSlice the tenant side
watches) and writes what :mod:`vk.forge.devices` builds: creates or replaces the node's mirror
ResourceSlices, deletes those the grant no longer has, and makes each granted DeviceClass the
consumer lacks (or adds the node to the owners of one gpuferry made). It runs as one named task:
a change of the grant wakes it, a resync every ``resync_seconds`` repairs what someone else
changed, and an error is logged with the object and retried with backoff.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from typing import Any

from kube.api import LABEL_MANAGED_BY, MANAGED_BY, PROVIDER_LABEL
from kube.backoff import Backoff
from kube.clients import KubeClient
from kube.errors import AlreadyExists, Conflict, KubeError, NotFound
from kube.objects import DEVICECLASSES, NODES, RESOURCESLICES, RawObject
from kube.tasks import wait_set

from ..forge.devices import class_owners, mirror_class, mirror_slices

__all__ = ["DeviceMirror"]

logger = logging.getLogger(__name__)


class DeviceMirror:
    """The virtual node's mirror of its grant's DRA devices (see the module docstring)."""

    def __init__(
        self, consumer: KubeClient, *, node_name: str, provider_id: str, resync_seconds: float
    ) -> None:
        self.consumer = consumer
        self.node_name = node_name
        self.provider_id = provider_id
        self.resync_seconds = resync_seconds
        self._devices: Mapping[str, Any] | None = None
        self._wake = asyncio.Event()

    def grant_changed(self, slice_obj: RawObject | None) -> None:
        """The GPUSlice changed (None: gone): its ``status.devices`` is what to mirror."""
        granted = ((slice_obj or {}).get("status") or {}).get("phase") in ("Granted", "PartiallyGranted")
        devices = ((slice_obj or {}).get("status") or {}).get("devices") if granted else None
        if devices != self._devices:
            self._devices = devices
            self._wake.set()

    async def run(self) -> None:
        backoff = Backoff(base=1.0, cap=60.0)
        while True:
            self._wake.clear()
            try:
                done = await self.sync()
                backoff.reset()
                delay = self.resync_seconds if done else 1.0
            except KubeError as exc:
                delay = backoff.next()
                logger.warning("ResourceSlices of node %s: %s; retrying in %.0fs", self.node_name, exc, delay)
            await wait_set(self._wake, delay)

    async def sync(self) -> bool:
        """One pass: the node's mirror slices and classes as the grant says (False: the node is
        not registered yet, the slices' owner; try again soon)."""
        try:
            node = await self.consumer.get(NODES, self.node_name)
        except NotFound:
            return False
        desired = {s["metadata"]["name"]: s for s in mirror_slices(self._devices, node=node,
                                                                   provider_id=self.provider_id)}  # fmt: skip
        for entry in (self._devices or {}).get("classes") or ():
            await self._ensure_class(entry, node)
        selector = f"{LABEL_MANAGED_BY}={MANAGED_BY},{PROVIDER_LABEL}={self.provider_id}"
        current = {
            s["metadata"]["name"]: s
            for s in (await self.consumer.list(RESOURCESLICES, label_selector=selector))["items"]
            if (s.get("spec") or {}).get("nodeName") == self.node_name
        }
        for name, obj in desired.items():
            have = current.get(name)
            if have is None:
                with contextlib.suppress(AlreadyExists):
                    await self.consumer.create(RESOURCESLICES, obj)
                    logger.info("ResourceSlice %s: %d devices of pool %s", name, len(obj["spec"]["devices"]),
                                obj["spec"]["pool"]["name"])  # fmt: skip
            elif have.get("spec", {}).get("devices") != obj["spec"]["devices"]:
                obj["metadata"]["resourceVersion"] = have["metadata"]["resourceVersion"]
                with contextlib.suppress(Conflict):
                    await self.consumer.replace(RESOURCESLICES, name, obj)
                    logger.info("ResourceSlice %s: now %d devices", name, len(obj["spec"]["devices"]))
        for name in current.keys() - desired.keys():
            with contextlib.suppress(NotFound):
                await self.consumer.delete(RESOURCESLICES, name)
                logger.info("ResourceSlice %s deleted: no longer granted", name)
        return True

    async def _ensure_class(self, entry: Mapping[str, Any], node: RawObject) -> None:
        name = str(entry["name"])
        try:
            current = await self.consumer.get(DEVICECLASSES, name)
        except NotFound:
            with contextlib.suppress(AlreadyExists):
                await self.consumer.create(DEVICECLASSES, mirror_class(entry, node=node))
                logger.info("DeviceClass %s made as the provider defines it", name)
            return
        owners = class_owners(current, node)
        if owners is not None:
            version = current["metadata"]["resourceVersion"]
            patch = {"metadata": {"ownerReferences": owners, "resourceVersion": version}}
            with contextlib.suppress(Conflict, NotFound):
                await self.consumer.patch(DEVICECLASSES, name, patch)
