"""Session-scoped real clusters (profile "test", or $GPUFERRY_TEST_PROFILE) and a fresh namespace
per test.

The clusters are the same hack/localcluster code the demo runs. If they are already up (a
developer keeps them between runs with GPUFERRY_KEEP_CLUSTERS=1), they are reused and left up;
otherwise they are started here and torn down at the end of the session. One session at a time
holds a profile (a second one waits, see hack/localcluster/locking.py); clusters left up by a
session that was killed are started afresh, since they carry its leftovers.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from hack.localcluster import LocalCluster, profile_clusters, second_provider
from hack.localcluster.locking import ProfileLock
from kube.clients import KubeClient
from kube.errors import NotFound
from kube.objects import NAMESPACES, SERVICEACCOUNTS, RawObject
from peering.localagents import all_agents, stop_agent

from .clirunner import Cli, cache_of
from .waiting import wait_for


@pytest.fixture(scope="session")
def clusters() -> Iterator[dict[str, LocalCluster]]:
    profile = os.environ.get("GPUFERRY_TEST_PROFILE", "test")
    with ProfileLock(profile, progress=lambda msg: print(msg, flush=True)) as lock:
        found = profile_clusters(profile)
        if not lock.previous_ended_cleanly:
            print(f"the last session on {profile!r} was killed: its clusters start afresh", flush=True)
            for cluster in [*found.values(), second_provider(profile, build=False)]:
                cluster.down()
        reused = all(st.running for c in found.values() for st in c.status())
        for cluster in found.values():
            cluster.up(progress=lambda msg: print(msg, flush=True))
        yield found
        failures = [str(f) for c in found.values() for f in c.crashed()]
        if not reused and not os.environ.get("GPUFERRY_KEEP_CLUSTERS"):
            for cluster in found.values():
                cluster.down()
    assert not failures, "a cluster component crashed during the tests:\n" + "\n".join(failures)


@pytest.fixture
def provider(clusters: dict[str, LocalCluster]) -> LocalCluster:
    return clusters["provider"]


@pytest.fixture
def consumer(clusters: dict[str, LocalCluster]) -> LocalCluster:
    return clusters["consumer"]


@pytest.fixture
async def provider_client(provider: LocalCluster) -> AsyncIterator[KubeClient]:
    async with KubeClient.from_kubeconfig(provider.spec.kubeconfig) as client:
        yield client


@pytest.fixture
async def consumer_client(consumer: LocalCluster) -> AsyncIterator[KubeClient]:
    async with KubeClient.from_kubeconfig(consumer.spec.kubeconfig) as client:
        yield client


NamespaceFactory = Callable[[KubeClient], Awaitable[str]]


@pytest.fixture
async def make_namespace(request: pytest.FixtureRequest) -> AsyncIterator[NamespaceFactory]:
    """Creates a uniquely named namespace in a cluster; all are deleted after the test."""
    made: list[tuple[KubeClient, str]] = []

    async def make(client: KubeClient) -> str:
        base = request.node.name.lower().replace("_", "-")[:40].strip("-")
        name = f"{base}-{uuid.uuid4().hex[:6]}"
        body: RawObject = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
        await client.create(NAMESPACES, body)
        made.append((client, name))
        # pods are refused until the service-account controller has made "default", as on any
        # real cluster: wait for it like a careful user would
        await wait_for(client, SERVICEACCOUNTS, "default", lambda _: True, namespace=name)
        return name

    yield make
    for client, name in made:
        with contextlib.suppress(NotFound):
            await client.delete(NAMESPACES, name)


@pytest.fixture
async def provider_ns(provider_client: KubeClient, make_namespace: NamespaceFactory) -> str:
    return await make_namespace(provider_client)


@pytest.fixture
async def cli(consumer: LocalCluster, provider: LocalCluster, tmp_path: Path) -> AsyncIterator[Cli]:
    runner = Cli(consumer, provider, tmp_path / "cache")
    yield runner
    # a failed test must not leave its peering to the next one (unpeer is idempotent)
    await runner("unpeer", "--kubeconfig", runner.c, "--remote-kubeconfig", runner.p, "-q")
    with cache_of(runner):
        for agent in all_agents():  # whatever a failed test left running
            stop_agent(agent)
