"""Keeps each VirtualNode in step with the grant behind it.

The provider re-evaluates grants when its capacity changes (a node drained, added, another
tenant's slice). The consumer sees that in the GPUSlice's status, read with the consumer's own
scoped identity (the kubeconfig Secret the VirtualNode names). When what is granted changes —
resources, the per-node largest block, the GPU labels to copy — the VirtualNode's spec is
patched; its virtual kubelet restarts itself on the change and the Node shows the new capacity.
"""

from __future__ import annotations

import asyncio
import base64
import logging
from typing import Any

from kube.clients import KubeClient
from kube.errors import KubeError, NotFound
from kube.logs import object_logger
from kube.objects import SECRETS, ObjectKey, RawObject
from kube.settings import WatchSettings
from kube.watching import Listed, backoff_delay, watch_objects

from ..resources import GPUSLICES
from ..virtualnodes import VIRTUALNODES

__all__ = ["GrantFollower", "PerVirtualNode", "desired_from_grant"]

logger = logging.getLogger(__name__)


def desired_from_grant(slice_obj: RawObject) -> dict[str, Any] | None:
    """The VirtualNode spec fields a decided GPUSlice implies, or ``None`` while undecided or
    denied (a denied slice leaves the node as it was: pods keep running, nothing new fits). Pure."""
    status = slice_obj.get("status") or {}
    if status.get("phase") not in ("Granted", "PartiallyGranted") or not status.get("granted"):
        return None
    return {
        "resources": dict(status["granted"]),
        "shape": dict((status.get("shape") or {}).get("largest") or {}),
        "labels": dict(status.get("labels") or {}),
    }


def _differs(spec: dict[str, Any], desired: dict[str, Any]) -> bool:
    return any({str(k): str(v) for k, v in (spec.get(f) or {}).items()} != desired[f] for f in desired)


class PerVirtualNode:
    """One task per VirtualNode that follows something on its provider with the consumer's own
    scoped identity (the kubeconfig Secret the VirtualNode names); retried with backoff.

    Subclasses implement `follow`, which runs until cancelled (the VirtualNode went)."""

    task_name = "follow"

    def __init__(self, consumer: KubeClient, namespace: str | None) -> None:
        self.consumer = consumer
        self.namespace = namespace
        self.tasks: dict[ObjectKey, asyncio.Task[None]] = {}

    async def run(self) -> None:
        try:
            async for item in watch_objects(self.consumer, VIRTUALNODES, namespace=self.namespace):
                if isinstance(item, Listed):
                    for key in [k for k in self.tasks if k not in item.keys]:
                        self.tasks.pop(key).cancel()
                    continue
                key = item.key
                if item.type == "DELETED" or item.object["metadata"].get("deletionTimestamp"):
                    if (task := self.tasks.pop(key, None)) is not None:
                        task.cancel()
                    continue
                spec = item.object.get("spec") or {}
                if key not in self.tasks and spec.get("sliceName") and spec.get("tenantNamespace"):
                    self.tasks[key] = asyncio.create_task(self._follow(key), name=f"{self.task_name} {key}")
        finally:
            for task in self.tasks.values():
                task.cancel()
            await asyncio.gather(*self.tasks.values(), return_exceptions=True)

    async def follow(self, key: ObjectKey, spec: dict[str, Any], tenant: KubeClient, log: Any) -> None:
        raise NotImplementedError

    async def _follow(self, key: ObjectKey) -> None:
        log = object_logger(logger, "VirtualNode", key)
        failures = 0
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            try:  # anything missing but the VirtualNode (its Secret, a CRD on the provider) may come
                try:
                    vn = await self.consumer.get(VIRTUALNODES, key.name, key.namespace)
                except NotFound:
                    return  # the VirtualNode went: its watch in run() cancels us anyway
                spec = vn.get("spec") or {}
                ref = spec["kubeconfigSecretRef"]
                secret = await self.consumer.get(SECRETS, ref["name"], key.namespace)
                kubeconfig = base64.b64decode((secret.get("data") or {})[ref.get("key") or "kubeconfig"])
                async with KubeClient.from_kubeconfig_data(
                    kubeconfig, source=f"Secret {ref['name']}"
                ) as tenant:
                    await self.follow(key, spec, tenant, log)
            except (KubeError, KeyError, ValueError) as exc:
                settings = WatchSettings()
                if loop.time() - started > settings.backoff_max:
                    failures = 0  # it had worked for a while: a new incident, not the same one
                failures += 1
                delay = backoff_delay(failures, settings)
                log.warning("%s failed (%s); retrying in %.1fs", self.task_name, exc, delay)
                await asyncio.sleep(delay)


class GrantFollower(PerVirtualNode):
    """One watch per VirtualNode (its GPUSlice on the provider); see the module docstring."""

    task_name = "follow_grant"

    async def follow(self, key: ObjectKey, spec: dict[str, Any], tenant: KubeClient, log: Any) -> None:
        async for item in watch_objects(
            tenant, GPUSLICES, namespace=spec["tenantNamespace"],
            field_selector=f"metadata.name={spec['sliceName']}",
        ):  # fmt: skip
            if isinstance(item, Listed) or item.type == "DELETED":
                continue
            await self._apply(key, item.object, log)

    async def _apply(self, key: ObjectKey, slice_obj: RawObject, log: Any) -> None:
        desired = desired_from_grant(slice_obj)
        if desired is None:
            return
        vn = await self.consumer.get(VIRTUALNODES, key.name, key.namespace)
        if not _differs(vn.get("spec") or {}, desired):
            return
        # replace the three maps whole (a merge patch would keep keys the grant no longer has)
        patch = [{"op": "replace" if f in vn["spec"] else "add", "path": f"/spec/{f}", "value": v}
                 for f, v in desired.items()]  # fmt: skip
        await self.consumer.patch(VIRTUALNODES, key.name, patch, key.namespace, patch_type="json")
        log.info("grant changed: now %s", desired["resources"])
