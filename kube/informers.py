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

A ``compact`` informer keeps each projection as its JSON bytes (orjson) instead of a dict, and
deflates them against a dictionary: the JSON of the first object it packed. Objects of one
informer are alike (pods of the same Jobs, on the same nodes), so a pod of ~2.5 to 5.5 KB of JSON
keeps 0.2 to 0.8 KB, against ~12 KB as a dict, which is what lets one virtual kubelet hold ten
thousand pods on each side (issue 15: 169 MiB at 10,000 with plain JSON; a deflate costs ~11 µs
and an inflate ~1 to 5 µs, beside ~1 to 4 µs for the JSON). The last ``decoded`` objects read or
changed are kept as dicts, and an object is packed when it leaves them: a reconciler that reads
the same object several times just after its event decodes it at most once, and an object changed
several times in a row (a pod through its start: bound, twin made, Running) is packed once, not
at each change. Readers never mutate what they get, compact or not: the store shares its objects.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import zlib
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator
from typing import Literal, NamedTuple

import orjson

from .clients import KubeClient
from .objects import ObjectKey, RawObject, Resource
from .settings import WatchSettings
from .watching import Listed, WatchEvent, watch_objects

__all__ = ["Change", "Informer", "Projection", "Stored", "drop_noise"]

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


_MEM_LEVEL = 4
"""zlib's memLevel for packing: most of a deflate of a small object is zlib clearing its hash
tables, whose size grows with memLevel. A 1.6 KB pod: ~51 µs at memLevel 9 (the default), ~11 µs
at 4, for 3 % more bytes (167 against 162; issue 15)."""


class _Packer:
    """Objects as raw deflate of their JSON, with the JSON of the first object packed as the
    dictionary (kept for the packer's life: what it packed needs it to unpack)."""

    __slots__ = ("_zdict",)

    def __init__(self) -> None:
        self._zdict: bytes | None = None

    def pack(self, obj: RawObject) -> bytes:
        data = orjson.dumps(obj)
        if self._zdict is None:
            self._zdict = bytes(memoryview(data))  # exact size: orjson keeps growth room
        deflate = zlib.compressobj(1, zlib.DEFLATED, -15, _MEM_LEVEL, zlib.Z_DEFAULT_STRATEGY, self._zdict)
        return deflate.compress(data) + deflate.flush()

    def unpack(self, packed: bytes) -> RawObject:
        inflate = zlib.decompressobj(-15, zdict=self._zdict or b"")
        obj: RawObject = orjson.loads(inflate.decompress(packed) + inflate.flush())
        return obj


JOURNAL_MAX = 4096
"""The most changes an informer's journal tells (:meth:`Informer.changed_since`): a reader that
comes back after more reads everything again."""


class Stored(NamedTuple):
    """What an informer knows of a stored object without decoding it."""

    uid: str | None
    version: str | None
    """Its resourceVersion."""
    own: ObjectKey
    """Its own key (namespace, name), which may differ from the key it is filed under."""


def _identity(obj: RawObject, own: ObjectKey) -> Stored:
    metadata = obj.get("metadata") or {}
    return Stored(metadata.get("uid"), metadata.get("resourceVersion"), own)


