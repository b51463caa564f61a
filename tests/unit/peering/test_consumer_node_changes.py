"""Which changes of a virtual Node wake the consumer's peering and offloading controllers, how
often a Pending offloading is looked at again, and how often its pass applies the admission
objects."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from kube.api import PROVIDER_LABEL, PROVIDER_UNREACHABLE_TAINT_KEY
from kube.informers import Change
from kube.objects import ObjectKey
from kube.watching import Listed, WatchEvent
from peering.consumer.app import (
    offloadings_concerned,
    offloadings_it_leaves,
    offloadings_woken,
    peering_concerned,
    provider_came_back,
)
from peering.consumer.offloadings import (
    ADMISSION_RESYNC_SECONDS,
    admission_due,
    namespace_state,
    pending_retry,
    provider_unreachable,
    unreachable_entry,
    unreachable_providers,
    with_given,
)

PROVIDER = PROVIDER_LABEL


def node(*, ready: str = "True", heartbeat: str = "t0", labels: dict[str, str] | None = None,
         pods: str = "110") -> dict[str, Any]:  # fmt: skip
    return {
        "metadata": {"name": "gpuferry-gpu-farm", "labels": {PROVIDER: "farm", **(labels or {})}},
        "status": {
            "allocatable": {"pods": pods},
            "conditions": [
                {"type": "MemoryPressure", "status": "False", "lastHeartbeatTime": heartbeat},
                {"type": "Ready", "status": ready, "lastHeartbeatTime": heartbeat},
            ],
        },
    }


def offloading(namespace: str, selector: dict[str, Any] | None = None) -> dict[str, Any]:
    spec = {"clusterSelector": selector} if selector is not None else {}
    return {"metadata": {"name": "offloading", "namespace": namespace}, "spec": spec}


BIG = {"key": "gpuferry.io/largest-gpu-block", "operator": "In", "values": ["8"]}
OFFLOADINGS = [
    offloading("all"),
    offloading("eu", {"matchLabels": {"region": "eu"}}),
    offloading("big", {"matchExpressions": [BIG]}),
]


def modified(old: dict[str, Any], new: dict[str, Any]) -> Change:
    return Change("MODIFIED", ObjectKey(None, "gpuferry-gpu-farm"), old, new)


def woken(change: Change) -> set[str]:
    return {str(key.namespace) for key in offloadings_concerned(change, OFFLOADINGS)}


def test_a_heartbeat_or_a_new_free_room_concerns_neither() -> None:
    change = modified(node(), node(heartbeat="t1", pods="90"))
    assert not peering_concerned(change)
    assert woken(change) == set()


def test_readiness_concerns_the_peering_only() -> None:
    change = modified(node(), node(ready="False"))
    assert peering_concerned(change)
    assert woken(change) == set()


def test_a_label_wakes_only_the_offloadings_whose_selection_it_changes() -> None:
    block = "gpuferry.io/largest-gpu-block"
    change = modified(node(labels={block: "8"}), node(labels={block: "6"}))
    assert not peering_concerned(change)  # the largest free block follows every burst of pods
    assert woken(change) == {"big"}
    assert woken(modified(node(labels={block: "6"}), node(labels={block: "5"}))) == set()
    assert woken(modified(node(), node(labels={"region": "eu"}))) == {"eu"}


def test_a_new_provider_label_concerns_the_peering_and_every_offloading_selecting_the_node() -> None:
    change = modified(node(), node(labels={PROVIDER: "other"}))
    assert peering_concerned(change)
    assert woken(change) == {"all"}


@pytest.mark.parametrize("kind", ["ADDED", "DELETED"])
def test_a_node_that_comes_or_goes_concerns_the_peering_and_the_offloadings_selecting_it(kind: str) -> None:
    old, new = (None, node()) if kind == "ADDED" else (node(), None)
    change = Change(kind, ObjectKey(None, "n"), old, new)  # type: ignore[arg-type]
    assert peering_concerned(change)
    assert woken(change) == {"all"}


def test_a_compact_old_object_is_read_too() -> None:
    packed = Change("MODIFIED", ObjectKey(None, "n"), orjson.dumps(node()), node(ready="Unknown"))
    assert peering_concerned(packed)


def test_an_offloading_that_stays_pending_is_looked_at_less_and_less_often_down_to_once_a_minute() -> None:
    # a backstop: the provider's answer, or its coming back, wakes it (below)
    assert [pending_retry(n) for n in range(1, 10)] == [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0, 60.0]


def tainted(node_: dict[str, Any], key: str = PROVIDER_UNREACHABLE_TAINT_KEY) -> dict[str, Any]:
    return {**node_, "spec": {"taints": [{"key": key, "effect": "NoSchedule"}]}}


def test_a_provider_that_answers_again_is_told_by_its_node_losing_the_unreachable_taint() -> None:
    assert provider_came_back(modified(tainted(node()), node()))
    assert not provider_came_back(modified(node(), tainted(node())))  # the other way
    assert not provider_came_back(modified(tainted(node()), tainted(node(heartbeat="t1"))))
    assert not provider_came_back(modified(tainted(node(), "other"), node()))
    assert not provider_came_back(Change("ADDED", ObjectKey(None, "n"), None, node()))  # type: ignore[arg-type]
    compact = Change("MODIFIED", ObjectKey(None, "n"), orjson.dumps(tainted(node())), node())
    assert provider_came_back(compact)


def test_a_provider_found_unreachable_wakes_the_offloadings_whose_status_does_not_say_so_yet() -> None:
    def using(namespace: str, *entries: dict[str, Any]) -> dict[str, Any]:
        return {**offloading(namespace), "status": {"remoteNamespaces": list(entries)}}

    farm = {"clusterID": "farm", "phase": "Ready", "remoteNamespace": "x-farm"}
    said = {"clusterID": "farm", "phase": "Pending", "reason": "ProviderUnreachable"}
    other = {"clusterID": "other", "phase": "Ready", "remoteNamespace": "x-other"}
    offloadings = [using("a", farm, other), using("b", other), using("c", said), offloading("d")]

    def left(change: Change) -> list[str]:
        return [str(k.namespace) for k in offloadings_it_leaves(change, offloadings)]

    assert left(modified(node(), tainted(node()))) == ["a"]
    assert left(modified(tainted(node()), node())) == []  # the other way: provider_came_back's
    assert left(modified(tainted(node()), tainted(node(heartbeat="t1")))) == []  # still away
    assert left(modified(node(), tainted(node(), "other"))) == []
    assert left(Change("ADDED", ObjectKey(None, "n"), None, tainted(node()))) == []  # type: ignore[arg-type]
    assert left(Change("MODIFIED", ObjectKey(None, "n"), orjson.dumps(node()), tainted(node()))) == ["a"]


def request(origin: str, phase: str | None) -> dict[str, Any]:
    """The consumer's twin namespace request on a provider, as its watch shows it."""
    status = {"phase": phase} if phase else {}
    return {"metadata": {"name": origin, "namespace": "gpuferry-tenant-c1"}, "status": status}


