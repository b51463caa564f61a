"""Consumer Services reflected into the twin namespace, so that pods on the provider resolve them:
a selector-less copy (the provider allocates its ClusterIP) and an EndpointSlice with the
endpoints as the provider reaches them: twins at their own addresses, consumer pods at their
address in the provider's view (only with the network fabric's PeerNetwork)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from kube.clients import KubeClient
from kube.errors import AlreadyExists
from kube.objects import (
    CONFIGMAPS,
    ENDPOINTSLICES,
    NAMESPACES,
    PEERNETWORKS,
    PODS,
    SECRETS,
    SERVICES,
    RawObject,
)
from netfabric.keys import generate_private_key, public_key
from peering.crds import ensure_crds
from vk.forge.services import slice_name

from .conftest import NamespaceFactory
from .test_vk_pods import VirtualKubelet, pod, running, scrape, vk  # noqa: F401  (vk: the fixture)
from .waiting import wait_for, wait_for_deletion


def service(name: str, selector: dict[str, str], port: int, **spec: Any) -> RawObject:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name},
        "spec": {"selector": selector, "ports": [{"port": port, "targetPort": "http"}], **spec},
    }


def addresses(slice_: RawObject) -> list[str]:
    return sorted(a for e in slice_.get("endpoints") or [] for a in e["addresses"])


def remapped(ip: str, prefix: str = "10.64") -> str:
    return f"{prefix}.{ip.split('.', 2)[2]}"


async def test_services_are_reflected_with_the_endpoints_the_provider_reaches(
    vk: VirtualKubelet,  # noqa: F811
    consumer_client: KubeClient,
    provider_client: KubeClient,
    make_namespace: NamespaceFactory,
) -> None:
    ns = await make_namespace(consumer_client)
    twin_ns = vk.twin_ns(ns)
    # a GPU pod on the virtual node behind "llm"; a consumer pod (a CPU worker) behind headless "db"
    gpu = pod("serve-0", 1)
    gpu["metadata"]["labels"] = {"app": "serve"}
    gpu["spec"]["containers"][0]["ports"] = [{"containerPort": 8000, "name": "http"}]
    db: RawObject = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "db-0", "labels": {"app": "db"}},
        "spec": {"containers": [{"name": "db", "image": "postgres", "ports": [{"containerPort": 5432,
                                                                                "name": "http"}]}]},
    }  # fmt: skip
    for body in (gpu, db):
        await consumer_client.create(PODS, body, ns)
    await consumer_client.create(SERVICES, service("llm", {"app": "serve"}, 80), ns)
    await consumer_client.create(SERVICES, service("db", {"app": "db"}, 5432, clusterIP="None"), ns)
    await wait_for(consumer_client, PODS, "serve-0", running, namespace=ns, timeout=30)
    db_pod = await wait_for(
        consumer_client, PODS, "db-0", lambda p: bool(p["status"].get("podIP")), namespace=ns
    )
    twin = await wait_for(provider_client, PODS, "serve-0", lambda p: bool(p["status"].get("podIP")),
                          namespace=twin_ns)  # fmt: skip
    twin_ip = twin["status"]["podIP"]

    # the copy: no selector (the provider must not pick endpoints itself), its own ClusterIP
    copy = await wait_for(provider_client, SERVICES, "llm", lambda s: True, namespace=twin_ns)
    assert "selector" not in copy["spec"] and copy["spec"]["clusterIP"] not in ("", "None")
    assert copy["spec"]["ports"][0]["port"] == 80
    endpoints = await wait_for(provider_client, ENDPOINTSLICES, slice_name("llm"),
                               lambda s: addresses(s) == [twin_ip], namespace=twin_ns)  # fmt: skip
    assert endpoints["metadata"]["labels"]["kubernetes.io/service-name"] == "llm"
    assert [p["port"] for p in endpoints["ports"]] == [8000]
    # headless stays headless; a consumer pod is unreachable from the provider without the fabric
    headless = await wait_for(provider_client, SERVICES, "db", lambda s: True, namespace=twin_ns)
    assert headless["spec"]["clusterIP"] == "None"
    assert addresses(await wait_for(provider_client, ENDPOINTSLICES, slice_name("db"), lambda s: True,
                                    namespace=twin_ns)) == []  # fmt: skip

    # the fabric comes up: the provider publishes where it reaches our pods (10.64.0.0/16)
    tenant_ns = f"gpuferry-tenant-{vk.settings.consumer_cluster_id}"
    await ensure_crds(provider_client)
    with contextlib.suppress(AlreadyExists):
        await provider_client.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace",
                                                  "metadata": {"name": tenant_ns}})  # fmt: skip
    try:
        peer = {
            "apiVersion": PEERNETWORKS.api_version,
            "kind": PEERNETWORKS.kind,
            "metadata": {"name": vk.settings.consumer_cluster_id},
            "spec": {"clusterID": vk.settings.consumer_cluster_id, "podCIDRs": ["10.244.0.0/16"],
                     "serviceCIDRs": ["10.96.0.0/16"], "publicKey": public_key(generate_private_key())},
        }  # fmt: skip
        await provider_client.create(PEERNETWORKS, peer, tenant_ns)
        await provider_client.patch(PEERNETWORKS, vk.settings.consumer_cluster_id,
                                    {"status": {"remappedPodCIDRs": ["10.64.0.0/16"]}}, tenant_ns,
                                    subresource="status")  # fmt: skip
        db_ip = remapped(db_pod["status"]["podIP"])
        await wait_for(provider_client, ENDPOINTSLICES, slice_name("db"), lambda s: addresses(s) == [db_ip],
                       namespace=twin_ns)  # fmt: skip
    finally:
        await provider_client.delete(NAMESPACES, tenant_ns)

    # a change of the consumer Service reaches the copy; its deletion removes copy and slice
    change = {"spec": {"ports": [{"port": 81, "targetPort": "http"}]}}
    await consumer_client.patch(SERVICES, "llm", change, ns)
    await wait_for(provider_client, SERVICES, "llm", lambda s: s["spec"]["ports"][0]["port"] == 81,
                   namespace=twin_ns)  # fmt: skip
    await consumer_client.delete(SERVICES, "llm", ns)
    await wait_for_deletion(provider_client, SERVICES, "llm", twin_ns, timeout=30)
    await wait_for_deletion(provider_client, ENDPOINTSLICES, slice_name("llm"), twin_ns, timeout=30)
    # the last pod on the node in the namespace goes: nothing there resolves "db" any more
    await consumer_client.delete(PODS, "serve-0", ns, grace_period_seconds=0)
    await wait_for_deletion(provider_client, SERVICES, "db", twin_ns, timeout=60)


async def test_a_namespace_without_pods_on_the_node_is_watched_no_more(
    vk: VirtualKubelet,  # noqa: F811
    consumer_client: KubeClient,
    provider_client: KubeClient,
    make_namespace: NamespaceFactory,
) -> None:
    """Issue 15, many namespaces: the per-namespace watches (ConfigMaps, Secrets, Services and
    their EndpointSlices on the consumer, Events on the provider) were started and never stopped.
    They stop when the node's last pod in the namespace goes, and start again with the next; a
    ConfigMap or Secret watch is held only where a pod of the node names an object of that kind."""
    watches = ("watch-consumer-configmaps", "watch-consumer-secrets", "watch-consumer-services",
               "watch-provider-events")  # fmt: skip

    async def held() -> dict[str, float]:
        samples = await scrape(vk.settings.metrics_port)
        return {w: samples[("gpuferry_vk_namespace_watches", frozenset({("reflector", w)}))] for w in watches}

    async def until_held(count: int, **other: int) -> None:
        want = {w: float(other.get(w.removeprefix("watch-").replace("-", "_"), count)) for w in watches}
        for _ in range(100):
            if await held() == want:
                return
            await asyncio.sleep(0.2)
        raise AssertionError(f"not {want}: {await held()}")

    def mounting(name: str, *kinds: str) -> dict[str, Any]:
        body = pod(name, 1)
        sources = {"configMap": {"name": "hyper"}, "secret": {"secretName": "token"}}
        body["spec"]["volumes"] = [{"name": k.lower(), k: sources[k]} for k in kinds]
        body["spec"]["containers"][0]["volumeMounts"] = [
            {"name": k.lower(), "mountPath": f"/etc/{k.lower()}"} for k in kinds
        ]
        return body

    namespaces = [await make_namespace(consumer_client) for _ in range(3)]
    for ns in namespaces:
        hyper = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "hyper"}, "data": {"lr": "1"}}
        token = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "token"}, "data": {"t": "eA=="}}
        await consumer_client.create(CONFIGMAPS, hyper, ns)
        await consumer_client.create(SECRETS, token, ns)
        await consumer_client.create(SERVICES, service("llm", {"app": "serve"}, 80), ns)
        await consumer_client.create(PODS, mounting("train", "configMap", "secret"), ns)
    for ns in namespaces:
        await wait_for(consumer_client, PODS, "train", running, namespace=ns, timeout=60)
        await wait_for(provider_client, CONFIGMAPS, "hyper", lambda c: True, namespace=vk.twin_ns(ns))
        await wait_for(provider_client, SECRETS, "token", lambda c: True, namespace=vk.twin_ns(ns))
    await until_held(3)

    # the pods go: the watches go, and what was copied for them
    for ns in namespaces:
        await consumer_client.delete(PODS, "train", ns, grace_period_seconds=0)
    for ns in namespaces:
        await wait_for_deletion(provider_client, CONFIGMAPS, "hyper", vk.twin_ns(ns), timeout=30)
        await wait_for_deletion(provider_client, SECRETS, "token", vk.twin_ns(ns), timeout=30)
        await wait_for_deletion(provider_client, SERVICES, "llm", vk.twin_ns(ns), timeout=30)
    await until_held(0)

    # a pod comes back to one of them, naming only the ConfigMap: watched again, but not its Secrets,
    # and a change of its ConfigMap reaches the copy
    ns = namespaces[0]
    await consumer_client.create(PODS, mounting("again", "configMap"), ns)
    await wait_for(consumer_client, PODS, "again", running, namespace=ns, timeout=60)
    await until_held(1, consumer_secrets=0)
    await consumer_client.patch(CONFIGMAPS, "hyper", {"data": {"lr": "2"}}, ns)
    await wait_for(provider_client, CONFIGMAPS, "hyper", lambda c: c.get("data") == {"lr": "2"},
                   namespace=vk.twin_ns(ns), timeout=30)  # fmt: skip
