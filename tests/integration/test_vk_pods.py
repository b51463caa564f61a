"""The virtual kubelet end to end on the real clusters: the consumer's kube-scheduler places GPU
pods on the virtual node, they run as twins on the provider's GPU nodes, status comes back."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from hack.localcluster import LocalCluster
from hack.localcluster.cluster import KubectlFailed
from kube.clients import KubeClient
from kube.errors import AlreadyExists, Forbidden, Invalid, NotFound
from kube.kubeconfigs import Connection
from kube.objects import (
    CONFIGMAPS,
    DEPLOYMENTS,
    ENDPOINTSLICES,
    EVENTS,
    JOBS,
    LEASES,
    NAMESPACES,
    NODES,
    PODS,
    SECRETS,
    SELFSUBJECTREVIEWS,
    SERVICEACCOUNTS,
    SERVICES,
    VALIDATINGADMISSIONPOLICIES,
    VALIDATINGADMISSIONPOLICYBINDINGS,
    RawObject,
    Resource,
)
from kube.ports import free_port
from kube.watching import Listed, watch_objects
from vk.app import forge_options, run
from vk.forge.fit import per_node_free
from vk.forge.labels import VIRTUAL_NODE_TAINT_KEY, owner_selector
from vk.forge.names import twin_namespace
from vk.forge.node import LARGEST_BLOCK_ANNOTATION
from vk.forge.pods import remote_pod
from vk.reflection.pods import GATE_RETRY_SECONDS, REASON_MOUNT
from vk.settings import VirtualKubeletSettings

from .conftest import NamespaceFactory
from .stopping import stop
from .waiting import condition, wait_for, wait_for_deletion, wait_for_empty, wait_for_items

pytestmark = pytest.mark.integration

H100 = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
H100_SELECTOR = "nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3"
TOLERATION = {"key": VIRTUAL_NODE_TAINT_KEY, "operator": "Exists", "effect": "NoExecute"}


@dataclass
class VirtualKubelet:
    settings: VirtualKubeletSettings
    task: asyncio.Task[None]

    @property
    def node(self) -> str:
        return self.settings.effective_node_name

    def twin_ns(self, namespace: str) -> str:
        return twin_namespace(namespace, self.settings.consumer_cluster_id)


@pytest.fixture
async def vk(
    request: pytest.FixtureRequest,
    consumer: LocalCluster,
    provider: LocalCluster,
    consumer_client: KubeClient,
    provider_client: KubeClient,
) -> AsyncIterator[VirtualKubelet]:
    """A virtual kubelet running in-process; indirect parametrisation overrides settings."""
    suffix = uuid.uuid4().hex[:6]
    overrides: dict[str, Any] = getattr(request, "param", {})
    settings = VirtualKubeletSettings(
        consumer_kubeconfig=consumer.spec.kubeconfig,
        provider_kubeconfig=provider.spec.kubeconfig,
        consumer_cluster_id=f"cons-{suffix}",
        provider_cluster_id=f"prov-{suffix}",
        resources={"nvidia.com/gpu": "16", "cpu": "128", "memory": "1Ti", "pods": "110"},
        provider_node_selector=H100,
        heartbeat_seconds=2,
        status_seconds=5,
        provider_probe_seconds=1,
        resync_seconds=5,
        metrics_port=free_port(),
    )
    settings = dataclasses.replace(settings, **overrides)
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


async def scrape(port: int) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """The virtual kubelet's /metrics, parsed: (name, labels) -> value."""
    async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}/metrics") as resp:
        assert resp.status == 200
        text = await resp.text()
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples


def gpu_spec(gpus: int, *, tolerate: bool = True) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [
            {
                "name": "cuda",
                "image": "nvcr.io/nvidia/pytorch:25.01-py3",
                "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
            }
        ],
        "terminationGracePeriodSeconds": 5,
    }
    if tolerate:
        spec["tolerations"] = [TOLERATION]
    return spec


def pod(name: str, gpus: int, *, tolerate: bool = True) -> RawObject:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": gpu_spec(gpus, tolerate=tolerate),
    }


def scheduled(p: RawObject) -> bool:
    return bool(p["spec"].get("nodeName"))


def running(p: RawObject) -> bool:
    return p.get("status", {}).get("phase") == "Running"


def leaving(pods: list[RawObject], nodes: set[str], terminating: set[str]) -> list[str]:
    """The pods on ``nodes`` that are on their way out: being deleted, or in a namespace that
    is (whose pods the namespace controller has yet to mark)."""
    return [
        f"{p['metadata']['namespace']}/{p['metadata']['name']}"
        for p in pods
        if p["spec"].get("nodeName") in nodes
        and ("deletionTimestamp" in p["metadata"] or p["metadata"]["namespace"] in terminating)
    ]


async def h100_room(
    provider_client: KubeClient, timeout: float = 60
) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """The free room of each H100 node, and the pods on them on their way out, once one node is
    idle (8 GPUs free) and none is leaving, or as they are after ``timeout``: an earlier test's pods
    leave with its namespace, which is deleted at its end but goes on its own time, and a node
    they free after this snapshot would be room a test did not count on."""
    deadline = time.monotonic() + timeout
    while True:
        nodes = (await provider_client.list(NODES, label_selector=H100_SELECTOR))["items"]
        pods = (await provider_client.list(PODS))["items"]
        terminating = {
            n["metadata"]["name"]
            for n in (await provider_client.list(NAMESPACES))["items"]
            if "deletionTimestamp" in n["metadata"]
        }
        free = per_node_free(nodes, pods, selector=H100)
        going = leaving(pods, set(free), terminating)
        idle = any(room.get("nvidia.com/gpu", 0) == 8 for room in free.values())
        if (idle and not going) or time.monotonic() > deadline:
            return free, going
        await asyncio.sleep(0.5)


