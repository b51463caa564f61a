"""watch_objects against the fake API server: list, watch, resume, relist, back off, give up."""

from __future__ import annotations

import gc
import time
from collections.abc import AsyncIterator

import pytest

from kube.clients import KubeClient
from kube.errors import Forbidden, NotFound, ResourceNotServed
from kube.metrics import REGISTRY
from kube.objects import CONFIGMAPS, ObjectKey
from kube.settings import WatchSettings
from kube.watching import Listed, WatchEvent, backoff_delay, present_after, watch_objects

from .fakeapi import NS, Drop, FakeApi, Fault, Pause, bookmark, configmap, error_event, event

FAST = WatchSettings(
    timeout_seconds=7, page_size=2, backoff_base=0.01, backoff_max=0.05, backoff_jitter=0, read_timeout=2
)


async def collect(
    client: KubeClient, iterations: int, settings: WatchSettings = FAST
) -> list[WatchEvent | Listed]:
    out: list[WatchEvent | Listed] = []
    stream: AsyncIterator[WatchEvent | Listed] = watch_objects(
        client, CONFIGMAPS, namespace=NS, settings=settings, _iterations=iterations
    )
    async for item in stream:
        out.append(item)
    return out


def summary(items: list[WatchEvent | Listed]) -> list[str]:
    return [
        f"Listed@{i.resource_version}:{','.join(sorted(k.name for k in i.keys))}"
        if isinstance(i, Listed)
        else f"{i.type}:{i.key.name}"
        for i in items
    ]


async def test_lists_all_pages_then_watches_from_the_list_rv(fake: FakeApi, client: KubeClient) -> None:
    fake.put("a", "b", "c")  # rv 101..103, page_size 2 -> two pages
    fake.watch_scripts = [[event("MODIFIED", configmap("a", 104)), event("DELETED", configmap("b", 105))]]

    items = await collect(client, iterations=2)

    assert summary(items) == ["ADDED:a", "ADDED:b", "ADDED:c", "Listed@103:a,b,c", "MODIFIED:a", "DELETED:b"]
    assert [r.query.get("continue") for r in fake.lists] == [None, "2"]
    assert all(r.query["limit"] == "2" for r in fake.lists)
    (watch,) = fake.watches
    assert watch.query["resourceVersion"] == "103"
    assert watch.query["allowWatchBookmarks"] == "true"
    assert watch.query["timeoutSeconds"] == "7"
    assert watch.headers["Authorization"] == "Bearer s3cr3t-token"
    first = items[0]
    assert isinstance(first, WatchEvent)
    assert first.object["kind"] == "ConfigMap" and first.object["apiVersion"] == "v1"
    assert first.key == ObjectKey(NS, "a")


async def test_a_watch_that_ends_is_resumed_from_the_last_rv_without_relisting(
    fake: FakeApi, client: KubeClient
) -> None:
    fake.put("a")
    fake.watch_scripts = [[event("MODIFIED", configmap("a", 150))], [event("MODIFIED", configmap("a", 151))]]

    items = await collect(client, iterations=3)

    assert summary(items) == ["ADDED:a", "Listed@101:a", "MODIFIED:a", "MODIFIED:a"]
    assert len(fake.lists) == 1
    assert [w.query["resourceVersion"] for w in fake.watches] == ["101", "150"]


async def test_bookmarks_move_the_rv_and_are_not_yielded(fake: FakeApi, client: KubeClient) -> None:
    fake.put("a")
    fake.watch_scripts = [[bookmark(300)], [bookmark(301), event("ADDED", configmap("z", 302))]]

    items = await collect(client, iterations=3)

    assert summary(items) == ["ADDED:a", "Listed@101:a", "ADDED:z"]
    assert [w.query["resourceVersion"] for w in fake.watches] == ["101", "300"]


