"""The virtual node's kubelet API on the real clusters, through the real kubectl: logs, exec,
attach and port-forward of an offloaded pod on the consumer reach its twin on the provider, where
kwok's kubelet-like server serves them (kwok Logs/Exec/Attach/PortForward objects); the kubelet
API authenticates and authorises like a kubelet."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import logging
import os
import ssl
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from cryptography import x509
from cryptography.x509.oid import NameOID

from hack.localcluster import LocalCluster
from kube.clients import KubeClient
from kube.errors import NotFound
from kube.objects import (
    CLUSTERROLEBINDINGS,
    CLUSTERROLES,
    CSRS,
    LEASES,
    NAMESPACES,
    NODES,
    PODS,
    SERVICEACCOUNTS,
    RawObject,
    Resource,
)
from kube.ports import free_port
from vk.app import run
from vk.forge.labels import VIRTUAL_NODE_TAINT_KEY, owner_selector
from vk.forge.names import twin_namespace
from vk.kubelet.certificates import ServingCertificate, approve_csr
from vk.settings import VirtualKubeletSettings

from .conftest import NamespaceFactory
from .relay import Relay, kubeconfig_via
from .stopping import stop
from .test_vk_pods import held_for_capacity, pod
from .test_vk_tenant_mode import ROLEBINDINGS, ROLES, gpu_pod, grant, offload_twin, tenant
from .waiting import condition, wait_for, wait_for_items

pytestmark = pytest.mark.integration
_ = tenant  # the scoped-identity fixture of the tenant-mode tests, used by name below

H100 = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
KWOK = "kwok.x-k8s.io"
KWOK_LOGS = Resource(KWOK, "v1alpha1", "logs", "Logs", namespaced=True)
KWOK_EXECS = Resource(KWOK, "v1alpha1", "execs", "Exec", namespaced=True)
KWOK_ATTACHES = Resource(KWOK, "v1alpha1", "attaches", "Attach", namespaced=True)
KWOK_PORTFORWARDS = Resource(KWOK, "v1alpha1", "portforwards", "PortForward", namespaced=True)


@dataclass
class Kubectl:
    """The real kubectl, run without blocking the loop the in-process virtual kubelet serves on."""

    cluster: LocalCluster

    def argv(self, *args: str) -> list[str]:
        return [str(self.cluster.bin.kubectl), f"--kubeconfig={self.cluster.spec.kubeconfig}", *args]

    async def __call__(
        self, *args: str, input: str | None = None, timeout: float = 60
    ) -> tuple[int, str, str]:
        proc = await asyncio.create_subprocess_exec(
            *self.argv(*args),
            stdin=asyncio.subprocess.PIPE if input is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            out, err = await asyncio.wait_for(
                proc.communicate(input.encode() if input is not None else None), timeout
            )
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise
        assert proc.returncode is not None
        return proc.returncode, out.decode(), err.decode()

    @contextlib.asynccontextmanager
    async def background(self, *args: str) -> AsyncIterator[asyncio.subprocess.Process]:
        proc = await asyncio.create_subprocess_exec(
            *self.argv(*args),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            yield proc
        finally:
            if proc.returncode is None:
                proc.kill()
            await proc.wait()


@dataclass
class Offloaded:
    """A consumer pod on the virtual node and where its twin lives."""

    namespace: str
    name: str
    twin_namespace: str
    logs: dict[str, Path]


@dataclass
class VirtualKubelet:
    settings: VirtualKubeletSettings
    task: asyncio.Task[None]

    @property
    def node(self) -> str:
        return self.settings.effective_node_name

    @property
    def url(self) -> str:
        return f"https://{self.settings.node_address}:{self.settings.kubelet_port}"


@dataclass
class ProviderRoute:
    """How the virtual kubelet reaches the provider's API server."""

    kubeconfig: Path
    relay: Relay | None = None


@pytest.fixture
async def provider_route(
    request: pytest.FixtureRequest, provider: LocalCluster, tmp_path: Path
) -> AsyncIterator[ProviderRoute]:
    """Straight to the provider; or, parametrized with "relay" (indirectly), through a TCP relay
    that the test can cut like a partition or a provider API server killed."""
    if getattr(request, "param", None) != "relay":
        yield ProviderRoute(provider.spec.kubeconfig)
        return
    relay = Relay(provider.spec.ports.apiserver)
    await relay.start()
    try:
        via = kubeconfig_via(provider.spec.kubeconfig, f"https://127.0.0.1:{relay.port}", tmp_path)
        yield ProviderRoute(via, relay)
    finally:
        await relay.stop()


@pytest.fixture
async def vk(
    consumer: LocalCluster,
    provider_route: ProviderRoute,
    consumer_client: KubeClient,
    provider_client: KubeClient,
) -> AsyncIterator[VirtualKubelet]:
    suffix = uuid.uuid4().hex[:6]
    settings = VirtualKubeletSettings(
        consumer_kubeconfig=consumer.spec.kubeconfig,
        provider_kubeconfig=provider_route.kubeconfig,
        consumer_cluster_id=f"cons-{suffix}",
        provider_cluster_id=f"prov-{suffix}",
        resources={"nvidia.com/gpu": "16", "cpu": "128", "memory": "1Ti", "pods": "110"},
        provider_node_selector=H100,
        heartbeat_seconds=2,
        status_seconds=5,
        provider_probe_seconds=1,
        resync_seconds=5,
        kubelet_api=True,
        kubelet_csr_self_approve=True,
        kubelet_port=free_port(),
        kubelet_cert_seconds=600,
        log_resume_seconds=5,
    )
    task = asyncio.create_task(run(settings), name="virtual-kubelet")
    running = VirtualKubelet(settings, task)
    await wait_for(
        consumer_client,
        NODES,
        running.node,
        lambda n: (
            (condition(n, "Ready") or {}).get("status") == "True"
            and not [
                t for t in n.get("spec", {}).get("taints") or [] if t["key"].startswith("node.kubernetes.io/")
            ]
        ),
        timeout=60,
    )
    await _wait_listening(settings.node_address, settings.kubelet_port, task)
    yield running
    assert not task.done(), f"the virtual kubelet stopped: {task.exception() if not task.cancelled() else ''}"
    await stop(task)
    for client, resource, name, ns in (
        (consumer_client, NODES, running.node, None),
        (consumer_client, LEASES, running.node, "kube-node-lease"),
    ):
        with contextlib.suppress(NotFound):
            await client.delete(resource, name, ns)
    twins = await provider_client.list(
        NAMESPACES, label_selector=owner_selector(settings.consumer_cluster_id)
    )
    for ns in twins["items"]:
        await provider_client.delete(NAMESPACES, ns["metadata"]["name"])


