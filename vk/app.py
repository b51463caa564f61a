"""One virtual kubelet: root tasks for the node, both pod caches, the pod workers and the resync.

Every long-lived loop is a named task under :func:`kube.tasks.run_supervised`: when one ends,
the others are stopped, and the process exits (a supervisor, or the peering controller,
restarts it; all state is in the two API servers).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from aiohttp import web

from kube.clients import KubeClient
from kube.errors import NotFound
from kube.kubeconfigs import ConfigError
from kube.metrics import render
from kube.objects import LEASES, NODES, SECRETS, TENANT_NAMESPACE_PREFIX, VIRTUALNODES, ObjectKey
from kube.queueing import KeyedQueue
from kube.reconciling import run_workers
from kube.tasks import run_supervised
from kube.watching import Listed, WatchEvent, watch_objects

from .forge.accessories import CONFIGMAP, SECRET
from .forge.labels import owner_selector
from .forge.names import twin_namespace
from .forge.node import network_condition
from .forge.pods import ForgeOptions
from .kubelet import KubeletContext, serve_kubelet_api
from .kubelet.certificates import ServingCertificate
from .node.controller import NodeController
from .node.lease import LEASE_NAMESPACE
from .reflection.accessories import AccessoryReflector
from .reflection.addresses import PeerNetworkFollower
from .reflection.caches import PodCache, consumer_key, twin_key_for
from .reflection.events import EventReflector
from .reflection.pods import PodReflector, refresh_phase_gauge
from .reflection.services import ServiceReflector
from .reflection.tokens import TokenReflector
from .reflection.twins import TwinNamespaces
from .settings import VirtualKubeletSettings, VirtualNodeError, from_virtual_node

logger = logging.getLogger(__name__)



def forge_options(settings: VirtualKubeletSettings) -> ForgeOptions:
    return ForgeOptions(
        consumer_cluster_id=settings.consumer_cluster_id,
        provider_cluster_id=settings.provider_cluster_id,
        virtual_node_name=settings.effective_node_name,
        namespace_strategy=settings.namespace_strategy,
        grant_node_selector=dict(settings.provider_node_selector),
        service_account_tokens=settings.service_account_tokens,
    )


async def _sync_pods(
    queue: KeyedQueue[ObjectKey], reflector: PodReflector, settings: VirtualKubeletSettings
) -> None:
    # never act before both sides are listed: an empty cache would read as "pod gone"
    await asyncio.gather(reflector.local.synced.wait(), reflector.remote.synced.wait())
    logger.info("pod caches synced: %d local, %d twins", len(reflector.local), len(reflector.remote))
    await run_workers(queue, reflector, settings=settings.queue, logger=logger, kind="Pod")


async def _resync(
    queue: KeyedQueue[ObjectKey],
    reflector: PodReflector,
    accessories: Sequence[AccessoryReflector | TokenReflector | ServiceReflector],
    every: float,
) -> None:
    """Reconcile everything now and then: collects orphans, heals anything a lost event hid."""
    while True:
        await asyncio.sleep(every)
        for key in {*reflector.local.keys(), *reflector.remote.keys()}:
            queue.add(key)
        for accessory in accessories:
            accessory.resync()


async def _serve_metrics(port: int, reflector: PodReflector) -> None:
    async def metrics(_: web.Request) -> web.Response:
        refresh_phase_gauge(reflector.local, reflector.remote)
        return web.Response(body=render(), content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", port).start()
        await asyncio.Event().wait()
    finally:
        await asyncio.shield(runner.cleanup())


async def _serve_kubelet_api(
    settings: VirtualKubeletSettings,
    consumer: KubeClient,
    provider: KubeClient,
    local: PodCache,
    remote: PodCache | TwinNamespaces,
) -> None:
    node = settings.effective_node_name
    ctx = KubeletContext(
        node_name=node,
        provider=provider,
        local_pod=local.get,
        twin_pod=remote.get,
        local_keys=local.keys,
        started=datetime.datetime.now(datetime.UTC),
    )
    certificate = ServingCertificate(
        consumer,
        node_name=node,
        addresses=(settings.node_address,),
        self_approve=settings.kubelet_csr_self_approve,
        expiration_seconds=settings.kubelet_cert_seconds,
        sign_timeout=120.0,
    )
    await serve_kubelet_api(
        consumer=consumer,
        ctx=ctx,
        certificate=certificate,
        host=settings.node_address,
        port=settings.kubelet_port,
    )


def _provider_client(settings: VirtualKubeletSettings) -> KubeClient:
    if settings.provider_kubeconfig_data is not None:
        source = f"Secret of VirtualNode {settings.virtual_node}"
        return KubeClient.from_kubeconfig_data(
            settings.provider_kubeconfig_data, settings=settings.provider_client, source=source
        )
    if settings.provider_kubeconfig is None:
        raise ConfigError("no provider kubeconfig: give a file or a VirtualNode")
    return KubeClient.from_kubeconfig(settings.provider_kubeconfig, settings=settings.provider_client)


class VirtualNodeGone(Exception):
    """The VirtualNode this kubelet runs for was deleted: the node was removed, the process ends."""


class VirtualNodeChanged(Exception):
    """The VirtualNode's spec changed: the process ends so that its supervisor starts it anew."""