async def test_error_410_in_the_stream_relists_and_yields_a_fresh_listed(
    fake: FakeApi, client: KubeClient
) -> None:
    fake.put("a", "b")
    fake.watch_scripts = [
        [
            event("MODIFIED", configmap("a", 103)),
            error_event(410, "Expired", "too old resource version: 103"),
        ],
        [event("ADDED", configmap("c", 201))],
    ]

    stream = watch_objects(client, CONFIGMAPS, namespace=NS, settings=FAST, _iterations=4)
    items: list[WatchEvent | Listed] = []
    async for item in stream:
        items.append(item)
        if isinstance(item, WatchEvent) and item.type == "MODIFIED":
            # while the watcher is away, b goes and d comes: only the relist can tell
            del fake.objects["b"]
            fake.put("d")

    assert summary(items) == [
        "ADDED:a",
        "ADDED:b",
        "Listed@102:a,b",
        "MODIFIED:a",
        "ADDED:a",
        "ADDED:d",
        "Listed@103:a,d",
        "ADDED:c",
    ]
    assert [w.query["resourceVersion"] for w in fake.watches] == ["102", "103"]
    assert len([r for r in fake.lists if "continue" not in r.query]) == 2


async def test_http_410_on_the_watch_request_relists(fake: FakeApi, client: KubeClient) -> None:
    fake.put("a")
    # list, then the watch request itself is answered 410
    fake.watch_scripts = [[]]
    items: list[WatchEvent | Listed] = []
    async for item in watch_objects(client, CONFIGMAPS, namespace=NS, settings=FAST, _iterations=4):
        items.append(item)
        if isinstance(item, Listed) and len(fake.lists) == 1:
            fake.faults.append(Fault(410, "Expired"))

    assert summary(items) == ["ADDED:a", "Listed@101:a", "ADDED:a", "Listed@101:a"]
    assert len(fake.lists) == 2
    assert len(fake.watches) == 2


async def test_500_then_success_resumes_from_the_last_rv(fake: FakeApi, client: KubeClient) -> None:
    fake.put("a")
    fake.watch_scripts = [[event("MODIFIED", configmap("a", 120))], [event("MODIFIED", configmap("a", 121))]]
    items: list[WatchEvent | Listed] = []
    async for item in watch_objects(client, CONFIGMAPS, namespace=NS, settings=FAST, _iterations=5):
        items.append(item)
        if isinstance(item, WatchEvent) and item.object["metadata"]["resourceVersion"] == "120":
            fake.faults += [Fault(500), Fault(503, "ServiceUnavailable")]

    assert summary(items) == ["ADDED:a", "Listed@101:a", "MODIFIED:a", "MODIFIED:a"]
    assert len(fake.lists) == 1, "a 5xx must not cause a relist"
    assert [w.query["resourceVersion"] for w in fake.watches] == ["101", "120", "120", "120"]


async def test_429_honours_retry_after(fake: FakeApi, client: KubeClient) -> None:
    fake.put("a")
    fake.faults = [Fault(429, "TooManyRequests", headers={"Retry-After": "0.3"})]
    started = time.monotonic()

    items = await collect(client, iterations=2)

    assert summary(items) == ["ADDED:a", "Listed@101:a"]
    assert time.monotonic() - started >= 0.3
    assert len(fake.lists) == 2


async def test_a_dropped_connection_resumes_from_the_last_complete_event(
    fake: FakeApi, client: KubeClient
) -> None:
    fake.put("a")
    half = event("MODIFIED", configmap("a", 131))[:20]
    fake.watch_scripts = [
        [event("MODIFIED", configmap("a", 130)), half, Pause(0.05), Drop()],
        [event("MODIFIED", configmap("a", 131))],
    ]

    items = await collect(client, iterations=3)

    assert summary(items) == ["ADDED:a", "Listed@101:a", "MODIFIED:a", "MODIFIED:a"]
    assert [w.query["resourceVersion"] for w in fake.watches] == ["101", "130"]
    assert len(fake.lists) == 1


async def test_an_event_split_across_chunks_is_reassembled(fake: FakeApi, client: KubeClient) -> None:
    fake.put("a")
    big = configmap("a", 140, blob="x" * 300_000)  # larger than aiohttp's readline limit
    line = event("MODIFIED", big) + event("MODIFIED", configmap("a", 141))
    cut1, cut2 = 7, len(line) // 2
    fake.watch_scripts = [[line[:cut1], Pause(0.02), line[cut1:cut2], Pause(0.02), line[cut2:]]]

    items = await collect(client, iterations=2)

    assert summary(items) == ["ADDED:a", "Listed@101:a", "MODIFIED:a", "MODIFIED:a"]
    modified = items[2]
    assert isinstance(modified, WatchEvent)
    assert modified.object["data"]["blob"] == "x" * 300_000