async def fill_h100_nodes(provider_client: KubeClient, namespace: str, *, but_one: bool = False) -> str:
    """Fill the H100 nodes with blockers (bound directly, as a kubelet would see them), all of
    them or all but one; returns the name of a node that was idle (the one left, with
    ``but_one``)."""
    free, going = await h100_room(provider_client)
    whole = [name for name, room in free.items() if room.get("nvidia.com/gpu", 0) == 8]
    assert whole, f"the test needs one idle H100 node; free now: {free}"
    # room freed after this snapshot would be left unblocked: say so rather than race it
    assert not going, f"earlier tests' pods still leaving the H100 nodes after 60 s: {going}"
    for name, room in free.items():
        gpus = int(room.get("nvidia.com/gpu", 0))
        if gpus and not (but_one and name == whole[0]):
            blocker = pod(f"blocker-{name}", gpus, tolerate=False)
            blocker["spec"]["nodeName"] = name
            await provider_client.create(PODS, blocker, namespace)
    return whole[0]


async def no_room_seen(consumer_client: KubeClient, vk: VirtualKubelet, gpus: int) -> None:
    """Wait until the virtual kubelet's view of the provider has no node with ``gpus`` free GPUs,
    as the virtual node's largest block says: the blockers just created are in the view its fit
    gate reads (a pod created before that could still be sent to the provider, and wait there)."""

    def fits_nowhere(node: RawObject) -> bool:
        shape = (node["metadata"].get("annotations") or {}).get(LARGEST_BLOCK_ANNOTATION)
        return shape is not None and int(json.loads(shape).get("nvidia.com/gpu", "0")) < gpus

    await wait_for(consumer_client, NODES, vk.node, fits_nowhere, timeout=30)


async def held_for_capacity(consumer_client: KubeClient, name: str, namespace: str) -> RawObject:
    """The consumer pod ``name`` once the virtual kubelet holds it for want of provider room."""
    return await wait_for(
        consumer_client,
        PODS,
        name,
        lambda p: p.get("status", {}).get("reason") == "ProviderCapacity",
        namespace=namespace,
        timeout=20,
    )


async def test_deployment_runs_as_twins_on_provider_gpu_nodes_and_scales_to_zero(
    vk: VirtualKubelet,
    consumer_client: KubeClient,
    provider_client: KubeClient,
    make_namespace: NamespaceFactory,
) -> None:
    ns = await make_namespace(consumer_client)
    deploy: RawObject = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "inference"},
        "spec": {
            "replicas": 10,
            "selector": {"matchLabels": {"app": "inference"}},
            "template": {"metadata": {"labels": {"app": "inference"}}, "spec": gpu_spec(1)},
        },
    }
    before = await scrape(vk.settings.metrics_port)
    await consumer_client.create(DEPLOYMENTS, deploy, ns)
    await wait_for(
        consumer_client,
        DEPLOYMENTS,
        "inference",
        lambda d: d.get("status", {}).get("readyReplicas") == 10,
        namespace=ns,
        timeout=90,
    )
    await asyncio.sleep(1)  # what follows Running (nothing should)
    after = await scrape(vk.settings.metrics_port)

    def sent(verb: str, resource: str) -> float:
        def total(samples: dict[tuple[str, frozenset[tuple[str, str]]], float]) -> float:
            return sum(v for (name, labels), v in samples.items() if name == "gpuferry_api_requests_total"
                       and ("verb", verb) in labels and ("resource", resource) in labels)  # fmt: skip

        return total(after) - total(before)

    # issue 15: one token and one token Secret per pod (two paths wrote both), and the namespace's
    # CA read per namespace, not per pod: once by the tokens (a burst shares one read), and by
    # the ConfigMap copier only until its watch of the namespace has listed
    assert sent("create", "serviceaccounts/token") == 10
    assert sent("create", "secrets") == 10 and sent("update", "secrets") == 0
    assert sent("get", "configmaps") < 10
    assert sent("create", "pods") == 10  # the twins

    local = {p["metadata"]["name"]: p for p in (await consumer_client.list(PODS, ns))["items"]}
    twins = {p["metadata"]["name"]: p for p in (await provider_client.list(PODS, vk.twin_ns(ns)))["items"]}
    assert len(local) == 10 and set(twins) == set(local)
    gpu_nodes = {
        n["metadata"]["name"]
        for n in (
            await provider_client.list(NODES, label_selector="nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3")
        )["items"]
    }
    for name, p in local.items():
        twin = twins[name]
        assert p["spec"]["nodeName"] == vk.node
        assert twin["spec"]["nodeName"] in gpu_nodes
        assert twin["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
        assert p["status"]["phase"] == twin["status"]["phase"] == "Running"
        assert p["status"]["podIP"] == twin["status"]["podIP"]
        assert [c["ready"] for c in p["status"]["containerStatuses"]] == [True]

    metrics = await scrape(vk.settings.metrics_port)
    assert metrics[("gpuferry_vk_pods", frozenset({("side", "consumer"), ("phase", "Running")}))] == 10
    assert metrics[("gpuferry_vk_pods", frozenset({("side", "provider"), ("phase", "Running")}))] == 10
    assert metrics[("gpuferry_vk_offload_seconds_count", frozenset({("stage", "running")}))] >= 10
    assert metrics[("gpuferry_vk_offload_seconds_count", frozenset({("stage", "twin_created")}))] >= 10
    assert metrics[("gpuferry_queue_depth", frozenset({("queue", "sync_pods_to_remote")}))] >= 0
    twins_created = sum(v for (name, labels), v in metrics.items() if name == "gpuferry_api_requests_total"
                        and ("verb", "create") in labels and ("resource", "pods") in labels)  # fmt: skip
    assert twins_created >= 10

    await consumer_client.patch(DEPLOYMENTS, "inference", {"spec": {"replicas": 0}}, ns)
    await wait_for_empty(consumer_client, PODS, ns)
    await wait_for_empty(provider_client, PODS, vk.twin_ns(ns))


async def test_job_completes_when_its_twins_complete(
    vk: VirtualKubelet, consumer_client: KubeClient, make_namespace: NamespaceFactory
) -> None:
    ns = await make_namespace(consumer_client)
    job: RawObject = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "finetune"},
        "spec": {
            "completions": 3,
            "parallelism": 3,
            "backoffLimit": 0,
            "template": {
                "metadata": {"annotations": {"gpuferry.io/simulate-complete-after": "2s"}},
                "spec": {**gpu_spec(2), "restartPolicy": "Never"},
            },
        },
    }
    await consumer_client.create(JOBS, job, ns)
    done = await wait_for(
        consumer_client,
        JOBS,
        "finetune",
        lambda j: (condition(j, "Complete") or {}).get("status") == "True",
        namespace=ns,
        timeout=90,
    )
    assert done["status"]["succeeded"] == 3


