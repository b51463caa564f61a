"""Peering steps for the CLI: establish a tenant, request a slice and twin namespaces, tear down.

The CLI runs these holding both admin kubeconfigs (the platform engineer's), but what the
consumer *runs with* on the provider is only the identity issued here: :func:`establish_tenant`
stores it as a kubeconfig in a consumer Secret, and :func:`request_slice` and
:func:`request_twin_namespace` take a client made from it (:func:`issued_client`).

Every step is idempotent: running it again finds what is done and goes on from there.

Objects made:

* provider: namespace ``gpuferry-tenant-<consumer>`` with the peering-token Secret and the
  Tenant (the provider controller adds a Role/RoleBinding, the CSR, twin namespaces);
* consumer: Secret ``gpuferry-identity-<provider>`` in ``gpuferry-system`` (private key,
  CSR, certificate, kubeconfig) — the private key never leaves the consumer cluster.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import yaml

from kube.clients import KubeClient
from kube.errors import AlreadyExists, NotFound
from kube.kubeconfigs import Connection
from kube.objects import NAMESPACES, ROLEBINDINGS, ROLES, SECRETS, SERVICEACCOUNTS, RawObject, meta

from .conditions import find_condition
from .identity.keys import b64, certificate_validity, csr_proof, make_csr, make_private_key, unb64
from .identity.kubeconfigs import build_kubeconfig
from .provider.builders import TOKEN_SECRET, peering_token_manifests
from .provider.tenants import csr_name
from .resources import (
    CONSUMER_NAMESPACE,
    CONSUMERS_GROUP,
    GPUSLICES,
    LABEL_CONSUMER_PROVIDER,
    LABEL_MANAGED_BY,
    LABEL_TENANT,
    MANAGED_BY,
    NAMESPACEOFFLOADINGS,
    TENANTS,
    consumer_username,
    identity_secret_name,
    tenant_namespace,
)
from .teardown import finish_teardown, start_teardown, teardown
from .waits import PeeringError, Progress, quiet, wait_all_gone, wait_gone, wait_until

__all__ = [
    "CONSUMER_NAMESPACE",
    "TOKEN_SECRET",
    "IssuedIdentity",
    "PeeringError",
    "authenticate",
    "bootstrap_client",
    "establish_tenant",
    "finish_teardown",
    "identity_secret_name",
    "issue_peering_token",
    "issued_client",
    "release_twin_namespace",
    "request_slice",
    "request_twin_namespace",
    "start_teardown",
    "teardown",
    "wait_all_gone",
]


@dataclass(frozen=True)
class IssuedIdentity:
    """The consumer's identity on a provider, as stored on the consumer."""

    username: str
    secret_namespace: str
    secret_name: str
    kubeconfig: str
    not_after: str
    already: bool
    """True when a valid identity was already there (nothing was issued this time)."""


async def _ensure_namespace(client: KubeClient, name: str, labels: Mapping[str, str]) -> None:
    """Made when missing; an existing one is only read (an installed controller's account may
    read namespaces, not create them)."""
    with contextlib.suppress(NotFound):
        await client.get(NAMESPACES, name)
        return
    with contextlib.suppress(AlreadyExists):
        await client.create(
            NAMESPACES,
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": dict(labels)}},
        )


# -- authentication -------------------------------------------------------------------------------


