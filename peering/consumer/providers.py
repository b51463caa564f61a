"""The consumer agent's clients of its providers, and the watches that follow each provider.

The agent talks to a provider with one of two credentials, both kept on this cluster: the peering
token (until it has an identity: it can only send the CSR) and then the identity the provider
issued (the kubeconfig in ``gpuferry-system/gpuferry-identity-<provider>``). :class:`ProviderClients`
keeps one open client per provider and credential, replaced when the credential changes and
closed when the peering goes.

:class:`ProviderWatches` follows, per provider, the consumer's own objects in its tenant namespace
(its Tenant, its GPUSlice) and calls back on every change: the provider issuing the certificate,
deciding or re-deciding the slice, publishing its network, all wake the ForeignCluster's
controller within a moment. With ``on_offloading`` it also follows the consumer's twin namespace
requests there (its NamespaceOffloadings, one per offloaded namespace) and hands each change,
and each (re)list, to that callback: the provider making a twin namespace Ready wakes the
namespace's offloading at once, not at its next look. A watch outlives what is missing for a
while (a 404 because the provider's CRDs or the object are not there yet, a 403 while RBAC is
being bound): it retries with backoff, and ends only when the peering goes.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import logging
from collections.abc import Callable, Sequence

from kube.api import SYSTEM_NAMESPACE
from kube.clients import KubeClient
from kube.errors import NotFound
from kube.objects import SECRETS, RawObject, Resource
from kube.settings import ClientSettings
from kube.tasks import cancel_and_wait
from kube.watching import Listed, WatchEvent, watch_objects

from ..resources import NAMESPACEOFFLOADINGS, identity_secret_name

__all__ = ["ProviderClients", "ProviderWatches", "identity_data"]

logger = logging.getLogger(__name__)


class ProviderClients:
    """Open clients by (provider, credential kind); a new fingerprint replaces the old client."""

    def __init__(self, settings: ClientSettings | None = None) -> None:
        self.settings = settings
        """Of every client opened (None: the defaults)."""
        self._clients: dict[tuple[str, str], tuple[str, KubeClient]] = {}

    async def get(
        self, provider_id: str, kind: str, fingerprint: str, make: Callable[[], KubeClient]
    ) -> KubeClient:
        found = self._clients.get((provider_id, kind))
        if found is not None and found[0] == fingerprint:
            return found[1]
        if found is not None:
            await found[1].close()
        client = make()
        await client.open()
        self._clients[(provider_id, kind)] = (fingerprint, client)
        return client

    async def tenant(self, provider_id: str, data: dict[str, str]) -> KubeClient:
        """The client of ``provider_id`` as the identity it issued (``data``: the identity Secret's)."""
        kubeconfig = base64.b64decode(data["kubeconfig"])
        source = f"Secret {SYSTEM_NAMESPACE}/{identity_secret_name(provider_id)}"
        return await self.get(
            provider_id,
            "tenant",
            hashlib.sha256(kubeconfig).hexdigest(),
            lambda: KubeClient.from_kubeconfig_data(kubeconfig, settings=self.settings, source=source),
        )

    async def forget(self, provider_id: str) -> None:
        for key in [k for k in self._clients if k[0] == provider_id]:
            _, client = self._clients.pop(key)
            await client.close()

    async def close(self) -> None:
        for _, client in self._clients.values():
            await client.close()
        self._clients.clear()


async def identity_data(consumer: KubeClient, provider_id: str) -> dict[str, str] | None:
    """The identity Secret's data once it holds a kubeconfig (an identity was issued); else None."""
    try:
        secret: RawObject = await consumer.get(SECRETS, identity_secret_name(provider_id), SYSTEM_NAMESPACE)
    except NotFound:
        return None
    data: dict[str, str] = secret.get("data") or {}
    return data if data.get("kubeconfig") else None


class ProviderWatches:
    """One task per provider watching named objects in one namespace (see the module docstring)."""

    def __init__(
        self,
        on_change: Callable[[str], None],
        on_offloading: Callable[[str, WatchEvent | Listed], None] | None = None,
    ) -> None:
        self.on_change = on_change
        self.on_offloading = on_offloading
        """Called with the provider and each change of the twin namespace requests in the
        tenant namespace, or their (re)list (None: not followed)."""
        self._tasks: dict[str, tuple[KubeClient, asyncio.Task[None]]] = {}

    def ensure(
        self, provider_id: str, client: KubeClient, namespace: str, objects: Sequence[tuple[Resource, str]]
    ) -> None:
        """Follow ``objects`` (resource, name) in ``namespace`` with ``client``, unless already."""
        found = self._tasks.get(provider_id)
        if found is not None and found[0] is client and not found[1].done():
            return
        if found is not None:
            found[1].cancel()
        task = asyncio.create_task(
            self._follow(provider_id, client, namespace, objects), name=f"follow-provider {provider_id}"
        )
        self._tasks[provider_id] = (client, task)

    async def _follow(
        self, provider_id: str, client: KubeClient, namespace: str, objects: Sequence[tuple[Resource, str]]
    ) -> None:
        async def one(resource: Resource, name: str) -> None:
            async for _ in watch_objects(
                client,
                resource,
                namespace=namespace,
                field_selector=f"metadata.name={name}",
                retry_permanent=True,
            ):
                self.on_change(provider_id)

        async def requests(on_offloading: Callable[[str, WatchEvent | Listed], None]) -> None:
            async for item in watch_objects(client, NAMESPACEOFFLOADINGS, namespace=namespace,
                                            retry_permanent=True):  # fmt: skip
                on_offloading(provider_id, item)

        followed = [one(r, n) for r, n in objects]
        if self.on_offloading is not None:
            followed.append(requests(self.on_offloading))
        await asyncio.gather(*followed)

    def running(self, provider_id: str) -> bool:
        found = self._tasks.get(provider_id)
        return found is not None and not found[1].done()

    async def stop(self, provider_id: str) -> None:
        found = self._tasks.pop(provider_id, None)
        if found is not None:
            await cancel_and_wait([found[1]], logger=logger)

    async def close(self) -> None:
        for provider_id in list(self._tasks):
            await self.stop(provider_id)