async def test_pod_larger_than_any_provider_node_gets_a_clear_answer(
    vk: VirtualKubelet, consumer_client: KubeClient, make_namespace: NamespaceFactory
) -> None:
    # the virtual node shows 16 GPUs, but no single H100 node has more than 8
    ns = await make_namespace(consumer_client)
    await consumer_client.create(PODS, pod("too-big", 12), ns)
    gated = await held_for_capacity(consumer_client, "too-big", ns)
    assert gated["spec"]["nodeName"] == vk.node
    assert gated["status"]["phase"] == "Pending"
    assert "12 nvidia.com/gpu" in gated["status"]["message"]
    # the Event is recorded just after the status: wait for it rather than race it, then count
    selector = "involvedObject.name=too-big"

    async def capacity_event() -> None:
        async for item in watch_objects(consumer_client, EVENTS, namespace=ns, field_selector=selector):
            if not isinstance(item, Listed) and item.object["reason"] == "ProviderCapacity":
                return

    await asyncio.wait_for(capacity_event(), 15)
    events = (await consumer_client.list(EVENTS, ns, field_selector=selector))["items"]
    assert [e["reason"] for e in events if e["reason"] == "ProviderCapacity"] == ["ProviderCapacity"]


@pytest.mark.parametrize("vk", [{"resync_seconds": 300}], indirect=True)  # no resync to hide behind
async def test_a_gated_pod_starts_as_soon_as_a_provider_node_has_room(
    vk: VirtualKubelet,
    consumer_client: KubeClient,
    provider_client: KubeClient,
    make_namespace: NamespaceFactory,
    provider_ns: str,
) -> None:
    idle = await fill_h100_nodes(provider_client, provider_ns)  # every H100 node full
    await no_room_seen(consumer_client, vk, 8)
    ns = await make_namespace(consumer_client)
    await consumer_client.create(PODS, pod("eight", 8), ns)
    gated = await held_for_capacity(consumer_client, "eight", ns)
    assert gated["status"]["phase"] == "Pending"
    # debugged while it waits (as kubectl debug does): the twin, which cannot be created with an
    # ephemeral container, gets it on the pass after its creation
    debugger = {"name": "early", "image": "busybox", "command": ["sh"]}
    await consumer_client.patch(PODS, "eight", {"spec": {"ephemeralContainers": [debugger]}}, ns,
                                subresource="ephemeralcontainers", patch_type="strategic")  # fmt: skip

    # room appears: the gate opens on the provider's watch, not on the 30 s retry timer
    await provider_client.delete(PODS, f"blocker-{idle}", provider_ns, grace_period_seconds=0)
    freed = time.monotonic()
    started = await wait_for(consumer_client, PODS, "eight", running, namespace=ns, timeout=60)
    waited = time.monotonic() - freed
    assert waited < GATE_RETRY_SECONDS, (
        f"the gated pod waited {waited:.1f}s: it was not retried on the change"
    )
    assert "reason" not in started["status"], "the ProviderCapacity reason is cleared once running"
    twin = await provider_client.get(PODS, "eight", vk.twin_ns(ns))
    assert twin["spec"]["nodeName"] == idle
    twin = await wait_for(provider_client, PODS, "eight", lambda p: "ephemeralContainers" in p["spec"],
                          namespace=vk.twin_ns(ns), timeout=15)  # fmt: skip
    assert [c["name"] for c in twin["spec"]["ephemeralContainers"]] == ["early"]


async def test_a_running_twin_takes_its_room_so_the_next_pod_waits_on_the_consumer(
    vk: VirtualKubelet,
    consumer_client: KubeClient,
    provider_client: KubeClient,
    make_namespace: NamespaceFactory,
    provider_ns: str,
) -> None:
    """The virtual kubelet counts its own twins on the provider's nodes from its twin watch (its
    watch of the provider's other pods leaves them out): with one idle node left, a pod's twin
    takes it, and the next pod of that size is held with a reason instead of sent to wait."""
    idle = await fill_h100_nodes(provider_client, provider_ns, but_one=True)
    ns = await make_namespace(consumer_client)
    await consumer_client.create(PODS, pod("first", 8), ns)
    await wait_for(consumer_client, PODS, "first", running, namespace=ns, timeout=60)
    twin = await provider_client.get(PODS, "first", vk.twin_ns(ns))
    assert twin["spec"]["nodeName"] == idle
    await consumer_client.create(PODS, pod("second", 8), ns)
    held = await held_for_capacity(consumer_client, "second", ns)
    assert held["status"]["phase"] == "Pending"
    with contextlib.suppress(NotFound):
        await provider_client.get(PODS, "second", vk.twin_ns(ns))
        raise AssertionError("the second pod got a twin, which could only wait on the provider")


async def test_pod_without_the_toleration_never_lands_on_the_virtual_node(
    vk: VirtualKubelet, consumer_client: KubeClient, make_namespace: NamespaceFactory
) -> None:
    ns = await make_namespace(consumer_client)
    await consumer_client.create(PODS, pod("no-toleration", 1, tolerate=False), ns)
    p = await wait_for(
        consumer_client,
        PODS,
        "no-toleration",
        lambda p: (condition(p, "PodScheduled") or {}).get("reason") == "Unschedulable",
        namespace=ns,
    )
    assert "nodeName" not in p["spec"]
    assert "untolerated taint" in condition(p, "PodScheduled")["message"]  # type: ignore[index]


