"""The bench's waits for its twins and namespaces, on a real API server: each watches until
what it waits for is gone, and gives up after its timeout naming what is left."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from bench.offload import TimedOut, namespace, wait_gone, wait_no_pods
from kube.clients import KubeClient
from kube.errors import NotFound
from kube.objects import NAMESPACES, PODS, RawObject

from .conftest import NamespaceFactory

pytestmark = pytest.mark.integration


def _pending_pod(name: str, run: str) -> RawObject:
    """A pod no node takes: it stays Pending, and its deletion is immediate."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"bench-waits": run}},
        "spec": {
            "nodeSelector": {"bench-waits": "no-such-node"},
            "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}],
        },
    }


async def test_wait_no_pods_times_out_naming_them_then_returns_once_they_are_gone(
    provider_client: KubeClient, make_namespace: NamespaceFactory
) -> None:
    ns = await make_namespace(provider_client)
    run = uuid.uuid4().hex[:8]
    for name in ("a", "b"):
        await provider_client.create(PODS, _pending_pod(name, run), ns)
    with pytest.raises(TimedOut, match=rf"2 twins still there after 1 s: {ns}/a, {ns}/b"):
        await wait_no_pods(provider_client, f"bench-waits={run}", timeout=1)

    async def delete_later() -> None:
        await asyncio.sleep(0.5)  # after the watch has listed them
        for name in ("a", "b"):
            await provider_client.delete(PODS, name, ns, grace_period_seconds=0)

    deleting = asyncio.create_task(delete_later())
    await wait_no_pods(provider_client, f"bench-waits={run}", timeout=30)
    await deleting
    assert not (await provider_client.list(PODS, ns, label_selector=f"bench-waits={run}"))["items"]


async def test_wait_no_pods_returns_at_once_when_none_match(provider_client: KubeClient) -> None:
    await wait_no_pods(provider_client, f"bench-waits={uuid.uuid4().hex[:8]}", timeout=5)


async def test_wait_gone_times_out_naming_the_namespace_then_sees_it_go(provider_client: KubeClient) -> None:
    name = f"bench-waits-{uuid.uuid4().hex[:6]}"
    await provider_client.create(NAMESPACES, namespace(name))
    deleted = False
    try:
        with pytest.raises(TimedOut, match=rf"1 of 1 namespaces still there after 1 s: {name}"):
            await wait_gone(provider_client, [name], timeout=1)
        await provider_client.delete(NAMESPACES, name)
        deleted = True
        await wait_gone(provider_client, [name], timeout=60)
        with pytest.raises(NotFound):
            await provider_client.get(NAMESPACES, name)
    finally:
        if not deleted:
            await provider_client.delete(NAMESPACES, name)
