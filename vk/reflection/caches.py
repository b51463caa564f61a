"""Watched caches of both sides, feeding one keyed queue.

The consumer side holds the pods bound to the virtual node; the provider side holds the twins
this consumer owns. Both are keyed by the *consumer* pod key (namespace, name), so a change on
either side queues the same key, and the reconciler sees both objects at once.

Only projections are kept (``_project``): what the reconciler and the forge read, not managed
fields or the last-applied annotation, which are most of a pod's bytes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator
from typing import Any

from kube.clients import KubeClient
from kube.objects import PODS, ObjectKey, RawObject
from kube.settings import WatchSettings
from kube.watching import Listed, WatchEvent, watch_objects

from ..forge.labels import origin_of

logger = logging.getLogger(__name__)

_DROPPED_METADATA = ("managedFields",)
_LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"


def _project(obj: RawObject) -> RawObject:
    meta = {k: v for k, v in obj.get("metadata", {}).items() if k not in _DROPPED_METADATA}
    if _LAST_APPLIED in (meta.get("annotations") or {}):
        meta["annotations"] = {k: v for k, v in meta["annotations"].items() if k != _LAST_APPLIED}
    return {**obj, "metadata": meta}


class PodCache:
    """One side's pods, keyed by consumer pod key, kept current by a watch.

    ``key_of`` maps a watched pod to the consumer key it belongs to (None: not ours, ignored).
    ``synced`` is set once the first list is in; until then the cache must not be trusted to
    say that something does not exist.
    """

    def __init__(
        self,
        name: str,
        client: KubeClient,
        *,
        key_of: Callable[[RawObject], ObjectKey | None],
        on_change: Callable[[ObjectKey], None],
        label_selector: str | None = None,
        field_selector: str | None = None,
        settings: WatchSettings | None = None,
        namespace: str | None = None,
        on_event: Callable[[WatchEvent | Listed], None] | None = None,
        retry_permanent: bool = False,
    ) -> None:
        self.name = name
        self._client = client
        self._key_of = key_of
        self._on_change = on_change
        self._label_selector = label_selector
        self._field_selector = field_selector
        self._settings = settings
        self.namespace = namespace
        self._on_event = on_event
        self._retry_permanent = retry_permanent
        self._objects: dict[ObjectKey, RawObject] = {}
        self._watched: dict[ObjectKey, ObjectKey] = {}  # key of the watched object -> consumer key
        self.synced = asyncio.Event()

    def get(self, key: ObjectKey) -> RawObject | None:
        return self._objects.get(key)

    def keys(self) -> list[ObjectKey]:
        return list(self._objects)

    def __iter__(self) -> Iterator[ObjectKey]:
        return iter(list(self._objects))

    def phases(self) -> dict[str, int]:
        """How many cached pods are in each phase (``Pending`` when none is reported yet)."""
        counts: dict[str, int] = {}
        for pod in self._objects.values():
            phase = str((pod.get("status") or {}).get("phase") or "Pending")
            counts[phase] = counts.get(phase, 0) + 1
        return counts

    def __len__(self) -> int:
        return len(self._objects)

    async def run(self) -> None:
        """Watch forever. Events update the cache and queue their key; a ``Listed`` marker (first
        list, or relist after 410) drops what the list no longer has and queues those keys."""
        async for item in watch_objects(
            self._client,
            PODS,
            namespace=self.namespace,
            label_selector=self._label_selector,
            field_selector=self._field_selector,
            settings=self._settings,
            retry_permanent=self._retry_permanent,
        ):
            if self._on_event is not None:
                self._on_event(item)
            if isinstance(item, Listed):
                for watched in set(self._watched) - set(item.keys):
                    vanished = self._watched.pop(watched)
                    self._objects.pop(vanished, None)
                    self._on_change(vanished)
                if not self.synced.is_set():
                    logger.info("%s cache synced: %d pods", self.name, len(self._objects))
                    self.synced.set()
                continue
            key = self._key_of(item.object)
            if key is None:
                continue
            if item.type == "DELETED":
                current = self._objects.get(key)
                # a DELETED for an older object with the same key must not drop its successor
                if current is not None and current["metadata"].get("uid") == item.object["metadata"].get(
                    "uid"
                ):
                    del self._objects[key]
                self._watched.pop(item.key, None)
            else:
                self._objects[key] = _project(item.object)
                self._watched[item.key] = key
            self._on_change(key)


def consumer_key(pod: RawObject) -> ObjectKey:
    return ObjectKey(pod["metadata"].get("namespace"), pod["metadata"]["name"])


def twin_key_for(consumer_id: str) -> Callable[[RawObject], ObjectKey | None]:
    """Maps a provider twin to the consumer key recorded in its origin labels/annotations."""

    def key_of(pod: RawObject) -> ObjectKey | None:
        origin = origin_of(pod)
        if origin is None or origin.cluster_id != consumer_id:
            return None
        return ObjectKey(origin.namespace, origin.name)

    return key_of


def pod_uid(pod: dict[str, Any] | None) -> str | None:
    return None if pod is None else pod["metadata"].get("uid")