async def test_twin_deleted_on_the_provider_is_reported_and_deletion_flows_both_ways(
    vk: VirtualKubelet,
    consumer_client: KubeClient,
    provider_client: KubeClient,
    make_namespace: NamespaceFactory,
) -> None:
    ns = await make_namespace(consumer_client)
    for name in ("victim", "normal"):
        await consumer_client.create(PODS, pod(name, 1), ns)
        await wait_for(consumer_client, PODS, name, running, namespace=ns, timeout=30)

    # deleted behind our back on the provider: the consumer pod says so
    await provider_client.delete(PODS, "victim", vk.twin_ns(ns), grace_period_seconds=0)
    failed = await wait_for(
        consumer_client,
        PODS,
        "victim",
        lambda p: p.get("status", {}).get("phase") == "Failed",
        namespace=ns,
        timeout=15,
    )
    assert failed["status"]["reason"] == "ProviderPodDeleted"

    # deleted on the consumer: the twin goes, then the consumer pod
    await consumer_client.delete(PODS, "normal", ns)

    await wait_for_deletion(consumer_client, PODS, "normal", ns, timeout=30)
    with pytest.raises(NotFound):
        await provider_client.get(PODS, "normal", vk.twin_ns(ns))


async def test_allowed_spec_changes_reach_the_twin(
    vk: VirtualKubelet,
    consumer_client: KubeClient,
    provider_client: KubeClient,
    make_namespace: NamespaceFactory,
) -> None:
    ns = await make_namespace(consumer_client)
    await consumer_client.create(PODS, pod("evolving", 1), ns)
    await wait_for(consumer_client, PODS, "evolving", running, namespace=ns, timeout=30)
    before = await provider_client.get(PODS, "evolving", vk.twin_ns(ns))
    await consumer_client.patch(
        PODS,
        "evolving",
        {
            "metadata": {"labels": {"stage": "eval"}, "annotations": {"team.example.com/owner": "ml"}},
            "spec": {
                "activeDeadlineSeconds": 3600,
                "containers": [{"name": "cuda", "image": "nvcr.io/nvidia/pytorch:25.02-py3"}],
            },
        },
        ns,
        patch_type="strategic",
    )
    twin = await wait_for(
        provider_client,
        PODS,
        "evolving",
        lambda p: p["spec"]["containers"][0]["image"].endswith("25.02-py3"),
        namespace=vk.twin_ns(ns),
        timeout=15,
    )
    assert twin["metadata"]["labels"]["stage"] == "eval"
    assert twin["metadata"]["annotations"]["team.example.com/owner"] == "ml"
    assert twin["spec"]["activeDeadlineSeconds"] == 3600
    assert twin["metadata"]["uid"] == before["metadata"]["uid"], "patched in place, not recreated"


async def test_kubectl_debug_reaches_the_twin_or_says_why_the_provider_refused(
    vk: VirtualKubelet,
    consumer: LocalCluster,
    consumer_client: KubeClient,
    provider_client: KubeClient,
    make_namespace: NamespaceFactory,
) -> None:
    """``kubectl debug`` adds an ephemeral container to the consumer pod; the virtual kubelet adds
    it to the twin. The twin namespace enforces Pod Security baseline (as the provider controller
    labels it): the default profile's ``--target`` asks for SYS_PTRACE, which the provider refuses.
    A Warning Event on the pod says so, once, with what to use instead; the next debugger is
    still added."""
    ns = await make_namespace(consumer_client)
    await consumer_client.create(PODS, pod("debugged", 1), ns)
    await wait_for(consumer_client, PODS, "debugged", running, namespace=ns, timeout=30)
    twin_ns = vk.twin_ns(ns)
    baseline = {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "baseline"}}}
    await provider_client.patch(NAMESPACES, twin_ns, baseline)

    def debug(*args: str) -> str:
        return consumer.kubectl(
            "-n", ns, "debug", "debugged", "--image=busybox", "--target=cuda", *args, "--", "sh"
        )

    await asyncio.to_thread(debug, "-c", "traced")  # the default profile
    await asyncio.to_thread(debug, "--profile=baseline", "-c", "looking")
    twin = await wait_for(
        provider_client,
        PODS,
        "debugged",
        lambda p: [c["name"] for c in p["spec"].get("ephemeralContainers") or ()] == ["looking"],
        namespace=twin_ns,
        timeout=15,
    )
    (looking,) = twin["spec"]["ephemeralContainers"]
    assert looking["targetContainerName"] == "cuda" and looking["command"] == ["sh"], looking

    def refused(events: list[RawObject]) -> list[RawObject]:
        return [e for e in events if e["reason"] == "EphemeralContainerRejected"]

    (event,) = refused(
        await wait_for_items(consumer_client, EVENTS, lambda e: bool(refused(e)), namespace=ns)
    )
    assert event["type"] == "Warning"
    assert event["involvedObject"]["fieldPath"] == "spec.ephemeralContainers{traced}"
    assert "SYS_PTRACE" in event["message"] and "--profile=baseline" in event["message"], event["message"]
    # a later pass over the pod (a label changed) neither asks again nor says it again
    await consumer_client.patch(PODS, "debugged", {"metadata": {"labels": {"looked": "yes"}}}, ns)
    twin = await wait_for(
        provider_client, PODS, "debugged", lambda p: p["metadata"]["labels"].get("looked") == "yes",
        namespace=twin_ns, timeout=15,
    )  # fmt: skip
    assert [c["name"] for c in twin["spec"]["ephemeralContainers"]] == ["looking"]
    assert len(refused((await consumer_client.list(EVENTS, namespace=ns))["items"])) == 1


async def test_an_orphan_twin_is_collected_on_resync(
    vk: VirtualKubelet,
    consumer_client: KubeClient,
    provider_client: KubeClient,
    make_namespace: NamespaceFactory,
) -> None:
    ns = await make_namespace(consumer_client)
    await consumer_client.create(PODS, pod("alive", 1), ns)
    await wait_for(consumer_client, PODS, "alive", running, namespace=ns, timeout=30)
    # a twin whose consumer pod no longer exists (as if deleted while the kubelet was down)
    ghost = pod("ghost", 1)
    ghost["metadata"].update(namespace=ns, uid=str(uuid.uuid4()))
    await provider_client.create(PODS, remote_pod(ghost, forge_options(vk.settings)), vk.twin_ns(ns))
    await wait_for_deletion(provider_client, PODS, "ghost", vk.twin_ns(ns), timeout=30)
    assert (await provider_client.get(PODS, "alive", vk.twin_ns(ns)))["status"]["phase"] == "Running"


