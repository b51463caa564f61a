"""The GPU pool: one serialized decision pass over every GPUSlice of the provider.

All grant decisions happen in one place, on one queue key (:data:`POOL`), so they are
serialized: two tenants competing for the same GPUs are decided in the same pass, oldest slice
first (:func:`peering.provider.planning.allocate`). Any change to nodes (cordoned, drained,
deleted, added), to pods (read as sums per namespace and node, :mod:`peering.provider.usage`),
or to a slice's spec queues the pass again; statuses that did not change are not written.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from decimal import Decimal
from typing import Any, NamedTuple

from kube.api import GPU_RESOURCE, WAITING_BLOCK_ANNOTATION
from kube.clients import KubeClient
from kube.errors import Conflict, KubeError, NotFound
from kube.informers import Informer
from kube.logs import object_logger
from kube.metrics import gauge
from kube.objects import ObjectKey, RawObject, labels, meta
from kube.pacing import Pacer
from kube.patching import patch_changes
from kube.quantities import ResourceList, add, parse_resource_list
from kube.reconciling import Requeue

from ..conditions import set_condition
from ..resources import GPUSLICES, LABEL_TENANT, TENANT_NAMESPACE_PREFIX
from .devices import allocated, class_selector, granted_devices, node_devices
from .events import record_event
from .planning import Decision, allocate, free_capacity_of_use, reservations_of, slice_request, slice_status
from .settings import ProviderSettings
from .usage import PodUse

__all__ = ["POOL", "DraCaches", "PoolReconciler", "project_node", "project_pod"]

logger = logging.getLogger(__name__)

POOL = "pool"

_GRANTED = gauge(
    "gpu_pool_granted", "Resources granted to consumers over all GPUSlices, by resource.", ["resource"]
)
_FREE = gauge(
    "gpu_pool_free", "Resources free on usable provider nodes before grants, by resource.", ["resource"]
)


def project_node(node: RawObject) -> RawObject:
    md, spec, status = meta(node), node.get("spec") or {}, node.get("status") or {}
    return {
        "metadata": {k: md[k] for k in ("name", "labels", "deletionTimestamp") if k in md},
        "spec": {k: spec[k] for k in ("unschedulable", "taints") if k in spec},
        "status": {
            "allocatable": status.get("allocatable") or {},
            "conditions": [
                {"type": c.get("type"), "status": c.get("status")} for c in status.get("conditions") or ()
            ],
        },
    }


def _containers(items: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    return [{k: c[k] for k in ("resources", "restartPolicy") if k in c} for c in items or ()]


def project_pod(pod: RawObject) -> RawObject:
    md, spec = meta(pod), pod.get("spec") or {}
    return {
        "metadata": {"name": md.get("name"), "namespace": md.get("namespace")},
        "spec": {
            "nodeName": spec.get("nodeName"),
            "containers": _containers(spec.get("containers")),
            "initContainers": _containers(spec.get("initContainers")),
            **{k: spec[k] for k in ("overhead", "resources") if k in spec},
        },
        "status": {"phase": (pod.get("status") or {}).get("phase")},
    }


class PoolReconciler:
    """Decides all slices from the caches and writes the statuses that changed."""

    def __init__(
        self,
        client: KubeClient,
        *,
        nodes: Informer,
        pods: Informer,
        slices: Informer,
        twins: Informer,
        settings: ProviderSettings,
        requests: Informer | None = None,
        dra: DraCaches | None = None,
    ) -> None:
        self.client = client
        self.nodes, self.pods, self.slices, self.twins = nodes, pods, slices, twins
        self.dra = dra
        """ResourceSlices, ResourceClaims and DeviceClasses: DRA devices in the pool."""
        self.requests = requests
        """The tenants' twin-namespace requests (NamespaceOffloadings): their waiting blocks."""
        self.settings = settings
        self.usage = PodUse()
        """What the pods request per namespace and node, kept as they change: a pass reads the
        sums instead of every pod (:mod:`peering.provider.usage`)."""
        for key, pod in pods.items():
            self.usage.set(key, pod)
        pods.add_handler(self.usage.changed)
        self.pacer = Pacer(factor=settings.pool_pace)
        """Every change the pool reads asks for a pass over every node (a pod's after
        ``pool_pod_batch``): a burst on a large provider made passes back to back (see
        :mod:`kube.pacing`)."""

    def _waiting_blocks(self) -> dict[str, Decimal]:
        """Tenant namespace → GPUs of its largest pod waiting for a block."""
        out: dict[str, Decimal] = {}
        for request in self.requests.values() if self.requests is not None else ():
            ns = str(meta(request).get("namespace") or "")
            raw = (meta(request).get("annotations") or {}).get(WAITING_BLOCK_ANNOTATION)
            if not raw or not ns.startswith(TENANT_NAMESPACE_PREFIX):
                continue
            try:
                gpus = parse_resource_list(json.loads(raw)).get(GPU_RESOURCE, Decimal(0))
            except (ValueError, AttributeError, TypeError):
                continue  # the consumer's own words: unreadable is nothing
            out[ns] = max(out.get(ns, Decimal(0)), gpus)
        return out

    async def reconcile(self, key: str) -> Requeue | None:
        for cache in (self.nodes, self.pods, self.slices, self.twins, *(self.dra or ())):
            await cache.synced.wait()
        started = time.monotonic()
        wait = self.pacer.wait(started)
        if wait > 0:
            return Requeue(wait)  # the changes meanwhile are read then, in one pass
        twin_tenants = {meta(ns)["name"]: labels(ns).get(LABEL_TENANT, "") for ns in self.twins.values()}
        slices = {ObjectKey.of(s): s for s in self.slices.values() if not meta(s).get("deletionTimestamp")}
        devices, device_use = self.dra.devices() if self.dra is not None else ({}, {})
        free = free_capacity_of_use(
            self.nodes.values(), self.usage.sums, twin_tenants, reservations_of(slices.values()),
            devices=devices, device_use=device_use,
        )  # fmt: skip
        requests = []
        blocks = self._waiting_blocks()
        for skey, obj in slices.items():
            try:
                requests.append(slice_request(obj, block=blocks.get(skey.namespace or "", Decimal(0))))
            except ValueError as exc:
                object_logger(logger, "GPUSlice", skey).error("invalid request: %s", exc)
        decisions = allocate(free, requests)
        self.pacer.record(started, time.monotonic())  # the pass's own work; the writes wait on others
        for (ns, name), decision in decisions.items():
            granted = self.dra.granted(decision.nodes) if self.dra is not None else None
            await self._write(slices[ObjectKey(ns, name)], decision, granted)
        _publish(_FREE, add(*(n.free for n in free)))
        _publish(_GRANTED, add(*(d.granted for d in decisions.values())))
        return Requeue(self.settings.resync_seconds)

    async def _write(self, obj: RawObject, decision: Decision, devices: dict[str, Any] | None = None) -> None:
        old_status = obj.get("status") or {}
        status: dict[str, Any] = {**old_status, **slice_status(decision)}
        status.pop("devices", None)
        if devices is not None:
            status["devices"] = devices  # the DRA devices of the grant, for the consumer to mirror
        generation = meta(obj).get("generation")
        status["observedGeneration"] = generation or 0
        if decision.refused is not None:
            # the current spec refused, the grant decided before it still in force: not accepted,
            # not denied either (the consumer keeps what it had)
            status["refusedChange"] = {
                "generation": generation or 0,
                "reason": decision.refused[0],
                "message": decision.refused[1],
            }
            accepted, denied = False, False
        else:
            status.pop("refusedChange", None)
            accepted = decision.phase != "Denied"
            denied = not accepted
        reason = decision.refused[0] if decision.refused else decision.reason
        conditions = set_condition(
            old_status.get("conditions"),
            "Accepted",
            accepted,
            reason,
            decision.message,
            generation=generation,
        )
        status["conditions"] = set_condition(
            conditions, "Denied", denied, reason, decision.message, generation=generation
        )
        if _same(old_status, status):
            return
        log = object_logger(logger, "GPUSlice", ObjectKey.of(obj))
        try:
            # guarded: a decision made from a stale cached copy fails with Conflict (the pass is
            # retried once the cache caught up) instead of being written, and announced, twice
            written = await patch_changes(
                self.client, GPUSLICES, obj, {**obj, "status": status}, subresource="status", guard=True
            )
        except NotFound:
            return
        except KubeError as exc:
            if exc.temporary or isinstance(exc, Conflict):
                raise  # the whole pass is retried
            # one bad status must not stop the decisions of the other slices
            log.error("cannot write the decision (%s, permanent): %s", decision.phase, exc)
            return
        self.slices.put_written(written)
        log.info("%s: %s (granted %s)", decision.phase, decision.message, status["granted"] or "nothing")
        refused_before = old_status.get("refusedChange") or {}
        if decision.refused is not None and refused_before.get("generation") != generation:
            await record_event(self.client, obj, "ChangeRefused", decision.message, "Warning")
        elif (old_status.get("phase"), old_status.get("granted")) != (decision.phase, status["granted"]):
            granted = ", ".join(f"{k}={v}" for k, v in status["granted"].items()) or "nothing"
            await record_event(
                self.client,
                obj,
                decision.reason,
                f"{decision.phase}: {granted}; {decision.message}",
                "Warning" if decision.phase == "Denied" else "Normal",
            )