async def issue_peering_token(provider: KubeClient, consumer_id: str, *, timeout: float = 30.0) -> str:
    """Provider side (an admin): the tenant namespace and the peering token for ``consumer_id``; returns
    the token (the existing one on a second run).

    The token belongs to the ServiceAccount ``gpuferry-peering`` of the tenant namespace, whose Role
    lets it create the consumer's Tenant and read and update that one Tenant: handed to the consumer
    (with the API server's address and CA), it is all the consumer needs to ask for an identity,
    which the provider controller issues only for a CSR proven with the same token.
    """
    ns = tenant_namespace(consumer_id)
    namespace, *objects, token = peering_token_manifests(consumer_id)
    with contextlib.suppress(AlreadyExists):
        await provider.create(NAMESPACES, namespace)
    for body in objects:
        kinds = {"ServiceAccount": SERVICEACCOUNTS, "Role": ROLES, "RoleBinding": ROLEBINDINGS}
        resource = kinds[body["kind"]]
        await provider.patch(resource, body["metadata"]["name"], body, ns, patch_type="apply",
                             field_manager="gpuferry-peering", force=True)  # fmt: skip
    with contextlib.suppress(AlreadyExists):
        await provider.create(SECRETS, token)

    def filled(secret: RawObject) -> str | None:  # the token controller fills it in
        return "" if (secret.get("data") or {}).get("token") else None

    secret = await wait_until(provider, SECRETS, TOKEN_SECRET, ns, filled, timeout,
                              f"the peering token (Secret {ns}/{TOKEN_SECRET})")  # fmt: skip
    return unb64(secret["data"]["token"]).decode()


def bootstrap_client(server: str, ca_pem: bytes | None, token: str) -> KubeClient:
    """A (not yet opened) client of the provider authenticated with the peering token alone."""
    return KubeClient(Connection(server=server, ca_pem=ca_pem, token=token))


async def _consumer_key_and_csr(
    consumer: KubeClient, consumer_id: str, provider_id: str, namespace: str
) -> tuple[RawObject, bytes, bytes]:
    """The identity Secret on the consumer with a private key and CSR (made once)."""
    await _ensure_namespace(consumer, namespace, {LABEL_MANAGED_BY: MANAGED_BY})
    name = identity_secret_name(provider_id)
    try:
        secret = await consumer.get(SECRETS, name, namespace)
    except NotFound:
        key = make_private_key()
        csr = make_csr(key, consumer_username(consumer_id), (CONSUMERS_GROUP,))
        body: RawObject = {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "Opaque",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "labels": {LABEL_MANAGED_BY: MANAGED_BY, LABEL_CONSUMER_PROVIDER: provider_id},
            },
            "data": {"tls.key": b64(key), "csr.pem": b64(csr)},
        }
        try:
            secret = await consumer.create(SECRETS, body)
        except AlreadyExists:
            secret = await consumer.get(SECRETS, name, namespace)
    data = secret.get("data") or {}
    return secret, unb64(data["tls.key"]), unb64(data["csr.pem"])


async def establish_tenant(
    consumer: KubeClient,
    provider: KubeClient,
    *,
    consumer_id: str,
    provider_id: str,
    provider_server: str | None = None,
    provider_ca: bytes | None = None,
    pod_security: str = "baseline",
    max_twin_namespaces: int | None = None,
    namespace: str = CONSUMER_NAMESPACE,
    renew_within: timedelta = timedelta(days=7),
    timeout: float = 60.0,
    progress: Progress = quiet,
) -> IssuedIdentity:
    """Peer the consumer's identity with the provider; store it as a kubeconfig on the consumer.

    1. provider: tenant namespace + peering token (:func:`issue_peering_token`);
    2. consumer: private key + CSR in the identity Secret;
    3. the proof (HMAC of the CSR with the token) and the CSR go into the Tenant;
    4. the provider controller verifies, issues, binds; we wait for ``Authenticated=True``;
    5. consumer: certificate and kubeconfig (server ``provider_server`` or the provider
       client's, CA ``provider_ca`` or the provider client's) into the identity Secret.

    A second run with a valid identity changes nothing (``already=True``); one whose
    certificate expires within ``renew_within`` renews it with a new key.

    Needs the provider controller running. Raises :class:`PeeringError` (refused, timeout).
    """
    server = provider_server or provider.base_url
    ca = provider_ca if provider_ca is not None else provider.connection.ca_pem
    token = await issue_peering_token(provider, consumer_id)
    progress(f"peering token ready in {tenant_namespace(consumer_id)}")
    issued = await authenticate(
        consumer, provider, token=token, consumer_id=consumer_id, provider_id=provider_id, server=server,
        ca_pem=ca, tls_server_name=provider.connection.tls_server_name, pod_security=pod_security,
        max_twin_namespaces=max_twin_namespaces, namespace=namespace, renew_within=renew_within,
        timeout=timeout, progress=progress,
    )  # fmt: skip
    assert issued is not None  # it waited
    return issued