async def test_a_twin_the_provider_scheduler_refuses_says_why_on_the_consumer(
    vk: VirtualKubelet,
    consumer_client: KubeClient,
    provider_client: KubeClient,
    make_namespace: NamespaceFactory,
    provider_ns: str,
) -> None:
    # every H100 node already has a pod on host port 8080: the fit gate (GPUs) lets the pod
    # through, the provider's scheduler cannot place it
    for node in (await provider_client.list(NODES, label_selector=H100_SELECTOR))["items"]:
        blocker = pod(f"port-{node['metadata']['name']}", 0, tolerate=False)
        blocker["spec"]["nodeName"] = node["metadata"]["name"]
        blocker["spec"]["containers"][0]["ports"] = [{"containerPort": 8080, "hostPort": 8080}]
        await provider_client.create(PODS, blocker, provider_ns)
    ns = await make_namespace(consumer_client)
    server = pod("server", 1)
    server["spec"]["containers"][0]["ports"] = [{"containerPort": 8080, "hostPort": 8080}]
    await consumer_client.create(PODS, server, ns)
    pending = await wait_for(
        consumer_client,
        PODS,
        "server",
        lambda p: p.get("status", {}).get("reason") == "ProviderUnschedulable",
        namespace=ns,
        timeout=30,
    )
    assert pending["status"]["phase"] == "Pending"
    assert pending["status"]["message"].startswith("provider scheduler: 0/")
    assert "free ports" in pending["status"]["message"]
    # on the consumer the pod is scheduled (on the virtual node), whatever the provider says
    assert (condition(pending, "PodScheduled") or {}).get("status") == "True"


async def test_configmaps_and_secrets_follow_the_pods_that_use_them(
    vk: VirtualKubelet,
    consumer_client: KubeClient,
    provider_client: KubeClient,
    make_namespace: NamespaceFactory,
) -> None:
    ns = await make_namespace(consumer_client)
    twin_ns = vk.twin_ns(ns)
    await consumer_client.create(
        CONFIGMAPS,
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "hyper"}, "data": {"lr": "3e-4"}},
        ns,
    )
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "s3"},
        "type": "Opaque",
        "data": {"key": "c2VjcmV0"},
    }
    await consumer_client.create(SECRETS, secret, ns)
    for name in ("reader-a", "reader-b"):
        spec = pod(name, 1)
        spec["spec"]["volumes"] = [{"name": "cfg", "configMap": {"name": "hyper"}}]
        spec["spec"]["containers"][0]["volumeMounts"] = [{"name": "cfg", "mountPath": "/etc/hyper"}]
        spec["spec"]["containers"][0]["envFrom"] = [{"secretRef": {"name": "s3"}}]
        await consumer_client.create(PODS, spec, ns)
    for name in ("reader-a", "reader-b"):
        await wait_for(consumer_client, PODS, name, running, namespace=ns, timeout=30)
    copy = await provider_client.get(CONFIGMAPS, "hyper", twin_ns)
    assert copy["data"] == {"lr": "3e-4"}
    assert (await provider_client.get(SECRETS, "s3", twin_ns))["data"] == {"key": "c2VjcmV0"}

    # an update reaches the copy
    await consumer_client.patch(CONFIGMAPS, "hyper", {"data": {"lr": "1e-4"}}, ns)
    await wait_for(
        provider_client, CONFIGMAPS, "hyper", lambda c: c["data"] == {"lr": "1e-4"}, namespace=twin_ns
    )

    # one user gone: still needed; both gone: the copies go
    await consumer_client.delete(PODS, "reader-a", ns)
    await wait_for_deletion(consumer_client, PODS, "reader-a", ns)
    await asyncio.sleep(1)
    assert (await provider_client.get(CONFIGMAPS, "hyper", twin_ns))["data"] == {"lr": "1e-4"}
    await consumer_client.delete(PODS, "reader-b", ns)
    await wait_for_deletion(provider_client, CONFIGMAPS, "hyper", twin_ns, timeout=30)
    await wait_for_deletion(provider_client, SECRETS, "s3", twin_ns, timeout=30)


async def test_a_consumer_service_lists_the_twins_addresses(
    vk: VirtualKubelet,
    consumer_client: KubeClient,
    provider_client: KubeClient,
    make_namespace: NamespaceFactory,
) -> None:
    ns = await make_namespace(consumer_client)
    for name in ("serve-0", "serve-1"):
        spec = pod(name, 1)
        spec["metadata"]["labels"] = {"app": "serve"}
        spec["spec"]["containers"][0]["ports"] = [{"containerPort": 8000, "name": "http"}]
        await consumer_client.create(PODS, spec, ns)
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "llm"},
        "spec": {"selector": {"app": "serve"}, "ports": [{"port": 80, "targetPort": "http"}]},
    }
    await consumer_client.create(SERVICES, service, ns)
    twin_ips = set()
    for name in ("serve-0", "serve-1"):
        await wait_for(consumer_client, PODS, name, running, namespace=ns, timeout=30)
        twin = await wait_for(
            provider_client, PODS, name, lambda p: bool(p["status"].get("podIP")), namespace=vk.twin_ns(ns)
        )
        twin_ips.add(twin["status"]["podIP"])

    def ready_addresses(slice_: RawObject) -> set[str]:
        return {
            a
            for e in slice_.get("endpoints") or []
            if (e.get("conditions") or {}).get("ready")
            for a in e["addresses"]
        }

    async def endpoints() -> set[str]:
        seen: dict[str, set[str]] = {}
        selector = "kubernetes.io/service-name=llm"
        async for item in watch_objects(
            consumer_client, ENDPOINTSLICES, namespace=ns, label_selector=selector
        ):
            if isinstance(item, Listed):
                continue
            seen[item.key.name] = set() if item.type == "DELETED" else ready_addresses(item.object)
            if set().union(*seen.values()) == twin_ips:
                return twin_ips
        raise AssertionError("watch ended")

    # the consumer's own EndpointSlice controller, from the reflected pod status
    assert await asyncio.wait_for(endpoints(), 30) == twin_ips