async def _wait_listening(host: str, port: int, task: asyncio.Task[None], timeout: float = 60) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        assert not task.done(), (
            f"the virtual kubelet stopped: {task.exception() if not task.cancelled() else ''}"
        )
        with contextlib.suppress(OSError):
            _, writer = await asyncio.open_connection(host, port)
            writer.close()
            return
        if loop.time() > deadline:
            raise TimeoutError(f"kubelet API not listening on {host}:{port}")
        await asyncio.sleep(0.2)


def cri_line(when: datetime.datetime, text: str, stream: str = "stdout") -> str:
    """One line of a CRI container log file, which kwok (like the kubelet) reads."""
    return f"{when.strftime('%Y-%m-%dT%H:%M:%S.%f000Z')} {stream} F {text}\n"


async def create_running_on(client: KubeClient, body: RawObject, namespace: str, node: str) -> None:
    """Create the pod ``body`` and wait until it runs on ``node``."""
    await client.create(PODS, body, namespace)
    await wait_for(
        client,
        PODS,
        body["metadata"]["name"],
        lambda p: p.get("status", {}).get("phase") == "Running" and p["spec"].get("nodeName") == node,
        namespace=namespace,
        timeout=60,
    )


@pytest.fixture
async def offloaded(
    vk: VirtualKubelet,
    consumer_client: KubeClient,
    provider_client: KubeClient,
    make_namespace: NamespaceFactory,
    tmp_path: Path,
) -> Offloaded:
    """A two-container GPU pod on the virtual node, Running, with kwok debugging objects for its
    twin: logs from files (one old and two recent lines in ``main``), local exec, attach, and
    port 8080 forwarded to a port the test chooses later (see the port-forward test)."""
    ns = await make_namespace(consumer_client)
    name = "trainer"
    body: RawObject = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "nvcr.io/nvidia/pytorch:25.01-py3",
                    "resources": {"limits": {"nvidia.com/gpu": "1"}},
                },
                {"name": "side", "image": "busybox"},
            ],
            "tolerations": [{"key": VIRTUAL_NODE_TAINT_KEY, "operator": "Exists", "effect": "NoExecute"}],
            "terminationGracePeriodSeconds": 1,
        },
    }
    await create_running_on(consumer_client, body, ns, vk.node)
    twin_ns = twin_namespace(ns, vk.settings.consumer_cluster_id)
    now = datetime.datetime.now(datetime.UTC)
    logs = {"main": tmp_path / "main.log", "side": tmp_path / "side.log", "attach": tmp_path / "attach.log"}
    logs["main"].write_text(
        cri_line(now - datetime.timedelta(hours=2), "epoch 0: loading dataset")
        + cri_line(now - datetime.timedelta(seconds=5), "epoch 1: loss 0.93")
        + cri_line(now - datetime.timedelta(seconds=4), "epoch 2: loss 0.41", stream="stderr")
    )
    logs["side"].write_text(cri_line(now, "sidecar ready"))
    logs["attach"].write_text("")
    meta = {"name": name, "namespace": twin_ns}
    await provider_client.create(
        KWOK_LOGS,
        {
            "apiVersion": f"{KWOK}/v1alpha1",
            "kind": "Logs",
            "metadata": meta,
            "spec": {
                "logs": [
                    {"containers": [c], "logsFile": str(logs[c]), "follow": True} for c in ("main", "side")
                ]
            },
        },
        twin_ns,
    )
    await provider_client.create(
        KWOK_EXECS,
        {
            "apiVersion": f"{KWOK}/v1alpha1",
            "kind": "Exec",
            "metadata": meta,
            "spec": {"execs": [{"local": {"workDir": str(tmp_path)}}]},
        },
        twin_ns,
    )
    await provider_client.create(
        KWOK_ATTACHES,
        {
            "apiVersion": f"{KWOK}/v1alpha1",
            "kind": "Attach",
            "metadata": meta,
            "spec": {"attaches": [{"logsFile": str(logs["attach"])}]},
        },
        twin_ns,
    )
    return Offloaded(ns, name, twin_ns, logs)


async def _provider_ready(provider: LocalCluster, pod: Offloaded) -> None:
    """kwok picks up its debugging objects from watches, one per kind: wait until the provider
    serves the twin's logs and its exec."""
    kubectl = Kubectl(provider)
    for _ in range(100):
        rc, out, _ = await kubectl("logs", "-n", pod.twin_namespace, pod.name, "-c", "side")
        if rc == 0 and "sidecar ready" in out:
            break
        await asyncio.sleep(0.2)
    else:
        raise TimeoutError("kwok on the provider does not serve the twin's logs")
    for _ in range(100):
        rc, _, _ = await kubectl("exec", "-n", pod.twin_namespace, pod.name, "-c", "main", "--", "true")
        if rc == 0:
            return
        await asyncio.sleep(0.2)
    raise TimeoutError("kwok on the provider does not serve the twin's exec")