class Change:
    """One change of the store: ``old`` is None for an addition, ``new`` None for a deletion.

    ``old`` is decoded when first read (a compact store holds it as bytes, and most handlers
    read only ``key``)."""

    __slots__ = ("_old", "_unpack", "key", "new", "type")

    def __init__(
        self,
        type: Literal["ADDED", "MODIFIED", "DELETED"],
        key: ObjectKey,
        old: RawObject | bytes | None,
        new: RawObject | None,
        unpack: Callable[[bytes], RawObject] = orjson.loads,
    ) -> None:
        self.type = type
        self.key = key
        self._old = old
        self.new = new
        self._unpack = unpack

    @property
    def old(self) -> RawObject | None:
        if isinstance(self._old, bytes):
            self._old = self._unpack(self._old)
        return self._old

    def __repr__(self) -> str:
        return f"Change({self.type}, {self.key})"

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
        compact: bool = False,
        decoded: int = 128,
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
        self.compact = compact
        self._store: dict[ObjectKey, RawObject | bytes] = {}
        self._packer = _Packer()
        self._decoded: OrderedDict[ObjectKey, RawObject] = OrderedDict()
        """Compact only: the last ``decoded`` objects read or changed (LRU). One changed since it was
        last packed is a dict in ``_store`` too (and only while it is here); the others are bytes
        there."""
        self._decoded_max = max(1, decoded)
        self._filed: dict[ObjectKey, ObjectKey] = {}  # an object's own key -> the key it is filed under
        self._uids: dict[ObjectKey, Stored] = {}
        """Filed key -> the stored object's UID, resourceVersion and own key, read without
        decoding it (and kept whatever the projection drops)."""
        self._changes = 0
        """How many times the store changed (an object put or dropped): see :meth:`changes`."""
        self._journal: deque[ObjectKey] | None = None
        """The keys of the last changes, one per change (see :meth:`changed_since`); kept once
        a reader asked for them."""
        self._handlers: list[Callable[[Change], None]] = []
        self._event_handlers: list[Callable[[WatchEvent | Listed], None]] = []
        self.synced = asyncio.Event()

    # ---- reading -------------------------------------------------------------------------------

    def get(self, key: ObjectKey) -> RawObject | None:
        stored = self._store.get(key)
        if not isinstance(stored, bytes):
            if self.compact and stored is not None:
                self._decoded.move_to_end(key)
            return stored
        obj = self._decoded.get(key)
        if obj is not None:
            self._decoded.move_to_end(key)
            return obj
        decoded = self._packer.unpack(stored)
        self._remember(key, decoded)
        return decoded

    def _remember(self, key: ObjectKey, obj: RawObject) -> None:
        """Compact only: ``obj`` is the last read or changed. The one read or changed longest ago,
        beyond the ``decoded`` kept as dicts, is dropped as a dict, and packed if it changed since
        it was last packed (an object changed again while it is kept, as a pod is through its
        start, is packed once; one only read is not packed again)."""
        self._decoded[key] = obj
        self._decoded.move_to_end(key)
        if len(self._decoded) > self._decoded_max:
            cold_key, cold = self._decoded.popitem(last=False)
            if not isinstance(self._store[cold_key], bytes):
                self._store[cold_key] = self._packer.pack(cold)

    def _put(self, key: ObjectKey, obj: RawObject) -> None:
        self._changes += 1
        if self._journal is not None:
            self._journal.append(key)
        self._store[key] = obj
        if self.compact:
            self._remember(key, obj)

    def _drop(self, key: ObjectKey) -> RawObject | bytes | None:
        self._changes += 1
        if self._journal is not None:
            self._journal.append(key)
        if self.compact:
            decoded = self._decoded.pop(key, None)
            stored = self._store.pop(key, None)
            return decoded if decoded is not None else stored
        return self._store.pop(key, None)

    def keys(self) -> list[ObjectKey]:
        return list(self._store)

    def changes(self) -> int:
        """A count that grows with every change of the store (also :meth:`put_written`'s), and
        only then: a reader that made something of every object (the kubelet API's list of the
        node's pods) keeps it while the count is the same."""
        return self._changes

    def changed_since(self, count: int) -> set[ObjectKey] | None:
        """The keys of the objects put or dropped since :meth:`changes` was ``count``: a reader
        that made something of every object makes it again of these only. None where the store
        cannot tell: more than :data:`JOURNAL_MAX` changes since, or since before the first
        call (which starts the journal: a store no reader asks keeps none)."""
        if self._journal is None:
            self._journal = deque(maxlen=JOURNAL_MAX)
            return set() if count == self._changes else None
        since = self._changes - count
        if since < 0 or since > len(self._journal):
            return None
        return set(itertools.islice(reversed(self._journal), since))

    def resource_version(self, key: ObjectKey) -> str | None:
        """The ``resourceVersion`` of the object stored under ``key`` (no decoding)."""
        stored = self._uids.get(key)
        return stored.version if stored is not None else None

    def identity(self, key: ObjectKey) -> Stored | None:
        """The UID, resourceVersion and own key of the object stored under ``key`` (no
        decoding; None: nothing stored there)."""
        return self._uids.get(key)

    def items(self) -> list[tuple[ObjectKey, RawObject]]:
        return [(key, obj) for key in list(self._store) if (obj := self.get(key)) is not None]

    def put_written(self, obj: RawObject) -> None:
        """Store ``obj``, the API server's answer to a write of ours, before its watch event
        comes (which then replaces it): a read in between sees what was written. No handler is
        called."""
        key = self.key_of(obj)
        if key is None:
            return
        self._put(key, self.project(obj))
        own = ObjectKey.of(obj)
        self._uids[key] = _identity(obj, own)
        self._filed[own] = key

    def values(self) -> list[RawObject]:
        """Every object (a compact store decodes each: for rare, whole-store reads)."""
        return [obj for key in list(self._store) if (obj := self.get(key)) is not None]

    def __iter__(self) -> Iterator[ObjectKey]:
        return iter(list(self._store))

    def __len__(self) -> int:
        return len(self._store)

    def __contains__(self, key: object) -> bool:
        return key in self._store

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
        present = key in self._store
        uid = (item.object.get("metadata") or {}).get("uid")
        if item.type == "DELETED":
            # a deletion of an older object filed under the same key must not drop its successor
            self._filed.pop(item.key, None)
            if present and (stored := self._uids.get(key)) is not None and stored.uid == uid:
                old = self._drop(key)
                del self._uids[key]
                self._emit(Change("DELETED", key, old, None, self._packer.unpack))
            return
        old = self._drop(key) if present and self.compact else self._store.get(key)
        new = self.project(item.object)
        self._put(key, new)
        self._uids[key] = _identity(item.object, item.key)
        self._filed[item.key] = key
        self._emit(Change("MODIFIED" if present else "ADDED", key, old, new, self._packer.unpack))

    def _relisted(self, listed: Listed) -> None:
        gone = [(own, self._filed.pop(own)) for own in set(self._filed) - set(listed.keys)]
        still_filed = set(self._filed.values()) if gone else set()
        for _, key in gone:
            if key in still_filed:
                continue  # filed anew by a successor that the list has
            old = self._drop(key)
            self._uids.pop(key, None)
            if old is not None:
                self._emit(Change("DELETED", key, old, None, self._packer.unpack))
        if not self.synced.is_set():
            logger.info("informer %s synced: %d objects", self.name, len(self._store))
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
            self.receive(item)

    def receive(self, item: WatchEvent | Listed) -> None:
        """Take one item of the watch: its event handlers see it, then the store changes."""
        for handler in self._event_handlers:
            handler(item)
        if isinstance(item, Listed):
            self._relisted(item)
        else:
            self._apply(item)