async def test_no_twin_before_its_namespace_has_the_consumers_ca(
    vk: VirtualKubelet, consumer_client: KubeClient, provider_client: KubeClient
) -> None:
    """A pod in a namespace made a moment ago, before the controller-manager published its
    ``kube-root-ca.crt``: the twin waits for the CA, as a kubelet waits to build the volume,
    instead of running with a token Secret whose CA is empty until the token's renewal (CI,
    2026-11-27: "BEGIN CERTIFICATE" in ''). A ValidatingAdmissionPolicy holds the publisher back."""
    tag = uuid.uuid4().hex[:6]
    label = {"gpuferry-test-ca-held": tag}
    held = ["kube-root-ca.crt", "vap-probe"]
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": f"hold-root-ca-{tag}"},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "namespaceSelector": {"matchLabels": label},
                "resourceRules": [
                    {
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE"],
                        "resources": ["configmaps"],
                    }
                ],
            },
            "validations": [{"expression": f"!(object.metadata.name in {held})", "message": "held"}],
        },
    }
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": f"hold-root-ca-{tag}"},
        "spec": {"policyName": f"hold-root-ca-{tag}", "validationActions": ["Deny"]},
    }
    probe_ns, ns = f"ca-probe-{tag}", f"ca-held-{tag}"
    namespaces = [probe_ns, ns]
    await consumer_client.create(VALIDATINGADMISSIONPOLICIES, policy)
    await consumer_client.create(VALIDATINGADMISSIONPOLICYBINDINGS, binding)
    try:
        await consumer_client.create(NAMESPACES, {"metadata": {"name": probe_ns, "labels": label}})
        deadline = time.monotonic() + 30
        while True:  # the policy is in force once the API server has loaded it
            try:
                probe = {"metadata": {"name": "vap-probe"}}
                await consumer_client.create(CONFIGMAPS, probe, probe_ns, dry_run=True)
            except (Invalid, Forbidden):
                break
            assert time.monotonic() < deadline, "the policy never took effect"
            await asyncio.sleep(0.2)
        await consumer_client.create(NAMESPACES, {"metadata": {"name": ns, "labels": label}})
        await wait_for(consumer_client, SERVICEACCOUNTS, "default", lambda _: True, namespace=ns)
        await consumer_client.create(PODS, pod("caller", 1), ns)
        # held, and the pod says why, as a kubelet's FailedMount does
        held_pod = await wait_for(
            consumer_client,
            PODS,
            "caller",
            lambda p: p.get("status", {}).get("reason") == REASON_MOUNT,
            namespace=ns,
            timeout=30,
        )
        assert held_pod["status"]["phase"] == "Pending"
        assert f"kube-root-ca.crt in {ns}" in held_pod["status"]["message"]
        events = await wait_for_items(  # recorded just after the status: wait for it, not race it
            consumer_client,
            EVENTS,
            lambda items: any(e["reason"] == REASON_MOUNT for e in items),
            namespace=ns,
            timeout=15,
        )
        assert [e["type"] for e in events if e["reason"] == REASON_MOUNT] == ["Warning"]
        await asyncio.sleep(2)  # and stays held through its retries (one a second)
        with pytest.raises(NotFound):
            await consumer_client.get(CONFIGMAPS, "kube-root-ca.crt", ns)
        with pytest.raises(NotFound):
            await provider_client.get(PODS, "caller", vk.twin_ns(ns))
        with pytest.raises(NotFound):
            await provider_client.get(SECRETS, "caller-gpuferry-token", vk.twin_ns(ns))

        # the CA published: the twin follows, with it
        await consumer_client.delete(VALIDATINGADMISSIONPOLICYBINDINGS, binding["metadata"]["name"])
        ca = (await consumer_client.get(CONFIGMAPS, "kube-root-ca.crt", "default"))["data"]
        published = {"metadata": {"name": "kube-root-ca.crt"}, "data": ca}
        deadline = time.monotonic() + 30
        while True:  # the API server lets go of the binding a moment after its deletion
            try:
                await consumer_client.create(CONFIGMAPS, published, ns)
            except AlreadyExists:  # the controller-manager did it first
                break
            except (Invalid, Forbidden):
                assert time.monotonic() < deadline, "the policy never let go"
                await asyncio.sleep(0.2)
            else:
                break
        started = await wait_for(consumer_client, PODS, "caller", running, namespace=ns, timeout=30)
        assert "reason" not in started["status"], "the FailedMount reason is cleared once running"
        secret = await provider_client.get(SECRETS, "caller-gpuferry-token", vk.twin_ns(ns))
        assert base64.b64decode(secret["data"]["ca.crt"]).decode() == ca["ca.crt"]
    finally:
        # its GPU back before the next test counts the provider's room
        with contextlib.suppress(NotFound):
            await consumer_client.delete(PODS, "caller", ns, grace_period_seconds=0)
        await wait_for_deletion(provider_client, PODS, "caller", vk.twin_ns(ns))
        with contextlib.suppress(NotFound):
            await consumer_client.delete(VALIDATINGADMISSIONPOLICYBINDINGS, binding["metadata"]["name"])
        with contextlib.suppress(NotFound):
            await consumer_client.delete(VALIDATINGADMISSIONPOLICIES, policy["metadata"]["name"])
        for name in namespaces:
            with contextlib.suppress(NotFound):
                await consumer_client.delete(NAMESPACES, name)


