"""Running one virtual kubelet: from its settings (:func:`run`) or from a ``VirtualNode`` object
(:func:`run_virtual_node`), on the manager :func:`vk.assembly.build_virtual_kubelet` assembles.

Every long-lived loop is a named task of that manager: when one fails the others stop and the
process exits (a supervisor, or the peering controller, restarts it; all state is in the two API
servers). SIGTERM and SIGINT stop it gracefully: the queues drain, the node's Lease is no longer
renewed, the watches end.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Callable, Iterator
from typing import Literal

from kube.api import kubelet_spec_digest
from kube.clients import KubeClient
from kube.errors import NotFound
from kube.informers import Informer
from kube.kubeconfigs import ConfigError
from kube.manager import Manager
from kube.objects import LEASES, NODES, SECRETS, VIRTUALNODES
from kube.settings import WatchSettings
from kube.watching import Listed, WatchEvent

from .assembly import assemble_virtual_kubelet, build_virtual_kubelet, forge_options
from .node.lease import LEASE_NAMESPACE
from .settings import VirtualKubeletSettings, VirtualNodeError, from_virtual_node, grant_of

__all__ = [
    "VIRTUALNODES",
    "VirtualNodeChanged",
    "VirtualNodeGone",
    "forge_options",
    "provider_client",
    "run",
    "run_virtual_node",
]

logger = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class VirtualNodeGone(Exception):
    """The VirtualNode this kubelet runs for was deleted: the node was removed, the process ends."""


class VirtualNodeChanged(Exception):
    """The VirtualNode's spec changed: the process ends so that its supervisor starts it anew."""


def provider_client(settings: VirtualKubeletSettings) -> KubeClient:
    """A client of the provider, with the kubeconfig of the VirtualNode's Secret or the file."""
    if settings.provider_kubeconfig_data is not None:
        source = f"Secret of VirtualNode {settings.virtual_node}"
        return KubeClient.from_kubeconfig_data(
            settings.provider_kubeconfig_data, settings=settings.provider_client, source=source
        )
    if settings.provider_kubeconfig is None:
        raise ConfigError("no provider kubeconfig: give a file or a VirtualNode")
    return KubeClient.from_kubeconfig(settings.provider_kubeconfig, settings=settings.provider_client)


async def run(settings: VirtualKubeletSettings, *, handle_signals: bool = False) -> int | None:
    """Run the virtual kubelet until it is stopped (a signal, with ``handle_signals``), a root
    task fails (raised here), or the task running this is cancelled.

    Returns the signal that stopped it; ``None`` when a root task ended without failing.
    """
    consumer = KubeClient.from_config(settings.consumer_kubeconfig, settings=settings.consumer_client)
    async with consumer, provider_client(settings) as provider:
        manager = build_virtual_kubelet(settings, consumer, provider)
        return await _run(manager, handle_signals=handle_signals)


async def run_virtual_node(
    namespace: str, name: str, base: VirtualKubeletSettings, *, handle_signals: bool = False
) -> int | None:
    """Run the virtual kubelet of the ``VirtualNode`` ``namespace/name`` (settings from it and
    its kubeconfig Secret, tuning from ``base``) until the object changes or goes away.

    Raises :class:`VirtualNodeChanged` when its spec changes (the supervisor restarts the
    process, which reads the new spec) and :class:`VirtualNodeGone` once it is deleted, after
    removing the Node and its Lease; :class:`vk.settings.VirtualNodeError` when it cannot run.
    Stopped otherwise, it returns as :func:`run` does (the Node stays, as a stopped kubelet's).
    """
    async with KubeClient.from_config(base.consumer_kubeconfig, settings=base.consumer_client) as consumer:
        settings, digest = await read_virtual_node(consumer, namespace, name, base)
        logger.info("VirtualNode %s/%s (spec %s): node %s for provider %s", namespace, name, digest,
                    settings.effective_node_name, settings.provider_cluster_id)  # fmt: skip
        async with provider_client(settings) as provider:
            manager, node = assemble_virtual_kubelet(settings, consumer, provider)
            follower = VirtualNodeFollower(consumer, namespace, name, digest, manager=manager,
                                           on_grant=node.apply_grant, on_gone=node.retire,
                                           settings=settings.watch)  # fmt: skip
            stopped_by = await _run(manager, handle_signals=handle_signals)
        if follower.outcome == "changed":
            raise VirtualNodeChanged(f"VirtualNode {namespace}/{name} changed: restart to apply it")
        if follower.outcome == "gone":
            # the kubelet is stopped: nothing re-registers the node behind our back
            node_name = settings.effective_node_name
            await _remove_node(consumer, node_name)
            raise VirtualNodeGone(f"VirtualNode {namespace}/{name} deleted: node {node_name} removed")
        return stopped_by


