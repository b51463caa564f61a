"""The NetworkReady step of the ForeignCluster controller (``spec.networkingEnabled``).

This cluster's network (its declaration) and its gateway's public key go into the Tenant
(``spec.network``); what the provider publishes back (``status.network``) becomes the PeerNetwork
``gpuferry-system/<provider-id>`` that this cluster's gateway reconciles; True once that gateway
has a handshake. Without networking, both are removed.
"""

from __future__ import annotations

import contextlib

from kube.api import GATEWAY_PUBLIC_KEY_ANNOTATION, NETWORK_READY, SYSTEM_NAMESPACE, tenant_namespace
from kube.clients import KubeClient
from kube.declaration import (
    DECLARATION_NAME,
    DECLARATION_NAMESPACE,
    DeclarationError,
    declaration_from_configmap,
)
from kube.errors import Forbidden, NotFound, admission_refusal
from kube.informers import Informer
from kube.objects import CONFIGMAPS, PEERNETWORKS, ObjectKey, RawObject, meta
from kube.objects import annotations as annotations_of

from ..conditions import find_condition
from ..resources import TENANTS
from .builders import FIELD_MANAGER, consumer_network, consumer_peer_network
from .passes import Pass, Waiting, differs

__all__ = ["network_step"]


async def network_step(
    consumer: KubeClient,
    peer_networks: Informer,
    tenant: KubeClient,
    provider_id: str,
    consumer_id: str,
    enabled: bool,
    result: Pass,
) -> None:
    ns = tenant_namespace(consumer_id)
    here = peer_networks.get(ObjectKey(SYSTEM_NAMESPACE, provider_id))
    if not enabled:
        if here is not None:
            await consumer.delete(PEERNETWORKS, provider_id, SYSTEM_NAMESPACE)
        with contextlib.suppress(NotFound):
            tenant_obj = await tenant.get(TENANTS, consumer_id, ns)
            if (tenant_obj.get("spec") or {}).get("network"):
                await tenant.patch(TENANTS, consumer_id, {"spec": {"network": None}}, ns)
        result.set(NETWORK_READY, True, "NetworkDisabled", "peered without the network fabric")
        return
    try:
        cm: RawObject | None = await consumer.get(CONFIGMAPS, DECLARATION_NAME, DECLARATION_NAMESPACE)
    except NotFound:
        cm = None
    try:
        declaration = declaration_from_configmap(cm, side="consumer")
    except DeclarationError as e:
        raise Waiting(NETWORK_READY, "InvalidDeclaration", str(e), retry=30) from None
    own_key = annotations_of(here).get(GATEWAY_PUBLIC_KEY_ANNOTATION) if here is not None else None
    tenant_obj = await tenant.get(TENANTS, consumer_id, ns)
    wanted = consumer_network(declaration, own_key)
    if (tenant_obj.get("spec") or {}).get("network") != wanted:
        try:
            tenant_obj = await tenant.patch(TENANTS, consumer_id, {"spec": {"network": wanted}}, ns)
        except Forbidden as e:  # new CIDRs need the provider's operator; the tunnel stays as it was
            raise Waiting(NETWORK_READY, "CIDRChangeRefused", admission_refusal(e), retry=60) from None
    published = (tenant_obj.get("status") or {}).get("network") or {}
    body = consumer_peer_network(provider_id, published)
    if body is None:
        raise Waiting(NETWORK_READY, "AwaitingProvider", "the provider has not published its network yet")
    if here is None or differs(here.get("spec") or {}, body["spec"]):
        here = await consumer.patch(
            PEERNETWORKS,
            provider_id,
            body,
            SYSTEM_NAMESPACE,
            patch_type="apply",
            field_manager=FIELD_MANAGER,
            force=True,
        )
    status = here.get("status") or {}
    endpoint = body["spec"].get("endpoint")
    result.status["network"] = {
        k: v
        for k, v in {
            "endpoint": f"{endpoint['address']}:{endpoint['port']}" if endpoint else None,
            "remappedPodCIDRs": status.get("remappedPodCIDRs"),
            "remappedServiceCIDRs": status.get("remappedServiceCIDRs"),
            "backend": status.get("backend"),
        }.items()
        if v
    }
    cond = find_condition(status.get("conditions"), NETWORK_READY)
    if cond is None or cond.get("observedGeneration", meta(here).get("generation")) != meta(here).get(
        "generation"
    ):
        raise Waiting(
            NETWORK_READY, "AwaitingGateway", "this cluster's gateway has not reported on the tunnel yet"
        )
    if cond.get("status") != "True":
        raise Waiting(NETWORK_READY, str(cond.get("reason")), str(cond.get("message")))
    result.set(NETWORK_READY, True, str(cond.get("reason")), str(cond.get("message")))