async def test_the_twin_gets_its_consumer_pods_service_account_token(
    vk: VirtualKubelet,
    consumer: LocalCluster,
    consumer_client: KubeClient,
    provider_client: KubeClient,
    make_namespace: NamespaceFactory,
) -> None:
    ns = await make_namespace(consumer_client)
    await consumer_client.create(PODS, pod("caller", 1), ns)  # admission adds kube-api-access-*
    await wait_for(consumer_client, PODS, "caller", running, namespace=ns, timeout=30)
    twin = await provider_client.get(PODS, "caller", vk.twin_ns(ns))
    (volume,) = [v for v in twin["spec"]["volumes"] if v["name"].startswith("kube-api-access-")]
    secret_names = {s["secret"]["name"] for s in volume["projected"]["sources"]}
    assert secret_names == {"caller-gpuferry-token"}
    secret = await provider_client.get(SECRETS, "caller-gpuferry-token", vk.twin_ns(ns))
    data = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    assert data["namespace"] == ns and "BEGIN CERTIFICATE" in data["ca.crt"]

    # the token is the consumer's: it authenticates there as the pod's service account
    connection = Connection(server=consumer.spec.server, ca_pem=data["ca.crt"].encode(), token=data["token"])
    async with KubeClient(connection) as as_pod:
        review = await as_pod.create(
            SELFSUBJECTREVIEWS, {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
        )
    user = review["status"]["userInfo"]
    assert user["username"] == f"system:serviceaccount:{ns}:default"
    assert user["extra"]["authentication.kubernetes.io/pod-name"] == ["caller"]  # bound to the pod

    await consumer_client.delete(PODS, "caller", ns)
    await wait_for_deletion(provider_client, SECRETS, "caller-gpuferry-token", vk.twin_ns(ns), timeout=30)


PEERNET_NS = "gpuferry-test-peernet"


@pytest.mark.parametrize("vk", [{"peer_network_namespace": PEERNET_NS}], indirect=True)
async def test_pod_ips_are_reported_in_the_view_the_network_fabric_publishes(
    vk: VirtualKubelet,
    consumer_client: KubeClient,
    provider_client: KubeClient,
    make_namespace: NamespaceFactory,
) -> None:
    from netfabric.keys import generate_private_key, public_key
    from peering.crds import ensure_crds
    from vk.reflection.addresses import PEERNETWORKS

    await ensure_crds(consumer_client)
    with contextlib.suppress(AlreadyExists):
        await consumer_client.create(
            NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": PEERNET_NS}}
        )
    ns = await make_namespace(consumer_client)
    await consumer_client.create(PODS, pod("remapped", 1), ns)
    before = await wait_for(consumer_client, PODS, "remapped", running, namespace=ns, timeout=30)
    twin_ip = (await provider_client.get(PODS, "remapped", vk.twin_ns(ns)))["status"]["podIP"]
    assert before["status"]["podIP"] == twin_ip, "no PeerNetwork yet: the provider's address"

    # the fabric comes up and publishes the provider's pods as 10.70.0.0/16 in our view
    peer: RawObject = {
        "apiVersion": PEERNETWORKS.api_version,
        "kind": PEERNETWORKS.kind,
        "metadata": {"name": vk.settings.provider_cluster_id},
        "spec": {
            "clusterID": vk.settings.provider_cluster_id,
            "podCIDRs": ["10.244.0.0/16"],
            "serviceCIDRs": ["10.96.0.0/16"],
            "publicKey": public_key(generate_private_key()),
        },
    }
    await consumer_client.create(PEERNETWORKS, peer, PEERNET_NS)
    try:
        await consumer_client.patch(
            PEERNETWORKS,
            peer["metadata"]["name"],
            {"status": {"remappedPodCIDRs": ["10.70.0.0/16"]}},
            PEERNET_NS,
            subresource="status",
        )
        expected = "10.70." + twin_ip.split(".", 2)[2]
        remapped = await wait_for(
            consumer_client,
            PODS,
            "remapped",
            lambda p: p["status"].get("podIP") == expected,
            namespace=ns,
            timeout=20,
        )
        assert remapped["status"]["podIPs"] == [{"ip": expected}]
    finally:
        await consumer_client.delete(PEERNETWORKS, peer["metadata"]["name"], PEERNET_NS)
    # the fabric goes away: back to the provider's addresses
    await wait_for(
        consumer_client,
        PODS,
        "remapped",
        lambda p: p["status"].get("podIP") == twin_ip,
        namespace=ns,
        timeout=20,
    )


def copied_about(events: list[RawObject], uid: str) -> list[RawObject]:
    """The Events copied from the provider about the consumer pod of ``uid``."""
    return [
        e for e in events
        if e["involvedObject"].get("uid") == uid
        and (e.get("source") or {}).get("component", "").startswith("gpuferry/provider")
    ]  # fmt: skip


async def test_provider_events_about_a_twin_show_on_the_consumer_pod_once(
    vk: VirtualKubelet,
    consumer_client: KubeClient,
    provider_client: KubeClient,
    make_namespace: NamespaceFactory,
) -> None:
    ns = await make_namespace(consumer_client)
    created = await consumer_client.create(PODS, pod("observed", 1), ns)
    await wait_for(consumer_client, PODS, "observed", running, namespace=ns, timeout=30)
    twin = await provider_client.get(PODS, "observed", vk.twin_ns(ns))
    uid = created["metadata"]["uid"]

    def about_it(events: list[RawObject]) -> list[RawObject]:
        return copied_about(events, uid)

    reflected = about_it(await wait_for_items(
        consumer_client, EVENTS, lambda items: any(e["reason"] == "Scheduled" for e in about_it(items)),
        namespace=ns, timeout=20,
    ))  # fmt: skip
    (scheduled,) = [e for e in reflected if e["reason"] == "Scheduled"]
    assert twin["spec"]["nodeName"] in scheduled["message"], "where the provider placed it"
    assert scheduled["source"]["component"] == "gpuferry/provider default-scheduler"
    # later updates and relists of the provider events add nothing twice
    await asyncio.sleep(6)
    selector = f"involvedObject.uid={uid}"
    again = about_it((await consumer_client.list(EVENTS, ns, field_selector=selector))["items"])
    assert sorted(e["metadata"]["name"] for e in again) == sorted(e["metadata"]["name"] for e in reflected)


@pytest.mark.parametrize("vk", [{"provider_events": "warnings"}], indirect=True)
async def test_with_warnings_only_a_twins_normal_events_stay_on_the_provider(
    vk: VirtualKubelet,
    consumer_client: KubeClient,
    provider_client: KubeClient,
    make_namespace: NamespaceFactory,
) -> None:
    """``--provider-events warnings``: the provider's scheduler placing the twin (Normal) is not
    copied, a Warning about it is. The copier writes what its watch brings in order, so once
    the Warning is on the consumer, a Normal Event from before it would be there too."""
    ns = await make_namespace(consumer_client)
    created = await consumer_client.create(PODS, pod("quiet", 1), ns)
    await wait_for(consumer_client, PODS, "quiet", running, namespace=ns, timeout=30)
    twin_ns = vk.twin_ns(ns)
    twin = await provider_client.get(PODS, "quiet", twin_ns)
    twin_uid = twin["metadata"]["uid"]
    await wait_for_items(  # the Normal Event there is to leave behind
        provider_client, EVENTS,
        lambda items: any(e["reason"] == "Scheduled" and e["involvedObject"].get("uid") == twin_uid
                          for e in items),
        namespace=twin_ns, timeout=20,
    )  # fmt: skip
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    await provider_client.create(EVENTS, {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": f"quiet.{uuid.uuid4().hex[:8]}"},
        "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": "quiet", "namespace": twin_ns,
                           "uid": twin_uid},
        "type": "Warning", "reason": "BackOff", "message": "Back-off restarting failed container cuda",
        "source": {"component": "kubelet"}, "firstTimestamp": now, "lastTimestamp": now, "count": 1,
    }, twin_ns)  # fmt: skip
    uid = created["metadata"]["uid"]
    copied = copied_about(await wait_for_items(
        consumer_client, EVENTS,
        lambda items: any(e["reason"] == "BackOff" for e in copied_about(items, uid)),
        namespace=ns, timeout=20,
    ), uid)  # fmt: skip
    assert [(e["type"], e["reason"]) for e in copied] == [("Warning", "BackOff")]
    assert copied[0]["source"]["component"] == "gpuferry/provider kubelet"