async def test_kubectl_logs_of_an_offloaded_pod_are_the_twins_logs(
    vk: VirtualKubelet, offloaded: Offloaded, consumer: LocalCluster, provider: LocalCluster
) -> None:
    await _provider_ready(provider, offloaded)
    on_consumer, on_provider = Kubectl(consumer), Kubectl(provider)
    ns, name = offloaded.namespace, offloaded.name

    for args in ((), ("--tail=1",), ("--since=1m",), ("--timestamps",), ("--limit-bytes=10",)):
        rc, out, err = await on_consumer("logs", "-n", ns, name, "-c", "main", *args)
        assert rc == 0, err
        prc, pout, perr = await on_provider("logs", "-n", offloaded.twin_namespace, name, "-c", "main", *args)
        assert prc == 0, perr
        assert out == pout, args
    rc, out, _ = await on_consumer("logs", "-n", ns, name, "-c", "main")
    assert out == "epoch 0: loading dataset\nepoch 1: loss 0.93\nepoch 2: loss 0.41\n"
    rc, out, _ = await on_consumer("logs", "-n", ns, name, "-c", "main", "--tail=1")
    assert out == "epoch 2: loss 0.41\n"
    rc, out, _ = await on_consumer("logs", "-n", ns, name, "-c", "main", "--since=1m")
    assert out == "epoch 1: loss 0.93\nepoch 2: loss 0.41\n"
    rc, out, _ = await on_consumer("logs", "-n", ns, name, "-c", "side")
    assert out == "sidecar ready\n"
    # a container the pod does not have: the API server says so, nothing hangs
    rc, _, err = await on_consumer("logs", "-n", ns, name, "-c", "nope")
    assert rc != 0 and "nope" in err

    # -f: what is written later arrives on the consumer while kubectl keeps following
    async with on_consumer.background("logs", "-f", "-n", ns, name, "-c", "main", "--tail=1") as follow:
        assert follow.stdout is not None
        first = await asyncio.wait_for(follow.stdout.readline(), 30)
        assert first == b"epoch 2: loss 0.41\n"
        with offloaded.logs["main"].open("a") as f:
            f.write(cri_line(datetime.datetime.now(datetime.UTC), "epoch 3: loss 0.12"))
        later = await asyncio.wait_for(follow.stdout.readline(), 30)
        assert later == b"epoch 3: loss 0.12\n"
        assert follow.returncode is None  # still following


async def test_a_log_the_provider_cannot_give_says_why_as_the_provider_did(
    vk: VirtualKubelet,
    offloaded: Offloaded,
    consumer: LocalCluster,
    provider: LocalCluster,
    consumer_client: KubeClient,
) -> None:
    # a Status in JSON from the kubelet API came out of kubectl raw: Error from server
    # (BadRequest): {"kind": "Status", "apiVersion": "v1", ... "message": "provider API server: ...
    ns, name = offloaded.namespace, "no-logs"
    toleration = {"key": VIRTUAL_NODE_TAINT_KEY, "operator": "Exists", "effect": "NoExecute"}
    body: RawObject = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "containers": [{"name": "main", "image": "busybox"}],
            "nodeName": vk.node,
            "tolerations": [toleration],
            "terminationGracePeriodSeconds": 1,
        },
    }
    await create_running_on(consumer_client, body, ns, vk.node)
    # kwok has no Logs object for this twin: the provider says so
    prc, _, perr = await Kubectl(provider)("logs", "-n", offloaded.twin_namespace, name)
    assert prc != 0 and perr.startswith("Error from server (BadRequest): "), perr
    said = perr.strip().removeprefix("Error from server (BadRequest): ")
    rc, _, err = await Kubectl(consumer)("logs", "-n", ns, name)
    assert rc != 0
    assert err.strip() == f"Error from server (BadRequest): provider: {said}"


async def test_logs_of_a_pod_held_without_a_twin_say_what_it_waits_for(
    vk: VirtualKubelet,
    consumer: LocalCluster,
    consumer_client: KubeClient,
    make_namespace: NamespaceFactory,
) -> None:
    # nine GPUs fit the virtual node (16) but no H100 node (8 each): the pod is held, no twin
    # made. kubectl logs said only "pod ns/big is waiting to start: it has no twin on the
    # provider yet", and the reason was left to `kubectl describe`
    ns = await make_namespace(consumer_client)
    big = pod("big", 9)
    big["spec"]["nodeName"] = vk.node  # this virtual node, whatever others the session has
    await consumer_client.create(PODS, big, ns)
    held = await held_for_capacity(consumer_client, "big", ns)
    rc, out, err = await Kubectl(consumer)("logs", "-n", ns, "big")
    assert rc != 0 and out == ""
    assert err.strip() == (
        'Error from server (BadRequest): container "cuda" in pod "big" is waiting to start: '
        f"ProviderCapacity: {held['status']['message']}"
    ), err
    assert "waiting for a provider node with room" in err


async def test_kubectl_exec_returns_output_and_exit_status(
    vk: VirtualKubelet, offloaded: Offloaded, consumer: LocalCluster, provider: LocalCluster
) -> None:
    await _provider_ready(provider, offloaded)
    on_consumer, on_provider = Kubectl(consumer), Kubectl(provider)
    ns, name = offloaded.namespace, offloaded.name

    rc, out, err = await on_consumer(
        "exec", "-n", ns, name, "-c", "main", "--", "sh", "-c", "echo hello; pwd"
    )
    assert (rc, out) == (0, f"hello\n{offloaded.logs['main'].parent}\n"), err

    failing = ("--", "sh", "-c", "echo out; echo err >&2; exit 3")
    rc, out, err = await on_consumer("exec", "-n", ns, name, "-c", "main", *failing)
    prc, pout, perr = await on_provider("exec", "-n", offloaded.twin_namespace, name, "-c", "main", *failing)
    # kwok reports a failed command as an error carrying its status (not a CRI exit code): the
    # consumer's kubectl gets exactly what the provider's does
    assert (rc, out) == (prc, pout) == (1, "out\n")
    assert "err\n" in err and "exit status 3" in err
    assert "exit status 3" in perr

    # stdin is carried to the command
    rc, out, err = await on_consumer(
        "exec",
        "-i",
        "-n",
        ns,
        name,
        "-c",
        "main",
        "--",
        "sh",
        "-c",
        "read a; read b; echo got:$b:$a",
        input="first\nsecond\n",
    )
    assert (rc, out) == (0, "got:second:first\n"), err