class DraCaches(NamedTuple):
    """The provider's DRA objects the pool reads (projected by :mod:`.devices`)."""

    resource_slices: Informer
    claims: Informer
    classes: Informer

    def devices(self) -> tuple[dict[str, ResourceList], dict[tuple[str, str], ResourceList]]:
        """Node → DRA devices per class, and (namespace, node) → those claims hold."""
        classes = {meta(c)["name"]: class_selector(c) for c in self.classes.values()}
        slices = self.resource_slices.values()
        return node_devices(slices, classes), allocated(self.claims.values(), slices, classes)

    def granted(self, nodes: Mapping[str, ResourceList]) -> dict[str, Any] | None:
        """The DRA devices of a grant shaped as ``nodes`` (see :func:`.devices.granted_devices`)."""
        classes = {meta(c)["name"]: c for c in self.classes.values()}
        return granted_devices(nodes, self.resource_slices.values(), classes)


def _publish(family: Any, amounts: dict[str, Any]) -> None:
    for res in (GPU_RESOURCE, "cpu", "memory", "pods"):
        family.labels(res).set(float(amounts.get(res, 0)))


def _same(old: dict[str, Any], new: dict[str, Any]) -> bool:
    def strip(status: dict[str, Any]) -> dict[str, Any]:
        out = dict(status)
        out["conditions"] = [
            {k: v for k, v in c.items() if k != "lastTransitionTime"} for c in status.get("conditions") or ()
        ]
        return out

    return strip(old) == strip(new)