async def authenticate(
    consumer: KubeClient,
    provider: KubeClient,
    *,
    token: str,
    consumer_id: str,
    provider_id: str,
    server: str,
    ca_pem: bytes | None,
    tls_server_name: str | None = None,
    pod_security: str = "baseline",
    max_twin_namespaces: int | None = None,
    namespace: str = CONSUMER_NAMESPACE,
    renew_within: timedelta = timedelta(days=7),
    timeout: float = 60.0,
    progress: Progress = quiet,
    wait: bool = True,
) -> IssuedIdentity | None:
    """Consumer side: send the CSR (proven with ``token``) in the Tenant through ``provider`` (the
    peering token's client, or an admin's), wait for the certificate and store the identity
    (certificate and kubeconfig for ``server``/``ca_pem``) in the consumer's identity Secret.

    Without ``wait``, returns None instead of waiting when the certificate is not issued yet (a
    controller looks again when the Tenant changes). Raises :class:`PeeringError` when refused.
    """
    ns = tenant_namespace(consumer_id)
    secret, key_pem, csr_pem = await _consumer_key_and_csr(consumer, consumer_id, provider_id, namespace)
    data = secret.get("data") or {}
    if data.get("kubeconfig") and data.get("tls.crt"):
        _, not_after = certificate_validity(unb64(data["tls.crt"]))
        if not_after - datetime.now(UTC) < renew_within:
            # renew with a new key: the old certificate stays valid until it expires, the new
            # one is issued through the same proof of the peering token
            progress(f"certificate expires {not_after:%Y-%m-%d %H:%M}Z: renewing")
            key_pem = make_private_key()
            csr_pem = make_csr(key_pem, consumer_username(consumer_id), (CONSUMERS_GROUP,))
            kept = {k: v for k, v in data.items() if k in ("kubeconfig", "ca.crt", "server")}
            secret = await consumer.replace(
                SECRETS,
                meta(secret)["name"],
                {**secret, "data": {**kept, "tls.key": b64(key_pem), "csr.pem": b64(csr_pem)}},
                namespace,
            )
        else:
            with contextlib.suppress(NotFound):
                tenant = await provider.get(TENANTS, consumer_id, ns)
                identity = (tenant.get("status") or {}).get("identity") or {}
                if identity.get("certificate") == data["tls.crt"]:
                    progress(f"already peered: {identity.get('username')} until {identity.get('notAfter')}")
                    return IssuedIdentity(
                        str(identity.get("username")),
                        namespace,
                        meta(secret)["name"],
                        unb64(data["kubeconfig"]).decode(),
                        str(identity.get("notAfter")),
                        True,
                    )
    proof = csr_proof(token, consumer_id, csr_pem)
    spec: dict[str, Any] = {
        "consumerClusterID": consumer_id,
        "csr": b64(csr_pem),
        "csrProof": proof,
        "peeringTokenSecretRef": {"name": TOKEN_SECRET, "key": "token"},
        "podSecurity": pod_security,
    }
    if max_twin_namespaces is not None:
        spec["maxTwinNamespaces"] = max_twin_namespaces
    body: RawObject = {
        "apiVersion": TENANTS.api_version,
        "kind": TENANTS.kind,
        "metadata": {
            "name": consumer_id,
            "namespace": ns,
            "labels": {LABEL_MANAGED_BY: MANAGED_BY, LABEL_TENANT: consumer_id},
        },
        "spec": spec,
    }
    try:
        current: RawObject | None = await provider.get(TENANTS, consumer_id, ns)
    except NotFound:
        current = None
    if current is None:
        with contextlib.suppress(AlreadyExists):
            await provider.create(TENANTS, body)
        progress(f"Tenant {ns}/{consumer_id} submitted with CSR for {consumer_username(consumer_id)}")
    else:
        # a Tenant that exists keeps what the provider may have set since (its Pod Security, how
        # many twin namespaces): the consumer sends its new CSR and proof only
        renewal = {k: spec[k] for k in ("csr", "csrProof")}
        if any((current.get("spec") or {}).get(k) != v for k, v in renewal.items()):
            await provider.patch(TENANTS, consumer_id, {"spec": renewal}, ns)
        progress(f"Tenant {ns}/{consumer_id} submitted with CSR for {consumer_username(consumer_id)}")

    wanted_csr = csr_name(consumer_id, csr_pem)

    def authenticated(obj: RawObject) -> str | None:
        cond = find_condition((obj.get("status") or {}).get("conditions"), "Authenticated")
        identity = (obj.get("status") or {}).get("identity") or {}
        if (
            cond
            and cond.get("status") == "True"
            and identity.get("certificate")
            and identity.get("csrName") == wanted_csr
        ):
            return ""
        current = cond is not None and cond.get("observedGeneration") == meta(obj).get("generation")
        if current and cond and cond.get("reason") in {"InvalidProof", "InvalidCSR", "WrongNamespace"}:
            return f"the provider refused the peering request: {cond.get('reason')}: {cond.get('message')}"
        return None

    if wait:
        tenant = await wait_until(provider, TENANTS, consumer_id, ns, authenticated, timeout,
                                  f"Tenant {ns}/{consumer_id}")  # fmt: skip
    else:
        tenant = await provider.get(TENANTS, consumer_id, ns)
        verdict = authenticated(tenant)
        if verdict is None:
            return None
        if verdict:
            raise PeeringError(verdict)
    identity = tenant["status"]["identity"]
    cert_pem = unb64(identity["certificate"])
    kubeconfig = build_kubeconfig(
        server=server, ca_pem=ca_pem, cert_pem=cert_pem, key_pem=key_pem,
        cluster_name=f"gpuferry-{provider_id}", user=identity["username"], tls_server_name=tls_server_name,
    )  # fmt: skip
    patch = {
        "data": {
            "tls.crt": identity["certificate"],
            "kubeconfig": b64(kubeconfig.encode()),
            "ca.crt": b64(ca_pem or b""),
            "server": b64(server.encode()),
        }
    }
    await consumer.patch(SECRETS, meta(secret)["name"], patch, namespace)
    progress(
        f"issued {identity['username']} until {identity.get('notAfter')}; "
        f"kubeconfig in {namespace}/{meta(secret)['name']}"
    )
    return IssuedIdentity(
        str(identity["username"]),
        namespace,
        meta(secret)["name"],
        kubeconfig,
        str(identity.get("notAfter")),
        False,
    )


