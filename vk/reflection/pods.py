"""Pods out: one reconciler for every pod bound to the virtual node, in ``sync_pods_to_remote``.

``reconcile(key)`` reads the consumer pod and its provider twin from the informers and does
the one thing the pair needs, in this order:

1. consumer pod gone → delete the twin (UID precondition) — this also collects orphans;
2. the twins of the pod's namespace not listed yet → look again shortly (a twin not seen is not
   yet a twin missing);
3. consumer pod terminating → delete the twin with the same grace period; when the twin is
   gone, remove the consumer pod (``gracePeriodSeconds=0``, as a kubelet does);
4. no twin → if it ran before, the twin was deleted behind our back: the pod is Failed with
   reason ``ProviderPodDeleted`` (a controller replaces it); otherwise, if its namespace is
   offloaded and the pod fits on one provider node, create the twin (after its namespace and
   the copies it mounts), else keep it Pending with a clear reason and an Event, and look again
   later (the gate: "fit, not sum");
5. twin of an older pod with the same name → delete it, then start over;
6. otherwise → patch the twin with what may change on a running pod, resize it as the pod was
   resized (its ``resize`` subresource: cpu and memory; a refusal is a Warning Event
   ``ResizeRejected`` with the provider's words, and the pod's status keeps showing the
   resources the twin runs with; one its quota refused is asked again every few seconds, as a
   kubelet retries a deferred resize), and add to it the
   ephemeral containers ``kubectl debug`` added to the pod, one by one through its
   ``ephemeralcontainers`` subresource. One the provider refuses (its Pod Security level, say,
   for a debugger with ``SYS_PTRACE``) is not tried again for that pod; a Warning Event
   ``EphemeralContainerRejected`` on the pod gives the provider's words.

The twin's status comes back through its own queue (:mod:`vk.reflection.podstatus`). Where twins
go and how they are seen is the :class:`vk.remote.RemoteSide`'s. All state lives in the two API
servers: a restart rebuilds the informers and converges.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any, Literal, Protocol

from kube.api import GPU_RESOURCE, GRANT_PIN_REFUSAL
from kube.clients import KubeClient
from kube.errors import AlreadyExists, Conflict, Forbidden, Invalid, KubeError, NotFound, TemporaryError
from kube.informers import Change, Informer
from kube.logs import object_logger
from kube.metrics import counter
from kube.objects import EVENTS, PODS, ObjectKey, RawObject
from kube.quantities import ResourceList, add, format_resource_list
from kube.reconciling import Requeue
from kube.times import rfc3339

from ..forge.fit import FitResult, placement_request
from ..forge.labels import origin_of
from ..forge.pods import ForgeOptions, new_ephemeral_containers, remote_pod, remote_pod_update, resize_patch
from ..remote import RemoteSide
from .echoes import Echoes
from .podstatus import observe_since

logger = logging.getLogger(__name__)

TWINS_CREATED = counter("vk_twins_created", "Twin pods created on the provider.")
TWINS_DELETED = counter("vk_twins_deleted", "Twin pods deleted on the provider.", ["why"])

GATE_RETRY_SECONDS = 30.0
"""Backstop for gated pods: they are looked at again as soon as provider capacity changes
(:meth:`PodReflector.gated_keys`), and at the latest after this long."""
REASON_DELETED = "ProviderPodDeleted"
REASON_MOUNT = "FailedMount"
"""What the twin mounts cannot be built yet (the kubelet's own Event reason for it)."""
REASON_NO_FIT = "ProviderCapacity"
REASON_NOT_OFFLOADED = "NamespaceNotOffloaded"
REASON_QUOTA = "ProviderQuotaExceeded"
REASON_REJECTED = "ProviderRejected"
REASON_EPHEMERAL_REJECTED = "EphemeralContainerRejected"
REASON_RESIZE_REJECTED = "ResizeRejected"
DEBUG_PROFILE_HINT = (
    "use kubectl debug --profile=baseline, or --profile=restricted where the provider enforces "
    "restricted: the default profile's --target adds SYS_PTRACE, which baseline refuses"
)
QUOTA_RETRY_SECONDS = 5.0
LISTING_RETRY_SECONDS = 0.5
"""How soon a pod whose namespace's twins are not listed yet is looked at again."""


class Prerequisite(Protocol):
    """Something a twin needs on the provider before it is created (copies, token Secrets)."""

    async def ensure_for(self, pod: RawObject) -> None: ...


class PrerequisiteNotReady(TemporaryError):
    """Raised by a :class:`Prerequisite` that cannot be made yet for a reason the pod's owner
    should see (a namespace's CA not published): the pod is held Pending with ``reason`` and the
    message, and looked at again after ``delay``."""

    def __init__(self, reason: str, message: str, delay: float) -> None:
        super().__init__(message, delay=delay)
        self.reason = reason


class FitOracle(Protocol):
    """Answers whether a pod fits on one provider node now. ``None``: not known yet (do not gate)."""

    def fit(self, pod: RawObject) -> FitResult | None: ...


class PodReflector:
    """The reconciler of ``sync_pods_to_remote`` (see the module docstring)."""

    def __init__(
        self,
        *,
        consumer: KubeClient,
        provider: KubeClient,
        local: Informer,
        remote: RemoteSide,
        opts: ForgeOptions,
        fit: FitOracle | None = None,
        accessories: Sequence[Prerequisite] = (),
    ) -> None:
        self.consumer = consumer
        self.provider = provider
        self.local = local
        self.remote = remote
        self.opts = opts
        self.fitter = fit
        self.accessories = list(accessories)
        """ConfigMaps, Secrets and tokens the twin needs are written before it is created."""
        self._events_sent: dict[ObjectKey, tuple[str, set[str]]] = {}  # pod -> (uid, reasons sent)
        self._refused: dict[ObjectKey, tuple[str, frozenset[str]]] = {}
        """Pods with ephemeral containers the provider refused: (uid, their names)."""
        self._resize_deferred: set[ObjectKey] = set()
        """Pods whose resize the provider's quota refused in the pass at hand."""
        self._gated: set[ObjectKey] = set()
        self._quota_waiting: dict[ObjectKey, ResourceList] = {}
        self._block_waiting: dict[ObjectKey, ResourceList] = {}
        """Pods held because no provider node of the grant has a block as large as they are."""
        self._in_sync: dict[ObjectKey, tuple[object, ...]] = {}
        """Pods whose twin needed no patch, with both resource versions then: a resync (every
        pod, every few minutes) finds them so without forging the twin again (issue 15)."""
        self.echoes = Echoes()
        """Twins as our creates returned them, by consumer pod key: the watch event of a twin
        just created needs no pass (:mod:`vk.reflection.echoes`)."""

    def settled(self, key: ObjectKey) -> bool:
        """Whether the last pass over ``key`` found nothing to do and neither pod changed
        since (read from the stores' resource versions, without decoding either pod)."""
        seen = self._in_sync.get(key)
        return seen is not None and seen == (
            self.local.resource_version(key),
            self.remote.resource_version(key),
        )

    def still_in_sync(self, key: ObjectKey, change: Change, side: Literal["consumer", "twin"]) -> None:
        """``change`` of one pod of the pair (the one ``side`` names) cannot matter to this
        reconciler (:func:`~vk.forge.pods.matters_to_twin_sync` said so): a pair
        found in sync stays so at the new version, and a resync does not pass over it again
        (issue 15: every twin bound and Running since its creation made every resync a pass over
        every pod)."""
        seen = self._in_sync.get(key)
        if seen is None or change.old is None or change.new is None:
            return
        before = change.old["metadata"].get("resourceVersion")
        at = 0 if side == "consumer" else 1
        if before is None or seen[at] != before:
            return
        after = change.new["metadata"].get("resourceVersion")
        self._in_sync[key] = (after, seen[1]) if at == 0 else (seen[0], after)

    def gated_keys(self) -> list[ObjectKey]:
        """Pods held back because they fit on no provider node now (to retry when that changes)."""
        return list(self._gated)

    async def reconcile(self, key: ObjectKey) -> Requeue | None:
        log = object_logger(logger, "Pod", key)
        local, remote = self.local.get(key), self.remote.get(key)
        self._gated.discard(key)
        gone = local is None or bool(local["metadata"].get("deletionTimestamp"))
        if gone and (self._quota_waiting.pop(key, None), self._block_waiting.pop(key, None)) != (None, None):
            await self._report_demand(key.namespace or "")
        if local is None or remote is None:
            self._in_sync.pop(key, None)
        if local is None or local["metadata"].get("deletionTimestamp"):
            self.echoes.forget(key)
        if local is None:
            self._events_sent.pop(key, None)
            self._refused.pop(key, None)
            self._resize_deferred.discard(key)
            if remote is not None:
                await self._delete_twin(remote, grace=None, why="orphan", log=log)
            return None
        if remote is None and not self.remote.knows(key):
            return Requeue(LISTING_RETRY_SECONDS)
        if local["metadata"].get("deletionTimestamp"):
            return await self._terminate(local, remote, log)
        if remote is None:
            return await self._create(key, local, log)
        origin = origin_of(remote)
        if origin is None or origin.uid != local["metadata"]["uid"]:
            await self._delete_twin(remote, grace=0, why="stale", log=log)
            return None
        seen = (local["metadata"].get("resourceVersion"), remote["metadata"].get("resourceVersion"))
        if seen[0] is not None and seen[1] is not None and self._in_sync.get(key) == seen:
            return None  # the same pair as the last pass, which found nothing to patch
        changed = await self._update(local, remote, log)
        if key in self._resize_deferred:
            # the provider's quota has no room for the resize now: asked again, as a kubelet
            # retries a deferred resize, until it has or the pod changes
            self._resize_deferred.discard(key)
            self._in_sync.pop(key, None)
            return Requeue(QUOTA_RETRY_SECONDS)
        if changed:
            self._in_sync.pop(key, None)
        else:
            self._in_sync[key] = seen
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
        twin_ns = self.remote.twin_namespace_for(origin_ns)
        if twin_ns is None:
            message = (
                f"namespace {origin_ns} is not offloaded to provider {self.opts.provider_cluster_id} "
                f"(gpuferry offload namespace {origin_ns})"
            )
            self._gated.add(key)  # first: what changes while it is held wakes it (see below)
            await self._hold(local, REASON_NOT_OFFLOADED, message, log)
            return Requeue(GATE_RETRY_SECONDS)
        if self.fitter is not None and (result := self.fitter.fit(local)) is not None and not result.ok:
            # held from now on, before the awaits of saying so: capacity that frees up meanwhile
            # retries it (gated_keys); marked after them, it went unseen and the pod waited for
            # the backstop timer
            self._gated.add(key)
            await self._gate(local, result, log)
            if result.reason == "ExceedsLargestBlock" and key not in self._block_waiting:
                # the provider may place the grant anew so that one node holds such a block
                self._block_waiting[key] = placement_request(local)
                await self._report_demand(origin_ns)
            return Requeue(GATE_RETRY_SECONDS)
        self._block_waiting.pop(key, None)
        # also after a restart, which forgot what it reported: a stale waiting block goes
        # (repeating the last report costs no API call)
        await self._report_demand(origin_ns)
        twin = remote_pod(local, self.opts)
        twin["metadata"]["namespace"] = twin_ns
        await self.remote.prepare_namespace(origin_ns)
        try:
            for accessory in self.accessories:  # what the twin mounts exists before the twin
                await accessory.ensure_for(local)
        except PrerequisiteNotReady as exc:
            await self._hold(local, exc.reason, str(exc), log)
            return Requeue(exc.delay)
        try:
            answer = await self.provider.create(PODS, twin, twin["metadata"]["namespace"])
        except AlreadyExists:
            return Requeue(1.0)  # our cache is behind: look again once the watch caught up
        except Invalid as exc:  # the provider's API server refuses the twin as it is: it never will run
            await self._reject(local, str(exc.message), log)
            return None
        except Forbidden as exc:
            if "cannot create resource" in exc.message:
                raise  # RBAC: the tenant's role may not be bound yet; retried with backoff
            if GRANT_PIN_REFUSAL in str(exc):
                # the grant moves to other nodes and this twin was made for the old ones: the
                # virtual node follows in a moment; wait for it rather than fail the pod
                self._gated.add(key)
                await self._hold(local, REASON_QUOTA, f"the provider's grant is moving: {exc.message}", log)
                return Requeue(QUOTA_RETRY_SECONDS)
            if not quota_is_full(exc):
                # admission (Pod Security, a policy): the pod as written never runs there; say why
                await self._reject(local, str(exc.message), log)
                return None
            # the provider's quota (our grant, as the API server enforces it) is full for now:
            # wait, as a kubelet waits for room, and say so on the consumer pod
            self._gated.add(key)
            await self._hold(local, REASON_QUOTA, f"the provider's quota for this tenant is full: {exc}", log)
            self._quota_waiting[key] = placement_request(local)
            await self._report_demand(origin_ns)
            return Requeue(QUOTA_RETRY_SECONDS)
        TWINS_CREATED.inc()
        # forged from this very pod: the pair as created needs no patch (nor its echo a pass)
        written = self.echoes.wrote(key, answer, seen=self.remote.resource_version(key))
        debugged = bool(local["spec"].get("ephemeralContainers"))  # debugged while Pending
        version = local["metadata"].get("resourceVersion")
        if written is not None and version is not None and not debugged:
            self._in_sync[key] = (version, written)
        observe_since(local, "twin_created")
        if self._quota_waiting.pop(key, None) is not None:
            await self._report_demand(origin_ns)
        log.info("twin created in %s", twin["metadata"]["namespace"])
        # a twin cannot be created with ephemeral containers: they are added on the next pass
        return Requeue(1.0) if debugged else None

    async def _gate(self, local: RawObject, result: FitResult, log: Any) -> None:
        message = f"waiting for a provider node with room: {result.message}"
        await self._hold(local, REASON_NO_FIT, message, log)

    async def _report_demand(self, origin_ns: str) -> None:
        waiting = [r for k, r in self._quota_waiting.items() if k.namespace == origin_ns]
        blocks = [r for k, r in self._block_waiting.items() if k.namespace == origin_ns]
        largest = max(blocks, key=lambda r: (r.get(GPU_RESOURCE, 0), sorted(r.items())), default={})
        await self.remote.report_demand(
            origin_ns, format_resource_list(add(*waiting)) if waiting else {}, format_resource_list(largest)
        )

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

    async def _reject(self, local: RawObject, said: str, log: Any) -> None:
        """The provider refuses the twin (Pod Security, an admission policy, validation): the pod
        fails with the provider's own words, as a kubelet fails a pod it cannot admit."""
        message = f"provider {self.opts.provider_cluster_id} refused the pod: {said}"
        await self._fail(local, REASON_REJECTED, message, log)

    async def _report_deleted_twin(self, local: RawObject, log: Any) -> None:
        message = "the twin pod on the provider was deleted outside gpuferry"
        await self._fail(local, REASON_DELETED, message, log)

    async def _fail(self, local: RawObject, reason: str, message: str, log: Any) -> None:
        """The pod ends Failed with ``reason`` and ``message``, not ready, and one Event says so."""
        meta = local["metadata"]
        now = _now()
        status = {
            "phase": "Failed",
            "reason": reason,
            "message": message,
            "conditions": [
                {"type": kind, "status": "False", "reason": reason, "lastTransitionTime": now}
                for kind in ("Ready", "ContainersReady")
            ],
        }
        # the Event first: whoever sees the pod Failed finds why in its events too
        await self._event(local, "Warning", reason, message)
        await self.consumer.patch(
            PODS, meta["name"], {"status": status}, meta["namespace"], subresource="status"
        )
        log.warning("%s", message)

    # ---- updates -------------------------------------------------------------------------------

    async def _update(self, local: RawObject, remote: RawObject, log: Any) -> bool:
        """Patch the twin with what changed on the pod, and add the ephemeral containers it
        lacks; whether there was anything."""
        meta = remote["metadata"]
        spec_patch = remote_pod_update(local, remote, self.opts)
        if spec_patch is not None:
            await self.provider.patch(
                PODS, meta["name"], spec_patch, meta["namespace"], patch_type="strategic"
            )
            log.info("twin updated: %s", sorted(spec_patch))
        resized = await self._resize(local, remote, log)
        return await self._add_ephemeral_containers(local, remote, log) or resized or spec_patch is not None

    async def _resize(self, local: RawObject, remote: RawObject, log: Any) -> bool:
        """Resize the twin as the consumer pod was resized; whether it was."""
        patch = resize_patch(local, remote)
        if patch is None:
            return False
        meta = remote["metadata"]
        try:
            await self.provider.patch(
                PODS, meta["name"], patch, meta["namespace"], subresource="resize", patch_type="strategic"
            )
        except NotFound:
            return False  # the twin went: its deletion event brings the pod back
        except (Invalid, Forbidden) as exc:
            # the provider will not (its quota, a QoS class change it sees, a node that cannot):
            # the twin runs as it was, which the pod's status shows; say why, once per request.
            # Its quota may have room later: that one is asked again (see reconcile)
            message = f"the provider refused to resize the twin: {exc.message}"
            asked = json.dumps(patch["spec"], sort_keys=True)
            said = await self._event(local, "Warning", REASON_RESIZE_REJECTED, message,
                                     once=f"{REASON_RESIZE_REJECTED}/{asked}")  # fmt: skip
            log.log(logging.WARNING if said else logging.DEBUG, "%s", message)
            if quota_is_full(exc):
                self._resize_deferred.add(
                    ObjectKey(local["metadata"]["namespace"], local["metadata"]["name"])
                )
            return False
        log.info("twin resized: %s", json.dumps(patch["spec"], sort_keys=True))
        return True

    async def _add_ephemeral_containers(self, local: RawObject, remote: RawObject, log: Any) -> bool:
        """Add to the twin the ephemeral containers the consumer pod has and it lacks, one per
        request (a refused one does not hold back the next); whether one was added."""
        key = ObjectKey(local["metadata"]["namespace"], local["metadata"]["name"])
        uid = local["metadata"]["uid"]
        refused_uid, refused = self._refused.get(key, (uid, frozenset()))
        if refused_uid != uid:  # another pod of the same name
            refused = frozenset()
        meta = remote["metadata"]
        added = False
        for container in new_ephemeral_containers(local, remote, self.opts, refused):
            name = container["name"]
            try:
                await self.provider.patch(
                    PODS,
                    meta["name"],
                    {"spec": {"ephemeralContainers": [container]}},
                    meta["namespace"],
                    subresource="ephemeralcontainers",
                    patch_type="strategic",
                )
            except NotFound:
                return added  # the twin went: its deletion event brings the pod back
            except (Invalid, Forbidden) as exc:
                # the provider will not run it as written (Pod Security, RBAC of an older
                # provider): say so on the pod, once, and do not ask again
                message = f"the provider refused ephemeral container {name}: {exc.message}"
                if "PodSecurity" in exc.message:
                    message += f" ({DEBUG_PROFILE_HINT})"
                log.warning("%s", message)
                await self._event(local, "Warning", REASON_EPHEMERAL_REJECTED, message,
                                  once=f"{REASON_EPHEMERAL_REJECTED}/{name}",
                                  field_path=f"spec.ephemeralContainers{{{name}}}")  # fmt: skip
                refused |= {name}  # after the Event: one not recorded is asked again, and said
                self._refused[key] = (uid, refused)
                continue
            added = True
            log.info("ephemeral container %s added to the twin", name)
        return added

    async def _event(
        self,
        local: RawObject,
        type_: str,
        reason: str,
        message: str,
        *,
        once: str | None = None,
        field_path: str | None = None,
    ) -> bool:
        """Record an Event on the consumer pod, once per pod for each ``once`` (the reason,
        unless given); ``field_path`` names the container it concerns, as a kubelet's does.
        Whether it was recorded now (not before)."""
        meta = local["metadata"]
        key = ObjectKey(meta["namespace"], meta["name"])
        once = once or reason
        uid, sent = self._events_sent.get(key, ("", set()))
        if uid == meta["uid"] and once in sent:
            return False
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
        if field_path:
            event["involvedObject"]["fieldPath"] = field_path
        await self.consumer.create(EVENTS, event, meta["namespace"])
        self._events_sent[key] = (meta["uid"], (sent if uid == meta["uid"] else set()) | {once})
        return True


def quota_is_full(exc: KubeError) -> bool:
    """Whether the provider refused for want of room in the tenant's quota (``exceeded quota``,
    the ResourceQuota admission's words): room may come, so what was refused is asked again."""
    return isinstance(exc, Forbidden) and "exceeded quota" in str(exc)


def _now() -> str:
    return rfc3339()
