"""The provider's side of a tenant's network fabric, and the consumer's ForeignCluster here.

The consumer never writes a PeerNetwork on the provider. It writes its network into its Tenant
(``spec.network``: pod and Service CIDRs, its gateway's public key); this reconciler, keyed by the
Tenant, turns that into the PeerNetwork ``<tenant namespace>/<consumer-id>`` that the provider's
gateway reconciles, and publishes what the consumer needs back in ``status.network``: this
cluster's CIDRs (its declaration), where its gateway for this tenant listens (the declared
``endpointAddress`` and the gateway's ``status.listenPort``), that gateway's public key, and
whether it has a handshake. A rotated key on either side crosses over the same way.

The consumer's CIDRs are taken once: the first network of an authenticated Tenant is recorded in
``status.acceptedNetwork`` (which the consumer cannot write), and the PeerNetwork routes those,
whatever ``spec.network`` says later (issue 16 §4: a consumer that rewrote its CIDRs to
``172.16.0.0/12`` had the provider's gateway route the provider's own addresses to it). The API
server refuses such a change already (``gpuferry-tenant-self-service``); this is the second line.
Only the key is taken from ``spec.network`` each time. A provider operator approves new CIDRs by
writing them into ``status.acceptedNetwork``.

It also keeps the ForeignCluster of the consumer (role Consumer) with what this side knows:
Authenticated from the Tenant, NetworkReady from the PeerNetwork.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from kube.api import GATEWAY_PUBLIC_KEY_ANNOTATION, NETWORK_READY
from kube.clients import KubeClient
from kube.declaration import (
    DECLARATION_NAME,
    DECLARATION_NAMESPACE,
    DeclarationError,
    declaration_from_configmap,
)
from kube.errors import NotFound
from kube.informers import Informer
from kube.logs import object_logger
from kube.objects import CONFIGMAPS, FOREIGNCLUSTERS, PEERNETWORKS, ObjectKey, RawObject, meta
from kube.objects import annotations as annotations_of
from kube.patching import patch_changes
from kube.reconciling import Requeue

from ..conditions import find_condition, set_condition
from ..resources import TENANTS, tenant_namespace
from .builders import owned_labels
from .settings import ProviderSettings

__all__ = ["TenantNetworkReconciler", "accepted_network", "consumer_foreign_cluster", "provider_peer_network"]

logger = logging.getLogger(__name__)


def provider_peer_network(consumer_id: str, network: dict[str, Any]) -> RawObject:
    """The PeerNetwork describing the consumer to this provider's gateway (it dials in). Pure."""
    spec: dict[str, Any] = {
        "clusterID": consumer_id,
        "podCIDRs": list(network.get("podCIDRs") or []),
        "serviceCIDRs": list(network.get("serviceCIDRs") or []),
    }
    if network.get("publicKey"):
        spec["publicKey"] = network["publicKey"]
    return {
        "apiVersion": PEERNETWORKS.api_version,
        "kind": PEERNETWORKS.kind,
        "metadata": {
            "name": consumer_id,
            "namespace": tenant_namespace(consumer_id),
            "labels": owned_labels(consumer_id, **{"gpuferry.io/peer": consumer_id}),
        },
        "spec": spec,
    }


def accepted_network(tenant: RawObject) -> tuple[dict[str, Any] | None, str | None]:
    """The consumer network to route: (network, why not as asked). The CIDRs are those accepted
    in ``status.acceptedNetwork`` (the first network asked for, when none is yet), the key is the
    one in ``spec.network``; the second item says what the spec asks that is not taken. Pure."""
    network = (tenant.get("spec") or {}).get("network")
    if not network:
        return None, None
    asked = {"podCIDRs": list(network.get("podCIDRs") or []),
             "serviceCIDRs": list(network.get("serviceCIDRs") or [])}  # fmt: skip
    accepted = (tenant.get("status") or {}).get("acceptedNetwork")
    if not accepted:
        accepted = asked
    accepted = {"podCIDRs": list(accepted.get("podCIDRs") or []),
                "serviceCIDRs": list(accepted.get("serviceCIDRs") or [])}  # fmt: skip
    routed = {**accepted, **({"publicKey": network["publicKey"]} if network.get("publicKey") else {})}
    if accepted == asked:
        return routed, None
    return routed, (
        f"the consumer asks for pod CIDRs {', '.join(asked['podCIDRs'])} and Service CIDRs "
        f"{', '.join(asked['serviceCIDRs']) or 'none'}; the provider routes the accepted "
        f"{', '.join(accepted['podCIDRs'])} and {', '.join(accepted['serviceCIDRs']) or 'none'} (a provider "
        "operator approves new CIDRs by writing them into the Tenant's status.acceptedNetwork)"
    )


def consumer_foreign_cluster(consumer_id: str) -> RawObject:
    """The consumer as a peer of this provider. Pure."""
    return {
        "apiVersion": FOREIGNCLUSTERS.api_version,
        "kind": FOREIGNCLUSTERS.kind,
        "metadata": {"name": consumer_id, "labels": owned_labels(consumer_id)},
        "spec": {"clusterID": consumer_id, "role": "Consumer"},
    }