async def issued_client(
    consumer: KubeClient, provider_id: str, *, namespace: str = CONSUMER_NAMESPACE
) -> KubeClient:
    """A (not yet opened) client for the provider authenticated as the issued identity only."""
    try:
        secret = await consumer.get(SECRETS, identity_secret_name(provider_id), namespace)
    except NotFound:
        raise PeeringError(
            f"not peered with {provider_id}: no Secret {namespace}/"
            f"{identity_secret_name(provider_id)} on the consumer"
        ) from None
    data = secret.get("data") or {}
    if not data.get("kubeconfig"):
        raise PeeringError(f"the identity for {provider_id} has not been issued yet")
    config = yaml.safe_load(unb64(data["kubeconfig"]))
    cluster, user = config["clusters"][0]["cluster"], config["users"][0]["user"]
    ca = cluster.get("certificate-authority-data")
    return KubeClient(
        Connection(
            server=cluster["server"],
            ca_pem=unb64(ca) if ca else None,
            tls_server_name=cluster.get("tls-server-name"),
            client_cert_pem=unb64(user["client-certificate-data"]),
            client_key_pem=unb64(user["client-key-data"]),
        )
    )


# -- negotiation ----------------------------------------------------------------------------------


async def request_slice(
    tenant_client: KubeClient,
    *,
    consumer_id: str,
    resources: Mapping[str, str | int],
    name: str | None = None,
    node_selector: Mapping[str, str] | None = None,
    allow_partial: bool = False,
    wait: bool = True,
    timeout: float = 60.0,
) -> RawObject:
    """Create (or update) the GPUSlice ``name`` (default: the consumer ID) in the tenant
    namespace with the consumer's issued identity; with ``wait``, return it once decided
    (``status.phase`` Granted, PartiallyGranted or Denied — a denial is returned, not raised)."""
    ns = tenant_namespace(consumer_id)
    name = name or consumer_id
    spec: dict[str, Any] = {
        "consumerClusterID": consumer_id,
        "resources": dict(resources),
        "nodeSelector": dict(node_selector or {}),
        "allowPartial": allow_partial,
    }
    body: RawObject = {
        "apiVersion": GPUSLICES.api_version,
        "kind": GPUSLICES.kind,
        "metadata": {"name": name, "namespace": ns},
        "spec": spec,
    }
    try:
        created = await tenant_client.create(GPUSLICES, body)
    except AlreadyExists:
        # replace the selector as a whole: a merge patch would keep labels left out of the new one
        current = await tenant_client.get(GPUSLICES, name, ns)
        body["metadata"]["resourceVersion"] = meta(current)["resourceVersion"]
        created = await tenant_client.replace(GPUSLICES, name, body, ns)
    if not wait:
        return created
    generation = meta(created).get("generation")

    def decided(obj: RawObject) -> str | None:
        status = obj.get("status") or {}
        if (
            status.get("phase") in {"Granted", "PartiallyGranted", "Denied"}
            and status.get("observedGeneration") == generation
        ):
            return ""
        return None

    return await wait_until(tenant_client, GPUSLICES, name, ns, decided, timeout, f"GPUSlice {ns}/{name}")


