"""Pods out, status back: one reconciler for every pod bound to the virtual node.

``reconcile(key)`` reads the consumer pod and its provider twin from the watched caches and does
the one thing the pair needs, in this order:

1. consumer pod gone → delete the twin (UID precondition) — this also collects orphans;
2. consumer pod terminating → delete the twin with the same grace period; when the twin is
   gone, remove the consumer pod (``gracePeriodSeconds=0``, as a kubelet does);
3. no twin → if it ran before, the twin was deleted behind our back: the pod is Failed with
   reason ``ProviderPodDeleted`` (a controller replaces it); otherwise, if the pod fits on one
   provider node, create the twin (and its namespace), else keep it Pending with a clear
   reason and an Event, and look again later (the gate: "fit, not sum");
4. twin of an older pod with the same name → delete it, then start over;
5. otherwise → patch the twin with what may change on a running pod, and the consumer status
   with the twin's.

All state lives in the two API servers: a restart rebuilds the caches and converges.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any, Protocol

from kube.clients import KubeClient
from kube.errors import AlreadyExists, Conflict, Forbidden, NotFound
from kube.logs import object_logger
from kube.metrics import counter, gauge, histogram
from kube.objects import EVENTS, NAMESPACES, PODS, ObjectKey, RawObject
from kube.quantities import ResourceList, add, format_resource_list
from kube.reconciling import Requeue

from ..forge.fit import FitResult, placement_request
from ..forge.labels import ORIGIN_NAMESPACE, origin_of, ownership_labels
from ..forge.names import twin_namespace
from ..forge.pods import ForgeOptions, remote_pod, remote_pod_update
from ..forge.podstatus import local_status, status_patch
from .caches import PodCache
from .twins import TwinNamespaces

logger = logging.getLogger(__name__)

TWINS_CREATED = counter("vk_twins_created", "Twin pods created on the provider.")
TWINS_DELETED = counter("vk_twins_deleted", "Twin pods deleted on the provider.", ["why"])
OFFLOAD_LATENCY = histogram(
    "vk_offload_seconds",
    "Seconds from the consumer pod's creation to its twin being created (stage twin_created) and "
    "to the consumer pod being reported Running (stage running).",
    ["stage"],
    buckets=(0.25, 0.5, 1, 2, 5, 10, 30, 60, 120),
)
PODS_BY_PHASE = gauge("vk_pods", "Consumer pods bound to the virtual node, by phase.", ["side", "phase"])

GATE_RETRY_SECONDS = 30.0
"""Backstop for gated pods: they are looked at again as soon as provider capacity changes
(:meth:`PodReflector.gated_keys`), and at the latest after this long."""
REASON_DELETED = "ProviderPodDeleted"
REASON_NO_FIT = "ProviderCapacity"
REASON_NOT_OFFLOADED = "NamespaceNotOffloaded"
REASON_QUOTA = "ProviderQuotaExceeded"
QUOTA_RETRY_SECONDS = 5.0


class Prerequisite(Protocol):
    """Something a twin needs on the provider before it is created (copies, token Secrets)."""

    async def ensure_for(self, pod: RawObject) -> None: ...


class FitOracle(Protocol):
    """Answers whether a pod fits on one provider node now. ``None``: not known yet (do not gate)."""

    def fit(self, pod: RawObject) -> FitResult | None: ...


class PodReflector:
    """The reconciler of pods bound to one virtual node (see the module docstring)."""

    def __init__(
        self,
        *,
        consumer: KubeClient,
        provider: KubeClient,
        local: PodCache,
        remote: PodCache | TwinNamespaces,
        opts: ForgeOptions,
        node_address: str,
        fit: FitOracle | None = None,
        remap_ip: Callable[[str], str] = lambda ip: ip,
        twins: TwinNamespaces | None = None,
        accessories: Sequence[Prerequisite] = (),
    ) -> None:
        self.consumer = consumer
        self.provider = provider
        self.local = local
        self.remote = remote
        self.opts = opts
        self.node_address = node_address
        self.fitter = fit
        self.remap_ip = remap_ip
        self.twins = twins
        self.accessories = list(accessories)
        """ConfigMaps and Secrets the twin needs are copied before it is created."""
        """Set with a scoped identity: the provider makes twin namespaces, we only use them."""
        self._namespaces: set[str] = set()
        self._events_sent: set[tuple[str, str]] = set()
        self._gated: set[ObjectKey] = set()
        self._quota_waiting: dict[ObjectKey, ResourceList] = {}

    def gated_keys(self) -> list[ObjectKey]:
        """Pods held back because they fit on no provider node now (to retry when that changes)."""
        return list(self._gated)

    async def reconcile(self, key: ObjectKey) -> Requeue | None:
        log = object_logger(logger, "Pod", key)
        local, remote = self.local.get(key), self.remote.get(key)
        self._gated.discard(key)
        gone = local is None or bool(local["metadata"].get("deletionTimestamp"))
        if gone and self._quota_waiting.pop(key, None) is not None:
            await self._report_demand(key.namespace or "")
        if local is None:
            if remote is not None:
                await self._delete_twin(remote, grace=None, why="orphan", log=log)
            return None
        if local["metadata"].get("deletionTimestamp"):
            return await self._terminate(local, remote, log)
        if remote is None:
            return await self._create(key, local, log)
        origin = origin_of(remote)
        if origin is None or origin.uid != local["metadata"]["uid"]:
            await self._delete_twin(remote, grace=0, why="stale", log=log)
            return None
        await self._update(local, remote, log)
        return None

    # ---- deletion ------------------------------------------------------------------------------

    async def _delete_twin(self, remote: RawObject, *, grace: int | None, why: str, log: Any) -> None:
        meta = remote["metadata"]
        if meta.get("deletionTimestamp") and grace is None:
            return
        try:
            await self.provider.delete(
                PODS,
                meta["name"],
                meta["namespace"],
                grace_period_seconds=grace,
                preconditions_uid=meta["uid"],
            )
            TWINS_DELETED.labels(why).inc()
            log.info("deleted twin %s/%s (%s)", meta["namespace"], meta["name"], why)
        except (NotFound, Conflict):
            pass  # already gone, or already replaced: the watch brings the news

    async def _terminate(self, local: RawObject, remote: RawObject | None, log: Any) -> Requeue | None:
        meta = local["metadata"]
        origin = origin_of(remote) if remote is not None else None
        if remote is not None and origin is not None and origin.uid == meta["uid"]:
            if not remote["metadata"].get("deletionTimestamp"):
                await self._delete_twin(
                    remote, grace=meta.get("deletionGracePeriodSeconds"), why="deleted", log=log
                )
            return None  # the twin's deletion event brings us back
        try:
            await self.consumer.delete(
                PODS, meta["name"], meta["namespace"], grace_period_seconds=0, preconditions_uid=meta["uid"]
            )
            log.info("twin gone: consumer pod removed")
        except (NotFound, Conflict):
            pass
        return None

    # ---- creation ------------------------------------------------------------------------------

    async def _create(self, key: ObjectKey, local: RawObject, log: Any) -> Requeue | None:
        status = local.get("status") or {}
        if status.get("phase") in ("Succeeded", "Failed"):
            return None  # finished: its twin may be gone, nothing to run again
        if status.get("startTime") or status.get("containerStatuses"):
            await self._report_deleted_twin(local, log)
            return None
        origin_ns = local["metadata"]["namespace"]
        if self.twins is not None:
            if self.twins.twin_namespace_for(origin_ns) is None:
                message = (
                    f"namespace {origin_ns} is not offloaded to provider {self.opts.provider_cluster_id} "
                    f"(gpuferry offload namespace {origin_ns})"
                )
                await self._hold(local, REASON_NOT_OFFLOADED, message, log)
                self._gated.add(key)
                return Requeue(GATE_RETRY_SECONDS)
            if not self.twins.namespace_synced(origin_ns):
                return Requeue(0.5)  # its twins are not listed yet: creating now could duplicate one
        if self.fitter is not None and (result := self.fitter.fit(local)) is not None and not result.ok:
            await self._gate(local, result, log)
            self._gated.add(key)
            return Requeue(GATE_RETRY_SECONDS)
        twin = remote_pod(local, self.opts)
        if self.twins is not None:
            twin["metadata"]["namespace"] = self.twins.twin_namespace_for(origin_ns)
        else:
            await self._ensure_namespace(origin_ns)
        for accessory in self.accessories:  # what the twin mounts exists before the twin
            await accessory.ensure_for(local)
        try:
            await self.provider.create(PODS, twin, twin["metadata"]["namespace"])
        except AlreadyExists:
            return Requeue(1.0)  # our cache is behind: look again once the watch caught up
        except Forbidden as exc:
            if "exceeded quota" not in str(exc):
                raise  # RBAC or Pod Security: permanent until someone changes something
            # the provider's quota (our grant, as the API server enforces it) is full for now:
            # wait, as a kubelet waits for room, and say so on the consumer pod
            await self._hold(local, REASON_QUOTA, f"the provider's quota for this tenant is full: {exc}", log)
            self._gated.add(key)
            self._quota_waiting[key] = placement_request(local)
            await self._report_demand(origin_ns)
            return Requeue(QUOTA_RETRY_SECONDS)
        TWINS_CREATED.inc()
        _observe_since(local, "twin_created")
        if self._quota_waiting.pop(key, None) is not None:
            await self._report_demand(origin_ns)
        log.info("twin created in %s", twin["metadata"]["namespace"])
        return None

    async def _ensure_namespace(self, namespace: str) -> None:
        name = twin_namespace(namespace, self.opts.consumer_cluster_id, strategy=self.opts.namespace_strategy)
        if name in self._namespaces:
            return
        body: RawObject = {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {
                "name": name,
                "labels": ownership_labels(self.opts.consumer_cluster_id),
                "annotations": {ORIGIN_NAMESPACE: namespace},
            },
        }
        with contextlib.suppress(AlreadyExists):
            await self.provider.create(NAMESPACES, body)
        self._namespaces.add(name)

    async def _gate(self, local: RawObject, result: FitResult, log: Any) -> None:
        message = f"waiting for a provider node with room: {result.message}"
        await self._hold(local, REASON_NO_FIT, message, log)

    async def _report_demand(self, origin_ns: str) -> None:
        if self.twins is None:
            return
        waiting = [r for k, r in self._quota_waiting.items() if k.namespace == origin_ns]
        await self.twins.report_demand(origin_ns, format_resource_list(add(*waiting)) if waiting else {})

    async def _hold(self, local: RawObject, reason: str, message: str, log: Any) -> None:
        """Keep the pod Pending with ``reason`` and ``message`` (and one Event) until it can go."""
        meta = local["metadata"]
        new = {"phase": "Pending", "reason": reason, "message": message}
        current = local.get("status") or {}
        if current.get("reason") != new["reason"] or current.get("message") != new["message"]:
            await self.consumer.patch(
                PODS, meta["name"], {"status": new}, meta["namespace"], subresource="status"
            )
            log.info("held: %s", message)
        await self._event(local, "Warning", reason, message)

    async def _report_deleted_twin(self, local: RawObject, log: Any) -> None:
        meta = local["metadata"]
        message = "the twin pod on the provider was deleted outside gpuferry"
        status = {
            "phase": "Failed",
            "reason": REASON_DELETED,
            "message": message,
            "conditions": [
                {"type": "Ready", "status": "False", "reason": REASON_DELETED, "lastTransitionTime": _now()},
                {
                    "type": "ContainersReady",
                    "status": "False",
                    "reason": REASON_DELETED,
                    "lastTransitionTime": _now(),
                },
            ],
        }
        await self.consumer.patch(
            PODS, meta["name"], {"status": status}, meta["namespace"], subresource="status"
        )
        await self._event(local, "Warning", REASON_DELETED, message)
        log.warning("%s", message)

    # ---- updates and status --------------------------------------------------------------------

    async def _update(self, local: RawObject, remote: RawObject, log: Any) -> None:
        spec_patch = remote_pod_update(local, remote, self.opts)
        if spec_patch is not None:
            meta = remote["metadata"]
            await self.provider.patch(PODS, meta["name"], spec_patch, meta["namespace"])
            log.info("twin updated: %s", sorted(spec_patch))
        new_status = local_status(remote, remap_ip=self.remap_ip, host_ip=self.node_address, local=local)
        patch = status_patch(local.get("status") or {}, new_status)
        if patch is None:
            return
        meta = local["metadata"]
        await self.consumer.patch(PODS, meta["name"], patch, meta["namespace"], subresource="status")
        old_phase = (local.get("status") or {}).get("phase")
        if new_status.get("phase") == "Running" and old_phase != "Running":
            _observe_since(local, "running")
        if new_status.get("phase") != old_phase:
            log.info("phase %s -> %s", old_phase, new_status.get("phase"))

    async def _event(self, local: RawObject, type_: str, reason: str, message: str) -> None:
        meta = local["metadata"]
        if (meta["uid"], reason) in self._events_sent:
            return
        now = _now()
        event: RawObject = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta["uid"],
            },
            "type": type_,
            "reason": reason,
            "message": message,
            "source": {"component": "gpuferry-virtual-kubelet", "host": self.opts.virtual_node_name},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
            "reportingComponent": "gpuferry.io/virtual-kubelet",
            "reportingInstance": self.opts.virtual_node_name,
        }
        await self.consumer.create(EVENTS, event, meta["namespace"])
        self._events_sent.add((meta["uid"], reason))


def refresh_phase_gauge(local: PodCache, remote: PodCache | TwinNamespaces) -> None:
    """Set ``vk_pods{side,phase}`` from the caches (called before each /metrics scrape)."""
    PODS_BY_PHASE.clear()
    for side, cache in (("consumer", local), ("provider", remote)):
        for phase, count in cache.phases().items():
            PODS_BY_PHASE.labels(side, phase).set(count)


def _observe_since(local: RawObject, stage: str) -> None:
    created = _parse_time(local["metadata"].get("creationTimestamp"))
    if created is not None:
        OFFLOAD_LATENCY.labels(stage).observe(max(0.0, time.time() - created))


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse_time(value: str | None) -> float | None:
    if not value:
        return None
    return datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