@pytest.mark.parametrize("provider_route", ["relay"], indirect=True)
async def test_streams_the_provider_breaks_end_and_an_exec_says_so(
    vk: VirtualKubelet,
    offloaded: Offloaded,
    consumer: LocalCluster,
    provider: LocalCluster,
    provider_route: ProviderRoute,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The connection to the provider cut while streams are open (a partition, or the provider's
    API server killed): ``kubectl exec`` fails and says why instead of passing for a command that
    exited 0, and ``kubectl logs -f`` ends instead of hanging, once the provider has not come back
    in ``log_resume_seconds`` (5 here)."""
    caplog.set_level(logging.INFO, logger="vk.kubelet.server")  # what the follow did, on a failure
    await _provider_ready(provider, offloaded)
    assert provider_route.relay is not None
    kubectl = Kubectl(consumer)
    ns, name = offloaded.namespace, offloaded.name
    async with (
        kubectl.background("exec", "-n", ns, name, "-c", "main", "--",
                           "sh", "-c", "echo step 1; sleep 20; echo done") as execd,
        kubectl.background("logs", "-f", "-n", ns, name, "-c", "main") as follow,
    ):  # fmt: skip
        assert execd.stdout is not None and execd.stderr is not None and follow.stdout is not None
        assert await asyncio.wait_for(execd.stdout.readline(), 30) == b"step 1\n"
        assert b"epoch 0" in await asyncio.wait_for(follow.stdout.readline(), 30)

        await provider_route.relay.stop()
        rc, followed = await asyncio.gather(_ended(execd, 15), _ended(follow, 15))
        assert rc is not None, "kubectl exec went on after the provider was cut off"
        err = (await execd.stderr.read()).decode()
        assert rc == 1, f"an exec cut short passed for exit {rc}: {err}"
        assert "close 1011" in err, err
        assert "the connection to the provider ended before the command's exit status" in err, err
        assert await execd.stdout.read() == b"", "the command's rest cannot have come"
        assert followed is not None, "kubectl logs -f hung after the provider was cut off:\n" + "\n".join(
            f"{r.relativeCreated / 1000:.3f} {r.getMessage()}"
            for r in caplog.records
            if r.name == "vk.kubelet.server"
        )


@pytest.mark.parametrize("provider_route", ["relay"], indirect=True)
async def test_a_followed_log_goes_on_across_a_cut_each_line_once(
    vk: VirtualKubelet,
    offloaded: Offloaded,
    consumer: LocalCluster,
    provider: LocalCluster,
    provider_route: ProviderRoute,
) -> None:
    """``kubectl logs -f`` while the connection to the provider is cut for 2 s (its API server
    restarted): the follow goes on, with what was written during the cut and after it, each line
    once, as if nothing happened (it used to end, as if the container had)."""
    await _provider_ready(provider, offloaded)
    assert provider_route.relay is not None
    ns, name = offloaded.namespace, offloaded.name
    async with Kubectl(consumer).background("logs", "-f", "-n", ns, name, "-c", "main") as follow:
        assert follow.stdout is not None

        async def line() -> bytes:
            assert follow.stdout is not None
            return await asyncio.wait_for(follow.stdout.readline(), 30)

        assert [await line() for _ in range(3)] == [
            b"epoch 0: loading dataset\n", b"epoch 1: loss 0.93\n", b"epoch 2: loss 0.41\n"
        ]  # fmt: skip
        await provider_route.relay.stop()
        with offloaded.logs["main"].open("a") as f:
            f.write(cri_line(datetime.datetime.now(datetime.UTC), "epoch 3: loss 0.12"))
        await asyncio.sleep(2)
        await provider_route.relay.start()
        assert await line() == b"epoch 3: loss 0.12\n"
        with offloaded.logs["main"].open("a") as f:
            f.write(cri_line(datetime.datetime.now(datetime.UTC), "epoch 4: loss 0.05"))
        assert await line() == b"epoch 4: loss 0.05\n"
        assert follow.returncode is None  # still following
        with contextlib.suppress(TimeoutError):  # and nothing came twice
            extra = await asyncio.wait_for(follow.stdout.readline(), 2)
            raise AssertionError(f"a line came after the last one written: {extra!r}")


async def _ended(proc: asyncio.subprocess.Process, within: float) -> int | None:
    """``proc``'s exit status, or None if it still runs after ``within`` seconds."""
    try:
        return await asyncio.wait_for(proc.wait(), within)
    except TimeoutError:
        return None


async def test_kubectl_attach_streams_the_containers_output(
    vk: VirtualKubelet, offloaded: Offloaded, consumer: LocalCluster, provider: LocalCluster
) -> None:
    await _provider_ready(provider, offloaded)
    async with Kubectl(consumer).background(
        "attach", "-n", offloaded.namespace, offloaded.name, "-c", "main", "--pod-running-timeout=20s"
    ) as attached:
        assert attached.stdout is not None
        line = asyncio.ensure_future(attached.stdout.readline())
        try:
            for i in range(100):  # attach shows what is written after it started
                with offloaded.logs["attach"].open("a") as f:
                    f.write(cri_line(datetime.datetime.now(datetime.UTC), f"step {i}"))
                done, _ = await asyncio.wait([line], timeout=0.3)
                if done:
                    break
            got = await asyncio.wait_for(line, 1)
        finally:
            line.cancel()
        assert got.startswith(b"step "), got


async def test_kubectl_port_forward_carries_an_http_request(
    vk: VirtualKubelet,
    offloaded: Offloaded,
    consumer: LocalCluster,
    provider_client: KubeClient,
) -> None:
    # the "pod's" web server: kwok forwards the twin's port 8080 to it
    async def hello(request: web.Request) -> web.Response:
        return web.Response(text=f"hello from the twin, path {request.path}")

    app = web.Application()
    app.router.add_get("/{tail:.*}", hello)
    runner = web.AppRunner(app)
    await runner.setup()
    target = free_port()
    await web.TCPSite(runner, "127.0.0.1", target).start()
    try:
        await provider_client.create(
            KWOK_PORTFORWARDS,
            {
                "apiVersion": f"{KWOK}/v1alpha1",
                "kind": "PortForward",
                "metadata": {"name": offloaded.name, "namespace": offloaded.twin_namespace},
                "spec": {"forwards": [{"ports": [8080], "target": {"port": target, "address": "127.0.0.1"}}]},
            },
            offloaded.twin_namespace,
        )
        local = free_port()
        async with Kubectl(consumer).background(
            "port-forward", "-n", offloaded.namespace, f"pod/{offloaded.name}", f"{local}:8080"
        ) as forward:
            assert forward.stdout is not None
            banner = await asyncio.wait_for(forward.stdout.readline(), 30)
            if not banner:
                assert forward.stderr is not None
                pytest.fail(f"kubectl port-forward ended: {(await forward.stderr.read()).decode()}")
            assert b"Forwarding from 127.0.0.1" in banner, banner
            body = ""
            async with aiohttp.ClientSession() as session:
                for _ in range(50):  # kwok watches PortForward objects: it may take a moment
                    with contextlib.suppress(aiohttp.ClientError):
                        async with session.get(f"http://127.0.0.1:{local}/weights") as resp:
                            body = await resp.text()
                            if resp.status == 200:
                                break
                    await asyncio.sleep(0.2)
            assert body == "hello from the twin, path /weights"
    finally:
        await runner.cleanup()


async def _token_for(client: KubeClient, namespace: str, account: str) -> str:
    await client.create(
        SERVICEACCOUNTS,
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": account}},
        namespace,
    )
    answer = await client.request(
        "POST",
        f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token",
        json={
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"expirationSeconds": 600},
        },
    )
    return str(answer["status"]["token"])


