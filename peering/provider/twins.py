"""Twin namespaces of one tenant, and the partition of its grant into their ResourceQuotas.

The consumer asks for a twin namespace with a NamespaceOffloading in its tenant namespace on
the provider (``spec.originNamespace``, ``spec.namespaceMappingStrategy``); it cannot create
namespaces itself. For each tenant namespace, one pass:

1. creates the requested twin namespaces (``<origin>-<consumer-id>``, or ``<origin>`` with
   SameName when free and not reserved), labelled with the tenant and the Pod Security level of
   ``Tenant.spec.podSecurity``; deletes twin namespaces nobody asks for any more; refuses beyond
   ``Tenant.spec.maxTwinNamespaces``;
2. partitions the tenant's total grant (Σ ``status.granted`` of its GPUSlices) over the twin
   namespaces' ``gpuferry-grant`` ResourceQuotas (:mod:`.quotas`): lowers first, waits until the
   quota controller has synced every lowered ``status.hard``, and only then raises;
3. binds the consumer's Role in a twin namespace only once its quota exists, so the consumer
   never sees an unlimited namespace;
4. reports the twin namespace in the request's status and ``Tenant.status.twinNamespaces``.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from kube import api
from kube.accelerators import dra_resource
from kube.clients import KubeClient
from kube.declaration import DECLARATION_NAME, DECLARATION_NAMESPACE
from kube.errors import NotFound, TemporaryError
from kube.informers import Informer
from kube.logs import object_logger
from kube.objects import NAMESPACES, RESOURCEQUOTAS, ObjectKey, RawObject, meta
from kube.patching import patch_changes
from kube.quantities import ResourceList, add, format_resource_list, parse_resource_list, sub
from kube.reconciling import Requeue

from ..conditions import find_condition, set_condition
from ..resources import (
    GPUSLICES,
    LABEL_ORIGIN_NAMESPACE,
    LABEL_TENANT,
    LIMITRANGES,
    NAMESPACEOFFLOADINGS,
    ROLEBINDINGS,
    ROLES,
    TENANT_NAMESPACE_PREFIX,
    TENANTS,
    consumer_username,
    is_reserved_namespace,
    twin_namespace_name,
)
from .builders import (
    GRANT_QUOTA,
    consumer_rolebinding,
    grant_quota,
    limit_range,
    twin_namespace,
    twin_role,
)
from .events import record_event
from .quotas import (
    FIXED_LIMITS,
    lowering_step,
    needs_lowering,
    offered_accelerators,
    partition,
    quota_key,
    quota_totals,
)
from .settings import ProviderSettings
from .tenants import apply

__all__ = ["FINALIZER", "TwinReconciler", "tenant_grant"]

logger = logging.getLogger(__name__)

FINALIZER = "offloading.gpuferry.io/twin-namespace"
_GRANTED = frozenset({"Granted", "PartiallyGranted"})


DEMAND_ANNOTATION = api.DEMAND_ANNOTATION
"""On a twin-namespace request: what pods waiting for quota there need (JSON resource list),
written by the consumer's virtual kubelet; the partition serves it first."""


def demand_of(request: RawObject) -> ResourceList:
    """The quota keys and amounts a request's demand annotation asks for (bad input: nothing)."""
    raw = ((request.get("metadata") or {}).get("annotations") or {}).get(DEMAND_ANNOTATION)
    if not raw:
        return {}
    try:
        parsed = json.loads(raw)
        if not isinstance(parsed, dict):
            return {}
        return {quota_key(str(k)): v for k, v in parse_resource_list(parsed).items()}
    except ValueError:
        return {}


def pinned_selector(slices: list[RawObject]) -> dict[str, str]:
    """The node selector a tenant's pods must carry: what every grant in force was decided for
    (``status.nodeSelector``; the keys and values they share when there are several)."""
    selectors = [
        dict((s.get("status") or {}).get("nodeSelector") or {})
        for s in slices
        if (s.get("status") or {}).get("phase") in _GRANTED and not meta(s).get("deletionTimestamp")
    ]
    if not selectors:
        return {}
    first, *rest = selectors
    return {k: v for k, v in first.items() if all(other.get(k) == v for other in rest)}


def endpoint_cidrs(declaration: RawObject | None, peer_network: RawObject | None) -> tuple[str, ...]:
    """Where a tenant's EndpointSlices may point: this provider's pod CIDRs (twins) and its view of
    the consumer's pod CIDRs (consumer pods, through the fabric). Empty without a declaration:
    the provider then does not know its pod CIDRs, and nothing is checked. Pure."""
    pods = [c.strip() for c in str(((declaration or {}).get("data") or {}).get("podCIDRs", "")).split(",")]
    pods = [c for c in pods if c]
    if not pods:
        return ()
    remote = ((peer_network or {}).get("status") or {}).get("remappedPodCIDRs") or []
    return tuple(dict.fromkeys([*pods, *map(str, remote)]))


