from __future__ import annotations

import copy
from typing import Any

from kube.objects import ObjectKey
from vk.forge.labels import (
    MANAGED_BY,
    MANAGED_BY_VALUE,
    ORIGIN_CLUSTER_ID,
    ORIGIN_NAME,
    ORIGIN_NAMESPACE,
    ORIGIN_UID,
)
from vk.forge.podstatus import (
    Explanation,
    local_status,
    pending_explanation,
    status_patch,
    status_patch_needed,
    twin_status_inputs,
)
from vk.reflection.informers import PodPhases
from vk.reflection.podstatus import _parse_time

HOST = "10.0.0.42"
UNSCHEDULABLE = "0/7 nodes are available: 7 Insufficient nvidia.com/gpu"


def _remap(ip: str) -> str:
    return ip.replace("10.244.", "10.250.")


def running_twin() -> dict[str, Any]:
    return {
        "metadata": {"name": "train-0", "namespace": "ml-c7d2a9e4", "uid": "twin-uid", "generation": 3},
        "status": {
            "phase": "Running",
            "observedGeneration": 3,
            "nominatedNodeName": "gpu-node-2",
            "conditions": [
                {"type": "PodReadyToStartContainers", "status": "True", "observedGeneration": 3},
                {"type": "Initialized", "status": "True"},
                {"type": "Ready", "status": "True", "lastTransitionTime": "2024-06-01T10:00:09Z"},
                {"type": "ContainersReady", "status": "True"},
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2024-06-01T10:00:02Z"},
            ],
            "hostIP": "192.168.10.3",
            "hostIPs": [{"ip": "192.168.10.3"}],
            "podIP": "10.244.3.7",
            "podIPs": [{"ip": "10.244.3.7"}, {"ip": "fd00::7"}],
            "startTime": "2024-06-01T10:00:03Z",
            "initContainerStatuses": [
                {
                    "name": "fetch",
                    "ready": True,
                    "restartCount": 0,
                    "state": {"terminated": {"exitCode": 0, "reason": "Completed"}},
                }
            ],
            "containerStatuses": [
                {
                    "name": "main",
                    "ready": True,
                    "restartCount": 1,
                    "started": True,
                    "image": "nvcr.io/nvidia/pytorch:24.05-py3",
                    "containerID": "containerd://abc",
                    "state": {"running": {"startedAt": "2024-06-01T10:00:08Z"}},
                }
            ],
            "qosClass": "Burstable",
        },
    }


def consumer(conditions: list[dict[str, Any]]) -> dict[str, Any]:
    return {"metadata": {"name": "train-0"}, "status": {"phase": "Pending", "conditions": conditions}}


def pending_twin(condition: dict[str, Any] | None) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": "Pending", "qosClass": "BestEffort"}
    if condition:
        status["conditions"] = [condition]
    return {"metadata": {"uid": "twin-uid"}, "status": status}


