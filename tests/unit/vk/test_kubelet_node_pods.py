"""The kubelet API's list of the node's pods and their twins, kept between scrapes while neither
store changes (issue 15: read again at every scrape, it took a fifth of one at 10,000 pods)."""

from __future__ import annotations

import asyncio
import datetime
import itertools
import random
from typing import Any, cast

from kube.clients import KubeClient
from kube.informers import JOURNAL_MAX, Informer
from kube.objects import ObjectKey, RawObject
from kube.watching import Listed, WatchEvent
from vk.forge.labels import origin_annotations, ownership_labels
from vk.forge.usage import PodTexts, resource_texts
from vk.kubelet.nodepods import NodePodIndex
from vk.kubelet.server import KubeletContext, Usage
from vk.reflection.informers import consumer_pods, twin_pods
from vk.reflection.twins import TwinNamespaces

CONSUMER = "c1"


def consumer_pod(name: str, version: int) -> RawObject:
    started = {"running": {"startedAt": "2026-11-28T10:00:00Z"}}
    return {
        "metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}", "resourceVersion": str(version)},
        "spec": {"nodeName": "gpuferry-farm", "containers": [{"name": "main", "image": "busybox"}]},
        "status": {"phase": "Running", "containerStatuses": [{"name": "main", "state": started}]},
    }


def twin(of: RawObject, namespace: str, version: int) -> RawObject:
    meta = of["metadata"]
    return {
        "metadata": {
            "name": meta["name"],
            "namespace": namespace,
            "uid": f"twin-{meta['name']}",
            "resourceVersion": str(version),
            "labels": ownership_labels(CONSUMER, of),
            "annotations": origin_annotations(CONSUMER, of),
        },
        "status": {"phase": "Running"},
    }


def context(local: Informer, twins: Informer, *, with_changes: bool = True) -> KubeletContext:
    extra: dict[str, Any] = {"followed": (local, twins)} if with_changes else {}
    return KubeletContext(node_name="gpuferry-farm", provider=cast(KubeClient, None), local_pod=local.get,
                          twin_pod=twins.get, local_keys=local.keys, local_identity=local.identity,
                          twin_identity=twins.identity, started=datetime.datetime.now(datetime.UTC),
                          **extra)  # fmt: skip


def test_the_nodes_pods_are_read_again_only_after_either_store_changed() -> None:
    local = consumer_pods(cast(KubeClient, None), "gpuferry-farm")
    twins = twin_pods(cast(KubeClient, None), CONSUMER, name="provider-twins")
    a, b = consumer_pod("a", 10), consumer_pod("b", 11)
    local.receive(WatchEvent("ADDED", a))
    twins.receive(WatchEvent("ADDED", twin(a, "ml-c1", 100)))
    ctx, usage = context(local, twins), Usage()

    first = usage.pods(ctx)
    assert [(r.name, r.uid, r.version) for r in first.refs] == [("a", "uid-a", "10")]
    assert first.twins == {"ml-c1": {"a": "uid-a"}}
    assert usage.pods(ctx) is first  # nothing changed: the same list, not read again

    local.receive(WatchEvent("ADDED", b))  # a pod bound here, its twin not made yet
    second = usage.pods(ctx)
    assert [r.name for r in second.refs] == ["a", "b"] and second.twins == first.twins
    twins.receive(WatchEvent("ADDED", twin(b, "ml-c1", 101)))  # then its twin
    third = usage.pods(ctx)
    assert third is not second and third.twins == {"ml-c1": {"a": "uid-a", "b": "uid-b"}}
    local.receive(WatchEvent("MODIFIED", consumer_pod("a", 12)))  # a changed: its texts are made again
    assert sorted((r.name, r.version) for r in usage.pods(ctx).refs) == [("a", "12"), ("b", "11")]
    local.receive(WatchEvent("DELETED", consumer_pod("a", 13)))
    twins.receive(WatchEvent("DELETED", twin(a, "ml-c1", 102)))
    last = usage.pods(ctx)
    assert [r.name for r in last.refs] == ["b"] and last.twins == {"ml-c1": {"b": "uid-b"}}
    assert usage.pods(ctx) is last

    # a context that cannot tell whether its stores changed has them read at every scrape
    blind = context(local, twins, with_changes=False)
    assert usage.pods(blind) is not usage.pods(blind)


def test_kept_texts_answer_the_same_tuple_of_pods_from_the_last_scrape() -> None:
    """The node's pods given again as the same tuple (its stores unchanged) are answered without
    a look at any pod; a new tuple or a list is looked at pod by pod, as before."""
    made: list[str] = []

    def counted(pod: RawObject) -> object:
        made.append(pod["metadata"]["name"])
        return resource_texts(pod)

    local = consumer_pods(cast(KubeClient, None), "gpuferry-farm")
    twins = twin_pods(cast(KubeClient, None), CONSUMER, name="provider-twins")
    for i, name in enumerate(("a", "b")):
        local.receive(WatchEvent("ADDED", consumer_pod(name, 10 + i)))
    ctx, usage, kept = context(local, twins), Usage(), PodTexts(counted)
    refs = usage.pods(ctx).refs
    found = kept.scrape(refs)
    assert made == ["a", "b"] and set(found) == {("ml", "a"), ("ml", "b")}
    assert kept.scrape(refs) is found and made == ["a", "b"]
    local.receive(WatchEvent("MODIFIED", consumer_pod("b", 20)))
    again = kept.scrape(usage.pods(ctx).refs)
    assert again is not found and made == ["a", "b", "b"]  # only the pod that changed
    as_list = list(usage.pods(ctx).refs)
    assert kept.scrape(as_list) is not kept.scrape(as_list)  # a list may change between scrapes


