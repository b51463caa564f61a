"""An informer: list+watch of one resource into a store of projected objects, with handlers.

:class:`Informer` runs :func:`kube.watching.watch_objects` forever and keeps ``store`` equal to
what the API server holds (as of the last event), each object reduced by ``project`` to the fields
its users read (a pod is ~18 KB as a dict and ~1.6 KB projected). After each change it calls its
handlers with a :class:`Change` (the old and the new projection). A ``Listed`` marker (the first
list, or a relist after 410 Gone) turns every key the store holds but the list lacks into a
``DELETED`` change, so nothing deleted while the watch was down is missed. ``synced`` is set once
the first list is in: until then a missing key does not mean a missing object.

Objects may be filed under another key than their own (``key_of``): the virtual kubelet files a
provider twin under the key of the consumer pod it stands for. A ``DELETED`` event only drops the
stored object when it is the same object (same uid): a successor with the same key stays.

Handlers are plain callables that must not block (they add keys to work queues).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Literal

from .clients import KubeClient
from .objects import ObjectKey, RawObject, Resource
from .settings import WatchSettings
from .watching import Listed, WatchEvent, watch_objects

__all__ = ["Change", "Informer", "Projection", "drop_noise"]

logger = logging.getLogger(__name__)

Projection = Callable[[RawObject], RawObject]

_LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"


def drop_noise(obj: RawObject) -> RawObject:
    """The default projection: the object without ``managedFields`` and the last-applied
    annotation, most of an object's bytes and read by no controller."""
    md = obj.get("metadata") or {}
    if "managedFields" not in md and _LAST_APPLIED not in (md.get("annotations") or {}):
        return obj
    kept = {k: v for k, v in md.items() if k != "managedFields"}
    if _LAST_APPLIED in (kept.get("annotations") or {}):
        kept["annotations"] = {k: v for k, v in kept["annotations"].items() if k != _LAST_APPLIED}
    return {**obj, "metadata": kept}


@dataclass(frozen=True)
class Change:
    """One change of the store: ``old`` is None for an addition, ``new`` None for a deletion."""

    type: Literal["ADDED", "MODIFIED", "DELETED"]
    key: ObjectKey
    old: RawObject | None
    new: RawObject | None

    @property
    def object(self) -> RawObject:
        """The object as it is now, or as it was last seen for a deletion."""
        obj = self.new if self.new is not None else self.old
        assert obj is not None
        return obj


class Informer:
    """The objects of one resource (optionally one namespace, selectors), kept current."""

    def __init__(
        self,
        client: KubeClient,
        resource: Resource,
        *,
        name: str | None = None,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        project: Projection = drop_noise,
        key_of: Callable[[RawObject], ObjectKey | None] = ObjectKey.of,
        settings: WatchSettings | None = None,
        retry_permanent: bool = False,
    ) -> None:
        self.client = client
        self.resource = resource
        self.name = name or resource.plural
        self.namespace = namespace
        self.label_selector = label_selector
        self.field_selector = field_selector
        self.project = project
        self.key_of = key_of
        self.settings = settings
        self.retry_permanent = retry_permanent
        self.store: dict[ObjectKey, RawObject] = {}
        self._filed: dict[ObjectKey, ObjectKey] = {}  # an object's own key -> the key it is filed under
        self._uids: dict[
            ObjectKey, str | None
        ] = {}  # filed key -> uid of the stored object (projections drop it)
        self._handlers: list[Callable[[Change], None]] = []
        self._event_handlers: list[Callable[[WatchEvent | Listed], None]] = []
        self.synced = asyncio.Event()

    # ---- reading -------------------------------------------------------------------------------

    def get(self, key: ObjectKey) -> RawObject | None:
        return self.store.get(key)

    def keys(self) -> list[ObjectKey]:
        return list(self.store)

    def values(self) -> list[RawObject]:
        return list(self.store.values())

    def __iter__(self) -> Iterator[ObjectKey]:
        return iter(list(self.store))

    def __len__(self) -> int:
        return len(self.store)

    def __contains__(self, key: object) -> bool:
        return key in self.store

    # ---- subscribing ---------------------------------------------------------------------------

    def add_handler(self, handler: Callable[[Change], None]) -> None:
        """Call ``handler`` after every change of the store."""
        self._handlers.append(handler)

    def add_event_handler(self, handler: Callable[[WatchEvent | Listed], None]) -> None:
        """Call ``handler`` with every raw watch item (events of objects ``key_of`` ignores too),
        before the store changes: for users that keep views of their own."""
        self._event_handlers.append(handler)

    def _emit(self, change: Change) -> None:
        for handler in self._handlers:
            handler(change)

    # ---- running -------------------------------------------------------------------------------

    def _apply(self, item: WatchEvent) -> None:
        key = self.key_of(item.object)
        if key is None:
            return
        old = self.store.get(key)
        uid = (item.object.get("metadata") or {}).get("uid")
        if item.type == "DELETED":
            # a deletion of an older object filed under the same key must not drop its successor
            self._filed.pop(item.key, None)
            if old is not None and self._uids.get(key) == uid:
                del self.store[key]
                del self._uids[key]
                self._emit(Change("DELETED", key, old, None))
            return
        new = self.project(item.object)
        self.store[key] = new
        self._uids[key] = uid
        self._filed[item.key] = key
        self._emit(Change("MODIFIED" if old is not None else "ADDED", key, old, new))

    def _relisted(self, listed: Listed) -> None:
        for own in set(self._filed) - set(listed.keys):
            key = self._filed.pop(own)
            if key in self._filed.values():
                continue  # filed anew by a successor that the list has
            old = self.store.pop(key, None)
            self._uids.pop(key, None)
            if old is not None:
                self._emit(Change("DELETED", key, old, None))
        if not self.synced.is_set():
            logger.info("informer %s synced: %d objects", self.name, len(self.store))
            self.synced.set()

    async def run(self) -> None:
        """Watch forever (a permanent API error ends it, unless ``retry_permanent``)."""
        async for item in watch_objects(
            self.client,
            self.resource,
            namespace=self.namespace,
            label_selector=self.label_selector,
            field_selector=self.field_selector,
            settings=self.settings,
            retry_permanent=self.retry_permanent,
        ):
            for handler in self._event_handlers:
                handler(item)
            if isinstance(item, Listed):
                self._relisted(item)
            else:
                self._apply(item)
