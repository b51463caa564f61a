"""What wakes the twin sync: every change but one of a status alone, or of a twin's binding
(issue 15: four of a pod's changes on its way to Running forged its twin again for nothing)."""

from __future__ import annotations

import copy
from typing import Any

from kube.watching import WatchEvent
from vk.forge.pods import ForgeOptions, matters_to_twin_sync, remote_pod, twin_projection

from .assembled import KEY, VirtualKubelet
from .builders import CONSUMER_ID, PROVIDER_ID, consumer_pod

OPTS = ForgeOptions(consumer_cluster_id=CONSUMER_ID, provider_cluster_id=PROVIDER_ID)
BOUND = frozenset({"nodeName"})


def _bumped(obj: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    out["metadata"]["resourceVersion"] = str(int(out["metadata"].get("resourceVersion") or "1") + 1)
    out["metadata"]["managedFields"] = [{"manager": "someone", "operation": "Update"}]
    return out


def _twin() -> dict[str, Any]:
    twin = remote_pod(consumer_pod(), OPTS)
    twin["metadata"].update(namespace="ml-team-ml-eu1", uid="twin-uid", resourceVersion="7")
    return twin_projection(twin)


def test_the_status_written_back_does_not_wake_it() -> None:
    old = consumer_pod()
    new = _bumped(old)
    new["status"] = {"phase": "Running", "startTime": "2024-06-01T10:00:05Z"}
    assert not matters_to_twin_sync("MODIFIED", old, new)


def test_a_twin_bound_and_running_does_not_wake_it_but_any_other_spec_field_does() -> None:
    created = _twin()
    bound = _bumped(created)
    bound["spec"]["nodeName"] = "gpu-h100-3"
    running = _bumped(bound)
    running["status"] = {"phase": "Running"}
    assert not matters_to_twin_sync("MODIFIED", created, bound, unread_spec=BOUND)
    assert not matters_to_twin_sync("MODIFIED", bound, running, unread_spec=BOUND)
    # the same binding seen on the consumer side (where nodeName is read) wakes it
    assert matters_to_twin_sync("MODIFIED", created, bound)
    image = _bumped(running)
    image["spec"]["containers"][0]["image"] = "other:2"
    assert matters_to_twin_sync("MODIFIED", running, image, unread_spec=BOUND)


def test_metadata_additions_deletions_and_deleting_wake_it() -> None:
    old = consumer_pod()
    for change in (
        lambda p: p["metadata"]["labels"].update(tier="gold"),
        lambda p: p["metadata"]["annotations"].pop("team.example.com/cost-center"),
        lambda p: p["metadata"].update(deletionTimestamp="2024-06-01T11:00:00Z"),
        lambda p: p["metadata"].update(uid="another"),
        lambda p: p["spec"].update(activeDeadlineSeconds=60),
    ):
        new = _bumped(old)
        change(new)
        assert matters_to_twin_sync("MODIFIED", old, new), new
    assert matters_to_twin_sync("ADDED", None, old)
    assert matters_to_twin_sync("DELETED", old, None)
    assert matters_to_twin_sync("DELETED", None, None)  # a twin gone with its namespace


async def test_pod_sync_queues_status_and_twin_sync_each_when_the_change_matters_to_it() -> None:
    vk = VirtualKubelet()  # assembled for real, its informers fed by hand
    local = consumer_pod()
    local["metadata"]["resourceVersion"] = "48213"
    vk.local._apply(WatchEvent("ADDED", local))
    created = _twin()  # made by someone else than this process: no echo of ours
    vk.twins._apply(WatchEvent("ADDED", created))
    assert KEY in vk.to_remote.pending
    vk.drain()

    bound = _bumped(created)
    bound["spec"]["nodeName"] = "gpu-h100-3"
    vk.twins._apply(WatchEvent("MODIFIED", bound))
    assert vk.back.pending == frozenset() and vk.to_remote.pending == frozenset()

    started = _bumped(bound)
    started["status"] = {"phase": "Running"}
    vk.twins._apply(WatchEvent("MODIFIED", started))
    assert vk.back.pending == {KEY} and vk.to_remote.pending == frozenset()

    new = _bumped(local)
    new["status"] = {"phase": "Running"}
    vk.local._apply(WatchEvent("MODIFIED", new))
    assert vk.to_remote.pending == frozenset()

    vk.twins._apply(WatchEvent("DELETED", bound))
    assert vk.to_remote.pending == {KEY}