def test_local_status_of_a_running_twin() -> None:
    scheduled = {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2024-06-01T09:59:59Z"}
    gate = {"type": "target-health.example.com/lb", "status": "True"}
    local = consumer([scheduled, {"type": "Ready", "status": "False"}, gate])
    twin = running_twin()
    assert local_status(twin, remap_ip=_remap, host_ip=HOST, local=local) == {
        "phase": "Running",
        "startTime": "2024-06-01T10:00:03Z",
        "conditions": [
            scheduled,
            {"type": "PodReadyToStartContainers", "status": "True"},
            {"type": "Initialized", "status": "True"},
            {"type": "Ready", "status": "True", "lastTransitionTime": "2024-06-01T10:00:09Z"},
            {"type": "ContainersReady", "status": "True"},
            gate,
        ],
        "initContainerStatuses": twin["status"]["initContainerStatuses"],
        "containerStatuses": twin["status"]["containerStatuses"],
        "podIP": "10.250.3.7",
        "podIPs": [{"ip": "10.250.3.7"}, {"ip": "fd00::7"}],
        "hostIP": HOST,
        "hostIPs": [{"ip": HOST}],
    }


def test_local_status_without_consumer_pod_says_scheduled() -> None:
    status = local_status(running_twin(), remap_ip=str, host_ip=HOST)
    assert status["conditions"][0] == {"type": "PodScheduled", "status": "True"}
    assert status["podIP"] == "10.244.3.7"


def test_local_status_does_not_share_structures_with_the_twin() -> None:
    twin = running_twin()
    status = local_status(twin, remap_ip=str, host_ip=HOST)
    status["containerStatuses"][0]["ready"] = False
    assert twin["status"]["containerStatuses"][0]["ready"] is True


def test_pending_twin_without_address_has_no_ips() -> None:
    status = local_status(pending_twin(None), remap_ip=_remap, host_ip=HOST)
    assert status == {
        "phase": "Pending",
        "conditions": [{"type": "PodScheduled", "status": "True"}],
    }


def test_unschedulable_twin_explained_on_the_consumer() -> None:
    condition = {
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "message": UNSCHEDULABLE,
    }
    twin = pending_twin(condition)
    assert pending_explanation(twin) == Explanation(
        "ProviderUnschedulable", f"provider scheduler: {UNSCHEDULABLE}"
    )
    scheduled = {"type": "PodScheduled", "status": "True"}
    status = local_status(twin, remap_ip=str, host_ip=HOST, local=consumer([scheduled]))
    assert status["reason"] == "ProviderUnschedulable"
    assert status["message"] == "provider scheduler: 0/7 nodes are available: 7 Insufficient nvidia.com/gpu"
    assert status["conditions"] == [scheduled], "the consumer pod stays bound; the reason tells why"


def test_gated_twin() -> None:
    twin = pending_twin(
        {
            "type": "PodScheduled",
            "status": "False",
            "reason": "SchedulingGated",
            "message": "Scheduling is blocked due to non-empty scheduling gates",
        }
    )
    assert pending_explanation(twin) == Explanation(
        "ProviderSchedulingGated",
        "provider scheduler: Scheduling is blocked due to non-empty scheduling gates",
    )


def test_events_explain_when_no_condition_does() -> None:
    events = [
        {
            "reason": "FailedMount",
            "message": 'MountVolume.SetUp failed: configmap "cfg" not found',
            "involvedObject": {"uid": "twin-uid"},
            "lastTimestamp": "2024-06-01T10:00:05Z",
        },
        {
            "reason": "FailedMount",
            "message": "older",
            "involvedObject": {"uid": "twin-uid"},
            "lastTimestamp": "2024-06-01T10:00:01Z",
        },
        {
            "reason": "FailedScheduling",
            "message": "about another pod",
            "involvedObject": {"uid": "other"},
            "lastTimestamp": "2024-06-01T10:00:09Z",
        },
        {
            "reason": "Pulled",
            "message": "irrelevant",
            "involvedObject": {"uid": "twin-uid"},
            "lastTimestamp": "2024-06-01T10:00:10Z",
        },
    ]
    assert pending_explanation(pending_twin(None), events) == Explanation(
        "ProviderFailedMount", 'provider kubelet: MountVolume.SetUp failed: configmap "cfg" not found'
    )
    assert pending_explanation(pending_twin(None), []) is None
    assert pending_explanation(running_twin(), events) is None


def test_long_messages_are_shortened() -> None:
    twin = pending_twin(
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "x" * 5000}
    )
    explanation = pending_explanation(twin)
    assert explanation is not None and len(explanation.message) == 1024


def test_the_consumer_keeps_its_own_qos_class() -> None:
    # the twin got default requests from a provider LimitRange: Burstable; the consumer pod,
    # GPU limits only, is BestEffort, and qosClass is immutable (a patch of it is refused)
    local = {"metadata": {"name": "train-0"}, "status": {"phase": "Pending", "qosClass": "BestEffort"}}
    new = local_status(running_twin(), remap_ip=str, host_ip=HOST, local=local)
    assert "qosClass" not in new
    patch = status_patch(local["status"], new)
    assert patch is not None and "qosClass" not in patch["status"]


