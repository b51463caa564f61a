"""Follows a PeerNetwork: the remapped pod CIDRs the fabric published for one peer.

The consumer's PeerNetwork for the provider gives the provider's pods in our view (twin pod IPs);
the provider's for us (read with the provider client) where the provider reaches our pods (the
endpoints of reflected Services).

The virtual kubelet reports a twin's ``podIP`` in the consumer's view. When the PeerNetwork for
the provider (``spec.clusterID``) appears or its ``status.remappedPodCIDRs`` change, the pod
reflector gets a new remapping function and every pod's status is reconciled again. Without a
PeerNetwork (peered with ``--no-network``, or the fabric not up yet) addresses are reported as the
provider has them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from kube.clients import KubeClient
from kube.informers import Informer
from kube.objects import PEERNETWORKS, RawObject
from kube.settings import WatchSettings

from ..forge.addresses import identity, remapper
from .informers import after_each_item

__all__ = ["PEERNETWORKS", "PeerNetworkFollower"]

logger = logging.getLogger(__name__)


class PeerNetworkFollower:
    """One peer's PeerNetwork in one namespace, turned into address views (see the module
    docstring). Its informer is retried while the CRD is not installed (addresses stay as they
    are meanwhile), so it is run as a task of its own, not among the informers readiness waits
    for."""

    def __init__(
        self,
        client: KubeClient,
        *,
        namespace: str,
        peer_id: str,
        on_change: Callable[[Callable[[str], str]], None],
        on_object: Callable[[RawObject | None], None] | None = None,
        settings: WatchSettings | None = None,
    ) -> None:
        self.client = client
        self.namespace = namespace
        self.provider_id = peer_id
        self.on_change = on_change
        self.on_object = on_object
        """Called with the PeerNetwork (None: none) on every change of it, status included."""
        self.settings = settings or WatchSettings()
        self.informer = Informer(client, PEERNETWORKS, name=f"peernetworks-{namespace}", namespace=namespace,
                                 settings=self.settings, retry_permanent=True)  # fmt: skip
        after_each_item(self.informer, self._apply)
        self._current: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())

    def _apply(self) -> None:
        ours = [
            o for o in self.informer.values() if (o.get("spec") or {}).get("clusterID") == self.provider_id
        ]
        if self.on_object is not None:
            self.on_object(ours[0] if ours else None)
        spec = (ours[0].get("spec") or {}) if ours else {}
        status = (ours[0].get("status") or {}) if ours else {}
        pair = (tuple(spec.get("podCIDRs") or ()), tuple(status.get("remappedPodCIDRs") or ()))
        if pair == self._current:
            return
        self._current = pair
        function = remapper(*pair) if ours else identity
        logger.info(
            "provider %s pod addresses: %s",
            self.provider_id,
            f"{list(pair[0])} seen as {list(pair[1])}" if function is not identity else "as they are",
        )
        self.on_change(function)

    def reverse(self) -> Callable[[str], str]:
        """The other way: an address in our view of the peer's pods → the peer's own address."""
        pods, remapped = self._current
        return remapper(remapped, pods) if pods else identity

    async def run(self) -> None:
        await self.informer.run()
