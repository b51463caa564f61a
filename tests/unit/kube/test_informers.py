"""The informer against the fake API server: its store follows the watch, a relist after 410
turns what vanished meanwhile into deletions, objects filed under another key keep their
successor, and projections keep only what is read."""

from __future__ import annotations

import asyncio
import contextlib
import tracemalloc
from typing import Any

import orjson
import pytest

from kube.clients import KubeClient
from kube.informers import JOURNAL_MAX, Change, Informer, drop_noise
from kube.objects import CONFIGMAPS, ObjectKey
from kube.settings import WatchSettings
from kube.watching import Listed, WatchEvent

from .fakeapi import NS, FakeApi, Pause, configmap, error_event, event

FAST = WatchSettings(timeout_seconds=7, backoff_base=0.01, backoff_max=0.05, backoff_jitter=0, read_timeout=5)


def summary(changes: list[Change]) -> list[str]:
    return [f"{c.type}:{c.key.name}" for c in changes]


async def until(condition: Any, timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


@pytest.mark.parametrize("compact", [False, True], ids=["dicts", "compact"])
async def test_relist_after_410_turns_what_vanished_into_deletions(
    fake: FakeApi, client: KubeClient, compact: bool
) -> None:
    fake.put("a", "b")
    modified = configmap("a", 103, size="big")
    fake.watch_scripts = [[event("MODIFIED", modified), error_event(410, "Expired")], [Pause(30)]]
    informer = Informer(client, CONFIGMAPS, namespace=NS, settings=FAST, compact=compact, decoded=1)
    changes: list[Change] = []

    def record(change: Change) -> None:
        changes.append(change)
        if change.type == "MODIFIED" and len(changes) == 3:
            # while the watcher is away, b goes and d comes: only the relist can tell
            del fake.objects["b"]
            fake.put("d")

    informer.add_handler(record)
    task = asyncio.create_task(informer.run())
    try:
        await asyncio.wait_for(informer.synced.wait(), 5)
        await until(lambda: len(changes) == 6)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert summary(changes) == ["ADDED:a", "ADDED:b", "MODIFIED:a", "MODIFIED:a", "ADDED:d", "DELETED:b"]
    old, new = changes[2].old, changes[2].new
    assert old is not None and new is not None
    assert (old["metadata"]["resourceVersion"], old["data"]) == ("101", {})
    assert (new["metadata"]["resourceVersion"], new["data"]) == ("103", modified["data"])
    assert changes[5].new is None and changes[5].object["metadata"]["name"] == "b"
    assert sorted(k.name for k in informer) == ["a", "d"]


@pytest.mark.parametrize("compact", [False, True], ids=["dicts", "compact"])
async def test_a_deletion_never_drops_the_successor_filed_under_the_same_key(
    fake: FakeApi, client: KubeClient, compact: bool
) -> None:
    def slot(obj: dict[str, Any]) -> ObjectKey | None:
        value = (obj.get("data") or {}).get("slot")
        return ObjectKey(NS, value) if value else None

    fake.watch_scripts = [
        [
            event("ADDED", configmap("first", 101, slot="s")),
            event("ADDED", configmap("second", 102, slot="s")),
            event("ADDED", configmap("unfiled", 103)),
            event("DELETED", configmap("first", 104, slot="s")),
        ],
        [Pause(30)],
    ]
    # a projection that keeps nothing of the metadata (the uid included) changes nothing
    informer = Informer(
        client,
        CONFIGMAPS,
        namespace=NS,
        key_of=slot,
        settings=FAST,
        project=lambda obj: {"data": obj.get("data"), "metadata": {"name": obj["metadata"]["name"]}},
        compact=compact,
        decoded=1,
    )
    changes: list[Change] = []
    informer.add_handler(changes.append)
    task = asyncio.create_task(informer.run())
    try:
        await until(lambda: len(changes) == 2 and len(fake.watches) == 2)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert summary(changes) == ["ADDED:s", "MODIFIED:s"]
    stored = informer.get(ObjectKey(NS, "s"))
    assert stored is not None and stored["metadata"]["name"] == "second"


async def test_a_deletion_removes_the_object_whatever_the_projection_keeps(
    fake: FakeApi, client: KubeClient
) -> None:
    fake.put("a")
    fake.watch_scripts = [[event("DELETED", configmap("a", 102))], [Pause(30)]]
    informer = Informer(client, CONFIGMAPS, namespace=NS, settings=FAST, project=lambda obj: {})
    changes: list[Change] = []
    informer.add_handler(changes.append)
    task = asyncio.create_task(informer.run())
    try:
        await until(lambda: len(changes) == 2)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert summary(changes) == ["ADDED:a", "DELETED:a"]
    assert len(informer) == 0


def test_the_default_projection_drops_managed_fields_and_last_applied() -> None:
    obj = {
        "metadata": {
            "name": "a",
            "managedFields": [{"manager": "kubectl"}],
            "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{...}", "keep": "me"},
        },
        "data": {"x": "1"},
    }
    projected = drop_noise(obj)
    assert projected == {"metadata": {"name": "a", "annotations": {"keep": "me"}}, "data": {"x": "1"}}
    assert obj["metadata"]["managedFields"], "the watched object itself is not changed"
    plain = {"metadata": {"name": "b"}}
    assert drop_noise(plain) is plain