def test_status_patch() -> None:
    new = local_status(running_twin(), remap_ip=str, host_ip=HOST)
    assert status_patch(new, new) is None and not status_patch_needed(new, new)
    reordered = {**new, "conditions": list(reversed(new["conditions"]))}
    assert not status_patch_needed(reordered, new), "condition order carries no meaning"
    pending = {
        "phase": "Pending",
        "reason": "ProviderUnschedulable",
        "message": "m",
        "qosClass": "Burstable",
        "conditions": [{"type": "PodScheduled", "status": "True"}],
        "nominatedNodeName": "x",
    }
    patch = status_patch(pending, new)
    assert patch is not None
    assert patch["status"]["reason"] is None and patch["status"]["message"] is None
    assert patch["status"]["phase"] == "Running"
    assert "qosClass" not in patch["status"] and "nominatedNodeName" not in patch["status"]
    assert status_patch_needed(pending, new)


def test_pods_per_phase_follow_the_changes_not_the_store() -> None:
    phases = PodPhases()
    a, b = ObjectKey("ml", "a"), ObjectKey("ml", "b")
    phases.update(a, {"metadata": {"name": "a"}})
    phases.update(b, {"metadata": {"name": "b"}, "status": {"phase": "Running"}})
    assert phases.counts() == {"Pending": 1, "Running": 1}
    phases.update(a, {"metadata": {"name": "a"}, "status": {"phase": "Running"}})
    phases.update(b, None)
    assert phases.counts() == {"Running": 1}


def test_what_status_back_reads_from_a_twin_leaves_out_its_binding_only() -> None:
    created = pending_twin(None)
    created["spec"] = {"schedulerName": "default-scheduler"}
    bound = copy.deepcopy(created)
    bound["spec"]["nodeName"] = "gpu-node-2"
    bound["metadata"]["resourceVersion"] = "9"
    bound["status"]["conditions"] = [{"type": "PodScheduled", "status": "True"}]
    assert twin_status_inputs(bound) == twin_status_inputs(created)
    # and where equal, the consumer's status is the same
    forged = [local_status(twin, remap_ip=_remap, host_ip=HOST) for twin in (bound, created)]
    assert forged[0] == forged[1]

    refused = pending_twin({"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                            "message": UNSCHEDULABLE})  # fmt: skip
    assert twin_status_inputs(refused) != twin_status_inputs(created), "a refusal is said on the consumer"
    assert twin_status_inputs(running_twin()) != twin_status_inputs(created)
    ready = running_twin()
    ready["status"]["conditions"][2]["status"] = "False"
    assert twin_status_inputs(ready) != twin_status_inputs(running_twin())
    mine, older = copy.deepcopy(created), copy.deepcopy(created)
    for twin, uid in ((mine, "uid-2"), (older, "uid-1")):
        twin["metadata"]["labels"] = {MANAGED_BY: MANAGED_BY_VALUE}
        twin["metadata"]["annotations"] = {ORIGIN_CLUSTER_ID: "ml-eu", ORIGIN_NAMESPACE: "ml",
                                           ORIGIN_NAME: "train-0", ORIGIN_UID: uid}  # fmt: skip
    assert twin_status_inputs(mine) != twin_status_inputs(older), "whose twin it is matters"


def test_creation_times_are_read_as_utc() -> None:
    assert _parse_time("2024-06-01T10:00:03Z") == 1717236003.0
    assert _parse_time(None) is None and _parse_time("") is None


def test_a_resize_condition_goes_when_the_twins_goes() -> None:
    """The provider's kubelet sets PodResizeInProgress while it resizes the twin and removes it
    once done: the consumer pod shows it, then loses it (kept as the pod's own, it stayed True),
    while a condition of the consumer's controllers (DisruptionTarget) stays."""
    twin = running_twin()
    resizing = copy.deepcopy(twin)
    in_progress = {"type": "PodResizeInProgress", "status": "True", "observedGeneration": 3}
    resizing["status"]["conditions"].append(in_progress)
    local = consumer([{"type": "PodScheduled", "status": "True"}])
    during = local_status(resizing, remap_ip=str, host_ip=HOST, local=local)
    assert {"type": "PodResizeInProgress", "status": "True"} in during["conditions"]
    disruption = {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"}
    local["status"]["conditions"] = [*during["conditions"], disruption]
    after = local_status(twin, remap_ip=str, host_ip=HOST, local=local)
    assert [c["type"] for c in after["conditions"] if c["type"].startswith("PodResize")] == []
    assert disruption in after["conditions"]
