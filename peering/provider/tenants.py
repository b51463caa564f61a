"""Tenant reconciler: verify the peering proof, issue the client certificate, bind its RBAC.

For a Tenant ``<id>`` in ``gpuferry-tenant-<id>``:

1. a finalizer is added, so that deleting the Tenant first revokes everything (twin
   namespaces, RBAC, CSRs) — a certificate cannot be revoked, its permissions can;
2. ``spec.csr`` must be a CSR for exactly ``CN=gpuferry:consumer:<id>, O=gpuferry:consumers``
   and ``spec.csrProof`` the HMAC of that CSR keyed with the peering token from the Secret named
   by ``spec.peeringTokenSecretRef`` (see :mod:`peering.identity.keys`); otherwise the
   Tenant is marked ``Authenticated=False`` with the reason, and no CSR is created;
3. a ``certificates.k8s.io`` CSR (signer ``kubernetes.io/kube-apiserver-client``, usage client
   auth only) is created, approved by this controller (it only ever approves CSRs it created
   itself, after step 2) and signed by kube-controller-manager; the certificate goes to
   ``status.identity``;
4. the Role/RoleBinding of the tenant namespace are applied (twin namespaces: :mod:`.twins`).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
from typing import Any

from kube.clients import KubeClient
from kube.errors import NotFound, TemporaryError
from kube.logs import object_logger
from kube.metrics import counter
from kube.objects import CSRS, NAMESPACES, SECRETS, ObjectKey, RawObject, Resource, meta
from kube.patching import patch_changes
from kube.reconciling import Requeue
from kube.times import rfc3339

from ..conditions import find_condition, set_condition
from ..identity.keys import CsrError, certificate_validity, inspect_csr, unb64, verify_csr_proof
from ..resources import (
    CONSUMERS_GROUP,
    LABEL_TENANT,
    NAMESPACEOFFLOADINGS,
    ROLEBINDINGS,
    ROLES,
    TENANTS,
    consumer_username,
    tenant_namespace,
)
from .builders import consumer_rolebinding, owned_labels, tenant_role
from .events import record_event
from .settings import ProviderSettings

__all__ = ["FINALIZER", "TenantReconciler", "apply", "csr_name", "revoke"]

logger = logging.getLogger(__name__)

_DECISIONS = counter("peering_requests", "Peering requests (Tenant CSRs) decided, by outcome.", ["outcome"])

FINALIZER = "core.gpuferry.io/revoke"
SIGNER = "kubernetes.io/kube-apiserver-client"
ANNOTATION_TENANT = "gpuferry.io/tenant"


def csr_name(consumer_id: str, csr_pem: bytes) -> str:
    """One Kubernetes CSR per (consumer, request): a new key gets a new CSR."""
    return f"gpuferry-{consumer_id}-{hashlib.sha256(csr_pem).hexdigest()[:12]}"


async def apply(client: KubeClient, resource: Resource, body: RawObject, manager: str) -> RawObject:
    """Server-side apply of ``body`` (idempotent)."""
    md = body["metadata"]
    return await client.patch(
        resource, md["name"], body, md.get("namespace"), patch_type="apply", field_manager=manager, force=True
    )


async def _delete(client: KubeClient, resource: Resource, name: str, namespace: str | None = None) -> bool:
    try:
        await client.delete(resource, name, namespace, propagation_policy="Background")
    except NotFound:
        return False
    return True


async def revoke(client: KubeClient, consumer_id: str) -> list[str]:
    """Remove everything issued to ``consumer_id`` except its Tenant and tenant namespace:
    twin namespaces (with their RBAC and quotas), the tenant namespace's RBAC and twin
    requests' finalizers, and its CSRs. Returns what was deleted. Idempotent."""
    removed: list[str] = []
    selector = f"{LABEL_TENANT}={consumer_id}"
    labelled = (await client.list(NAMESPACES, label_selector=selector))["items"]
    namespaces = sorted({meta(ns)["name"] for ns in labelled} | {tenant_namespace(consumer_id)})
    # bindings first, everywhere: access ends at once, not when namespace finalization gets to them
    for ns in sorted(namespaces, key=lambda n: n != tenant_namespace(consumer_id)):
        for resource in (ROLEBINDINGS, ROLES):
            for obj in (await client.list(resource, ns, label_selector=selector))["items"]:
                if await _delete(client, resource, meta(obj)["name"], ns):
                    removed.append(f"{resource.plural}/{ns}/{meta(obj)['name']}")
    for name in namespaces:
        if name != tenant_namespace(consumer_id) and await _delete(client, NAMESPACES, name):
            removed.append(f"namespace/{name}")
    for obj in (await client.list(CSRS, label_selector=selector))["items"]:
        if await _delete(client, CSRS, meta(obj)["name"]):
            removed.append(f"csr/{meta(obj)['name']}")
    return removed


