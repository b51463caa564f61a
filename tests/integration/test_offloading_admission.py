"""The consumer's MutatingAdmissionPolicy for offloaded namespaces, on the real API server."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import yaml

from kube.api import PROVIDER_LABEL, PROVIDER_UNREACHABLE_TAINT_KEY, SYSTEM_NAMESPACE
from kube.clients import KubeClient
from kube.errors import AlreadyExists, Forbidden, NotFound
from kube.informers import Informer
from kube.metrics import REGISTRY
from kube.objects import (
    CONFIGMAPS,
    MUTATINGADMISSIONPOLICIES,
    MUTATINGADMISSIONPOLICYBINDINGS,
    NAMESPACEOFFLOADINGS,
    NAMESPACES,
    NODES,
    PODS,
    RESOURCEQUOTAS,
    SECRETS,
    ObjectKey,
    RawObject,
)
from kube.settings import ClientSettings
from peering.admission import (
    OFFLOADING_NAME,
    TAINT_KEY,
    admission_binding,
    admission_objects,
    admission_policy,
)
from peering.admissionprobe import Probe, admission_in_effect
from peering.clusterid import CLUSTER_ID_CONFIGMAP
from peering.consumer.offloadings import FIELD_MANAGER as AGENT_FIELD_MANAGER
from peering.consumer.offloadings import NamespaceOffloadingReconciler
from peering.consumer.providers import ProviderClients
from peering.crds import ensure_crds
from peering.resources import identity_secret_name

from .conftest import NamespaceFactory
from .waiting import wait_for_deletion

pytestmark = pytest.mark.integration


@pytest.fixture
async def policy(consumer_client: KubeClient) -> AsyncIterator[None]:
    await ensure_crds(consumer_client)
    for resource, body in admission_objects():  # what the consumer agent applies once a minute
        await consumer_client.patch(resource, body["metadata"]["name"], body, patch_type="apply",
                                    field_manager=AGENT_FIELD_MANAGER, force=True)  # fmt: skip
    yield
    for resource, body in (
        (MUTATINGADMISSIONPOLICYBINDINGS, admission_binding()),
        (MUTATINGADMISSIONPOLICIES, admission_policy()),
    ):
        with contextlib.suppress(NotFound):
            await consumer_client.delete(resource, body["metadata"]["name"])


def gpu_pod(name: str, **spec: Any) -> RawObject:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "containers": [{"name": "c", "image": "cuda", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
            **spec,
        },
    }


async def offload(client: KubeClient, namespace: str, strategy: str) -> None:
    body = {
        "apiVersion": NAMESPACEOFFLOADINGS.api_version,
        "kind": NAMESPACEOFFLOADINGS.kind,
        "metadata": {"name": OFFLOADING_NAME},
        "spec": {"podOffloadingStrategy": strategy},
    }
    await client.create(NAMESPACEOFFLOADINGS, body, namespace)


async def admitted(
    client: KubeClient, namespace: str, pod: RawObject, *, expect_mutated: bool = True
) -> RawObject:
    """The pod as admitted (dry run). The policy and its parameters reach the admission plugin
    through informers, so a first answer may predate them: ask again for a few seconds."""
    answer: RawObject = {}
    for _ in range(50):
        name = f"{pod['metadata']['name']}-{uuid.uuid4().hex[:4]}"
        answer = await client.create(PODS, {**pod, "metadata": {"name": name}}, namespace, dry_run=True)
        if tolerates(answer) == expect_mutated:
            return answer
        await asyncio.sleep(0.2)
    return answer


def tolerates(pod: RawObject) -> bool:
    return any(t.get("key") == TAINT_KEY for t in pod["spec"].get("tolerations") or [])


async def test_pods_of_an_offloaded_namespace_become_eligible_for_virtual_nodes(
    policy: None, consumer_client: KubeClient, make_namespace: NamespaceFactory
) -> None:
    ns = await make_namespace(consumer_client)
    await offload(consumer_client, ns, "LocalAndRemote")
    pod = await admitted(consumer_client, ns, gpu_pod("train"))
    matching = [t for t in pod["spec"]["tolerations"] if t.get("key") == TAINT_KEY]
    assert matching == [{"key": TAINT_KEY, "operator": "Exists", "effect": "NoExecute"}]
    assert "type" not in (pod["spec"].get("nodeSelector") or {}), "LocalAndRemote: the scheduler chooses"
    # the default tolerations admission adds are still there
    assert {t["key"] for t in pod["spec"]["tolerations"]} >= {"node.kubernetes.io/not-ready"}

    # a pod that already tolerates the taint is not given a second toleration
    own = {"key": TAINT_KEY, "operator": "Exists", "effect": "NoExecute"}
    pod = await admitted(consumer_client, ns, gpu_pod("explicit", tolerations=[own]))
    assert [t for t in pod["spec"]["tolerations"] if t.get("key") == TAINT_KEY] == [own]


async def test_remote_only_pins_pods_to_virtual_nodes_and_keeps_their_selector(
    policy: None, consumer_client: KubeClient, make_namespace: NamespaceFactory
) -> None:
    ns = await make_namespace(consumer_client)
    await offload(consumer_client, ns, "Remote")
    pod = await admitted(
        consumer_client,
        ns,
        gpu_pod("train", nodeSelector={"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}),
    )
    assert pod["spec"]["nodeSelector"] == {
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
        "type": "virtual-kubelet",
    }
    pod = await admitted(consumer_client, ns, gpu_pod("bare"))
    assert pod["spec"]["nodeSelector"] == {"type": "virtual-kubelet"}


async def test_other_namespaces_are_left_alone(
    policy: None, consumer_client: KubeClient, make_namespace: NamespaceFactory
) -> None:
    offloaded, plain = await make_namespace(consumer_client), await make_namespace(consumer_client)
    await offload(consumer_client, offloaded, "Remote")
    await admitted(consumer_client, offloaded, gpu_pod("probe"))  # the policy is live now
    pod = await consumer_client.create(PODS, gpu_pod("local"), plain, dry_run=True)
    assert not tolerates(pod)
    assert "nodeSelector" not in pod["spec"]


async def test_a_provider_restriction_becomes_a_required_node_affinity(
    policy: None, consumer_client: KubeClient, make_namespace: NamespaceFactory
) -> None:
    ns = await make_namespace(consumer_client)
    await offload(consumer_client, ns, "LocalAndRemote")
    await consumer_client.patch(
        NAMESPACEOFFLOADINGS,
        OFFLOADING_NAME,
        {"status": {"allowedProviders": ["gpu-farm-a"]}},
        ns,
        subresource="status",
    )
    expected = {
        "nodeSelectorTerms": [
            {
                "matchExpressions": [
                    {"key": "gpuferry.io/provider", "operator": "In", "values": ["gpu-farm-a"]}
                ]
            }
        ]
    }

    def pinned(pod: RawObject) -> bool:
        affinity = (pod["spec"].get("affinity") or {}).get("nodeAffinity") or {}
        return affinity.get("requiredDuringSchedulingIgnoredDuringExecution") == expected

    for _ in range(50):  # the parameter's new status reaches the admission plugin by informer
        pod = await admitted(consumer_client, ns, gpu_pod("train"))
        if pinned(pod):
            break
        await asyncio.sleep(0.2)
    assert pinned(pod), pod["spec"].get("affinity")
    # a pod with a node affinity of its own: kept as the user wrote it (only the toleration added)
    own = {
        "nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 1,
                    "preference": {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
                }
            ]
        }
    }
    pod = await admitted(consumer_client, ns, gpu_pod("mine", affinity=own))
    assert (
        pod["spec"]["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
        == own["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    )
    assert pinned(pod), "a preferred term of its own does not escape the restriction"
    required = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
                ]
            }
        }
    }
    pod = await admitted(consumer_client, ns, gpu_pod("strict", affinity=required))
    assert pod["spec"]["affinity"] == required


async def test_the_probe_says_when_the_rule_is_live_in_a_namespace_that_enforces_restricted_pods(
    policy: None, consumer_client: KubeClient, make_namespace: NamespaceFactory
) -> None:
    ns = await make_namespace(consumer_client)
    restricted = {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "restricted"}}}
    await consumer_client.patch(NAMESPACES, ns, restricted)
    with pytest.raises(Forbidden, match="restricted"):  # a pod as users write it is refused there
        await consumer_client.create(PODS, gpu_pod("plain"), ns, dry_run=True)

    async def probed(strategy: str, until: bool) -> Probe:
        probe = Probe(None, "not asked")
        for _ in range(50):  # the namespace's ServiceAccount, the policy's informers: seconds
            probe = await admission_in_effect(consumer_client, ns, strategy)
            if probe.live is until:
                break
            await asyncio.sleep(0.2)
        return probe

    # not offloaded: the probe is admitted (it passes the restricted level) but left unchanged
    assert await probed("LocalAndRemote", False) == Probe(
        False, "pods are still admitted without the virtual-node toleration"
    )
    await offload(consumer_client, ns, "Remote")
    assert await probed("Remote", True) == Probe(True)
    assert (await consumer_client.list(PODS, ns))["items"] == [], "a dry-run pod is never stored"


async def test_a_probe_the_namespaces_own_rules_refuse_cannot_tell(
    policy: None, consumer_client: KubeClient, make_namespace: NamespaceFactory
) -> None:
    ns = await make_namespace(consumer_client)
    quota = {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "no-pods"},
             "spec": {"hard": {"pods": "0"}}}  # fmt: skip
    await consumer_client.create(RESOURCEQUOTAS, quota, ns)
    await offload(consumer_client, ns, "LocalAndRemote")
    # refused for the namespace's quota ("status unknown" until the controller manager counts
    # it, then "exceeded"): the users' pods meet the same, so waiting for the probe would not end
    probe = await admission_in_effect(consumer_client, ns, "LocalAndRemote")
    assert probe.live is None and "quota: no-pods" in probe.detail, probe


def admission_applies(client: KubeClient) -> float:
    """Server-side applies of the admission objects this process's clients sent to ``client``'s
    API server so far (its ``gpuferry_api_requests_total``)."""
    total = 0.0
    for resource, _ in admission_objects():
        labels = {"verb": "patch", "resource": resource.plural, "server": client.server}
        total += REGISTRY.get_sample_value("gpuferry_api_requests_total", labels) or 0.0
    return total


async def test_the_offloading_controller_applies_the_admission_objects_once_a_resync_not_every_pass(
    policy: None, consumer_client: KubeClient, make_namespace: NamespaceFactory
) -> None:
    ns = await make_namespace(consumer_client)
    await offload(consumer_client, ns, "LocalAndRemote")
    key = ObjectKey(ns, OFFLOADING_NAME)
    # no virtual node: the offloading selects no provider, and asks none
    nodes = Informer(consumer_client, NODES, name="virtual-nodes", label_selector="gpuferry.io/none=none")
    reconciler = NamespaceOffloadingReconciler(
        consumer_client, virtual_nodes=nodes, clients=ProviderClients(), admission_resync=8.0
    )
    before = admission_applies(consumer_client)
    # a pass every few seconds, as an offloading held Pending gets, and four at once (all well
    # within the resync, on a busy machine too)
    for _ in range(3):
        await reconciler.reconcile(key)
    await asyncio.gather(*(reconciler.reconcile(key) for _ in range(4)))
    assert admission_applies(consumer_client) - before == len(admission_objects())
    offloading = await consumer_client.get(NAMESPACEOFFLOADINGS, OFFLOADING_NAME, ns)
    assert offloading["status"]["phase"] == "NoClusterSelected"
    # deleted by hand meanwhile: put back once the resync is due
    await consumer_client.delete(MUTATINGADMISSIONPOLICIES, admission_policy()["metadata"]["name"])
    await asyncio.sleep(8.1)
    await reconciler.reconcile(key)
    assert admission_applies(consumer_client) - before == 2 * len(admission_objects())
    assert await consumer_client.get(MUTATINGADMISSIONPOLICIES, admission_policy()["metadata"]["name"])
    # released: its finalizer goes with the pass that finds it deleted
    await consumer_client.delete(NAMESPACEOFFLOADINGS, OFFLOADING_NAME, ns)
    await reconciler.reconcile(key)
    with pytest.raises(NotFound):
        await consumer_client.get(NAMESPACEOFFLOADINGS, OFFLOADING_NAME, ns)


async def test_a_provider_whose_virtual_node_says_it_does_not_answer_is_not_asked(
    policy: None, consumer_client: KubeClient, make_namespace: NamespaceFactory
) -> None:
    """An offloading's pass asks no provider whose virtual node has the unreachable taint (each
    such pass waited on it, up to a request's timeout, holding one of the controller's workers),
    keeps the twin namespace it gave, and asks again once the taint is gone."""
    ns = await make_namespace(consumer_client)
    await offload(consumer_client, ns, "LocalAndRemote")
    key = ObjectKey(ns, OFFLOADING_NAME)
    run = uuid.uuid4().hex[:8]
    provider_id = f"farm-{run}"
    taint = {"key": PROVIDER_UNREACHABLE_TAINT_KEY, "effect": "NoSchedule"}
    # a virtual node as its virtual kubelet leaves it in an outage, seen by this test's informer only
    node = {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": f"gpuferry-{provider_id}",
                         "labels": {PROVIDER_LABEL: provider_id, "gpuferry.io/test-run": run}},
            "spec": {"taints": [taint]}}  # fmt: skip
    await consumer_client.create(NODES, node)
    nodes = Informer(
        consumer_client, NODES, name="virtual-nodes", label_selector=f"gpuferry.io/test-run={run}"
    )
    untainted = asyncio.Event()
    nodes.add_handler(
        lambda change: change.new and not (change.new.get("spec") or {}).get("taints") and untainted.set()
    )
    reconciler = NamespaceOffloadingReconciler(
        consumer_client, virtual_nodes=nodes, clients=ProviderClients()
    )
    watching = asyncio.create_task(nodes.run())
    try:
        async with asyncio.timeout(30):
            await nodes.synced.wait()
        # it gave a twin namespace before the outage
        await consumer_client.patch(NAMESPACEOFFLOADINGS, OFFLOADING_NAME, {"status": {"remoteNamespaces": [
            {"clusterID": provider_id, "phase": "Ready", "remoteNamespace": f"{ns}-there"}]}},
            ns, subresource="status")  # fmt: skip
        secrets_read = identity_reads(consumer_client)
        await reconciler.reconcile(key)
        status = (await consumer_client.get(NAMESPACEOFFLOADINGS, OFFLOADING_NAME, ns))["status"]
        assert status["phase"] == "Pending"
        [entry] = status["remoteNamespaces"]
        assert entry["phase"] == "Pending" and entry["remoteNamespace"] == f"{ns}-there"
        assert PROVIDER_UNREACHABLE_TAINT_KEY in entry["message"]
        assert entry["reason"] == "ProviderUnreachable"  # kept by the CRD's schema, for the CLI
        [ready] = [c for c in status["conditions"] if c["type"] == "Ready"]
        assert ready["message"].startswith(f"waiting for {provider_id}: the provider does not answer")
        assert identity_reads(consumer_client) == secrets_read  # not even its identity was read
        assert reconciler.waiting() == [key]
        # the provider answers again: its virtual kubelet takes the taint off, and the next pass
        # asks it (here it finds no identity for it: a pass that did ask)
        await consumer_client.patch(NODES, node["metadata"]["name"], {"spec": {"taints": None}})
        async with asyncio.timeout(30):
            await untainted.wait()
        await reconciler.reconcile(key)
        status = (await consumer_client.get(NAMESPACEOFFLOADINGS, OFFLOADING_NAME, ns))["status"]
        [entry] = status["remoteNamespaces"]
        assert entry["message"] == "no identity on this provider yet" and entry["reason"] == "NoIdentity"
        assert identity_reads(consumer_client) == secrets_read + 1
    finally:
        watching.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watching
        await consumer_client.delete(NODES, node["metadata"]["name"])
        with contextlib.suppress(NotFound):
            await consumer_client.delete(NAMESPACEOFFLOADINGS, OFFLOADING_NAME, ns)
        await reconciler.reconcile(key)  # released: its finalizer goes


@contextlib.asynccontextmanager
async def objects_made(client: KubeClient) -> AsyncIterator[list[tuple[Any, str, str | None]]]:
    """What a test makes (resource, name, namespace), deleted after it, last made first; a
    namespace waited for until it is gone, so that the next test may make it again."""
    made: list[tuple[Any, str, str | None]] = []
    try:
        yield made
    finally:
        for resource, name, namespace in reversed(made):
            with contextlib.suppress(NotFound):
                await client.delete(resource, name, namespace)
            if resource == NAMESPACES:
                await wait_for_deletion(client, NAMESPACES, name, None, timeout=60)


async def test_a_pass_asks_every_provider_at_once(
    policy: None, consumer_client: KubeClient, make_namespace: NamespaceFactory
) -> None:
    """Two providers whose API servers take the connection and never answer (as before their
    virtual nodes are tainted): each is asked before the other's request gives up, so one that
    hangs holds no other provider's answer for a request's timeout (they were asked in turn)."""
    ns = await make_namespace(consumer_client)
    await offload(consumer_client, ns, "LocalAndRemote")
    key = ObjectKey(ns, OFFLOADING_NAME)
    run = uuid.uuid4().hex[:8]
    providers = [f"hang-a-{run}", f"hang-b-{run}"]
    events: list[tuple[str, str]] = []

    def listener(provider_id: str) -> Any:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            events.append(("asked", provider_id))
            await reader.read()  # never a word back; until the client gives up
            events.append(("gave up", provider_id))
            writer.close()

        return handle

    servers = [await asyncio.start_server(listener(p), "127.0.0.1", 0) for p in providers]
    nodes = Informer(
        consumer_client, NODES, name="virtual-nodes", label_selector=f"gpuferry.io/test-run={run}"
    )
    seen_both = asyncio.Event()
    nodes.add_handler(lambda _: len(nodes.values()) == 2 and seen_both.set())
    watching = asyncio.create_task(nodes.run())
    reconciler = NamespaceOffloadingReconciler(
        consumer_client,
        virtual_nodes=nodes,
        clients=ProviderClients(ClientSettings(request_timeout=3.0, connect_timeout=3.0)),
    )
    try:
        async with objects_made(consumer_client) as made:
            with contextlib.suppress(AlreadyExists):
                await consumer_client.create(NAMESPACES, {"metadata": {"name": SYSTEM_NAMESPACE}})
                made.append((NAMESPACES, SYSTEM_NAMESPACE, None))
            with contextlib.suppress(AlreadyExists):
                body = {"metadata": {"name": CLUSTER_ID_CONFIGMAP}, "data": {"clusterID": "ml-eu"}}
                await consumer_client.create(CONFIGMAPS, body, SYSTEM_NAMESPACE)
                made.append((CONFIGMAPS, CLUSTER_ID_CONFIGMAP, SYSTEM_NAMESPACE))
            for provider_id, server in zip(providers, servers, strict=True):
                port = server.sockets[0].getsockname()[1]
                config = {
                    "apiVersion": "v1", "kind": "Config", "current-context": "c",
                    "clusters": [{"name": "c", "cluster": {"server": f"https://127.0.0.1:{port}",
                                                           "insecure-skip-tls-verify": True}}],
                    "users": [{"name": "u", "user": {"token": "t"}}],
                    "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                }  # fmt: skip
                data = {"kubeconfig": base64.b64encode(yaml.safe_dump(config).encode()).decode()}
                secret = {"metadata": {"name": identity_secret_name(provider_id)}, "data": data}
                await consumer_client.create(SECRETS, secret, SYSTEM_NAMESPACE)
                made.append((SECRETS, identity_secret_name(provider_id), SYSTEM_NAMESPACE))
                node_labels = {PROVIDER_LABEL: provider_id, "gpuferry.io/test-run": run}
                node = {"metadata": {"name": f"gpuferry-{provider_id}", "labels": node_labels}}
                await consumer_client.create(NODES, node)
                made.append((NODES, node["metadata"]["name"], None))
            async with asyncio.timeout(30):
                await seen_both.wait()
            await reconciler.reconcile(key)
            status = (await consumer_client.get(NAMESPACEOFFLOADINGS, OFFLOADING_NAME, ns))["status"]
            assert {e["clusterID"]: e["reason"] for e in status["remoteNamespaces"]} == {
                p: "RequestFailed" for p in providers
            }
            # both asked before either request gave up
            assert [e[0] for e in events[:2]] == ["asked", "asked"], events
            for provider_id in providers:  # no identity: nothing to withdraw from them
                await consumer_client.delete(SECRETS, identity_secret_name(provider_id), SYSTEM_NAMESPACE)
            with contextlib.suppress(NotFound):
                await consumer_client.delete(NAMESPACEOFFLOADINGS, OFFLOADING_NAME, ns)
            await reconciler.reconcile(key)  # released: its finalizer goes
    finally:
        watching.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watching
        await reconciler.clients.close()
        for server in servers:
            server.close()


def identity_reads(client: KubeClient) -> float:
    """GETs of Secrets this process sent to ``client``'s API server (a provider's identity is one)."""
    labels = {"verb": "get", "resource": "secrets", "server": client.server}
    return REGISTRY.get_sample_value("gpuferry_api_requests_total", labels) or 0.0
