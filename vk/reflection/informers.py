"""The pod informers of both sides, filed under the same key.

The consumer side holds the pods bound to the virtual node; the provider side holds the twins
this consumer owns. Both are keyed by the *consumer* pod key (namespace, name), so a change on
either side queues the same key, and a reconciler sees both objects at once.

Both are compact :class:`kube.informers.Informer` stores of projections
(:func:`kube.informers.drop_noise`: a pod without its managed fields and last-applied
annotation, most of its bytes and read by nobody here), kept as deflated JSON: a few hundred
bytes a pod instead of ~12 KB as a dict, for ten thousand pods on each side (issue 15). Twins
keep only the part of their spec that is read (:func:`vk.forge.pods.twin_projection`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from kube.clients import KubeClient
from kube.informers import Informer, drop_noise
from kube.objects import PODS, ObjectKey, RawObject
from kube.settings import WatchSettings

from ..forge.labels import origin_of, owner_selector
from ..forge.pods import twin_projection

__all__ = [
    "PodPhases",
    "after_each_item",
    "consumer_key",
    "consumer_pods",
    "phase_of",
    "twin_key_for",
    "twin_pods",
]


def consumer_key(pod: RawObject) -> ObjectKey:
    """A consumer pod's own key."""
    return ObjectKey(pod["metadata"].get("namespace"), pod["metadata"]["name"])


def twin_key_for(consumer_id: str) -> Callable[[RawObject], ObjectKey | None]:
    """Maps a provider twin to the consumer key recorded in its origin labels/annotations
    (None: not a twin of ``consumer_id``'s, ignored)."""

    def key_of(pod: RawObject) -> ObjectKey | None:
        origin = origin_of(pod)
        if origin is None or origin.cluster_id != consumer_id:
            return None
        return ObjectKey(origin.namespace, origin.name)

    return key_of


def consumer_pods(client: KubeClient, node: str, *, settings: WatchSettings | None = None) -> Informer:
    """The consumer pods bound to the virtual node ``node``."""
    return Informer(client, PODS, name="consumer-pods", field_selector=f"spec.nodeName={node}",
                    key_of=consumer_key, project=drop_noise, settings=settings, compact=True)  # fmt: skip


def _twin_projection(pod: RawObject) -> RawObject:
    return twin_projection(drop_noise(pod))


def twin_pods(
    client: KubeClient,
    consumer_id: str,
    *,
    name: str,
    namespace: str | None = None,
    settings: WatchSettings | None = None,
    retry_permanent: bool = False,
) -> Informer:
    """The twins of ``consumer_id``'s pods (in ``namespace``, or everywhere), by consumer key."""
    return Informer(client, PODS, name=name, namespace=namespace, label_selector=owner_selector(consumer_id),
                    key_of=twin_key_for(consumer_id), project=_twin_projection, settings=settings,
                    retry_permanent=retry_permanent, compact=True)  # fmt: skip


def phase_of(pod: RawObject) -> str:
    """A pod's phase (``Pending`` when none is reported yet)."""
    return str((pod.get("status") or {}).get("phase") or "Pending")


class PodPhases:
    """The phase of each pod of an informer, kept as it changes: counting them walks a dict of
    strings, not every pod (which a compact store would decode)."""

    def __init__(self) -> None:
        self._phases: dict[ObjectKey, str] = {}

    def update(self, key: ObjectKey, pod: RawObject | None) -> None:
        if pod is None:
            self._phases.pop(key, None)
        else:
            self._phases[key] = phase_of(pod)

    def counts(self) -> dict[str, int]:
        """How many pods are in each phase."""
        counts: dict[str, int] = {}
        for phase in self._phases.values():
            counts[phase] = counts.get(phase, 0) + 1
        return counts


def after_each_item(informer: Informer, callback: Callable[[], None]) -> None:
    """Call ``callback`` once the store reflects a watch item (a list included, even an empty
    one, which changes nothing and so calls no change handler). Items that arrive together
    make one call."""
    scheduled = False

    def run() -> None:
        nonlocal scheduled
        scheduled = False
        callback()

    def on_item(_: object) -> None:
        nonlocal scheduled
        if not scheduled:
            scheduled = True
            asyncio.get_running_loop().call_soon(run)  # event handlers run before the store changes

    informer.add_event_handler(on_item)
