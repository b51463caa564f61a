"""The consumer agent's watches of each provider (its Tenant and GPUSlice, which wake the
ForeignCluster's controller) outlive what is missing on the provider for a while (a CRD not
installed yet, an object not made yet: real 404s) and end only when the peering goes."""

from __future__ import annotations

import asyncio

from hack.localcluster import LocalCluster
from kube.clients import KubeClient
from kube.objects import CONFIGMAPS, Resource
from peering.consumer.providers import ProviderWatches

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