def ready_request(origin: str, twin_namespace: str | None, version: int) -> RawObject:
    status = {"phase": "Ready", "remoteNamespace": twin_namespace} if twin_namespace else {"phase": "Pending"}
    return {
        "metadata": {"name": origin, "namespace": "tenant-c1", "uid": f"req-{origin}",
                     "resourceVersion": str(version)},
        "spec": {"originNamespace": origin},
        "status": status,
    }  # fmt: skip


async def test_a_tenants_twins_tell_a_change_of_a_twin_and_of_their_namespaces() -> None:
    """With a scoped identity the twins are one store per twin namespace: what they tell
    changes with a twin, with a twin namespace that comes or goes, and with nothing read."""
    twins = TwinNamespaces(cast(KubeClient, None), tenant_namespace="tenant-c1", consumer_id=CONSUMER)
    holder = asyncio.create_task(twins.run())  # stopped at once: no watch is started, the stores stay
    await asyncio.sleep(0)
    holder.cancel()
    await asyncio.gather(holder, return_exceptions=True)

    seen = [twins.changes()]

    async def moved() -> bool:
        await asyncio.sleep(0)  # the requests are applied once the loop comes round
        seen.append(twins.changes())
        return seen[-1] != seen[-2]

    twins.requests.receive(Listed("1", frozenset()))
    twins.requests.receive(WatchEvent("ADDED", ready_request("ml", "ml-c1", 2)))
    assert await moved() and twins.twin_namespace_for("ml") == "ml-c1"
    a = consumer_pod("a", 10)
    key = ObjectKey("ml", "a")
    twins._pods["ml-c1"].receive(WatchEvent("ADDED", twin(a, "ml-c1", 100)))
    assert await moved() and twins.identity(key) is not None
    twins.get(key), twins.keys(), twins.identity(key)
    assert not await moved()
    twins.changed_since(seen[-1])  # the journal starts with the first question
    twins._pods["ml-c1"].receive(WatchEvent("MODIFIED", twin(a, "ml-c1", 101)))
    assert await moved() and twins.changed_since(seen[-2]) == {key}
    assert twins.changed_since(seen[-1]) == set()
    twins.requests.receive(WatchEvent("MODIFIED", ready_request("ml", None, 3)))  # no longer ready
    assert await moved() and twins.identity(key) is None
    assert twins.changed_since(seen[-2]) is None  # the twin namespaces changed: read everything


def test_the_index_read_again_where_the_stores_changed_is_what_a_full_read_gives() -> None:
    """Pods and twins come, change and go in both stores at random (relists among them); after
    each round the index, brought up to date by the keys that changed, holds what a full read of
    the stores gives; and a pod that did not change keeps its reference."""
    rng = random.Random(15)
    local = consumer_pods(cast(KubeClient, None), "gpuferry-farm")
    twins = twin_pods(cast(KubeClient, None), CONSUMER, name="provider-twins")
    ctx, blind = context(local, twins), context(local, twins, with_changes=False)
    index, version = NodePodIndex(), itertools.count(100)
    names = [f"p{i}" for i in range(40)]
    for _ in range(60):
        before = index.read(ctx)
        touched: set[str] = set()
        for _ in range(rng.randint(0, 6)):
            name = rng.choice(names)
            touched.add(name)
            here = consumer_pod(name, next(version))
            store, obj = (local, here) if rng.random() < 0.5 else (twins, twin(here, rng.choice(["t1", "t2"]),
                                                                              next(version)))  # fmt: skip
            kind = rng.choice(["ADDED", "MODIFIED", "DELETED"]) if rng.random() < 0.9 else "RELIST"
            if kind == "RELIST":  # what a relist after a 410 keeps: all but this one
                own = ObjectKey(obj["metadata"]["namespace"], name)
                kept = frozenset(k for k in store._filed if k != own)
                store.receive(Listed(str(next(version)), kept))
            else:
                store.receive(WatchEvent(kind, obj))  # type: ignore[arg-type]
        after, full = index.read(ctx), NodePodIndex().read(blind)
        assert sorted(r[:4] for r in after.refs) == sorted(r[:4] for r in full.refs), touched
        assert after.twins == full.twins, touched
        kept_refs = {ref.name: ref for ref in before.refs if ref.name not in touched}
        assert all(kept_refs[ref.name] is ref for ref in after.refs if ref.name in kept_refs)
        assert (after is before) == (after.token == before.token)  # the same while nothing changed
    # more changes than a store's journal holds: everything is read again, nothing left of before
    gone = next(ref for ref in index.read(ctx).refs)
    local.receive(WatchEvent("DELETED", consumer_pod(gone.name, next(version))))
    twins.receive(WatchEvent("DELETED", twin(consumer_pod(gone.name, 0), "t1", next(version))))
    for _ in range(JOURNAL_MAX):
        local.receive(WatchEvent("ADDED", consumer_pod("busy", next(version))))
    after, full = index.read(ctx), NodePodIndex().read(blind)
    assert gone.name not in {ref.name for ref in after.refs}
    assert sorted(r[:4] for r in after.refs) == sorted(r[:4] for r in full.refs)
    assert after.twins == full.twins