async def request_twin_namespace(
    tenant_client: KubeClient,
    *,
    consumer_id: str,
    origin_namespace: str,
    mapping: str = "DefaultName",
    timeout: float = 60.0,
) -> str:
    """Ask the provider for the twin namespace of ``origin_namespace``; returns its name once
    Ready (its RoleBinding and quota in place). Raises :class:`PeeringError` when refused."""
    ns = tenant_namespace(consumer_id)
    body: RawObject = {
        "apiVersion": NAMESPACEOFFLOADINGS.api_version,
        "kind": NAMESPACEOFFLOADINGS.kind,
        "metadata": {"name": origin_namespace, "namespace": ns},
        "spec": {"originNamespace": origin_namespace, "namespaceMappingStrategy": mapping},
    }
    with contextlib.suppress(AlreadyExists):
        await tenant_client.create(NAMESPACEOFFLOADINGS, body)

    def ready(obj: RawObject) -> str | None:
        status = obj.get("status") or {}
        cond = find_condition(status.get("conditions"), "Ready")
        if status.get("phase") == "Ready" and status.get("remoteNamespace"):
            return ""
        if status.get("phase") == "Failed" and cond:
            return f"the provider refused twin namespace for {origin_namespace}: {cond.get('message')}"
        return None

    found = await wait_until(
        tenant_client,
        NAMESPACEOFFLOADINGS,
        origin_namespace,
        ns,
        ready,
        timeout,
        f"twin namespace request {ns}/{origin_namespace}",
    )
    return str(found["status"]["remoteNamespace"])


async def release_twin_namespace(
    tenant_client: KubeClient, *, consumer_id: str, origin_namespace: str, timeout: float = 120.0
) -> None:
    """Withdraw the request; returns once the provider has deleted the twin namespace."""
    ns = tenant_namespace(consumer_id)
    try:
        await tenant_client.delete(NAMESPACEOFFLOADINGS, origin_namespace, ns)
    except NotFound:
        return
    await wait_gone(tenant_client, NAMESPACEOFFLOADINGS, origin_namespace, ns, timeout)