PODDISRUPTIONBUDGETS = Resource(
    "policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", namespaced=True
)


async def test_kubectl_drain_of_the_virtual_node_keeps_budgets_and_the_cordon_holds(
    vk: VirtualKubelet,
    consumer: LocalCluster,
    consumer_client: KubeClient,
    provider_client: KubeClient,
    make_namespace: NamespaceFactory,
) -> None:
    """A provider's maintenance, done from the consumer as for any node: ``kubectl drain`` of
    the virtual node evicts its pods within their PodDisruptionBudget, each twin going with its
    pod; the cordon holds through the virtual kubelet's own writes of its Node (heartbeat,
    status, taints); ``uncordon`` lets the pods back, each with a new twin."""
    ns = await make_namespace(consumer_client)
    labels = {"app": "trainer"}
    deploy: RawObject = {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "trainer"},
        "spec": {"replicas": 3, "selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels}, "spec": gpu_spec(1)}},
    }  # fmt: skip

    def ready(count: int) -> Callable[[RawObject], bool]:
        return lambda d: (d.get("status") or {}).get("readyReplicas") == count

    await consumer_client.create(DEPLOYMENTS, deploy, ns)
    await wait_for(consumer_client, DEPLOYMENTS, "trainer", ready(3), namespace=ns, timeout=60)
    budget = {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "trainer"},
              "spec": {"maxUnavailable": 1, "selector": {"matchLabels": labels}}}  # fmt: skip
    await consumer_client.create(PODDISRUPTIONBUDGETS, budget, ns)
    await wait_for(consumer_client, PODDISRUPTIONBUDGETS, "trainer",
                   lambda b: (b.get("status") or {}).get("disruptionsAllowed") == 1,
                   namespace=ns, timeout=30)  # fmt: skip

    def drain(timeout: str) -> str:  # in a thread: the virtual kubelet runs on this event loop
        return consumer.kubectl("drain", vk.node, "--ignore-daemonsets", f"--timeout={timeout}")

    # the budget allows one pod down, and its replacement has nowhere to go: the drain evicts
    # one and then waits, as on any node
    with pytest.raises(KubectlFailed, match="disruption budget"):
        await asyncio.to_thread(drain, "15s")
    listed = (await consumer_client.list(PODS, ns))["items"]
    bound = [p for p in listed if p["spec"].get("nodeName") == vk.node]
    where = [(p["metadata"]["name"], p["spec"].get("nodeName")) for p in listed]
    assert len(listed) == 3 and len(bound) == 2, where
    twins = (await provider_client.list(PODS, vk.twin_ns(ns)))["items"]
    assert sorted(t["metadata"]["name"] for t in twins) == sorted(p["metadata"]["name"] for p in bound)

    # the cordon holds through the virtual kubelet's heartbeats and status writes
    await asyncio.sleep(vk.settings.status_seconds + vk.settings.heartbeat_seconds)
    node = await consumer_client.get(NODES, vk.node)
    assert node["spec"].get("unschedulable") is True, node["spec"]
    assert "node.kubernetes.io/unschedulable" in {t["key"] for t in node["spec"].get("taints") or []}

    await consumer_client.delete(PODDISRUPTIONBUDGETS, "trainer", ns)
    await asyncio.to_thread(drain, "60s")
    await wait_for_empty(provider_client, PODS, vk.twin_ns(ns))
    listed = (await consumer_client.list(PODS, ns))["items"]
    assert len(listed) == 3 and not [p for p in listed if p["spec"].get("nodeName")], listed

    await asyncio.to_thread(consumer.kubectl, "uncordon", vk.node)
    await wait_for(consumer_client, DEPLOYMENTS, "trainer", ready(3), namespace=ns, timeout=60)
    twins = (await provider_client.list(PODS, vk.twin_ns(ns)))["items"]
    assert len(twins) == 3 and all(t["status"].get("phase") == "Running" for t in twins)
