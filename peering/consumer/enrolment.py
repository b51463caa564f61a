"""Enrolment of this cluster with a provider: the first step of the ForeignCluster controller.

A key and CSR are made here (the private key never leaves this cluster); the CSR goes to the
provider in the consumer's Tenant, proven with the peering token of ``spec.peeringTokenSecretRef``;
once the provider issued the certificate, the identity (certificate, and a kubeconfig for
``spec.apiServerURL`` and ``spec.caBundle``) is kept in ``gpuferry-identity-<provider>``. A
certificate that expires within a week is renewed with a new key.
"""

from __future__ import annotations

import base64
import hashlib
from datetime import UTC, datetime, timedelta

from kube.api import SYSTEM_NAMESPACE
from kube.clients import KubeClient
from kube.errors import KubeError, NetworkError, NotFound
from kube.objects import SECRETS, RawObject, meta
from kube.times import rfc3339

from .. import flow
from ..identity.keys import certificate_validity
from ..resources import identity_secret_name
from .passes import Pass, Waiting
from .providers import ProviderClients

__all__ = ["Enrolment", "request_failed"]


def _b64(text: str) -> bytes:
    return base64.b64decode(text)


def fingerprint(*parts: str | bytes | None) -> str:
    """What a cached client depends on: a new token, server or CA makes a new client."""
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part if isinstance(part, bytes) else str(part).encode())
        digest.update(b"\0")
    return digest.hexdigest()


def request_failed(error: KubeError, server: str) -> Waiting:
    """How a failed enrolment request reads in the Authenticated condition: the provider out of
    reach, or an API that answered no (on either side: a consumer whose account may not write
    its identity Secret must not read as an unreachable provider). Pure."""
    if isinstance(error, NetworkError):
        return Waiting("Authenticated", "ProviderUnreachable", f"{server}: {error}", retry=5)
    return Waiting("Authenticated", "RequestFailed", str(error), retry=10)


class Enrolment:
    """The Authenticated step, and the identity it keeps, for every provider of this cluster."""

    def __init__(self, consumer: KubeClient, clients: ProviderClients) -> None:
        self.consumer = consumer
        self.clients = clients

    async def authenticate(self, fc: RawObject, consumer_id: str, result: Pass) -> KubeClient:
        provider_id, spec = meta(fc)["name"], fc["spec"]
        identity = await self.identity_secret(provider_id)
        data = (identity or {}).get("data") or {}
        if data.get("kubeconfig") and data.get("tls.crt") and not _expiring(data["tls.crt"]):
            tenant = await self.tenant_client(provider_id, data)
            _, not_after = certificate_validity(_b64(data["tls.crt"]))
            result.status["identity"] = {
                "username": f"gpuferry:consumer:{consumer_id}",
                "notAfter": rfc3339(not_after),
            }
            result.set(
                "Authenticated",
                True,
                "CertificateIssued",
                f"authenticated as {result.status['identity']['username']} until "
                f"{result.status['identity']['notAfter']}",
            )
            return tenant
        ref = spec["peeringTokenSecretRef"]
        try:
            secret = await self.consumer.get(SECRETS, ref["name"], SYSTEM_NAMESPACE)
        except NotFound:
            raise Waiting(
                "Authenticated",
                "PeeringTokenMissing",
                f"the Secret {SYSTEM_NAMESPACE}/{ref['name']} with the peering token does not exist",
                retry=10,
            ) from None
        token_b64 = (secret.get("data") or {}).get(ref.get("key") or "token")
        if not token_b64:
            raise Waiting(
                "Authenticated",
                "PeeringTokenMissing",
                f"the Secret {SYSTEM_NAMESPACE}/{ref['name']} has no key {ref.get('key') or 'token'!r}",
                retry=10,
            )
        token = _b64(token_b64).decode()
        ca = _b64(spec["caBundle"]) if spec.get("caBundle") else None
        server = str(spec["apiServerURL"])
        bootstrap = await self.clients.get(
            provider_id,
            "bootstrap",
            fingerprint(server, ca, token),
            lambda: flow.bootstrap_client(server, ca, token),
        )
        try:
            issued = await flow.authenticate(
                self.consumer,
                bootstrap,
                token=token,
                consumer_id=consumer_id,
                provider_id=provider_id,
                server=server,
                ca_pem=ca,
                wait=False,
            )
        except flow.PeeringError as e:
            raise Waiting("Authenticated", "Refused", str(e), retry=30) from None
        except KubeError as e:
            raise request_failed(e, server) from None
        if issued is None:
            raise Waiting(
                "Authenticated", "Issuing", "the provider has not issued the certificate yet", retry=1
            )
        identity = await self.identity_secret(provider_id)
        return await self.tenant_client(provider_id, (identity or {}).get("data") or {})

    async def identity_secret(self, provider_id: str) -> RawObject | None:
        try:
            secret: RawObject = await self.consumer.get(
                SECRETS, identity_secret_name(provider_id), SYSTEM_NAMESPACE
            )
        except NotFound:
            return None
        return secret

    async def tenant_client(self, provider_id: str, data: dict[str, str]) -> KubeClient:
        return await self.clients.tenant(provider_id, data)


def _expiring(cert_b64: str, within: timedelta = timedelta(days=7)) -> bool:
    _, not_after = certificate_validity(_b64(cert_b64))
    return not_after - datetime.now(UTC) < within
