"""kube.watching against a real API server: it survives an API server restart without losing
an event, and relists when etcd has compacted away the resource version it would resume from."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest

from hack.localcluster import LocalCluster
from kube.clients import KubeClient
from kube.objects import CONFIGMAPS, EVENTS, RawObject, Resource
from kube.settings import ClientSettings, WatchSettings
from kube.watching import Listed, watch_objects

from .conftest import NamespaceFactory

pytestmark = pytest.mark.integration


@dataclass
class Mirror:
    """What a consumer of the watch believes exists, rebuilt from events and Listed markers."""

    names: set[str] = field(default_factory=set)
    listed: int = 0
    changed: asyncio.Event = field(default_factory=asyncio.Event)


async def _follow(
    client: KubeClient, resource: Resource, namespace: str, mirror: Mirror, settings: WatchSettings
) -> None:
    async for item in watch_objects(client, resource, namespace=namespace, settings=settings):
        if isinstance(item, Listed):
            mirror.listed += 1
            mirror.names = {k.name for k in item.keys}
        elif item.type == "DELETED":
            mirror.names.discard(item.key.name)
        else:
            mirror.names.add(item.key.name)
        mirror.changed.set()


async def _until(mirror: Mirror, predicate: object, timeout: float = 30) -> None:
    assert callable(predicate)

    async def wait() -> None:
        while not predicate():
            mirror.changed.clear()
            await mirror.changed.wait()

    await asyncio.wait_for(wait(), timeout)


@pytest.fixture
async def following() -> AsyncIterator[list[asyncio.Task[None]]]:
    tasks: list[asyncio.Task[None]] = []
    yield tasks
    for task in tasks:
        assert not task.done(), (
            f"the watch ended: {task.exception() if not task.cancelled() else 'cancelled'}"
        )
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def _configmap(name: str) -> RawObject:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"k": name}}


def _event(name: str, namespace: str) -> RawObject:
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": name},
        "involvedObject": {"kind": "Pod", "name": "x", "namespace": namespace},
        "reason": "Test",
        "message": name,
        "type": "Normal",
    }


async def test_watch_survives_an_apiserver_restart_without_losing_events(
    consumer: LocalCluster,
    consumer_client: KubeClient,
    make_namespace: NamespaceFactory,
    following: list[asyncio.Task[None]],
) -> None:
    ns = await make_namespace(consumer_client)
    mirror = Mirror()
    settings = WatchSettings(backoff_base=0.2, backoff_max=1.0)
    following.append(asyncio.create_task(_follow(consumer_client, CONFIGMAPS, ns, mirror, settings)))
    await consumer_client.create(CONFIGMAPS, _configmap("before"), namespace=ns)
    await _until(mirror, lambda: "before" in mirror.names)

    await asyncio.to_thread(consumer.restart, "kube-apiserver")

    await consumer_client.create(CONFIGMAPS, _configmap("after"), namespace=ns)
    await consumer_client.delete(CONFIGMAPS, "before", namespace=ns)
    await _until(mirror, lambda: "after" in mirror.names and "before" not in mirror.names)
    server = {
        cm["metadata"]["name"] for cm in (await consumer_client.list(CONFIGMAPS, namespace=ns))["items"]
    }
    assert mirror.names == server


async def test_watch_relists_after_etcd_compaction(
    consumer: LocalCluster,
    consumer_client: KubeClient,
    make_namespace: NamespaceFactory,
    following: list[asyncio.Task[None]],
) -> None:
    # Events are not in the API server's watch cache: their watches go straight to etcd, so a
    # resume from a compacted revision is answered with 410 Expired.
    ns = await make_namespace(consumer_client)
    other = await make_namespace(consumer_client)
    mirror = Mirror()
    settings = WatchSettings(timeout_seconds=1, backoff_base=0.1, backoff_max=0.5)
    following.append(asyncio.create_task(_follow(consumer_client, EVENTS, ns, mirror, settings)))
    await consumer_client.create(EVENTS, _event("first", ns), namespace=ns)
    await _until(mirror, lambda: "first" in mirror.names)
    assert mirror.listed == 1

    # move etcd past the watcher's last revision (writes it does not see), then compact
    for i in range(3):
        await consumer_client.create(CONFIGMAPS, _configmap(f"filler-{i}"), namespace=other)
    await asyncio.to_thread(consumer.compact_etcd)
    # the next reconnect (timeoutSeconds=1) is answered 410: the watcher lists again
    await _until(mirror, lambda: mirror.listed >= 2)
    assert mirror.names == {"first"}
    # and goes on watching from the new list
    await consumer_client.create(EVENTS, _event("second", ns), namespace=ns)
    await _until(mirror, lambda: "second" in mirror.names)



async def test_open_watches_never_leave_a_request_without_a_connection(
    consumer: LocalCluster, consumer_client: KubeClient, make_namespace: NamespaceFactory
) -> None:
    """Issue 15: a virtual kubelet holds a few watches in every namespace it has pods in; in the
    same pool as ordinary requests, about 25 namespaces took every connection, and a plain GET
    waited for a watch to end (minutes). Here: a pool of 4 and three times as many watches."""
    namespaces = [await make_namespace(consumer_client) for _ in range(12)]
    settings = ClientSettings(max_connections=4)
    async with KubeClient.from_kubeconfig(consumer.spec.kubeconfig, settings=settings) as client:
        mirrors = [Mirror() for _ in namespaces]
        watches = [
            asyncio.create_task(_follow(client, CONFIGMAPS, ns, mirror, WatchSettings()))
            for ns, mirror in zip(namespaces, mirrors, strict=True)
        ]
        try:
            for mirror in mirrors:  # with one pool, the watches took it all and the rest never listed
                await _until(mirror, lambda m=mirror: m.listed > 0)
            await asyncio.sleep(1)  # every watch is open now, each on its connection
            body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "while-watched"}}
            async with asyncio.timeout(10):  # at once, not after a watch ends
                await client.create(CONFIGMAPS, body, namespaces[-1])
                await client.get(CONFIGMAPS, "while-watched", namespaces[-1])
            await _until(mirrors[-1], lambda: "while-watched" in mirrors[-1].names, timeout=10)
        finally:
            for task in watches:
                task.cancel()
            await asyncio.gather(*watches, return_exceptions=True)
