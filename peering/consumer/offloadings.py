"""The consumer's NamespaceOffloading controller: a namespace offloaded, from its NamespaceOffloading.

A namespace is offloaded when it holds a ``NamespaceOffloading`` named ``offloading``. For each,
keyed by its namespace, the controller:

1. keeps the admission policy that makes offloaded namespaces' pods eligible for virtual nodes
   (:mod:`peering.admission`; it takes the object as its parameter);
2. picks the providers: every peered one (a VirtualNode), restricted to those whose virtual node's
   labels match ``spec.clusterSelector`` (then listed in ``status.allowedProviders``, which the
   policy turns into a node affinity);
3. asks each for the twin namespace, with the consumer's own identity on that provider (a
   NamespaceOffloading in its tenant namespace), and withdraws it from providers no longer picked;
   while one has not answered, the offloading is Pending and is looked at again when the
   provider's answer comes (a watch of those requests), or when a provider that was unreachable
   answers again, at the latest after a backoff of up to a minute (:func:`pending_retry`);
4. writes ``status``: each provider's twin namespace, phase and, when not Ready, the reason
   (:mod:`peering.offloadstatus`; a provider found unreachable is written so as soon as its
   node's taint is on, :func:`peering.consumer.app.offloadings_it_leaves`), a phase over all of them
   (Ready, Pending, SomeFailed, AllFailed, NoClusterSelected) and a ``Ready`` condition. Ready
   is written once a dry-run pod shows that the API server applies the policy to the namespace's
   pods (:mod:`peering.admissionprobe`): the policy and its parameter reach the admission plugin
   through informers, and a pod created a moment too early would never be offloaded. Where the
   namespace's own rules refuse the probe, Ready says the rule could not be checked. (A pod
   created just after ``clusterSelector`` changes may still get the former providers.)

Deleting it (finalizer ``offloading.gpuferry.io/release``) removes the namespace's pods that run on
virtual nodes (their twins go first) and withdraws every twin namespace; pods on local nodes stay.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

from kube.api import PROVIDER_LABEL, PROVIDER_UNREACHABLE_TAINT_KEY, tenant_namespace
from kube.clients import KubeClient
from kube.errors import AlreadyExists, KubeError, NotFound, is_temporary
from kube.informers import Informer
from kube.logs import object_logger
from kube.objects import (
    PODS,
    ObjectKey,
    RawObject,
    labels,
    meta,
)
from kube.patching import patch_changes
from kube.reconciling import Requeue
from kube.taints import blocking_taints

from ..admission import OFFLOADING_NAME, admission_objects
from ..admissionprobe import Probe, admission_in_effect
from ..clusterid import read_cluster_id
from ..conditions import find_condition, set_condition
from ..offloadstatus import NO_IDENTITY, REFUSED, REQUEST_FAILED, REQUESTED, UNREACHABLE, pending_message
from ..resources import NAMESPACEOFFLOADINGS, is_system_namespace
from .builders import FIELD_MANAGER
from .providers import ProviderClients, identity_data

__all__ = [
    "ADMISSION_RESYNC_SECONDS",
    "FINALIZER",
    "NamespaceOffloadingReconciler",
    "admission_due",
    "pending_retry",
    "provider_unreachable",
    "selected_providers",
    "selection_changed",
]

logger = logging.getLogger(__name__)

FINALIZER = "offloading.gpuferry.io/release"


def _matches(node_labels: Mapping[str, str], selector: Mapping[str, Any]) -> bool:
    for key, value in (selector.get("matchLabels") or {}).items():
        if node_labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        present = key in node_labels
        if op == "In" and node_labels.get(key) not in values:
            return False
        if op == "NotIn" and present and node_labels[key] in values:
            return False
        if op == "Exists" and not present:
            return False
        if op == "DoesNotExist" and present:
            return False
    return True


def selected_providers(virtual_nodes: Sequence[RawObject], selector: Mapping[str, Any] | None) -> list[str]:
    """The providers (by their virtual nodes' labels) a clusterSelector picks; all without one. Pure."""
    picked = []
    for node in virtual_nodes:
        provider = labels(node).get(PROVIDER_LABEL)
        if provider and (not selector or _matches(labels(node), selector)):
            picked.append(provider)
    return sorted(set(picked))


def provider_unreachable(node: RawObject) -> bool:
    """Whether a virtual node says that its provider does not answer: its virtual kubelet's
    ``provider-unreachable`` taint. Pure."""
    return any(t.get("key") == PROVIDER_UNREACHABLE_TAINT_KEY for t in blocking_taints(node))


def unreachable_providers(virtual_nodes: Sequence[RawObject]) -> set[str]:
    """The providers whose virtual node says they do not answer. Pure."""
    return {str(labels(n).get(PROVIDER_LABEL)) for n in virtual_nodes if provider_unreachable(n)}


def unreachable_entry(provider_id: str, current: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The status entry of a provider that does not answer, asked nothing: Pending, saying why,
    with the twin namespace it gave before, if any (the provider's kubelets keep running the
    twins there). Pure."""
    entry: dict[str, Any] = {
        "clusterID": provider_id,
        "phase": "Pending",
        "reason": UNREACHABLE,
        "message": "the provider does not answer (its virtual node has the taint "
        f"{PROVIDER_UNREACHABLE_TAINT_KEY})",
    }
    return with_given(entry, current)


def with_given(entry: dict[str, Any], current: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """``entry`` (a provider not heard from this pass) with the twin namespace that provider gave
    before, if any: not hearing from it says nothing of that namespace, whose twins keep running.
    Pure."""
    for before in current:
        if before.get("clusterID") == entry["clusterID"] and before.get("remoteNamespace"):
            return {**entry, "remoteNamespace": before["remoteNamespace"]}
    return entry


def selection_changed(
    old: Mapping[str, str] | None, new: Mapping[str, str] | None, selector: Mapping[str, Any] | None
) -> bool:
    """Whether a virtual node whose labels went from ``old`` to ``new`` (None: no node) changes
    what an offloading with ``selector`` selects: the provider it stands for, or whether it is
    selected. Pure."""

    def picked(node_labels: Mapping[str, str] | None) -> str | None:
        if node_labels is None:
            return None
        provider = node_labels.get(PROVIDER_LABEL)
        return provider if provider and (not selector or _matches(node_labels, selector)) else None

    return picked(old) != picked(new)


ADMISSION_RESYNC_SECONDS = 60.0
"""How long the admission policies and bindings, once applied, are taken as in place: they are
the same for every offloading, and a pass of each applied all four again (issue 15: an
offloading held Pending by a provider without an identity here passes every 5 s, and applied
them each time, about 40 writes in a 30 s burst on the demo). A dry-run pod that shows the rule
not applied has them applied at the next pass, whatever the time."""


def admission_due(applied_at: float | None, now: float, resync: float = ADMISSION_RESYNC_SECONDS) -> bool:
    """Whether the admission objects are to be applied again: never applied by this process (or
    found not in effect since, ``applied_at`` None), or applied ``resync`` seconds ago or more.
    Pure."""
    return applied_at is None or now - applied_at >= resync


PENDING_RETRY_MAX = 60.0
"""The longest wait between two looks at an offloading that stays Pending: a backstop. What it
waits for wakes it (:meth:`NamespaceOffloadingReconciler.waiting`): the provider's answer on
its twin namespace request (the consumer agent watches its requests in its tenant namespace,
:class:`~peering.consumer.providers.ProviderWatches`), a provider found unreachable answering
again (its virtual node loses the ``provider-unreachable`` taint), a virtual node coming."""


def pending_retry(passes: int) -> float:
    """Seconds until an offloading found Pending ``passes`` times in a row is looked at again
    unless woken: 1, 2, 4, 8, 16, 32, then 60 s. Each pass is ~9 requests on both clusters;
    with a cap of 5 s, a hundred offloadings held Pending by a provider that is down made 20
    passes a second, and 20 warnings in the agent's log. Pure."""
    return min(PENDING_RETRY_MAX, 2.0 ** max(0, passes - 1))


def with_admission(phase: str, message: str, probe: Probe) -> tuple[str, str, str]:
    """The phase, the Ready condition's reason and its message of an offloading whose twin
    namespaces are ready (``phase``, ``message``), given what a dry-run pod showed of the
    admission rule: held Pending while the API server does not apply it yet; Ready, saying so,
    where the namespace's own rules refuse the probe (waiting would never end). Pure."""
    if probe.live is False:
        waiting = f"waiting for the API server to apply the offloading rule: {probe.detail}"
        return "Pending", "AdmissionPending", waiting
    if probe.live is None:
        return phase, phase, f"{message}; the offloading rule could not be checked ({probe.detail})"
    return phase, phase, message


def namespace_state(obj: RawObject) -> RawObject:
    """A Namespace as the offloading controller keeps it: its name, uid and resourceVersion and,
    once it is being deleted, its deletionTimestamp; nothing else. Pure."""
    md = obj.get("metadata") or {}
    kept = {k: md[k] for k in ("name", "uid", "resourceVersion", "deletionTimestamp") if md.get(k)}
    return {"metadata": kept}


def _ready_at(obj: RawObject) -> bool:
    """Whether ``obj``'s status says Ready for its current generation. Pure."""
    cond = find_condition((obj.get("status") or {}).get("conditions"), "Ready")
    return (
        (obj.get("status") or {}).get("phase") == "Ready"
        and cond is not None
        and cond.get("status") == "True"
        and cond.get("observedGeneration") == meta(obj).get("generation")
    )


def overall_phase(entries: Sequence[Mapping[str, Any]]) -> str:
    """The phase over every provider's twin namespace. Pure."""
    if not entries:
        return "NoClusterSelected"
    phases = [e.get("phase") for e in entries]
    if all(p == "Ready" for p in phases):
        return "Ready"
    if all(p == "Failed" for p in phases):
        return "AllFailed"
    if "Failed" in phases:
        return "SomeFailed"
    return "Pending"


class NamespaceOffloadingReconciler:
    """Keyed by the NamespaceOffloading's ``ObjectKey`` (its namespace, ``offloading``)."""

    def __init__(
        self,
        consumer: KubeClient,
        *,
        virtual_nodes: Informer,
        clients: ProviderClients,
        namespaces: Informer | None = None,
        resync_seconds: float = 60.0,
        admission_resync: float = ADMISSION_RESYNC_SECONDS,
    ) -> None:
        self.consumer = consumer
        self.virtual_nodes = virtual_nodes
        self.namespaces = namespaces
        """The consumer's Namespaces (:func:`namespace_state`): an offloading whose namespace is
        being deleted is released at once, not when the namespace controller gets to it."""
        self.clients = clients
        self.resync_seconds = resync_seconds
        self.admission_resync = admission_resync
        self._admission_at: float | None = None
        """When this process last applied the admission objects (monotonic); None: to apply."""
        self._admission_lock = asyncio.Lock()
        self._pending: dict[ObjectKey, int] = {}
        """Offloading -> passes in a row that found it Pending."""

    async def _tenant(self, provider_id: str) -> KubeClient | None:
        data = await identity_data(self.consumer, provider_id)
        return None if data is None else await self.clients.tenant(provider_id, data)

    async def reconcile(self, key: ObjectKey) -> Requeue | None:
        if key.name != OFFLOADING_NAME or key.namespace is None:
            return None  # only the object named "offloading" offloads its namespace
        try:
            obj = await self.consumer.get(NAMESPACEOFFLOADINGS, key.name, key.namespace)
        except NotFound:
            self._pending.pop(key, None)
            return None
        consumer_id = await read_cluster_id(self.consumer)
        if meta(obj).get("deletionTimestamp") or self._namespace_going(key.namespace):
            return await self._release(obj, consumer_id)
        if is_system_namespace(key.namespace):  # never asked of a provider: nothing left there
            said = f"{key.namespace} is a system namespace: its pods are not offloaded"
            await self._refuse(obj, consumer_id, said)
            return None
        if FINALIZER not in (meta(obj).get("finalizers") or []):
            finalizers = [*(meta(obj).get("finalizers") or []), FINALIZER]
            obj = await self.consumer.patch(
                NAMESPACEOFFLOADINGS,
                key.name,
                {"metadata": {"finalizers": finalizers, "resourceVersion": meta(obj)["resourceVersion"]}},
                key.namespace,
            )
        await self._admission()
        spec = obj.get("spec") or {}
        selector = spec.get("clusterSelector") or None
        nodes = self.virtual_nodes.values()
        providers = selected_providers(nodes, selector)
        current = (obj.get("status") or {}).get("remoteNamespaces") or []
        # a provider that does not answer is not asked: each pass would wait on it (up to a
        # request's timeout, holding one of the controller's few workers) and log a warning;
        # its node losing the taint wakes the offloadings that wait (app.provider_came_back)
        down = unreachable_providers(nodes)
        mapping, origin = spec.get("namespaceMappingStrategy") or "DefaultName", key.namespace

        async def ask(provider_id: str) -> dict[str, Any]:
            if provider_id in down:
                return unreachable_entry(provider_id, current)
            entry = await self._twin(provider_id, consumer_id, origin, mapping)
            return with_given(entry, current) if entry.get("reason") == REQUEST_FAILED else entry

        # all at once: one provider that hangs (before its virtual node says so) holds the pass
        # for a request's timeout, not the others' answers after it
        entries = list(await asyncio.gather(*(ask(p) for p in providers)))
        for gone in [e for e in current if e.get("clusterID") not in providers]:
            await self._withdraw(gone["clusterID"], consumer_id, key.namespace)
        phase = overall_phase(entries)
        status: dict[str, Any] = {**(obj.get("status") or {}), "phase": phase, "remoteNamespaces": entries}
        status["allowedProviders"] = providers if selector else None
        failed = [f"{e['clusterID']}: {e.get('message')}" for e in entries if e.get("phase") == "Failed"]
        message = {
            "Ready": f"twin namespaces ready on {', '.join(providers)}",
            "NoClusterSelected": "no peered provider is selected",
            "Pending": pending_message(entries),
        }.get(phase, "; ".join(failed))
        reason = phase
        if phase == "Ready" and not _ready_at(obj):
            # Ready means the very next pod is offloaded: not before the API server applies the
            # rule (a policy written a moment ago is not: CI of stop 27)
            probe = await admission_in_effect(self.consumer, key.namespace, spec.get("podOffloadingStrategy"))
            if probe.live is False:  # deleted by hand, or not loaded yet: applied again next pass
                self._admission_at = None
            phase, reason, message = with_admission(phase, message, probe)
            status["phase"] = phase
        status["conditions"] = set_condition(
            status.get("conditions"),
            "Ready",
            phase == "Ready",
            reason,
            message,
            generation=meta(obj).get("generation"),
        )
        with contextlib.suppress(NotFound):
            await patch_changes(
                self.consumer, NAMESPACEOFFLOADINGS, obj, {**obj, "status": status}, subresource="status"
            )
        if phase != "Pending":
            self._pending.pop(key, None)
            return Requeue(self.resync_seconds)
        self._pending[key] = passes = self._pending.get(key, 0) + 1
        return Requeue(pending_retry(passes))

    def waiting(self) -> list[ObjectKey]:
        """The offloadings found Pending at their last pass: those a provider's answer, or its
        coming back, wakes."""
        return list(self._pending)

    def _namespace_going(self, namespace: str) -> bool:
        """Whether ``namespace`` is being deleted. Its NamespaceOffloading is released then, as
        for an unoffload: the namespace controller looks at a deleted namespace 5 s after, and
        again 5 s after each pass that found pods (which its first pass only deletes), then 5 to
        8 s after each that found the offloading still held by this controller's finalizer,
        which waited for the provider's namespace controller: 24 s for a namespace with one
        offloaded pod, where one not offloaded takes 10."""
        if self.namespaces is None:
            return False
        found = self.namespaces.get(ObjectKey(None, namespace))
        return found is not None and bool(meta(found).get("deletionTimestamp"))

    async def _refuse(self, obj: RawObject, consumer_id: str | None, message: str) -> None:
        """Failed at once, asking no provider (and withdrawing what an earlier version asked)."""
        for entry in (obj.get("status") or {}).get("remoteNamespaces") or []:
            await self._withdraw(entry["clusterID"], consumer_id, meta(obj)["namespace"])
        status: dict[str, Any] = {**(obj.get("status") or {}), "phase": "Failed", "remoteNamespaces": []}
        status["conditions"] = set_condition(
            status.get("conditions"), "Ready", False, "NamespaceReserved", message,
            generation=meta(obj).get("generation"),
        )  # fmt: skip
        with contextlib.suppress(NotFound):
            await patch_changes(
                self.consumer, NAMESPACEOFFLOADINGS, obj, {**obj, "status": status}, subresource="status"
            )

    async def _admission(self) -> None:
        """Apply the admission objects when due (:func:`admission_due`); passes at the same time
        share one application."""
        async with self._admission_lock:
            if not admission_due(self._admission_at, time.monotonic(), self.admission_resync):
                return
            for resource, body in admission_objects():
                await self.consumer.patch(
                    resource,
                    body["metadata"]["name"],
                    body,
                    patch_type="apply",
                    field_manager=FIELD_MANAGER,
                    force=True,
                )
            self._admission_at = time.monotonic()

    async def _twin(
        self, provider_id: str, consumer_id: str | None, origin: str, mapping: str
    ) -> dict[str, Any]:
        entry: dict[str, Any] = {"clusterID": provider_id, "phase": "Pending", "reason": REQUESTED}
        tenant = await self._tenant(provider_id)
        if tenant is None or consumer_id is None:
            entry["reason"], entry["message"] = NO_IDENTITY, "no identity on this provider yet"
            return entry
        ns = tenant_namespace(consumer_id)
        body = {
            "apiVersion": NAMESPACEOFFLOADINGS.api_version,
            "kind": NAMESPACEOFFLOADINGS.kind,
            "metadata": {"name": origin, "namespace": ns},
            "spec": {"originNamespace": origin, "namespaceMappingStrategy": mapping},
        }
        try:
            with contextlib.suppress(AlreadyExists):
                await tenant.create(NAMESPACEOFFLOADINGS, body)
            remote = await tenant.get(NAMESPACEOFFLOADINGS, origin, ns)
        except KubeError as e:
            object_logger(logger, "NamespaceOffloading", ObjectKey(origin, OFFLOADING_NAME)).warning(
                "cannot ask %s for the twin namespace: %s", provider_id, e
            )
            entry["reason"], entry["message"] = REQUEST_FAILED, str(e)
            return entry
        status = remote.get("status") or {}
        if status.get("remoteNamespace"):
            entry["remoteNamespace"] = status["remoteNamespace"]
        if status.get("phase") == "Ready" and status.get("remoteNamespace"):
            entry["phase"] = "Ready"
            del entry["reason"]
        elif status.get("phase") == "Failed":
            entry["phase"], entry["reason"] = "Failed", REFUSED
            cond = find_condition(status.get("conditions"), "Ready")
            entry["message"] = str((cond or {}).get("message") or "refused by the provider")
        return entry

    async def _withdraw(self, provider_id: str, consumer_id: str | None, origin: str) -> bool:
        """Withdraw the twin namespace request; True once it is gone on the provider."""
        tenant = await self._tenant(provider_id)
        if tenant is None or consumer_id is None:
            return True  # no identity left: the provider revokes the tenant's twins itself
        try:
            await tenant.delete(NAMESPACEOFFLOADINGS, origin, tenant_namespace(consumer_id))
        except NotFound:
            return True
        except KubeError as e:
            if is_temporary(e):  # the provider unreachable, or busy: the controller retries with
                raise  # backoff, and the finalizer holds, so its twin namespace is not left there
            logger.info("withdrawing the twin namespace of %s from %s: %s", origin, provider_id, e)
            return True  # e.g. the identity revoked: the provider revokes the tenant's twins itself
        return False

    async def _release(self, obj: RawObject, consumer_id: str | None) -> Requeue | None:
        ns = meta(obj)["namespace"]
        virtual = {n for n in (str(meta(v)["name"]) for v in self.virtual_nodes.values())}
        pods = [
            p for p in (await self.consumer.list(PODS, ns))["items"] if p["spec"].get("nodeName") in virtual
        ]
        for pod in pods:
            with contextlib.suppress(NotFound):
                await self.consumer.delete(PODS, pod["metadata"]["name"], ns)
        if pods:
            return Requeue(1.0)  # their twins go first; then the twin namespaces
        pending = False
        for entry in (obj.get("status") or {}).get("remoteNamespaces") or []:
            if not await self._withdraw(entry["clusterID"], consumer_id, ns):
                pending = True
        if pending:
            return Requeue(1.0)
        if FINALIZER not in (meta(obj).get("finalizers") or []):
            return None  # released before (its namespace going): it waits for the namespace controller
        finalizers = [f for f in meta(obj).get("finalizers") or [] if f != FINALIZER]
        with contextlib.suppress(NotFound):
            await self.consumer.patch(
                NAMESPACEOFFLOADINGS,
                OFFLOADING_NAME,
                {"metadata": {"finalizers": finalizers, "resourceVersion": meta(obj)["resourceVersion"]}},
                ns,
            )
        return None