async def test_a_silent_stream_times_out_and_resumes(fake: FakeApi, client: KubeClient) -> None:
    fake.put("a")
    fake.watch_scripts = [
        [event("MODIFIED", configmap("a", 160)), Pause(2)],
        [event("DELETED", configmap("a", 161))],
    ]
    settings = WatchSettings(page_size=10, backoff_base=0.01, backoff_jitter=0, read_timeout=0.2)

    items = await collect(client, iterations=3, settings=settings)

    assert summary(items) == ["ADDED:a", "Listed@101:a", "MODIFIED:a", "DELETED:a"]
    assert [w.query["resourceVersion"] for w in fake.watches] == ["101", "160"]


async def test_error_event_500_backs_off_without_relisting(fake: FakeApi, client: KubeClient) -> None:
    fake.put("a")
    fake.watch_scripts = [[event("MODIFIED", configmap("a", 170)), error_event(500, "InternalError")], []]

    items = await collect(client, iterations=3)

    assert summary(items) == ["ADDED:a", "Listed@101:a", "MODIFIED:a"]
    assert len(fake.lists) == 1
    assert [w.query["resourceVersion"] for w in fake.watches] == ["101", "170"]


async def test_a_failed_list_is_retried(fake: FakeApi, client: KubeClient) -> None:
    fake.put("a")
    fake.faults = [Fault(500)]

    items = await collect(client, iterations=2)

    assert summary(items) == ["ADDED:a", "Listed@101:a"]
    assert len(fake.lists) == 2


async def test_forbidden_list_is_raised(fake: FakeApi, client: KubeClient) -> None:
    fake.faults = [Fault(403, "Forbidden")]
    with pytest.raises(Forbidden):
        await collect(client, iterations=5)
    assert len(fake.requests) == 1


async def test_not_found_watch_is_raised(fake: FakeApi, client: KubeClient) -> None:
    fake.put("a")
    items: list[WatchEvent | Listed] = []
    with pytest.raises(NotFound):
        async for item in watch_objects(client, CONFIGMAPS, namespace=NS, settings=FAST, _iterations=5):
            items.append(item)
            fake.faults.append(Fault(404, "NotFound"))
    assert summary(items) == ["ADDED:a", "Listed@101:a"]


async def test_a_list_not_found_names_the_type_not_served(fake: FakeApi, client: KubeClient) -> None:
    """A list is never 404 for want of objects: the type is missing (a CRD not installed)."""
    fake.faults = [Fault(404, "NotFound")]
    with pytest.raises(ResourceNotServed) as caught:
        await collect(client, iterations=5)
    assert isinstance(caught.value, NotFound)  # still a 404 to whoever handles those
    assert "does not serve configmaps (v1): is its CustomResourceDefinition installed?" in str(caught.value)
    assert len(fake.requests) == 1


async def test_unreachable_server_is_retried_with_backoff(tmp_path: object, unused_tcp_port: int) -> None:
    from pathlib import Path

    from .conftest import write_kubeconfig

    assert isinstance(tmp_path, Path)
    path = write_kubeconfig(tmp_path / "kc", f"http://127.0.0.1:{unused_tcp_port}")
    async with KubeClient.from_kubeconfig(path) as client:
        started = time.monotonic()
        items = await collect(client, iterations=3)
    assert items == []
    # three refused attempts, each followed by a back-off: 0.01 + 0.02 + 0.04
    assert time.monotonic() - started >= 0.07