async def test_kubelet_api_authenticates_and_authorises_like_a_kubelet(
    vk: VirtualKubelet,
    offloaded: Offloaded,
    consumer: LocalCluster,
    consumer_client: KubeClient,
) -> None:
    ns = offloaded.namespace
    ca = ssl.create_default_context(cafile=str(consumer.spec.pki_dir / "ca.crt"))
    # the serving certificate came from the consumer's CSR API: the cluster CA verifies it for
    # the node's address, and it names the node
    _, writer = await asyncio.open_connection(vk.settings.node_address, vk.settings.kubelet_port, ssl=ca)
    der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    writer.close()
    cert = x509.load_der_x509_certificate(der)
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == f"system:node:{vk.node}"
    assert cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)[0].value == "system:nodes"

    allowed = await _token_for(consumer_client, ns, "node-proxy")
    denied = await _token_for(consumer_client, ns, "nobody")
    role = f"kubelet-api-test-{uuid.uuid4().hex[:6]}"
    await consumer_client.create(
        CLUSTERROLES,
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": role},
            "rules": [{"apiGroups": [""], "resources": ["nodes/proxy"], "verbs": ["get", "create"]}],
        },
    )
    await consumer_client.create(
        CLUSTERROLEBINDINGS,
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": role},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"kind": "ServiceAccount", "name": "node-proxy", "namespace": ns}],
        },
    )
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ca)) as session:

            async def get(path: str, token: str | None = None, **headers: str) -> tuple[int, Any]:
                if token:
                    headers["Authorization"] = f"Bearer {token}"
                async with session.get(
                    vk.url + path, headers=headers, timeout=aiohttp.ClientTimeout(total=20)
                ) as resp:
                    text = await resp.text()
                    return resp.status, text

            assert (await get("/pods"))[0] == 401
            assert (await get("/pods", "not-a-token"))[0] == 401
            status, text = await get("/pods", denied)
            assert status == 403 and "nodes" in text and "proxy" in text, text
            status, text = await get(f"/containerLogs/{ns}/{offloaded.name}/side", denied)
            assert status == 403, text
            # RBAC takes a moment to see the new binding
            for _ in range(50):
                status, text = await get("/pods", allowed)
                if status == 200:
                    break
                await asyncio.sleep(0.2)
            assert status == 200, text
            pods = json.loads(text)
            assert [p["metadata"]["name"] for p in pods["items"]] == [offloaded.name]
            assert (await get("/healthz", allowed)) == (200, "ok")
            status, text = await get(f"/containerLogs/{ns}/{offloaded.name}/side", allowed)
            assert (status, text) == (200, "sidecar ready\n")
            status, _ = await get("/stats/summary", allowed)
            assert status == 403  # nodes/stats is not granted by nodes/proxy
            for path in ("/metrics", "/metrics/cadvisor", "/metrics/probes"):
                status, text = await get(path, allowed)
                assert status == 403 and "metrics" in text, (path, text)  # nodes/metrics is not either
            assert (await get("/no/such/route", allowed))[0] == 404
            assert (await get(f"/containerLogs/{ns}/not-here/main", allowed))[0] == 404
            # a stream request that upgrades to nothing is refused with a clear answer, not a hang
            status, text = await get(f"/exec/{ns}/{offloaded.name}/main?command=true&output=1", allowed)
            assert status == 400 and "WebSocket" in text, text

        # a client certificate signed by the consumer's client CA authenticates (the admin's:
        # system:masters may do everything, stats included)
        admin = ssl.create_default_context(cafile=str(consumer.spec.pki_dir / "ca.crt"))
        admin.load_cert_chain(consumer.spec.pki_dir / "admin.crt", consumer.spec.pki_dir / "admin.key")
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=admin)) as session:

            async def scrape(path: str) -> str:
                async with session.get(vk.url + path) as resp:
                    assert resp.status == 200, (path, await resp.text())
                    return await resp.text()

            summary = json.loads(await scrape("/stats/summary"))
            # what Prometheus scrapes on every kubelet: the virtual kubelet's own metrics, the
            # twins' containers under cAdvisor's names (kwok's twins: start times, no usage
            # measured, none made up), and no probe counts (the provider's kubelet runs them)
            own, cadvisor, probes = [
                await scrape(p) for p in ("/metrics", "/metrics/cadvisor", "/metrics/probes")
            ]
        assert summary["node"]["nodeName"] == vk.node
        assert [p["podRef"]["name"] for p in summary["pods"]] == [offloaded.name]
        assert "gpuferry_api_requests_total{" in own and "process_resident_memory_bytes" in own, own
        assert f'kubelet_node_name{{node="{vk.node}"}} 1' in own.splitlines(), own
        assert "kubelet_running_pods 1" in own.splitlines(), own  # the offloaded pod, Running
        pod = await consumer_client.get(PODS, offloaded.name, ns)
        images = {c["name"]: c["image"] for c in pod["spec"]["containers"]}
        started = {
            line.split('container="')[1].split('"')[0]: line
            for line in cadvisor.splitlines()
            if line.startswith("container_start_time_seconds{") and f'pod="{offloaded.name}"' in line
        }
        assert set(started) == set(images), cadvisor
        cgroups = {"Guaranteed": "", "Burstable": "/burstable", "BestEffort": "/besteffort"}
        qos = cgroups[pod["status"]["qosClass"]]
        for container, line in started.items():
            assert f'namespace="{ns}"' in line and f'image="{images[container]}"' in line, line
            assert f'id="/kubepods{qos}/pod{pod["metadata"]["uid"]}' in line, line
        usage = ("container_cpu", "container_memory")
        assert not [line for line in cadvisor.splitlines() if line.startswith(usage)], cadvisor
        assert "container_scrape_error 0" in cadvisor.splitlines(), cadvisor
        probe_lines = probes.splitlines()
        assert probe_lines and all(line.startswith("# ") for line in probe_lines), probes
    finally:
        for resource, name in ((CLUSTERROLEBINDINGS, role), (CLUSTERROLES, role)):
            with contextlib.suppress(NotFound):
                await consumer_client.delete(resource, name)