async def run_virtual_node(namespace: str, name: str, base: VirtualKubeletSettings) -> None:
    """Run the virtual kubelet of the ``VirtualNode`` ``namespace/name`` (settings from it and
    its kubeconfig Secret, tuning from ``base``) until the object changes or goes away.

    Raises :class:`VirtualNodeChanged` when its spec changes (the supervisor restarts the
    process, which reads the new spec) and :class:`VirtualNodeGone` once it is deleted, after
    removing the Node and its Lease; :class:`vk.settings.VirtualNodeError` when it cannot run.
    """
    async with KubeClient.from_config(base.consumer_kubeconfig, settings=base.consumer_client) as consumer:
        try:
            vn = await consumer.get(VIRTUALNODES, name, namespace)
        except NotFound:
            raise VirtualNodeError(f"VirtualNode {namespace}/{name} not found") from None
        ref = (vn.get("spec") or {}).get("kubeconfigSecretRef") or {}
        try:
            secret = await consumer.get(SECRETS, str(ref.get("name", "")), namespace)
        except NotFound:
            raise VirtualNodeError(
                f"VirtualNode {namespace}/{name}: kubeconfig Secret {ref.get('name')!r} not found"
            ) from None
        settings = from_virtual_node(vn, secret, base)
        generation = vn["metadata"].get("generation")
        logger.info(
            "VirtualNode %s/%s generation %s: node %s for provider %s",
            namespace,
            name,
            generation,
            settings.effective_node_name,
            settings.provider_cluster_id,
        )

        outcome: list[str] = []

        async def follow() -> None:
            async for item in watch_objects(
                consumer, VIRTUALNODES, namespace=namespace, field_selector=f"metadata.name={name}"
            ):
                if isinstance(item, Listed):
                    if not item.keys:
                        outcome.append("gone")
                        return
                elif item.type == "DELETED" or item.object["metadata"].get("deletionTimestamp"):
                    outcome.append("gone")
                    return
                elif item.object["metadata"].get("generation") != generation:
                    outcome.append("changed")
                    return

        roots = {"follow_virtual_node": follow(), "virtual_kubelet": run(settings)}
        await run_supervised(roots, logger=logger)
        if outcome == ["changed"]:
            raise VirtualNodeChanged(f"VirtualNode {namespace}/{name} changed: restart to apply it")
        # the kubelet is stopped: nothing re-registers the node behind our back
        await _remove_node(consumer, settings.effective_node_name)
        node = settings.effective_node_name
        raise VirtualNodeGone(f"VirtualNode {namespace}/{name} deleted: node {node} removed")


async def _remove_node(consumer: KubeClient, node: str) -> None:
    for resource, ns in ((NODES, None), (LEASES, LEASE_NAMESPACE)):
        with contextlib.suppress(NotFound):
            await consumer.delete(resource, node, ns)