def test_backoff_doubles_up_to_the_cap_and_retry_after_wins() -> None:
    s = WatchSettings(backoff_base=0.5, backoff_max=3, backoff_jitter=0)
    assert [backoff_delay(n, s) for n in range(1, 6)] == [0.5, 1.0, 2.0, 3, 3]
    assert backoff_delay(4, s, retry_after=7) == 7
    jittered = WatchSettings(backoff_base=1, backoff_max=10, backoff_jitter=0.5)
    assert all(1 <= backoff_delay(1, jittered) <= 1.5 for _ in range(50))


async def test_a_long_lived_loop_can_outlive_a_permanent_error(fake: FakeApi, client: KubeClient) -> None:
    # e.g. the RoleBinding or the CRD is not there yet: 403, then 404, then it works
    fake.put("a")
    fake.faults = [Fault(403, "Forbidden"), Fault(404, "NotFound")]
    items: list[WatchEvent | Listed] = []
    async for item in watch_objects(
        client, CONFIGMAPS, namespace=NS, settings=FAST, retry_permanent=True, _iterations=3
    ):
        items.append(item)
    assert summary(items)[:2] == ["ADDED:a", "Listed@101:a"]
    assert len(fake.lists) == 3


def _listed_objects_alive(prefix: str, fake: FakeApi) -> int:
    """Decoded copies of the fake's objects still alive (the fake's own do not count)."""
    gc.collect()
    own = {id(obj) for obj in fake.objects.values()}
    return sum(
        1
        for obj in gc.get_objects()
        if isinstance(obj, dict)
        and id(obj) not in own
        and isinstance(obj.get("metadata"), dict)
        and str(obj["metadata"].get("name", "")).startswith(prefix)
    )


async def test_the_listed_objects_are_let_go_once_handed_out(fake: FakeApi, client: KubeClient) -> None:
    # the watch that follows a list runs for hours: the list must not stay in its frame
    fake.put(*(f"kept-{i}" for i in range(5)))
    fake.watch_scripts = [[Pause(30)]]
    stream = watch_objects(client, CONFIGMAPS, namespace=NS, settings=FAST)
    seen = 0
    async for item in stream:
        if isinstance(item, Listed):
            break
        seen += 1
    assert seen == 5
    del item
    assert _listed_objects_alive("kept-", fake) == 0
    await stream.aclose()  # type: ignore[attr-defined]


async def test_what_a_loop_receives_is_counted_by_resource_type_and_server(
    fake: FakeApi, client: KubeClient
) -> None:
    def seen(kind: str) -> float:
        labels = {"resource": "configmaps", "type": kind, "server": client.server}
        return REGISTRY.get_sample_value("gpuferry_watch_events_total", labels) or 0.0

    before = {kind: seen(kind) for kind in ("LISTED", "ADDED", "MODIFIED", "DELETED", "BOOKMARK")}
    fake.put("a", "b", "c")
    fake.watch_scripts = [
        [
            bookmark(200),
            event("MODIFIED", configmap("a", 201)),
            event("DELETED", configmap("b", 202)),
            event("ADDED", configmap("d", 203)),
        ]
    ]

    await collect(client, iterations=2)

    assert client.server and "://" not in client.server
    assert {kind: seen(kind) - before[kind] for kind in before} == {
        "LISTED": 3, "ADDED": 1, "MODIFIED": 1, "DELETED": 1, "BOOKMARK": 1,
    }  # fmt: skip


def _pod(event: str, name: str) -> WatchEvent:
    return WatchEvent(event, {"metadata": {"namespace": "ns", "name": name}})


def test_present_after_follows_a_relist_additions_and_deletions() -> None:
    a, b, c = (ObjectKey("ns", n) for n in "abc")
    present = present_after(frozenset(), _pod("ADDED", "a"))  # the list's objects come first
    present = present_after(present, _pod("ADDED", "b"))
    present = present_after(present, Listed("1", frozenset({a, b})))
    assert present == {a, b}
    present = present_after(present, _pod("MODIFIED", "a"))  # terminating: still there
    assert present == {a, b}
    present = present_after(present, _pod("ADDED", "c"))
    assert present_after(present, _pod("DELETED", "a")) == {b, c}
    assert present_after(present, Listed("9", frozenset({c}))) == {c}, "a relist says which are left"
    assert present_after(frozenset({b}), _pod("DELETED", "b")) == frozenset()