def test_a_compact_store_holds_bytes_and_gives_back_what_it_was_given() -> None:
    informer = Informer(None, CONFIGMAPS, compact=True, decoded=2)  # type: ignore[arg-type]
    objects = [configmap(f"cm-{i}", 100 + i, size="big") for i in range(4)]
    changes: list[Change] = []
    informer.add_handler(changes.append)
    for obj in objects:
        informer._apply(WatchEvent("ADDED", obj))
    # the last two changed as dicts, the others as bytes
    packed = [isinstance(informer._store[ObjectKey.of(o)], bytes) for o in objects]
    assert packed == [True, True, False, False]
    assert list(informer._decoded) == [ObjectKey.of(o) for o in objects[2:]]
    for obj in objects:
        assert informer.get(ObjectKey.of(obj)) == drop_noise(obj)
    assert sorted(k.name for k, _ in informer.items()) == [f"cm-{i}" for i in range(4)]
    newer = configmap("cm-0", 200)
    informer._apply(WatchEvent("MODIFIED", newer))
    modified = changes[-1]
    assert modified.type == "MODIFIED" and modified.new == drop_noise(newer)
    assert modified.old == drop_noise(objects[0])  # decoded from the bytes it had
    informer._apply(WatchEvent("DELETED", newer))
    assert changes[-1].old == drop_noise(newer) and informer.get(ObjectKey.of(newer)) is None
    written = configmap("cm-9", 300)
    informer.put_written(written)
    assert informer.get(ObjectKey.of(written)) == drop_noise(written)
    assert len(changes) == 6  # a write of ours calls no handler


def test_a_compact_store_packs_an_object_changed_in_a_row_once_when_it_goes_cold() -> None:
    """A pod through its start changes several times in a row: it is kept as a dict meanwhile,
    and packed when others have been read or changed since (issue 15: a deflate at each change
    was 3 to 4 % of the virtual kubelet's samples)."""
    informer = Informer(None, CONFIGMAPS, compact=True, decoded=2)  # type: ignore[arg-type]
    hot = ObjectKey.of(configmap("hot", 1))
    for version in range(1, 6):
        informer._apply(WatchEvent("MODIFIED" if version > 1 else "ADDED", configmap("hot", version)))
        assert informer.get(hot) == drop_noise(configmap("hot", version))
    # nothing packed yet (the first pack sets the packer's dictionary)
    assert informer._packer._zdict is None and informer._store[hot] == drop_noise(configmap("hot", 5))
    informer._apply(WatchEvent("ADDED", configmap("other-1", 1)))
    assert informer._packer._zdict is None  # still among the last two
    informer._apply(WatchEvent("ADDED", configmap("other-2", 1)))
    # packed now, as its last version is: that version's JSON is the dictionary
    assert isinstance(informer._store[hot], bytes)
    assert informer._packer._zdict == orjson.dumps(drop_noise(configmap("hot", 5)))
    assert informer.get(hot) == drop_noise(configmap("hot", 5))  # and read back as a dict again
    assert isinstance(informer._store[ObjectKey.of(configmap("other-1", 1))], bytes)
    # one only read is not packed again when it goes cold: its bytes stay as they were
    packed = informer._store[hot]
    informer._apply(WatchEvent("ADDED", configmap("other-3", 1)))
    informer._apply(WatchEvent("ADDED", configmap("other-4", 1)))
    assert hot not in informer._decoded and informer._store[hot] is packed