class TenantReconciler:
    """Reconciles one Tenant, keyed by ``ObjectKey(namespace, name)``."""

    def __init__(self, client: KubeClient, *, settings: ProviderSettings) -> None:
        self.client = client
        self.settings = settings

    async def reconcile(self, key: ObjectKey) -> Requeue | None:
        log = object_logger(logger, "Tenant", key)
        try:
            tenant = await self.client.get(TENANTS, key.name, key.namespace)
        except NotFound:
            return None
        consumer_id = str(tenant["spec"]["consumerClusterID"])
        md = meta(tenant)
        if md.get("deletionTimestamp"):
            removed = await revoke(self.client, consumer_id)
            await self._release_requests(key.namespace or "")
            log.info("revoked: %s", ", ".join(removed) or "nothing left")
            await self._remove_finalizer(tenant)
            return None
        if FINALIZER not in (md.get("finalizers") or []):
            finalizers = [*(md.get("finalizers") or []), FINALIZER]
            tenant = await self.client.patch(
                TENANTS,
                key.name,
                {"metadata": {"finalizers": finalizers, "resourceVersion": md["resourceVersion"]}},
                key.namespace,
            )
        if key.namespace != tenant_namespace(consumer_id) or key.name != consumer_id:
            await self._status(
                tenant,
                False,
                "WrongNamespace",
                f"the Tenant for {consumer_id!r} must be named {consumer_id!r} "
                f"in namespace {tenant_namespace(consumer_id)}",
            )
            _DECISIONS.labels("WrongNamespace").inc()
            return None
        csr_b64 = (tenant.get("spec") or {}).get("csr")
        if not csr_b64:
            await self._status(tenant, False, "WaitingForCSR", "the consumer has not sent its CSR yet")
            return None
        csr_pem = unb64(csr_b64)
        error = await self._verify(tenant, consumer_id, csr_pem)
        if error is not None:
            reason, message = error
            log.warning("peering request refused (%s): %s", reason, message)
            _DECISIONS.labels(reason).inc()
            if _condition_changed(tenant, False, reason):
                await record_event(self.client, tenant, reason, message, "Warning")
            await self._status(tenant, False, reason, message)
            return None
        name = csr_name(consumer_id, csr_pem)
        identity = (tenant.get("status") or {}).get("identity") or {}
        if identity.get("csrName") != name or not identity.get("certificate"):
            cert_b64 = await self._issue(key, consumer_id, name, csr_b64, log)
            if cert_b64 is None:
                await self._status(tenant, False, "Issuing", f"waiting for CSR {name} to be signed")
                return Requeue(2.0)
            not_before, not_after = certificate_validity(unb64(cert_b64))
            identity = {
                "certificate": cert_b64,
                "username": consumer_username(consumer_id),
                "csrName": name,
                "notBefore": rfc3339(not_before),
                "notAfter": rfc3339(not_after),
            }
            log.info("issued client certificate for %s (CSR %s)", identity["username"], name)
            _DECISIONS.labels("Issued").inc()
            await record_event(
                self.client,
                tenant,
                "CertificateIssued",
                f"issued a client certificate for {identity['username']} until "
                f"{identity['notAfter']} (CSR {name})",
            )
        await self._bind(tenant, consumer_id)
        await self._status(
            tenant,
            True,
            "CertificateIssued",
            f"authenticated as {consumer_username(consumer_id)}",
            identity=identity,
        )
        await self._drop_old_csrs(consumer_id, keep=name)
        return Requeue(self.settings.resync_seconds)

    async def _verify(self, tenant: RawObject, consumer_id: str, csr_pem: bytes) -> tuple[str, str] | None:
        spec = tenant["spec"]
        try:
            info = inspect_csr(csr_pem)
        except CsrError as exc:
            return "InvalidCSR", str(exc)
        want = consumer_username(consumer_id)
        if info.username != want or info.groups != (CONSUMERS_GROUP,):
            return "InvalidCSR", (
                f"the CSR asks for user {info.username!r} in groups {list(info.groups)}; "
                f"only {want!r} in [{CONSUMERS_GROUP!r}] can be issued"
            )
        ref = spec["peeringTokenSecretRef"]
        try:
            secret = await self.client.get(SECRETS, ref["name"], meta(tenant)["namespace"])
        except NotFound:
            return "PeeringTokenMissing", f"Secret {ref['name']} with the peering token does not exist"
        raw = (secret.get("data") or {}).get(ref.get("key") or "token")
        token = unb64(raw).decode() if raw else ""
        if not token:
            return "PeeringTokenMissing", f"Secret {ref['name']} has no key {ref.get('key') or 'token'!r}"
        if not verify_csr_proof(token, consumer_id, csr_pem, str(spec.get("csrProof") or "")):
            return "InvalidProof", "spec.csrProof is not the peering token's HMAC of this CSR"
        return None

    async def _issue(
        self,
        key: ObjectKey,
        consumer_id: str,
        name: str,
        csr_b64: str,
        log: logging.LoggerAdapter[logging.Logger],
    ) -> str | None:
        """Create and approve the CSR; its certificate (base64 PEM) once signed, else None."""
        try:
            csr = await self.client.get(CSRS, name)
        except NotFound:
            body: RawObject = {
                "apiVersion": "certificates.k8s.io/v1",
                "kind": "CertificateSigningRequest",
                "metadata": {
                    "name": name,
                    "labels": owned_labels(consumer_id),
                    "annotations": {ANNOTATION_TENANT: str(key)},
                },
                "spec": {
                    "request": csr_b64,
                    "signerName": SIGNER,
                    "usages": ["client auth"],
                    "expirationSeconds": self.settings.certificate_seconds,
                },
            }
            csr = await self.client.create(CSRS, body)
            log.info("created CSR %s", name)
        conditions = (csr.get("status") or {}).get("conditions") or []
        if find_condition(conditions, "Denied") or find_condition(conditions, "Failed"):
            await self.client.delete(CSRS, name)
            raise TemporaryError(f"CSR {name} was denied or failed; making a new one", delay=1.0)
        if not find_condition(conditions, "Approved"):
            approved = dict(csr)
            approved["status"] = {
                **(csr.get("status") or {}),
                "conditions": [
                    *conditions,
                    {
                        "type": "Approved",
                        "status": "True",
                        "reason": "PeeringTokenVerified",
                        "message": "approved by gpuferry: the request carries a valid peering-token proof",
                    },
                ],
            }
            csr = await self.client.replace(CSRS, name, approved, subresource="approval")
            log.info("approved CSR %s", name)
        cert = (csr.get("status") or {}).get("certificate")
        return str(cert) if cert else None

    async def _bind(self, tenant: RawObject, consumer_id: str) -> None:
        ns = meta(tenant)["namespace"]
        manager = self.settings.field_manager
        await apply(self.client, ROLES, tenant_role(ns, consumer_id), manager)
        await apply(
            self.client,
            ROLEBINDINGS,
            consumer_rolebinding(ns, consumer_id, consumer_username(consumer_id)),
            manager,
        )

    async def _drop_old_csrs(self, consumer_id: str, keep: str) -> None:
        found = await self.client.list(CSRS, label_selector=f"{LABEL_TENANT}={consumer_id}")
        for csr in found["items"]:
            if meta(csr)["name"] != keep:
                await _delete(self.client, CSRS, meta(csr)["name"])

    async def _release_requests(self, namespace: str) -> None:
        from .twins import FINALIZER as TWIN_FINALIZER

        for req in (await self.client.list(NAMESPACEOFFLOADINGS, namespace))["items"]:
            finalizers = meta(req).get("finalizers") or []
            if TWIN_FINALIZER in finalizers:
                with contextlib.suppress(NotFound):
                    await self.client.patch(
                        NAMESPACEOFFLOADINGS,
                        meta(req)["name"],
                        {
                            "metadata": {
                                "finalizers": [f for f in finalizers if f != TWIN_FINALIZER],
                                "resourceVersion": meta(req)["resourceVersion"],
                            }
                        },
                        namespace,
                    )

    async def _remove_finalizer(self, tenant: RawObject) -> None:
        md = meta(tenant)
        finalizers = [f for f in md.get("finalizers") or [] if f != FINALIZER]
        with contextlib.suppress(NotFound):
            await self.client.patch(
                TENANTS,
                md["name"],
                {"metadata": {"finalizers": finalizers, "resourceVersion": md["resourceVersion"]}},
                md["namespace"],
            )

    async def _status(
        self,
        tenant: RawObject,
        ok: bool,
        reason: str,
        message: str,
        *,
        identity: dict[str, Any] | None = None,
    ) -> None:
        status = dict(tenant.get("status") or {})
        status["observedGeneration"] = meta(tenant).get("generation", 0)
        status["conditions"] = set_condition(
            status.get("conditions"),
            "Authenticated",
            ok,
            reason,
            message,
            generation=meta(tenant).get("generation"),
        )
        if identity is not None:
            status["identity"] = identity
        elif not ok:
            status.pop("identity", None)
        new = {**tenant, "status": status}
        await patch_changes(self.client, TENANTS, tenant, new, subresource="status")


def _condition_changed(obj: RawObject, ok: bool, reason: str) -> bool:
    cond = find_condition((obj.get("status") or {}).get("conditions"), "Authenticated")
    return cond is None or cond.get("status") != ("True" if ok else "False") or cond.get("reason") != reason