async def read_virtual_node(
    consumer: KubeClient, namespace: str, name: str, base: VirtualKubeletSettings
) -> tuple[VirtualKubeletSettings, str]:
    """The settings a VirtualNode and its kubeconfig Secret give, and the digest of the spec read
    (:func:`kube.api.kubelet_spec_digest`)."""
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
    return from_virtual_node(vn, secret, base), kubelet_spec_digest(vn.get("spec"))


class VirtualNodeFollower:
    """Stops ``manager`` once the VirtualNode is deleted (``outcome`` "gone") or what it read of
    its spec at start changes ("changed": another ``digest``); hands each new grant (``resources``
    and ``labels``) to ``on_grant`` as it comes (the largest free block the spec also carries is
    computed live); an informer of that one object, run by the manager."""

    def __init__(self, consumer: KubeClient, namespace: str, name: str, digest: str, *,
                 manager: Manager, on_grant: Callable[[dict[str, str], dict[str, str]], None] | None = None,
                 on_gone: Callable[[], None] | None = None,
                 settings: WatchSettings | None = None) -> None:  # fmt: skip
        self.digest = digest
        self.on_grant = on_grant
        self.on_gone = on_gone
        """Called once the VirtualNode is seen gone, before the manager is stopped."""
        self.manager = manager
        self.outcome: Literal["gone", "changed"] | None = None
        self.informer = Informer(consumer, VIRTUALNODES, name="virtualnode", namespace=namespace,
                                 field_selector=f"metadata.name={name}", settings=settings)  # fmt: skip
        self.informer.add_event_handler(self._seen)
        manager.add_informer(self.informer)

    def _seen(self, item: WatchEvent | Listed) -> None:
        if self.outcome is not None:
            return
        if isinstance(item, Listed):
            if not item.keys:
                self.outcome = "gone"
        elif item.type == "DELETED" or item.object["metadata"].get("deletionTimestamp"):
            self.outcome = "gone"
        elif kubelet_spec_digest(item.object.get("spec")) != self.digest:
            self.outcome = "changed"
        elif self.on_grant is not None:
            self.on_grant(*grant_of(item.object.get("spec") or {}))
        if self.outcome == "gone" and self.on_gone is not None:
            self.on_gone()
        if self.outcome is not None:
            self.manager.stop()


async def _run(manager: Manager, *, handle_signals: bool) -> int | None:
    with _stopped_by_signals(manager, enabled=handle_signals) as received:
        await manager.run(handle_signals=False)
    return received[0] if received else None


@contextlib.contextmanager
def _stopped_by_signals(manager: Manager, *, enabled: bool) -> Iterator[list[int]]:
    """SIGTERM and SIGINT stop ``manager`` gracefully; the list gets the signals received."""
    received: list[int] = []
    if not enabled:
        yield received
        return
    loop = asyncio.get_running_loop()

    def stop(signum: int) -> None:
        logger.info("%s received: stopping", signal.Signals(signum).name)
        received.append(signum)
        manager.stop()

    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, stop, int(sig))
    try:
        yield received
    finally:
        for sig in STOP_SIGNALS:
            loop.remove_signal_handler(sig)


async def _remove_node(consumer: KubeClient, node: str) -> None:
    for resource, ns in ((NODES, None), (LEASES, LEASE_NAMESPACE)):
        with contextlib.suppress(NotFound):
            await consumer.delete(resource, node, ns)