def tenant_grant(slices: list[RawObject]) -> ResourceList:
    """The tenant's total grant: Σ status.granted of its granted slices."""
    return add(
        *(
            parse_resource_list((s.get("status") or {}).get("granted"))
            for s in slices
            if (s.get("status") or {}).get("phase") in _GRANTED and not meta(s).get("deletionTimestamp")
        )
    )


class TwinReconciler:
    """Reconciles the twin namespaces of the tenant whose namespace is the key."""

    def __init__(
        self,
        client: KubeClient,
        *,
        settings: ProviderSettings,
        peer_networks: Informer | None = None,
        declaration: Informer | None = None,
        nodes: Informer | None = None,
        device_classes: Informer | None = None,
    ) -> None:
        self.client = client
        self.settings = settings
        self.peer_networks = peer_networks
        self.declaration = declaration
        self.nodes = nodes
        self.device_classes = device_classes

    def _offered(self) -> set[str]:
        """The accelerator resources the provider's nodes advertise and its DeviceClasses' devices
        (each limited by quota)."""
        classes = self.device_classes.values() if self.device_classes is not None else ()
        return offered_accelerators(self.nodes.values() if self.nodes is not None else ()) | {
            dra_resource(meta(c)["name"]) for c in classes
        }

    def _endpoint_cidrs(self, tenant_ns: str, consumer_id: str) -> tuple[str, ...]:
        declaration = (
            self.declaration.get(ObjectKey(DECLARATION_NAMESPACE, DECLARATION_NAME))
            if self.declaration
            else None
        )
        peer_network = (
            self.peer_networks.get(ObjectKey(tenant_ns, consumer_id)) if self.peer_networks else None
        )
        return endpoint_cidrs(declaration, peer_network)

    async def reconcile(self, tenant_ns: str) -> Requeue | None:
        if not tenant_ns.startswith(TENANT_NAMESPACE_PREFIX):
            return None
        consumer_id = tenant_ns.removeprefix(TENANT_NAMESPACE_PREFIX)
        log = object_logger(logger, "TenantNamespace", tenant_ns)
        try:
            tenant = await self.client.get(TENANTS, consumer_id, tenant_ns)
        except NotFound:
            return None  # no tenant: nothing is made; revocation is the Tenant finalizer's job
        if meta(tenant).get("deletionTimestamp"):
            return None
        spec = tenant["spec"]
        requests = sorted(
            (await self.client.list(NAMESPACEOFFLOADINGS, tenant_ns))["items"],
            key=lambda r: (meta(r).get("creationTimestamp", ""), meta(r)["name"]),
        )
        existing = {
            meta(ns)["name"]: ns
            for ns in (
                await self.client.list(
                    NAMESPACES, label_selector=f"{LABEL_TENANT}={consumer_id},{LABEL_ORIGIN_NAMESPACE}"
                )
            )["items"]
        }
        wanted: dict[str, RawObject] = {}  # twin namespace -> request
        ready: list[str] = []
        pending = False
        slices = (await self.client.list(GPUSLICES, tenant_ns))["items"]
        pinned = pinned_selector(slices)
        endpoints = self._endpoint_cidrs(tenant_ns, consumer_id)
        for req in requests:
            if meta(req).get("deletionTimestamp"):
                continue
            outcome = await self._ensure_namespace(
                req, consumer_id, spec, existing, len(wanted), log, pinned, endpoints
            )
            if outcome is None:
                continue
            name, is_ready = outcome
            wanted[name] = req
            if is_ready:
                ready.append(name)
            else:
                pending = True
        leaving: list[str] = []
        for name, ns in existing.items():
            if name in wanted:
                continue
            leaving.append(name)
            if not meta(ns).get("deletionTimestamp"):
                try:
                    await self.client.delete(NAMESPACES, name)
                except NotFound:
                    continue
                log.info("deleted twin namespace %s (no longer requested)", name)
        for req in requests:  # requests being deleted: their namespace is gone or going
            if meta(req).get("deletionTimestamp") and not await self._release(req, existing):
                pending = True
        # pods still terminating in leaving namespaces keep their share until they are gone
        grant = sub(tenant_grant(slices), await self._still_used(leaving))
        demand = {name: demand_of(req) for name, req in wanted.items()}
        synced, usable = await self._partition(consumer_id, ready, grant, log, demand)
        for name in ready:
            await apply(self.client, ROLES, twin_role(name, consumer_id), self.settings.field_manager)
            await apply(
                self.client,
                ROLEBINDINGS,
                consumer_rolebinding(name, consumer_id, consumer_username(consumer_id)),
                self.settings.field_manager,
            )
        for name in ready:
            if name in usable:
                await self._request_status(
                    wanted[name], name, "Ready", True, "TwinNamespaceReady", f"twin namespace {name} is ready"
                )
            elif (wanted[name].get("status") or {}).get("phase") != "Ready":
                await self._request_status(
                    wanted[name],
                    name,
                    "Pending",
                    False,
                    "WaitingForQuota",
                    f"twin namespace {name} waits for its share of the grant",
                )
        new_status = {**(tenant.get("status") or {}), "twinNamespaces": sorted(wanted)}
        await patch_changes(
            self.client, TENANTS, tenant, {**tenant, "status": new_status}, subresource="status"
        )
        if not synced:
            raise TemporaryError(
                "waiting for the quota controller to sync lowered quotas",
                delay=self.settings.quota_sync_retry,
            )
        if pending:
            return Requeue(1.0)
        return Requeue(self.settings.resync_seconds)

    async def _ensure_namespace(
        self,
        req: RawObject,
        consumer_id: str,
        spec: dict[str, Any],
        existing: dict[str, RawObject],
        count: int,
        log: logging.LoggerAdapter[logging.Logger],
        pinned: Mapping[str, str],
        endpoints: tuple[str, ...] = (),
    ) -> tuple[str, bool] | None:
        rspec = req.get("spec") or {}
        origin = rspec.get("originNamespace")
        if not origin:
            await self._request_status(
                req,
                None,
                "Failed",
                False,
                "NoOriginNamespace",
                "spec.originNamespace is required on a provider",
            )
            return None
        strategy = rspec.get("namespaceMappingStrategy") or "DefaultName"
        try:
            name = twin_namespace_name(origin, consumer_id, strategy)
        except ValueError as exc:
            await self._request_status(req, None, "Failed", False, "InvalidName", str(exc))
            return None
        if is_reserved_namespace(name):
            await self._request_status(
                req, None, "Failed", False, "NamespaceReserved", f"{name} is a reserved namespace"
            )
            return None
        limit = int(spec.get("maxTwinNamespaces", 64))
        if name not in existing and count >= limit:
            await self._request_status(
                req,
                None,
                "Failed",
                False,
                "TooManyTwinNamespaces",
                f"this tenant may have at most {limit} twin namespaces",
            )
            return None
        ns = existing.get(name)
        if ns is None:
            try:
                found = await self.client.get(NAMESPACES, name)
            except NotFound:
                found = None
            if found is not None:
                await self._request_status(
                    req,
                    None,
                    "Failed",
                    False,
                    "NamespaceTaken",
                    f"namespace {name} exists on the provider and is not this tenant's",
                )
                return None
        elif meta(ns).get("labels", {}).get(LABEL_ORIGIN_NAMESPACE) != origin:
            await self._request_status(
                req,
                None,
                "Failed",
                False,
                "NamespaceTaken",
                f"namespace {name} is another origin namespace's twin",
            )
            return None
        if ns is not None and meta(ns).get("deletionTimestamp"):
            await self._request_status(
                req,
                name,
                "Pending",
                False,
                "NamespaceTerminating",
                f"twin namespace {name} is still being deleted",
            )
            return name, False
        finalizers = meta(req).get("finalizers") or []
        if FINALIZER not in finalizers:
            await self.client.patch(
                NAMESPACEOFFLOADINGS,
                meta(req)["name"],
                {
                    "metadata": {
                        "finalizers": [*finalizers, FINALIZER],
                        "resourceVersion": meta(req)["resourceVersion"],
                    }
                },
                meta(req)["namespace"],
            )
        pod_security = str(spec.get("podSecurity") or "baseline")
        body = twin_namespace(name, consumer_id, origin, pod_security, pinned, endpoints)
        created = await apply(self.client, NAMESPACES, body, self.settings.field_manager)
        if ns is None:
            log.info("created twin namespace %s for %s (pod security %s)", name, origin, pod_security)
        existing[name] = created
        return name, True

    async def _still_used(self, namespaces: list[str]) -> ResourceList:
        used: list[ResourceList] = []
        for ns in namespaces:
            try:
                quota = await self.client.get(RESOURCEQUOTAS, GRANT_QUOTA, ns)
            except NotFound:
                continue
            used.append(
                {
                    k.removeprefix("requests."): v
                    for k, v in parse_resource_list((quota.get("status") or {}).get("used")).items()
                }
            )
        return add(*used)

    async def _release(self, req: RawObject, existing: dict[str, RawObject]) -> bool:
        """Drop the request's finalizer once its twin namespace is gone; False while it is not."""
        md = meta(req)
        remaining = [
            n
            for n, ns in existing.items()
            if meta(ns).get("labels", {}).get(LABEL_ORIGIN_NAMESPACE)
            == (req.get("spec") or {}).get("originNamespace")
        ]
        for name in remaining:
            try:
                await self.client.get(NAMESPACES, name)
            except NotFound:
                continue
            return False
        finalizers = [f for f in md.get("finalizers") or [] if f != FINALIZER]
        with contextlib.suppress(NotFound):
            await self.client.patch(
                NAMESPACEOFFLOADINGS,
                md["name"],
                {"metadata": {"finalizers": finalizers, "resourceVersion": md["resourceVersion"]}},
                md["namespace"],
            )
        return True

    async def _partition(
        self,
        consumer_id: str,
        namespaces: list[str],
        grant: ResourceList,
        log: logging.LoggerAdapter[logging.Logger],
        demand: dict[str, ResourceList] | None = None,
    ) -> tuple[bool, set[str]]:
        """Bring the quotas towards the partition. Returns (False while a lowered quota is not
        synced yet, the namespaces whose quota is at its planned share and enforced)."""
        quotas: dict[str, RawObject | None] = {}
        for ns in namespaces:
            try:
                quotas[ns] = await self.client.get(RESOURCEQUOTAS, GRANT_QUOTA, ns)
            except NotFound:
                quotas[ns] = None
        current = {
            ns: _partitioned(parse_resource_list((q.get("spec") or {}).get("hard"))) if q else None
            for ns, q in quotas.items()
        }
        used = {
            ns: parse_resource_list((q.get("status") or {}).get("used")) if q else {}
            for ns, q in quotas.items()
        }
        plan = partition(quota_totals(grant, self._offered()), namespaces, used, demand)
        lowering = {
            ns: lowering_step(current[ns], plan[ns])
            for ns in namespaces
            if needs_lowering(current[ns], plan[ns])
        }
        for ns, hard in lowering.items():
            await apply(
                self.client, RESOURCEQUOTAS, grant_quota(ns, consumer_id, hard), self.settings.field_manager
            )
            lr = limit_range(ns, consumer_id, plan[ns])
            if lr is not None:
                await apply(self.client, LIMITRANGES, lr, self.settings.field_manager)
            log.info("quota of %s lowered to %s", ns, _fmt(hard))
        usable = {ns for ns in namespaces if plan[ns] == current[ns] and _synced(quotas[ns])}
        if lowering:
            return False, usable
        if not all(_synced(q) for q in quotas.values()):
            return False, usable
        for ns in namespaces:
            if plan[ns] != current[ns]:
                await apply(
                    self.client,
                    RESOURCEQUOTAS,
                    grant_quota(ns, consumer_id, plan[ns]),
                    self.settings.field_manager,
                )
                log.info("quota of %s raised to %s", ns, _fmt(plan[ns]))
        return True, usable

    async def _request_status(
        self, req: RawObject, remote: str | None, phase: str, ok: bool, reason: str, message: str
    ) -> None:
        old = req.get("status") or {}
        status: dict[str, Any] = {**old, "phase": phase, "observedGeneration": meta(req).get("generation", 0)}
        if remote is not None:
            status["remoteNamespace"] = remote
        else:
            status.pop("remoteNamespace", None)
        cond = find_condition(old.get("conditions"), "Ready")
        if (
            cond
            and cond.get("status") == ("True" if ok else "False")
            and cond.get("reason") == reason
            and old.get("phase") == phase
            and old.get("remoteNamespace") == remote
        ):
            return
        status["conditions"] = set_condition(
            old.get("conditions"), "Ready", ok, reason, message, generation=meta(req).get("generation")
        )
        try:
            await patch_changes(
                self.client, NAMESPACEOFFLOADINGS, req, {**req, "status": status}, subresource="status"
            )
        except NotFound:
            return
        if not ok and phase == "Failed":
            object_logger(logger, "NamespaceOffloading", ObjectKey.of(req)).warning("%s: %s", reason, message)
            await record_event(self.client, req, reason, message, "Warning")
        elif ok:
            await record_event(self.client, req, reason, message)


def _partitioned(hard: ResourceList) -> ResourceList:
    return {k: v for k, v in hard.items() if k not in FIXED_LIMITS}


def _synced(quota: RawObject | None) -> bool:
    if quota is None:
        return False
    spec_hard = parse_resource_list((quota.get("spec") or {}).get("hard"))
    status_hard = parse_resource_list((quota.get("status") or {}).get("hard"))
    return spec_hard == status_hard and "used" in (quota.get("status") or {})


def _fmt(hard: dict[str, Decimal]) -> str:
    return ", ".join(f"{k}={v}" for k, v in format_resource_list(hard).items())