async def test_scrapes_follow_the_pods_that_come_and_go(
    vk: VirtualKubelet,
    consumer: LocalCluster,
    consumer_client: KubeClient,
    make_namespace: NamespaceFactory,
) -> None:
    """Between scrapes the kubelet API keeps its list of the node's pods while neither store
    changes (the consumer pods', the twins'): a pod bound here, or gone, is in the next scrapes
    all the same, through the stores of a real virtual kubelet."""
    ns = await make_namespace(consumer_client)
    await _wait_listening(vk.settings.node_address, vk.settings.kubelet_port, vk.task)
    await scrapes_show(vk.url, consumer, ns, [], 0)
    for name in ("first", "second"):
        body = pod(name, 1)
        body["spec"]["nodeName"] = vk.node
        body["spec"]["terminationGracePeriodSeconds"] = 0
        await create_running_on(consumer_client, body, ns, vk.node)
    await scrapes_show(vk.url, consumer, ns, ["first", "second"], 2)
    await scrapes_show(vk.url, consumer, ns, ["first", "second"], 2)  # asked again, nothing changed
    await consumer_client.delete(PODS, "first", ns)
    await wait_for_items(consumer_client, PODS, lambda items: [p["metadata"]["name"] for p in items]
                         == ["second"], namespace=ns, timeout=60)  # fmt: skip
    await scrapes_show(vk.url, consumer, ns, ["second"], 1)


async def scrapes_show(url: str, consumer: LocalCluster, ns: str, names: list[str], running: int) -> None:
    """Wait until the kubelet API at ``url`` shows the pods ``names`` of ``ns`` in its Summary,
    and ``running`` pods Running on the node in ``/metrics`` (the stores follow the API server a
    moment later), scraped as the consumer's admin."""
    admin = ssl.create_default_context(cafile=str(consumer.spec.pki_dir / "ca.crt"))
    admin.load_cert_chain(consumer.spec.pki_dir / "admin.crt", consumer.spec.pki_dir / "admin.key")
    seen: tuple[list[str], list[str]] | None = None
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=admin)) as session:
        for _ in range(100):
            async with session.get(url + "/stats/summary") as resp:
                assert resp.status == 200, await resp.text()
                summary = await resp.json()
            async with session.get(url + "/metrics") as resp:
                assert resp.status == 200, await resp.text()
                counted = [line for line in (await resp.text()).splitlines()
                           if line.startswith("kubelet_running_pods ")]  # fmt: skip
            seen = (
                sorted(p["podRef"]["name"] for p in summary["pods"] if p["podRef"]["namespace"] == ns),
                counted,
            )
            if seen == (names, [f"kubelet_running_pods {running}"]):
                return
            await asyncio.sleep(0.1)
    raise AssertionError(f"scrapes show {seen}, not {names} with {running} running")


async def test_serving_certificate_is_renewed_in_place(
    consumer: LocalCluster, consumer_client: KubeClient
) -> None:
    """A renewal loads a new certificate into the serving context: the next handshake gets it."""
    node = f"gpuferry-renew-{uuid.uuid4().hex[:6]}"
    certificate = ServingCertificate(
        consumer_client,
        node_name=node,
        addresses=("127.0.0.1",),
        self_approve=True,
        expiration_seconds=600,
        sign_timeout=60,
    )
    await certificate.setup()
    runner = web.AppRunner(web.Application())
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port, ssl_context=certificate.context).start()
    ca = ssl.create_default_context(cafile=str(consumer.spec.pki_dir / "ca.crt"))

    async def served_serial() -> int:
        _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ca)
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        writer.close()
        return x509.load_der_x509_certificate(der).serial_number

    try:
        assert certificate.cert_pem is not None
        first = x509.load_pem_x509_certificate(certificate.cert_pem)
        lifetime = first.not_valid_after_utc - first.not_valid_before_utc
        assert lifetime <= datetime.timedelta(seconds=600 + 300)  # expirationSeconds honoured (+ backdating)
        assert await served_serial() == first.serial_number
        renewed = x509.load_pem_x509_certificate(await certificate.renew())
        assert renewed.serial_number != first.serial_number
        assert await served_serial() == renewed.serial_number
    finally:
        await runner.cleanup()


