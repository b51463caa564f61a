"""Status back: each twin's status, in the consumer's view, onto its consumer pod.

The queue ``sync_status_from_remote`` holds consumer pod keys, added when either pod of a pair
changes (not for a pod gone or terminating, or a twin gone: there is nothing to write then, and
:meth:`PodStatusReflector.forget` drops the pair without a pass; nor for the status it wrote
coming back, :mod:`vk.reflection.echoes`), when the network fabric's view of the provider's
addresses changes, and at each resync. ``reconcile(key)`` reads both pods from the informers
and, when the twin is the current pod's own (its origin UID is the pod's), patches the consumer
pod's status with :func:`vk.forge.podstatus.local_status` of the twin (pod IPs remapped, the host
IP the virtual node's), if anything differs. It writes nothing else.

Everything else about a pair (creating, updating and deleting twins; holding a pod that cannot
go yet; reporting a twin deleted behind our back) is :mod:`vk.reflection.pods`'s, in the queue
``sync_pods_to_remote``. The two never write the same thing in the same state of a pair: status
back acts only while the pod's own twin exists and the pod is not terminating; the statuses
pods-to-remote writes (Pending with a reason, Failed with ``ProviderPodDeleted``) are written
only while it has no twin. Both read the same informers, so a key handled by both at once sees
the same pair; a status written from a twin that vanished meanwhile is corrected by the next
event of that pair.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Protocol

from kube.clients import KubeClient
from kube.errors import KubeError, NotFound
from kube.informers import Informer
from kube.logs import object_logger
from kube.metrics import gauge, histogram
from kube.objects import PODS, RESOURCECLAIMS, ObjectKey, RawObject
from kube.reconciling import Requeue
from kube.times import unix_seconds

from ..forge.addresses import identity
from ..forge.devices import claim_device_status, claim_names
from ..forge.labels import origin_of
from ..forge.podstatus import local_status, status_patch
from .echoes import Echoes

__all__ = ["OFFLOAD_LATENCY", "PODS_BY_PHASE", "PodStatusReflector", "observe_since", "refresh_phase_gauge"]

logger = logging.getLogger(__name__)

OFFLOAD_LATENCY = histogram(
    "vk_offload_seconds",
    "Seconds from the consumer pod's creation to its twin being created (stage twin_created) and "
    "to the consumer pod being reported Running (stage running).",
    ["stage"],
    buckets=(0.25, 0.5, 1, 2, 5, 10, 30, 60, 120),
)
PODS_BY_PHASE = gauge("vk_pods", "Consumer pods bound to the virtual node, by phase.", ["side", "phase"])


class Twins(Protocol):
    """Twins by consumer pod key (:class:`vk.remote.RemoteSide` is one)."""

    def get(self, key: ObjectKey) -> RawObject | None: ...
    def resource_version(self, key: ObjectKey) -> str | None: ...


class PodStatusReflector:
    """The reconciler of ``sync_status_from_remote`` (see the module docstring)."""

    def __init__(
        self,
        *,
        consumer: KubeClient,
        local: Informer,
        twins: Twins,
        node_address: str,
        remap_ip: Callable[[str], str] = identity,
        provider: KubeClient | None = None,
    ) -> None:
        self.consumer = consumer
        self.provider = provider
        """Reads the twins' ResourceClaims, whose allocation goes back to the consumer's claims."""
        self._claims_back: set[ObjectKey] = set()
        """Running pods whose claims' device status was written."""
        self.local = local
        self.twins = twins
        self.node_address = node_address
        self.remap_ip = remap_ip
        """The fabric's view of a twin's address from the consumer (set by the PeerNetwork follower)."""
        self._in_sync: dict[ObjectKey, tuple[object, ...]] = {}
        """Pods whose status needed no patch, with what it was computed from (both resource
        versions and the address view): a resync finds them so without computing it again."""
        self.echoes = Echoes()
        """The consumer pods' versions our status patches returned: their watch events need no
        pass (:mod:`vk.reflection.echoes`)."""
        self._written: dict[ObjectKey, tuple[str, Mapping[str, object]]] = {}
        """The status our last patch of a pod left, with its version, until that version comes
        back to the informer (:meth:`echoed`): a pass meanwhile reads an older pod."""

    def settled(self, key: ObjectKey) -> bool:
        """Whether the last pass over ``key`` found nothing to write and neither pod nor the
        address view changed since (without decoding either pod), or one of the pair is missing:
        there is no status to write then, and the other's arrival wakes a pass (issue 15: a burst
        of ten thousand pods waiting for their twins made every resync a status pass over each)."""
        twin_version = self.twins.resource_version(key)
        if twin_version is None or self.local.resource_version(key) is None:
            return True
        seen = self._in_sync.get(key)
        return seen is not None and seen == (self.local.resource_version(key), twin_version, self.remap_ip)

    def twin_moved_on(self, key: ObjectKey, old_version: str | None, new_version: str | None) -> None:
        """The twin changed from ``old_version`` to ``new_version`` in nothing status back reads
        (:func:`vk.forge.podstatus.twin_status_inputs`): a pass that found the pair in sync with
        the old twin holds for the new one, and a resync need not redo it."""
        seen = self._in_sync.get(key)
        if seen is not None and old_version is not None and seen[1] == old_version:
            self._in_sync[key] = (seen[0], new_version, seen[2])

    def echoed(self, key: ObjectKey, version: str | None) -> bool:
        """Whether the consumer pod's change to ``version`` is our last status patch coming back
        (it needs no pass; the informer has caught up with it)."""
        if not self.echoes.is_echo(key, version):
            return False
        self._written.pop(key, None)
        return True

    def forget(self, key: ObjectKey) -> None:
        """Drop what is kept about ``key``'s pair: with the pod gone or terminating, or its twin
        gone, status back has nothing to write (a pass would find just that)."""
        self._in_sync.pop(key, None)
        self._written.pop(key, None)
        self._claims_back.discard(key)
        self.echoes.forget(key)

    async def reconcile(self, key: ObjectKey) -> Requeue | None:
        local, remote = self.local.get(key), self.twins.get(key)
        if local is None or remote is None or local["metadata"].get("deletionTimestamp"):
            self.forget(key)
            return None
        origin = origin_of(remote)
        if origin is None or origin.uid != local["metadata"]["uid"]:
            return None  # an older pod's twin: pods-to-remote replaces it
        versions = (local["metadata"].get("resourceVersion"), remote["metadata"].get("resourceVersion"))
        seen = (*versions, self.remap_ip)
        if seen[0] is not None and seen[1] is not None and self._in_sync.get(key) == seen:
            return None  # the same inputs as the last pass, which found nothing to write
        new_status = local_status(remote, remap_ip=self.remap_ip, host_ip=self.node_address, local=local)
        if new_status.get("phase") == "Running" and key not in self._claims_back:
            try:
                await self._claim_status_back(key, local, remote)
            except KubeError as exc:  # what the claim says is extra: it never holds the pod's status
                self._claims_back.add(key)
                object_logger(logger, "Pod", key).warning(
                    "the provider's device allocation is not written into the pod's claims: %s", exc
                )
        patch = status_patch(local.get("status") or {}, new_status)
        written = self._written.get(key)
        if written is not None and self.echoes.awaiting(key) == written[0]:
            # The informer's pod is older than our last patch's: a merge patch from it alone
            # leaves out what it already matched, and the pod would keep what that patch put
            # there (a PodResizeInProgress the twin has dropped since; CI, 2026-12-07). What
            # differs from either is written: each field as the twin has it, so never wrong.
            since = status_patch(written[1], new_status)
            if since is not None:
                patch = {"status": {**(patch or {"status": {}})["status"], **since["status"]}}
        if patch is None:
            self._in_sync[key] = seen
            return None
        meta = local["metadata"]
        answer = await self.consumer.patch(PODS, meta["name"], patch, meta["namespace"], subresource="status")
        # the pod as written is in sync with this twin: its echo needs no pass, nor a resync
        version = self.echoes.wrote(key, answer, seen=self.local.resource_version(key))
        if version is not None:
            self._in_sync[key] = (version, versions[1], self.remap_ip)
        else:
            self._in_sync.pop(key, None)
        if version is not None and self.echoes.awaiting(key) == version:
            self._written[key] = (version, answer.get("status") or {})
        else:
            # nothing to wait for: its echo came in before the answer (issue 15: kept, the
            # statuses of most pods stayed, 14 MiB more at 10,000 pods Running)
            self._written.pop(key, None)
        old_phase = (local.get("status") or {}).get("phase")
        if new_status.get("phase") == "Running" and old_phase != "Running":
            observe_since(local, "running")
        if new_status.get("phase") != old_phase:
            object_logger(logger, "Pod", key).info("phase %s -> %s", old_phase, new_status.get("phase"))
        return None

    async def _claim_status_back(self, key: ObjectKey, local: RawObject, remote: RawObject) -> None:
        """Write, on each of the consumer pod's ResourceClaims, which real device the provider
        allocated to the twin's claim for it (``status.devices[].data``, see
        :func:`vk.forge.devices.claim_device_status`); once per running pod."""
        mine, theirs = claim_names(local), claim_names(remote)
        if self.provider is None or not mine:
            self._claims_back.add(key)
            return
        log = object_logger(logger, "Pod", key)
        for ref, name in sorted(mine.items()):
            if ref not in theirs:
                return  # the twin's claim is not made yet: the next pass comes back
            try:
                twin_ns = remote["metadata"]["namespace"]
                provider_claim = await self.provider.get(RESOURCECLAIMS, theirs[ref], twin_ns)
                claim = await self.consumer.get(RESOURCECLAIMS, name, local["metadata"]["namespace"])
            except NotFound:
                return
            devices = claim_device_status(claim, provider_claim)
            if devices is None:
                return
            if (claim.get("status") or {}).get("devices") != devices:
                patch = {"status": {"devices": devices}}
                await self.consumer.patch(RESOURCECLAIMS, name, patch, local["metadata"]["namespace"],
                                          subresource="status")  # fmt: skip
                log.info("claim %s: allocated on the provider as %s", name,
                         ", ".join(f"{d['data']['provider']['pool']}/{d['data']['provider']['device']}"
                                   for d in devices))  # fmt: skip
        self._claims_back.add(key)


def refresh_phase_gauge(local: Mapping[str, int], remote: Mapping[str, int]) -> None:
    """Set ``vk_pods{side,phase}`` from the pods per phase of each side (called before each
    /metrics scrape)."""
    PODS_BY_PHASE.clear()
    for side, counts in (("consumer", local), ("provider", remote)):
        for phase, count in counts.items():
            PODS_BY_PHASE.labels(side, phase).set(count)


def observe_since(local: RawObject, stage: str) -> None:
    """Observe ``vk_offload_seconds{stage}``: the time since the consumer pod was created."""
    created = _parse_time(local["metadata"].get("creationTimestamp"))
    if created is not None:
        OFFLOAD_LATENCY.labels(stage).observe(max(0.0, time.time() - created))


def _parse_time(value: str | None) -> float | None:
    if not value:
        return None
    return unix_seconds(value)
