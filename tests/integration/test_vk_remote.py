"""The admin side of :mod:`vk.remote` on the real provider: twin namespaces made here."""

from __future__ import annotations

import asyncio
import contextlib
import uuid

import pytest

from hack.localcluster import LocalCluster
from kube.clients import KubeClient
from kube.errors import NotFound
from kube.metrics import REGISTRY
from kube.objects import NAMESPACES
from kube.settings import WatchSettings
from vk.forge.labels import ORIGIN_NAMESPACE, owner_selector
from vk.node.provider import ProviderView
from vk.remote import AdminSide
from vk.settings import VirtualKubeletSettings

pytestmark = pytest.mark.integration


def namespaces_created(client: KubeClient) -> float:
    """Namespaces this process's clients asked ``client``'s API server to create so far."""
    labels = {"verb": "create", "resource": "namespaces", "server": client.server}
    return REGISTRY.get_sample_value("gpuferry_api_requests_total", labels) or 0.0


async def test_pods_that_need_a_new_twin_namespace_at_once_create_it_once(
    consumer: LocalCluster, provider: LocalCluster, provider_client: KubeClient
) -> None:
    settings = VirtualKubeletSettings(
        consumer_kubeconfig=consumer.spec.kubeconfig,
        provider_kubeconfig=provider.spec.kubeconfig,
        consumer_cluster_id=f"cons-{uuid.uuid4().hex[:6]}",
        provider_cluster_id="prov",
    )
    view = ProviderView(provider=provider_client, selector={}, settings=WatchSettings())
    side = AdminSide(provider_client, settings=settings, view=view)
    origin = "team-a"
    try:
        before = namespaces_created(provider_client)
        # the pod workers of a burst in a namespace not offloaded before (issue 15: each created
        # it, 14 times for 100 pods)
        await asyncio.gather(*(side.prepare_namespace(origin) for _ in range(16)))
        assert namespaces_created(provider_client) - before == 1
        twin = await provider_client.get(NAMESPACES, side.twin_namespace_for(origin))
        assert twin["metadata"]["annotations"][ORIGIN_NAMESPACE] == origin
        await side.prepare_namespace(origin)  # made: nothing asked again
        assert namespaces_created(provider_client) - before == 1
    finally:
        made = await provider_client.list(
            NAMESPACES, label_selector=owner_selector(settings.consumer_cluster_id)
        )
        for ns in made["items"]:
            with contextlib.suppress(NotFound):
                await provider_client.delete(NAMESPACES, ns["metadata"]["name"])
