"""The consumer agent's watches of each provider (its Tenant and GPUSlice, which wake the
ForeignCluster's controller) outlive what is missing on the provider for a while (a CRD not
installed yet, an object not made yet: real 404s) and end only when the peering goes; the
provider's answer to a twin namespace request wakes the offloading that waits for it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from hack.localcluster import LocalCluster
from kube.clients import KubeClient
from kube.objects import CONFIGMAPS, NAMESPACEOFFLOADINGS, ObjectKey, Resource, meta
from kube.watching import Listed, WatchEvent
from peering.consumer.app import offloadings_woken
from peering.consumer.providers import ProviderWatches
from peering.crds import ensure_crds

from .conftest import NamespaceFactory

#: A resource no provider serves: every request for it is a real 404 from the API server.
MISSING = Resource("notinstalled.gpuferry.io", "v1", "widgets", "Widget", namespaced=True)


async def test_a_provider_watch_retries_a_missing_crd_and_ends_only_when_stopped(
    provider: LocalCluster, provider_client: KubeClient, make_namespace: NamespaceFactory
) -> None:
    ns = await make_namespace(provider_client)
    woken: list[str] = []
    watches = ProviderWatches(on_change=woken.append)
    async with KubeClient.from_kubeconfig(provider.spec.kubeconfig) as tenant:
        watches.ensure("farm", tenant, ns, [(MISSING, "w"), (CONFIGMAPS, "appears-later")])
        await asyncio.sleep(3)  # several 404s on the missing CRD, retried with backoff
        assert watches.running("farm"), "a missing CRD ended the watch"
        # what it follows comes into being: the controller is woken
        await provider_client.create(CONFIGMAPS, {"apiVersion": "v1", "kind": "ConfigMap",
                                                  "metadata": {"name": "appears-later"}}, ns)  # fmt: skip
        for _ in range(100):
            if woken:
                break
            await asyncio.sleep(0.1)
        assert woken and set(woken) == {"farm"}
        # the same client again changes nothing; the peering going ends the watch
        watches.ensure("farm", tenant, ns, [(MISSING, "w"), (CONFIGMAPS, "appears-later")])
        assert watches.running("farm")
        await watches.stop("farm")
        assert not watches.running("farm")


async def test_the_providers_answer_to_a_twin_namespace_request_wakes_the_offloading_waiting_for_it(
    provider: LocalCluster, provider_client: KubeClient, make_namespace: NamespaceFactory
) -> None:
    await ensure_crds(provider_client)
    tenant_ns = await make_namespace(provider_client)  # stands for the consumer's tenant namespace
    waiting = [ObjectKey("ml-team", "offloading"), ObjectKey("vision", "offloading")]
    woken: list[ObjectKey] = []
    items: list[tuple[str, WatchEvent | Listed]] = []

    def on_offloading(provider_id: str, item: WatchEvent | Listed) -> None:
        items.append((provider_id, item))
        woken.extend(offloadings_woken(item, waiting))

    async def until(what: str, done: Callable[[], object]) -> None:
        for _ in range(100):
            if done():
                return
            await asyncio.sleep(0.1)
        raise AssertionError(f"{what}: not within 10 s; handed over {[i for _, i in items]}")

    watches = ProviderWatches(on_change=lambda _: None, on_offloading=on_offloading)
    async with KubeClient.from_kubeconfig(provider.spec.kubeconfig) as tenant:
        watches.ensure("farm", tenant, tenant_ns, [])
        try:
            # its list: every offloading that waits looks again (the provider may be back)
            await until("the first list", lambda: any(isinstance(i, Listed) for _, i in items))
            assert woken == waiting and {p for p, _ in items} == {"farm"}
            woken.clear()
            spec = {"originNamespace": "ml-team", "namespaceMappingStrategy": "DefaultName"}
            body = {"apiVersion": NAMESPACEOFFLOADINGS.api_version, "kind": NAMESPACEOFFLOADINGS.kind,
                    "metadata": {"name": "ml-team"}, "spec": spec}  # fmt: skip
            await tenant.create(NAMESPACEOFFLOADINGS, body, tenant_ns)

            def made() -> bool:
                names = [meta(i.object)["name"] for _, i in items if isinstance(i, WatchEvent)]
                return "ml-team" in names

            await until("the request made", made)
            assert woken == []  # asked, not answered: a pass now would find it Pending again
            # the provider's controller answers: the twin namespace is Ready
            await provider_client.patch(NAMESPACEOFFLOADINGS, "ml-team",
                                        {"status": {"phase": "Ready", "remoteNamespace": "ml-team-farm"}},
                                        tenant_ns, subresource="status")  # fmt: skip
            await until("the answer", lambda: woken)
            assert woken == [ObjectKey("ml-team", "offloading")]
        finally:
            await watches.stop("farm")