WAITING = [ObjectKey("ml-team", "offloading"), ObjectKey("vision", "offloading")]


def test_a_provider_answering_a_twin_namespace_request_wakes_that_offloading_only() -> None:
    for phase in ("Ready", "Failed"):
        item = WatchEvent("MODIFIED", request("ml-team", phase))
        assert offloadings_woken(item, WAITING) == [ObjectKey("ml-team", "offloading")]
    assert offloadings_woken(WatchEvent("DELETED", request("vision", None)), WAITING) == [WAITING[1]]
    # made a moment ago and not answered yet: a pass would find it Pending again
    assert offloadings_woken(WatchEvent("ADDED", request("ml-team", None)), WAITING) == []
    # an offloading that is not waiting (Ready already, or not here) is not woken
    assert offloadings_woken(WatchEvent("MODIFIED", request("other", "Ready")), WAITING) == []


def test_a_relist_of_the_requests_wakes_every_waiting_offloading() -> None:
    listed = Listed("7", frozenset({ObjectKey("gpuferry-tenant-c1", "ml-team")}))
    assert offloadings_woken(listed, WAITING) == WAITING
    assert offloadings_woken(listed, []) == []


def test_the_admission_objects_are_applied_first_then_once_a_resync() -> None:
    assert admission_due(None, 0.0)  # never applied by this process, or found not in effect
    assert not admission_due(100.0, 100.0)
    assert not admission_due(100.0, 100.0 + ADMISSION_RESYNC_SECONDS - 0.1)
    assert admission_due(100.0, 100.0 + ADMISSION_RESYNC_SECONDS)
    assert admission_due(100.0, 103.0, resync=3.0) and not admission_due(100.0, 102.9, resync=3.0)


def test_a_namespace_is_kept_as_its_identity_and_whether_it_is_going() -> None:
    full = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": "ml-team", "uid": "u1", "resourceVersion": "7", "labels": {"team": "ml"},
                     "annotations": {"a": "b" * 1000}, "managedFields": [{"manager": "kubectl"}]},
        "spec": {"finalizers": ["kubernetes"]},
        "status": {"phase": "Active"},
    }  # fmt: skip
    kept = namespace_state(full)
    assert kept == {"metadata": {"name": "ml-team", "uid": "u1", "resourceVersion": "7"}}
    assert ObjectKey.of(kept) == ObjectKey(None, "ml-team")
    full["metadata"]["deletionTimestamp"] = "2026-11-28T01:30:17Z"
    assert namespace_state(full)["metadata"]["deletionTimestamp"] == "2026-11-28T01:30:17Z"


def test_the_providers_whose_virtual_node_says_they_do_not_answer() -> None:
    other = {**node(), "metadata": {"name": "gpuferry-other", "labels": {PROVIDER: "other"}}}
    assert unreachable_providers([tainted(node()), other]) == {"farm"}
    assert unreachable_providers([tainted(node(), "other-taint"), other]) == set()
    assert not provider_unreachable(node()) and provider_unreachable(tainted(node()))


def test_a_provider_that_does_not_answer_keeps_the_twin_namespace_it_gave_and_says_why() -> None:
    current = [
        {"clusterID": "farm", "phase": "Ready", "remoteNamespace": "ml-team-farm"},
        {"clusterID": "other", "phase": "Ready", "remoteNamespace": "ml-team-other"},
    ]
    entry = unreachable_entry("farm", current)
    assert entry["clusterID"] == "farm" and entry["phase"] == "Pending"
    assert entry["reason"] == "ProviderUnreachable"  # what the CLI reads: not waited for
    assert entry["remoteNamespace"] == "ml-team-farm"
    assert PROVIDER_UNREACHABLE_TAINT_KEY in entry["message"]
    assert "remoteNamespace" not in unreachable_entry("farm", [])  # never answered: none to keep


def test_a_provider_not_heard_from_this_pass_keeps_the_twin_namespace_it_gave() -> None:
    current = [{"clusterID": "farm", "phase": "Ready", "remoteNamespace": "ml-team-farm"}]
    failed = {"clusterID": "farm", "phase": "Pending", "reason": "RequestFailed", "message": "refused"}
    assert with_given(failed, current) == {**failed, "remoteNamespace": "ml-team-farm"}
    assert with_given({**failed, "clusterID": "other"}, current) == {**failed, "clusterID": "other"}