def published_network(declaration: Any, peer_network: RawObject | None) -> dict[str, Any]:
    """What the consumer is told of this side: CIDRs, and once the gateway has them, its key and
    where it listens. Pure."""
    out: dict[str, Any] = {
        "podCIDRs": list(declaration.pod_cidrs),
        "serviceCIDRs": list(declaration.service_cidrs),
    }
    if peer_network is None:
        return out
    key = annotations_of(peer_network).get(GATEWAY_PUBLIC_KEY_ANNOTATION)
    if key:
        out["publicKey"] = key
    status = peer_network.get("status") or {}
    port = status.get("listenPort")
    if declaration.endpoint_address and port:
        out["endpoint"] = {"address": declaration.endpoint_address, "port": int(port)}
    ready = find_condition(status.get("conditions"), NETWORK_READY)
    out["ready"] = bool(ready and ready.get("status") == "True")
    return out


class TenantNetworkReconciler:
    """Keyed by the Tenant's ``ObjectKey``; see the module docstring."""

    def __init__(self, client: KubeClient, *, peer_networks: Informer, settings: ProviderSettings) -> None:
        self.client = client
        self.peer_networks = peer_networks
        self.settings = settings

    async def _declaration(self) -> Any:
        try:
            cm: RawObject | None = await self.client.get(CONFIGMAPS, DECLARATION_NAME, DECLARATION_NAMESPACE)
        except NotFound:
            cm = None
        return declaration_from_configmap(cm, side="provider")

    async def reconcile(self, key: ObjectKey) -> Requeue | None:
        log = object_logger(logger, "Tenant", key)
        try:
            tenant = await self.client.get(TENANTS, key.name, key.namespace)
        except NotFound:
            tenant = None
        consumer_id = key.name
        if tenant is None or meta(tenant).get("deletionTimestamp"):
            await self._forget(consumer_id)
            return None
        authenticated = find_condition((tenant.get("status") or {}).get("conditions"), "Authenticated")
        is_authenticated = bool(authenticated and authenticated.get("status") == "True")
        network, not_taken = accepted_network(tenant)
        status_network: dict[str, Any] | None = None
        network_ready: tuple[bool, str, str] = (False, "NetworkDisabled", "the consumer asked for no network")
        if network and is_authenticated:
            try:
                declaration = await self._declaration()
            except DeclarationError as e:
                log.warning("cannot publish the network: %s", e)
                network_ready = (False, "InvalidDeclaration", str(e))
            else:
                wanted = provider_peer_network(consumer_id, network)
                await self.client.patch(
                    PEERNETWORKS,
                    consumer_id,
                    wanted,
                    key.namespace,
                    patch_type="apply",
                    field_manager=self.settings.field_manager,
                    force=True,
                )
                current = self.peer_networks.get(ObjectKey(key.namespace, consumer_id))
                status_network = published_network(declaration, current)
                ready = status_network.get("ready", False)
                if not_taken:
                    log.warning("%s", not_taken)
                    network_ready = (False, "CIDRChangeNotAccepted", not_taken)
                elif ready:
                    network_ready = (True, "HandshakeRecent", "the provider's gateway has a recent handshake")
                else:
                    message = "the provider's gateway has no handshake with the consumer's yet"
                    network_ready = (False, "AwaitingGateway", message)
        elif not network:
            with contextlib.suppress(NotFound):
                await self.client.delete(PEERNETWORKS, consumer_id, key.namespace)
        new_status = dict(tenant.get("status") or {})
        if network and network["podCIDRs"] and network["serviceCIDRs"] and is_authenticated \
                and not new_status.get("acceptedNetwork"):  # fmt: skip
            new_status["acceptedNetwork"] = {k: network[k] for k in ("podCIDRs", "serviceCIDRs")}
        if status_network is None:
            new_status.pop("network", None)
        else:
            new_status["network"] = status_network
        if new_status != (tenant.get("status") or {}):
            await patch_changes(
                self.client, TENANTS, tenant, {**tenant, "status": new_status}, subresource="status"
            )
        await self._foreign_cluster(consumer_id, is_authenticated, authenticated, network_ready)
        return None

    async def _foreign_cluster(
        self,
        consumer_id: str,
        authenticated: bool,
        condition: dict[str, Any] | None,
        network: tuple[bool, str, str],
    ) -> None:
        if not authenticated:
            return
        body = consumer_foreign_cluster(consumer_id)
        fc = await self.client.patch(
            FOREIGNCLUSTERS,
            consumer_id,
            body,
            patch_type="apply",
            field_manager=self.settings.field_manager,
            force=True,
        )
        status = dict(fc.get("status") or {})
        conditions = set_condition(
            status.get("conditions"),
            "Authenticated",
            True,
            str((condition or {}).get("reason") or "CertificateIssued"),
            str((condition or {}).get("message") or "authenticated"),
        )
        conditions = set_condition(conditions, NETWORK_READY, network[0], network[1], network[2])
        status["conditions"] = conditions
        status["tenantNamespace"] = tenant_namespace(consumer_id)
        await patch_changes(self.client, FOREIGNCLUSTERS, fc, {**fc, "status": status}, subresource="status")

    async def _forget(self, consumer_id: str) -> None:
        """The Tenant is gone: its gateway tears down (its PeerNetwork goes) and the peer is no more."""
        with contextlib.suppress(NotFound):
            await self.client.delete(PEERNETWORKS, consumer_id, tenant_namespace(consumer_id))
        with contextlib.suppress(NotFound):
            await self.client.delete(FOREIGNCLUSTERS, consumer_id)