def test_a_compact_store_costs_a_fraction_of_the_json_of_alike_objects() -> None:
    """Objects of one informer are alike (pods of one Job): deflated against the first one's JSON
    they cost a fraction of their own JSON (issue 15, ten thousand pods on each side)."""
    informer = Informer(None, CONFIGMAPS, compact=True, decoded=1)  # type: ignore[arg-type]
    objects = []
    for i in range(200):
        obj = configmap(f"cm-{i}", 100 + i)
        obj["data"] = {"payload": "".join(f"line {n}: the same text in each object\n" for n in range(60)),
                       "i": str(i), "uid": f"{i:08x}-4b1e-11ef-9f3a-{i * 7919:012x}"}  # fmt: skip
        objects.append(obj)
    size = len(orjson.dumps(drop_noise(objects[0])))
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for obj in objects:
            informer._apply(WatchEvent("ADDED", obj))
        per_object = (tracemalloc.get_traced_memory()[0] - before) / len(objects)
    finally:
        tracemalloc.stop()
    # the deflated JSON and a few hundred bytes of bookkeeping (keys, uid, resourceVersion)
    assert size > 2000 and per_object < size / 4, (per_object, size)
    assert all(informer.get(ObjectKey.of(o)) == drop_noise(o) for o in objects)


def test_a_compact_store_gives_back_objects_unlike_the_first() -> None:
    """The first object is the dictionary; objects that share nothing with it, or that are empty
    or not ASCII, come back as they were."""
    informer = Informer(None, CONFIGMAPS, compact=True, decoded=1)  # type: ignore[arg-type]
    first = configmap("first", 1)
    odd = [configmap("empty", 2), configmap("unicode", 3), configmap("long", 4)]
    odd[0]["data"] = {}
    odd[1]["data"] = {"text": "Grüße, 東京, ✓ " * 20, "quote": '"\\\n'}
    odd[2]["data"] = {f"k{i}": str(i * 31337) for i in range(2000)}  # longer than a 32 KB window
    for obj in [first, *odd]:
        informer._apply(WatchEvent("ADDED", obj))
    informer._apply(WatchEvent("MODIFIED", configmap("first", 5)))  # the dictionary outlives its object
    for obj in [*odd, configmap("first", 5)]:
        assert informer.get(ObjectKey.of(obj)) == drop_noise(obj)


def test_identity_tells_what_is_stored_under_a_key_without_decoding_it() -> None:
    """The UID, resourceVersion and own key of what is filed under a key (a twin under its
    consumer pod's key), read without decoding a compact store's bytes; none once it is gone,
    whether deleted, written over by another object or dropped at a relist."""
    filed = {"twin-a": ObjectKey("ml", "a"), "twin-b": ObjectKey("ml", "b")}
    informer = Informer(None, CONFIGMAPS, compact=True, decoded=1,  # type: ignore[arg-type]
                        key_of=lambda obj: filed.get(obj["metadata"]["name"]))  # fmt: skip
    a, b = configmap("twin-a", 100), configmap("twin-b", 101)
    informer._apply(WatchEvent("ADDED", a))
    informer._apply(WatchEvent("ADDED", b))  # a is bytes now
    assert isinstance(informer._store[ObjectKey("ml", "a")], bytes)
    assert informer.identity(ObjectKey("ml", "a")) == ("uid-twin-a", "100", ObjectKey(NS, "twin-a"))
    assert informer.identity(ObjectKey("ml", "b")).own == ObjectKey(NS, "twin-b")  # type: ignore[union-attr]
    assert list(informer._decoded) == [ObjectKey("ml", "b")]  # a was not decoded (a get() would have)
    assert informer.identity(ObjectKey(NS, "twin-a")) is None  # filed under the consumer key only
    informer._apply(WatchEvent("MODIFIED", configmap("twin-a", 102)))
    assert informer.identity(ObjectKey("ml", "a")).version == "102"  # type: ignore[union-attr]
    informer._apply(WatchEvent("DELETED", configmap("twin-a", 103)))
    assert informer.identity(ObjectKey("ml", "a")) is None
    informer.put_written(configmap("twin-a", 104))
    assert informer.identity(ObjectKey("ml", "a")) == ("uid-twin-a", "104", ObjectKey(NS, "twin-a"))
    informer._relisted(Listed("105", frozenset({ObjectKey(NS, "twin-a")})))
    assert informer.identity(ObjectKey("ml", "b")) is None