async def test_the_node_declares_websockets_and_spdy_clients_still_work(
    vk: VirtualKubelet,
    offloaded: Offloaded,
    consumer: LocalCluster,
    provider: LocalCluster,
    consumer_client: KubeClient,
    provider_client: KubeClient,
) -> None:
    """The Node declares ExtendWebSocketsToKubelet, so the API server hands WebSocket streams to
    the kubelet API as they are; clients forced to SPDY/3.1 are passed through to the provider."""
    node = await consumer_client.get(NODES, vk.node)
    assert node["status"]["declaredFeatures"] == ["ExtendWebSocketsToKubelet"]
    await _provider_ready(provider, offloaded)
    spdy = {
        **os.environ,
        "KUBECTL_REMOTE_COMMAND_WEBSOCKETS": "false",
        "KUBECTL_PORT_FORWARD_WEBSOCKETS": "false",
    }
    kubectl = Kubectl(consumer)
    proc = await asyncio.create_subprocess_exec(
        *kubectl.argv("exec", "-i", "-n", offloaded.namespace, offloaded.name, "-c", "main", "--",
                      "sh", "-c", "read a; echo got:$a; echo to-stderr >&2"),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env=spdy,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(b"over spdy\n"), 30)
    assert (proc.returncode, out) == (0, b"got:over spdy\n"), err
    assert err == b"to-stderr\n"

    # port-forward over plain SPDY too
    async def hello(_: web.Request) -> web.Response:
        return web.Response(text="spdy forwarded")

    app = web.Application()
    app.router.add_get("/", hello)
    runner = web.AppRunner(app)
    await runner.setup()
    target = free_port()
    await web.TCPSite(runner, "127.0.0.1", target).start()
    try:
        await provider_client.create(
            KWOK_PORTFORWARDS,
            {"apiVersion": f"{KWOK}/v1alpha1", "kind": "PortForward",
             "metadata": {"name": offloaded.name, "namespace": offloaded.twin_namespace},
             "spec": {"forwards": [{"ports": [8080], "target": {"port": target, "address": "127.0.0.1"}}]}},
            offloaded.twin_namespace,
        )  # fmt: skip
        local = free_port()
        forward = await asyncio.create_subprocess_exec(
            *kubectl.argv("port-forward", "-n", offloaded.namespace, f"pod/{offloaded.name}",
                          f"{local}:8080"),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=spdy,
        )  # fmt: skip
        try:
            assert forward.stdout is not None
            banner = await asyncio.wait_for(forward.stdout.readline(), 30)
            assert b"Forwarding from 127.0.0.1" in banner, banner
            body = ""
            async with aiohttp.ClientSession() as session:
                for _ in range(50):
                    with contextlib.suppress(aiohttp.ClientError):
                        async with session.get(f"http://127.0.0.1:{local}/") as resp:
                            body = await resp.text()
                            if resp.status == 200:
                                break
                    await asyncio.sleep(0.2)
            assert body == "spdy forwarded"
        finally:
            forward.kill()
            await forward.wait()
    finally:
        await runner.cleanup()


async def test_a_v4_websocket_client_execs_through_the_consumer_api_server(
    vk: VirtualKubelet, offloaded: Offloaded, consumer: LocalCluster, provider: LocalCluster
) -> None:
    """Not only kubectl: a plain WebSocket client speaking v4.channel.k8s.io (as the Python
    kubernetes client does) gets stdout and the exit status on the error channel."""
    await _provider_ready(provider, offloaded)
    tls = ssl.create_default_context(cafile=str(consumer.spec.pki_dir / "ca.crt"))
    tls.load_cert_chain(consumer.spec.pki_dir / "admin.crt", consumer.spec.pki_dir / "admin.key")
    params = [
        ("container", "main"),
        ("stdout", "true"),
        ("stderr", "true"),
        ("command", "sh"),
        ("command", "-c"),
        ("command", "echo out; echo err >&2; exit 3"),
    ]
    url = f"{consumer.spec.server}/api/v1/namespaces/{offloaded.namespace}/pods/{offloaded.name}/exec"
    channels: dict[int, bytes] = {}
    async with (
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=tls)) as session,
        session.ws_connect(url, params=params, protocols=["v4.channel.k8s.io"]) as ws,
    ):
        assert ws.protocol == "v4.channel.k8s.io"
        async for msg in ws:
            if msg.type == aiohttp.WSMsgType.BINARY and msg.data:
                channels[msg.data[0]] = channels.get(msg.data[0], b"") + msg.data[1:]
    assert channels[1] == b"out\n"
    assert channels[2] == b"err\n"
    status = json.loads(channels[3])
    assert status["status"] == "Failure" and "exit status 3" in status["message"], status


# what the provider's peering controller grants a consumer in each twin namespace on top of
# pods (peering/provider/builders.py): streams, and the accessories twins carry (the pod's
# service-account token is reflected as a Secret)
STREAM_RULES = [
    {
        "apiGroups": [""],
        "resources": ["configmaps", "secrets"],
        "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"],
    },
    {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
    {
        "apiGroups": [""],
        "resources": ["pods/exec", "pods/attach", "pods/portforward"],
        "verbs": ["get", "create"],
    },
]