async def run(settings: VirtualKubeletSettings) -> None:
    """Run the virtual kubelet until a root task ends (or the task running this is cancelled)."""
    consumer = KubeClient.from_config(settings.consumer_kubeconfig, settings=settings.consumer_client)
    provider = _provider_client(settings)
    async with consumer, provider:
        queue: KeyedQueue[ObjectKey] = KeyedQueue("sync_pods_to_remote", settings=settings.queue)
        accessories: list[AccessoryReflector | TokenReflector] = []

        events: list[EventReflector] = []
        services: list[ServiceReflector] = []

        def local_pod_changed(key: ObjectKey) -> None:
            queue.add(key)
            for reflector_ in [*accessories, *services]:
                reflector_.pod_changed(key)
            for events_ in events:
                events_.pod_changed(key)

        local = PodCache(
            "consumer",
            consumer,
            key_of=consumer_key,
            on_change=local_pod_changed,
            field_selector=f"spec.nodeName={settings.effective_node_name}",
            settings=settings.watch,
        )
        twins: TwinNamespaces | None = None
        remote: PodCache | TwinNamespaces
        if settings.tenant_namespace:

            def namespaces_changed(origins: set[str]) -> None:
                for key in local:
                    if key.namespace in origins:
                        queue.add(key)

            def twin_event(namespace: str, item: WatchEvent | Listed) -> None:
                if isinstance(item, Listed):
                    node.view.handle_pod_in(namespace, item)
                else:
                    node.view.handle_pod(item)

            remote = twins = TwinNamespaces(
                provider,
                tenant_namespace=settings.tenant_namespace,
                key_of=twin_key_for(settings.consumer_cluster_id),
                on_change=queue.add,
                on_namespaces=namespaces_changed,
                on_event=twin_event,
                label_selector=owner_selector(settings.consumer_cluster_id),
                settings=settings.watch,
            )
            node = NodeController(
                consumer=consumer, provider=provider, settings=settings, twins_synced=twins.synced
            )
        else:
            remote = PodCache(
                "provider",
                provider,
                key_of=twin_key_for(settings.consumer_cluster_id),
                on_change=queue.add,
                label_selector=owner_selector(settings.consumer_cluster_id),
                settings=settings.watch,
            )
            node = NodeController(consumer=consumer, provider=provider, settings=settings)
        opts = forge_options(settings)

        def twin_namespace_for(origin: str) -> str | None:
            if twins is not None:
                return twins.twin_namespace_for(origin)
            return twin_namespace(origin, opts.consumer_cluster_id, strategy=opts.namespace_strategy)

        if opts.service_account_tokens:
            accessories.append(
                TokenReflector(
                    consumer=consumer,
                    provider=provider,
                    pods=local,
                    twin_namespace_for=twin_namespace_for,
                    consumer_id=settings.consumer_cluster_id,
                )
            )
        for kind in (CONFIGMAP, SECRET):
            accessories.append(
                AccessoryReflector(
                    kind,
                    consumer=consumer,
                    provider=provider,
                    pods=local,
                    twin_namespace_for=twin_namespace_for,
                    consumer_id=settings.consumer_cluster_id,
                    settings=settings.watch,
                )
            )
        services.append(
            ServiceReflector(
                consumer=consumer,
                provider=provider,
                pods=local,
                twin_namespace_for=twin_namespace_for,
                consumer_id=settings.consumer_cluster_id,
                node=settings.effective_node_name,
                settings=settings.watch,
            )
        )
        events.append(
            EventReflector(
                consumer=consumer,
                provider=provider,
                pods=local,
                twin_namespace_for=twin_namespace_for,
                node=settings.effective_node_name,
                settings=settings.watch,
            )
        )
        reflector = PodReflector(
            consumer=consumer,
            provider=provider,
            local=local,
            remote=remote,
            opts=forge_options(settings),
            node_address=settings.node_address,
            fit=node,
            twins=twins,
            accessories=accessories,
        )

        def remap_changed(function: Callable[[str], str]) -> None:
            reflector.remap_ip = function
            for key in local:  # every status again, in the new view
                queue.add(key)
            for services_ in services:  # and every reflected Service's endpoints
                services_.set_views(twin_back=addresses.reverse())

        addresses = PeerNetworkFollower(
            consumer,
            namespace=settings.peer_network_namespace,
            peer_id=settings.provider_cluster_id,
            on_change=remap_changed,
            on_object=lambda obj: node.set_network(network_condition(obj)),
            settings=settings.watch,
        )

        def consumer_view_changed(function: Callable[[str], str]) -> None:
            for services_ in services:
                services_.set_views(to_provider_view=function)

        # the provider's PeerNetwork for us: where the provider reaches our pods
        provider_view = PeerNetworkFollower(
            provider,
            namespace=settings.tenant_namespace or TENANT_NAMESPACE_PREFIX + settings.consumer_cluster_id,
            peer_id=settings.consumer_cluster_id,
            on_change=consumer_view_changed,
            settings=settings.watch,
        )

        def retry_gated() -> None:
            for key in reflector.gated_keys():
                queue.add(key)

        node.on_capacity_change(retry_gated)
        roots: dict[str, Coroutine[Any, Any, Any]] = {
            "node": node.run(),
            "watch_consumer_pods": local.run(),
            "watch_provider_twins": remote.run(),
            "sync_pods_to_remote": _sync_pods(queue, reflector, settings),
            "resync": _resync(queue, reflector, [*accessories, *services], settings.resync_seconds),
            "follow_peer_network": addresses.run(),
            "follow_provider_peer_network": provider_view.run(),
        }
        for accessory in [*accessories, *services]:
            roots[f"sync_{accessory.kind}_to_remote"] = run_workers(
                accessory.queue,
                accessory,
                settings=settings.queue,
                logger=logger,
                kind=accessory.resource.kind if isinstance(accessory, AccessoryReflector | ServiceReflector)
                else "Pod",
            )
        if settings.metrics_port:
            roots["metrics"] = _serve_metrics(settings.metrics_port, reflector)
        if settings.kubelet_api:
            roots["kubelet_api"] = _serve_kubelet_api(settings, consumer, provider, local, remote)
        try:
            await run_supervised(roots, logger=logger)
        finally:
            queue.shutdown()
            for accessory in [*accessories, *services]:
                await accessory.stop()
            for events_ in events:
                await events_.stop()