@pytest.mark.parametrize("compact", [False, True])
def test_changes_grow_with_every_change_of_the_store_and_with_nothing_else(compact: bool) -> None:
    """A reader keeps what it made of the store while the count is the same: an addition, a
    change, a deletion, a write of ours and a relist that drops an object each move it; reads,
    a deletion of an object not held, and a relist that drops nothing do not."""
    informer = Informer(None, CONFIGMAPS, compact=compact, decoded=1)  # type: ignore[arg-type]
    seen = [informer.changes()]

    def moved() -> bool:
        seen.append(informer.changes())
        return seen[-1] != seen[-2]

    informer._apply(WatchEvent("ADDED", configmap("a", 1)))
    assert moved()
    informer._apply(WatchEvent("ADDED", configmap("b", 2)))
    assert moved()
    for read in (lambda: informer.get(ObjectKey(NS, "a")), informer.keys, informer.values, informer.items,
                 lambda: informer.identity(ObjectKey(NS, "b"))):  # fmt: skip
        read()
        assert not moved()
    informer._apply(WatchEvent("MODIFIED", configmap("a", 3)))
    assert moved()
    informer._apply(WatchEvent("DELETED", configmap("elsewhere", 4)))
    assert not moved()
    informer._apply(WatchEvent("DELETED", configmap("a", 5)))
    assert moved()
    informer.put_written(configmap("c", 6))
    assert moved()
    informer._relisted(Listed("7", frozenset({ObjectKey(NS, "b"), ObjectKey(NS, "c")})))
    assert not moved()
    informer._relisted(Listed("8", frozenset({ObjectKey(NS, "c")})))
    assert moved()
    assert informer.keys() == [ObjectKey(NS, "c")]
    assert sorted(seen) == seen  # never back: a count seen before is never seen for another store


def test_changed_since_tells_the_keys_changed_from_the_first_time_it_is_asked() -> None:
    """A reader that made something of every object reads again only the keys changed since;
    None where the store cannot tell: before its journal started (the first call), or after more
    changes than it holds."""
    informer = Informer(None, CONFIGMAPS, compact=True, decoded=1)  # type: ignore[arg-type]
    informer._apply(WatchEvent("ADDED", configmap("a", 1)))
    before = informer.changes()
    assert informer.changed_since(before - 1) is None  # before the journal started
    assert informer.changed_since(before) == set()
    informer._apply(WatchEvent("ADDED", configmap("b", 2)))
    informer._apply(WatchEvent("MODIFIED", configmap("a", 3)))
    middle = informer.changes()
    informer.put_written(configmap("c", 4))
    informer._apply(WatchEvent("DELETED", configmap("b", 5)))
    a, b, c = (ObjectKey(NS, name) for name in "abc")
    assert informer.changed_since(before) == {a, b, c}
    assert informer.changed_since(middle) == {b, c}
    assert informer.changed_since(informer.changes()) == set()
    assert informer.changed_since(informer.changes() + 1) is None  # not a count of this store's
    informer._relisted(Listed("6", frozenset({c})))
    assert informer.changed_since(middle) == {a, b, c}
    last = informer.changes()
    for version in range(JOURNAL_MAX):
        informer._apply(WatchEvent("MODIFIED", configmap("c", 10 + version)))  # a drop and a put each
    assert informer.changed_since(last) is None  # more than the journal holds
    assert informer.changed_since(informer.changes() - JOURNAL_MAX) == {c}
