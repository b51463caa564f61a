"""Which changes of a virtual Node wake the consumer's peering and offloading controllers."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from kube.informers import Change
from kube.objects import ObjectKey
from peering.consumer.app import virtual_node_change_concerns


def node(*, ready: str = "True", heartbeat: str = "t0", labels: dict[str, str] | None = None,
         pods: str = "110") -> dict[str, Any]:  # fmt: skip
    return {
        "metadata": {"name": "gpuferry-gpu-farm", "labels": labels or {"gpuferry.io/provider-id": "farm"}},
        "status": {
            "allocatable": {"pods": pods},
            "conditions": [
                {"type": "MemoryPressure", "status": "False", "lastHeartbeatTime": heartbeat},
                {"type": "Ready", "status": ready, "lastHeartbeatTime": heartbeat},
            ],
        },
    }


def modified(old: dict[str, Any], new: dict[str, Any]) -> Change:
    return Change("MODIFIED", ObjectKey(None, "gpuferry-gpu-farm"), old, new)


def test_a_heartbeat_or_a_new_free_room_concerns_neither() -> None:
    assert virtual_node_change_concerns(modified(node(), node(heartbeat="t1", pods="90"))) == (False, False)


def test_readiness_concerns_the_peering_only() -> None:
    assert virtual_node_change_concerns(modified(node(), node(ready="False"))) == (True, False)


def test_labels_concern_both() -> None:
    relabelled = node(labels={"gpuferry.io/provider-id": "farm", "region": "eu"})
    assert virtual_node_change_concerns(modified(node(), relabelled)) == (True, True)


@pytest.mark.parametrize("kind", ["ADDED", "DELETED"])
def test_a_node_that_comes_or_goes_concerns_both(kind: str) -> None:
    old, new = (None, node()) if kind == "ADDED" else (node(), None)
    assert virtual_node_change_concerns(Change(kind, ObjectKey(None, "n"), old, new)) == (True, True)  # type: ignore[arg-type]


def test_a_compact_old_object_is_read_too() -> None:
    packed = Change("MODIFIED", ObjectKey(None, "n"), orjson.dumps(node()), node(ready="Unknown"))
    assert virtual_node_change_concerns(packed) == (True, False)
