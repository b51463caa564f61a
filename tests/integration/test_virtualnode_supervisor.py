"""The consumer's VirtualNode controller keeps one real virtual kubelet process per VirtualNode."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import signal
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from hack.localcluster import LocalCluster
from kube.clients import KubeClient
from kube.errors import NotFound
from kube.objects import NODES, SECRETS, RawObject
from peering.crds import ensure_crds
from peering.virtualnodes import VIRTUALNODES, SupervisorSettings, VirtualNodeSupervisor

from .conftest import NamespaceFactory
from .kubeconfigs import embedded_kubeconfig
from .waiting import condition, wait_for, wait_for_deletion

pytestmark = pytest.mark.integration


def virtual_node(provider_id: str, secret: str, gpus: int = 8) -> RawObject:
    return {
        "apiVersion": VIRTUALNODES.api_version,
        "kind": VIRTUALNODES.kind,
        "metadata": {"name": provider_id},
        "spec": {
            "providerClusterID": provider_id,
            "consumerClusterID": f"c-{provider_id}",
            "nodeName": f"gpuferry-{provider_id}",
            "resources": {"nvidia.com/gpu": gpus, "cpu": "32", "memory": "256Gi", "pods": "110"},
            "kubeconfigSecretRef": {"name": secret},
        },
    }


def kubeconfig_secret(provider: LocalCluster, name: str) -> RawObject:
    """The Secret a VirtualNode names: a kubeconfig for the provider, certificates embedded."""
    kubeconfig = base64.b64encode(embedded_kubeconfig(provider.spec.kubeconfig)).decode()
    data = {"kubeconfig": kubeconfig}
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "data": data}


@contextlib.asynccontextmanager
async def supervising(
    consumer: LocalCluster, namespace: str, log_dir: Path, **overrides: Any
) -> AsyncIterator[VirtualNodeSupervisor]:
    async with KubeClient.from_kubeconfig(consumer.spec.kubeconfig) as client:
        settings = SupervisorSettings(
            consumer_kubeconfig=consumer.spec.kubeconfig, namespace=namespace, log_dir=log_dir, **overrides
        )
        supervisor = VirtualNodeSupervisor(client, settings)
        task = asyncio.create_task(supervisor.run(), name="virtual node supervisor")
        try:
            yield supervisor
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


def ready(node: RawObject) -> bool:
    return (condition(node, "Ready") or {}).get("status") == "True"


def phase_is(phase: str, reason: str | None = None) -> Any:
    def check(vn: RawObject) -> bool:
        status = vn.get("status") or {}
        running = condition(vn, "KubeletRunning") or {}
        return status.get("phase") == phase and (reason is None or running.get("reason") == reason)

    return check


async def test_one_kubelet_per_virtual_node_restarted_on_change_stopped_with_the_controller(
    consumer: LocalCluster,
    provider: LocalCluster,
    consumer_client: KubeClient,
    make_namespace: NamespaceFactory,
    tmp_path: Path,
) -> None:
    await ensure_crds(consumer_client)
    ns = await make_namespace(consumer_client)
    await consumer_client.create(SECRETS, kubeconfig_secret(provider, "kc"), ns)
    ids = [f"sup-{uuid.uuid4().hex[:6]}" for _ in range(2)]
    nodes = [f"gpuferry-{i}" for i in ids]
    try:
        async with supervising(consumer, ns, tmp_path) as supervisor:
            for provider_id in ids:
                await consumer_client.create(VIRTUALNODES, virtual_node(provider_id, "kc"), ns)
            for node in nodes:
                await wait_for(consumer_client, NODES, node, ready, timeout=60)
            for provider_id in ids:
                await wait_for(consumer_client, VIRTUALNODES, provider_id, phase_is("Running"), namespace=ns)
            pids = {k.name: c.proc.pid for k, c in supervisor.children.items() if c.proc is not None}
            assert set(pids) == set(ids)

            # a changed grant: the running kubelet advertises it, no restart (which would relist
            # every pod on both sides)
            await consumer_client.patch(
                VIRTUALNODES, ids[0], {"spec": {"resources": {"nvidia.com/gpu": 16}}}, ns
            )
            await wait_for(
                consumer_client,
                NODES,
                nodes[0],
                lambda n: n["status"]["capacity"]["nvidia.com/gpu"] == "16",
                timeout=60,
            )
            child = supervisor.children[next(k for k in supervisor.children if k.name == ids[0])]
            assert child.proc is not None and child.proc.pid == pids[ids[0]]

            # what the kubelet reads once (what twins tolerate): it restarts by itself to read it
            toleration = {"key": "example.com/dedicated", "operator": "Exists", "effect": "NoSchedule"}
            await consumer_client.patch(
                VIRTUALNODES, ids[0], {"spec": {"providerTolerations": [toleration]}}, ns
            )
            await wait_for(
                consumer_client,
                NODES,
                nodes[0],
                lambda n: (child.proc is not None and child.proc.pid != pids[ids[0]]
                           and n["status"]["capacity"]["nvidia.com/gpu"] == "16"),
                timeout=60,
            )  # fmt: skip
            await wait_for(consumer_client, NODES, nodes[0], ready, timeout=60)

            # deleted: the kubelet removes its node and ends; the other one is untouched
            await consumer_client.delete(VIRTUALNODES, ids[0], ns)
            await wait_for_deletion(consumer_client, NODES, nodes[0], None, timeout=30)
            await asyncio.wait_for(child.task, 30)
            other = supervisor.children[next(k for k in supervisor.children if k.name == ids[1])]
            assert other.proc is not None and other.proc.pid == pids[ids[1]] and other.proc.returncode is None

            # made again under the same name (generation 1 again, as the one that ended): a new kubelet
            await consumer_client.create(VIRTUALNODES, virtual_node(ids[0], "kc"), ns)
            await wait_for(consumer_client, NODES, nodes[0], ready, timeout=60)
            again = supervisor.children[next(k for k in supervisor.children if k.name == ids[0])]
            assert again is not child and again.proc is not None and again.proc.returncode is None
        # the controller stopped: so did its kubelets
        assert other.proc.returncode is not None
    finally:
        for node in nodes:
            with contextlib.suppress(NotFound):
                await consumer_client.delete(NODES, node)


async def test_a_virtual_node_that_cannot_run_is_failed_until_it_is_fixed(
    consumer: LocalCluster,
    provider: LocalCluster,
    consumer_client: KubeClient,
    make_namespace: NamespaceFactory,
    tmp_path: Path,
) -> None:
    await ensure_crds(consumer_client)
    ns = await make_namespace(consumer_client)
    provider_id = f"sup-{uuid.uuid4().hex[:6]}"
    node = f"gpuferry-{provider_id}"
    try:
        async with supervising(consumer, ns, tmp_path):
            await consumer_client.create(VIRTUALNODES, virtual_node(provider_id, "not-yet"), ns)
            failed = await wait_for(
                consumer_client,
                VIRTUALNODES,
                provider_id,
                phase_is("Failed", "InvalidVirtualNode"),
                namespace=ns,
                timeout=30,
            )
            assert "kubeconfig Secret 'not-yet' not found" in condition(failed, "KubeletRunning")["message"]

            # the Secret appears and the object is touched: it runs
            await consumer_client.create(SECRETS, kubeconfig_secret(provider, "not-yet"), ns)
            await consumer_client.patch(VIRTUALNODES, provider_id, {"spec": {"labels": {"retry": "1"}}}, ns)
            await wait_for(consumer_client, NODES, node, ready, timeout=60)
            await wait_for(consumer_client, VIRTUALNODES, provider_id, phase_is("Running"), namespace=ns)
    finally:
        with contextlib.suppress(NotFound):
            await consumer_client.delete(NODES, node)


def message_has(text: str) -> Any:
    def check(vn: RawObject) -> bool:
        pending = phase_is("Pending", "KubeletStartFailed")(vn)
        return pending and text in condition(vn, "KubeletRunning")["message"]

    return check


@pytest.mark.parametrize(
    ("overrides", "why"),
    [
        # a wrong --node-address: no port of it can be given to any virtual kubelet's API
        ({"node_address": "192.0.2.1"}, "[Errno 99] 192.0.2.1 is not an address of this machine"),
        ({"python": "/nonexistent/python3"}, "[Errno 2] No such file or directory: '/nonexistent/python3'"),
    ],
    ids=["address-not-here", "no-interpreter"],
)
async def test_a_kubelet_that_cannot_be_started_is_pending_and_retried_with_the_reason(
    consumer: LocalCluster,
    consumer_client: KubeClient,
    make_namespace: NamespaceFactory,
    tmp_path: Path,
    overrides: dict[str, str],
    why: str,
) -> None:
    """The VirtualNode says why its kubelet cannot start, and the supervisor keeps trying, backing
    off, until the object goes."""
    await ensure_crds(consumer_client)
    ns = await make_namespace(consumer_client)
    provider_id = f"sup-{uuid.uuid4().hex[:6]}"
    async with supervising(consumer, ns, tmp_path, **overrides) as supervisor:
        await consumer_client.create(VIRTUALNODES, virtual_node(provider_id, "unused"), ns)
        first = await wait_for(
            consumer_client,
            VIRTUALNODES,
            provider_id,
            message_has("retrying in 1s"),
            namespace=ns,
            timeout=30,
        )
        assert condition(first, "KubeletRunning")["message"] == (
            f"cannot start the virtual kubelet: {why}; retrying in 1s"
        )
        # still trying, a while later
        await wait_for(
            consumer_client,
            VIRTUALNODES,
            provider_id,
            message_has("retrying in 2s"),
            namespace=ns,
            timeout=30,
        )
        (child,) = supervisor.children.values()
        assert not child.task.done()
        assert child.proc is None

        # the object goes: so does its loop
        await consumer_client.delete(VIRTUALNODES, provider_id, ns)
        await wait_for_deletion(consumer_client, VIRTUALNODES, provider_id, namespace=ns)
        await asyncio.wait({child.task}, timeout=10)
        assert child.task.done()
        assert supervisor.children == {}


def crashed(delay: int) -> Any:
    def check(vn: RawObject) -> bool:
        running = condition(vn, "KubeletRunning") or {}
        return phase_is("Pending", "KubeletCrashed")(vn) and running.get("message", "").startswith(
            f"exited -9, restarting in {delay}s"
        )

    return check


async def test_a_crashed_kubelet_is_restarted_backing_off_and_forgiven_once_it_ran_long(
    consumer: LocalCluster,
    provider: LocalCluster,
    consumer_client: KubeClient,
    make_namespace: NamespaceFactory,
    tmp_path: Path,
) -> None:
    """A kubelet killed (as the OOM killer would) is restarted: 1 s, then 2 s if it crashes again
    at once, and 1 s again when it ran ``backoff_reset_after`` before it crashed."""
    await ensure_crds(consumer_client)
    ns = await make_namespace(consumer_client)
    await consumer_client.create(SECRETS, kubeconfig_secret(provider, "kc"), ns)
    provider_id = f"sup-{uuid.uuid4().hex[:6]}"
    node = f"gpuferry-{provider_id}"
    reset_after = 6.0
    try:
        async with supervising(consumer, ns, tmp_path, backoff_reset_after=reset_after) as supervisor:
            await consumer_client.create(VIRTUALNODES, virtual_node(provider_id, "kc"), ns)
            await wait_for(consumer_client, NODES, node, ready, timeout=60)
            (child,) = supervisor.children.values()

            async def kill_and_expect(delay: int) -> None:
                assert child.proc is not None
                pid = child.proc.pid
                os.kill(pid, signal.SIGKILL)
                await wait_for(
                    consumer_client, VIRTUALNODES, provider_id, crashed(delay), namespace=ns, timeout=30
                )
                await wait_for(
                    consumer_client,
                    VIRTUALNODES,
                    provider_id,
                    lambda vn: phase_is("Running")(vn) and child.proc is not None and child.proc.pid != pid,
                    namespace=ns,
                    timeout=30,
                )

            await kill_and_expect(1)
            await kill_and_expect(2)  # at once: backing off
            await asyncio.sleep(reset_after + 0.5)
            await kill_and_expect(1)  # it ran long enough: forgiven
            await wait_for(consumer_client, NODES, node, ready, timeout=60)
    finally:
        with contextlib.suppress(NotFound):
            await consumer_client.delete(NODES, node)