async def test_logs_and_exec_with_a_scoped_tenant_identity(
    consumer: LocalCluster,
    provider: LocalCluster,
    consumer_client: KubeClient,
    provider_client: KubeClient,
    make_namespace: NamespaceFactory,
    tenant: dict[str, Any],
    tmp_path: Path,
) -> None:
    """Tenant mode: twins are found through the NamespaceOffloading mapping, and the streams go
    out with the consumer's scoped provider identity."""
    h100 = sorted(
        n["metadata"]["name"]
        for n in (
            await provider_client.list(NODES, label_selector="nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3")
        )["items"]
    )
    await grant(provider_client, tenant, {h100[0]: 2})
    settings = VirtualKubeletSettings(
        consumer_kubeconfig=consumer.spec.kubeconfig,
        provider_kubeconfig=tenant["kubeconfig"],
        consumer_cluster_id=tenant["id"],
        provider_cluster_id=f"p{tenant['id']}",
        resources={"nvidia.com/gpu": "2", "cpu": "16", "memory": "128Gi", "pods": "40"},
        provider_node_selector=H100,
        tenant_namespace=tenant["ns"],
        slice_name="slice",
        heartbeat_seconds=2,
        provider_probe_seconds=1,
        kubelet_api=True,
        kubelet_csr_self_approve=True,
        kubelet_port=free_port(),
    )
    node = settings.effective_node_name
    task = asyncio.create_task(run(settings))
    try:
        await wait_for(
            consumer_client,
            NODES,
            node,
            lambda n: (condition(n, "Ready") or {}).get("status") == "True",
            timeout=60,
        )
        await _wait_listening(settings.node_address, settings.kubelet_port, task)
        ns = await make_namespace(consumer_client)
        twin_ns = await offload_twin(provider_client, tenant, ns)
        await bind_more(provider_client, twin_ns, tenant["user"], STREAM_RULES)
        await consumer_client.create(PODS, gpu_pod("scoped", node, 1), ns)
        await wait_for(
            consumer_client,
            PODS,
            "scoped",
            lambda p: p["status"].get("phase") == "Running",
            namespace=ns,
            timeout=30,
        )
        log = tmp_path / "c.log"
        log.write_text(cri_line(datetime.datetime.now(datetime.UTC), "hello from a scoped twin"))
        meta = {"name": "scoped", "namespace": twin_ns}
        await provider_client.create(
            KWOK_LOGS,
            {"apiVersion": f"{KWOK}/v1alpha1", "kind": "Logs", "metadata": meta,
             "spec": {"logs": [{"logsFile": str(log)}]}},
            twin_ns,
        )  # fmt: skip
        await provider_client.create(
            KWOK_EXECS,
            {
                "apiVersion": f"{KWOK}/v1alpha1",
                "kind": "Exec",
                "metadata": meta,
                "spec": {"execs": [{"local": {}}]},
            },
            twin_ns,
        )
        kubectl = Kubectl(consumer)
        out = ""
        for _ in range(50):  # kwok picks its objects up from a watch
            rc, out, _ = await kubectl("logs", "-n", ns, "scoped")
            if rc == 0:
                break
            await asyncio.sleep(0.2)
        assert out == "hello from a scoped twin\n"
        for _ in range(50):  # and its Exec objects from another watch
            rc, out, err = await kubectl("exec", "-n", ns, "scoped", "--", "echo", "scoped exec")
            if rc == 0:
                break
            await asyncio.sleep(0.2)
        assert (rc, out) == (0, "scoped exec\n"), err
        # the kubelet API's list of the node's pods follows the tenant's twin namespaces too
        url = f"https://{settings.node_address}:{settings.kubelet_port}"
        await scrapes_show(url, consumer, ns, ["scoped"], 1)
        await consumer_client.create(PODS, gpu_pod("second", node, 1), ns)
        await wait_for(consumer_client, PODS, "second", lambda p: p["status"].get("phase") == "Running",
                       namespace=ns, timeout=30)  # fmt: skip
        await scrapes_show(url, consumer, ns, ["scoped", "second"], 2)
    finally:
        await stop(task)
        for resource, name, namespace in ((NODES, node, None), (LEASES, node, "kube-node-lease")):
            with contextlib.suppress(NotFound):
                await consumer_client.delete(resource, name, namespace)


async def bind_more(provider: KubeClient, namespace: str, user: str, rules: list[dict[str, Any]]) -> None:
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": "tenant-streams"},
        "rules": rules,
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": "tenant-streams"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "tenant-streams"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
    }
    await provider.create(ROLES, role, namespace)
    await provider.create(ROLEBINDINGS, binding, namespace)


async def test_without_self_approval_the_kubelet_api_waits_for_an_approver(
    consumer: LocalCluster,
    provider: LocalCluster,
    consumer_client: KubeClient,
) -> None:
    """The production path: the serving CSR waits for an approver; the node runs meanwhile, and
    the API is served as soon as someone approves the request."""
    suffix = uuid.uuid4().hex[:6]
    settings = VirtualKubeletSettings(
        consumer_kubeconfig=consumer.spec.kubeconfig,
        provider_kubeconfig=provider.spec.kubeconfig,
        consumer_cluster_id=f"cons-{suffix}",
        provider_cluster_id=f"prov-{suffix}",
        resources={"nvidia.com/gpu": "8", "cpu": "16", "memory": "64Gi", "pods": "10"},
        provider_node_selector=H100,
        heartbeat_seconds=2,
        provider_probe_seconds=1,
        kubelet_api=True,
        kubelet_port=free_port(),
    )
    node = settings.effective_node_name
    task = asyncio.create_task(run(settings))
    try:
        await wait_for(
            consumer_client,
            NODES,
            node,
            lambda n: (condition(n, "Ready") or {}).get("status") == "True",
            timeout=60,
        )
        pending: list[RawObject] = []
        for _ in range(100):
            csrs = await consumer_client.list(CSRS, label_selector="gpuferry.io/component=virtual-kubelet")
            pending = [c for c in csrs["items"] if c["metadata"]["name"].startswith(f"{node}-serving-")]
            if pending:
                break
            await asyncio.sleep(0.2)
        assert len(pending) == 1, pending
        csr = pending[0]
        assert csr["spec"]["signerName"] == "kubernetes.io/kubelet-serving"
        assert not (csr.get("status") or {}).get("certificate")
        with pytest.raises(OSError):
            await asyncio.open_connection(settings.node_address, settings.kubelet_port)
        assert not task.done()
        await approve_csr(consumer_client, csr["metadata"]["name"], reason="TestApprover")
        await _wait_listening(settings.node_address, settings.kubelet_port, task, timeout=30)
        # the request object is removed once its certificate is in use
        with pytest.raises(NotFound):
            await consumer_client.get(CSRS, csr["metadata"]["name"])
    finally:
        await stop(task)
        for resource, name, namespace in ((NODES, node, None), (LEASES, node, "kube-node-lease")):
            with contextlib.suppress(NotFound):
                await consumer_client.delete(resource, name, namespace)
