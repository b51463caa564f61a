"""The virtual kubelet as a Deployment: what the agent applies, and how its pod reads back onto
the VirtualNode (phase and KubeletRunning)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from kube.objects import ObjectKey
from peering.consumer.__main__ import kubelet_pod_settings
from peering.kubeletworkload import (
    SPEC_ANNOTATION,
    KubeletWorkloadSettings,
    identity,
    kubelet_state,
    workload_name,
    workload_objects,
)
from peering.virtualnodes import SupervisorSettings, kubelet_command

VN: dict[str, Any] = {
    "apiVersion": "offloading.gpuferry.io/v1alpha1",
    "kind": "VirtualNode",
    "metadata": {"name": "gpu-farm", "namespace": "gpuferry-system", "uid": "u-1", "generation": 3},
    "spec": {
        "nodeName": "gpuferry-gpu-farm",
        "resources": {"nvidia.com/gpu": "8", "pods": "110"},
        "shape": {"nvidia.com/gpu": "8", "pods": "110"},
        "labels": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
    },
}
SETTINGS = KubeletWorkloadSettings(
    image="gpuferry.local/gpuferry:abc",
    pull_policy="Never",
    node_selector={"gpuferry.io/real-node": "true"},
    tolerations=[{"key": "gpuferry.io/real-node", "operator": "Exists", "effect": "NoSchedule"}],
    resources={"requests": {"cpu": "50m"}},
)


def test_the_objects_are_owned_by_the_virtual_node_and_bound_to_the_kubelet_role() -> None:
    sa, crb, deploy = workload_objects(VN, SETTINGS)
    assert sa["kind"] == "ServiceAccount" and sa["metadata"]["name"] == "gf-vk-gpu-farm"
    for owned in (sa, deploy):
        (owner,) = owned["metadata"]["ownerReferences"]
        assert owner == {"apiVersion": "offloading.gpuferry.io/v1alpha1", "kind": "VirtualNode",
                         "name": "gpu-farm", "uid": "u-1", "controller": True}  # fmt: skip
    assert "ownerReferences" not in crb["metadata"]  # cluster-scoped: no namespaced owner
    assert crb["roleRef"]["name"] == "gpuferry-virtual-kubelet"
    subject = {"kind": "ServiceAccount", "name": "gf-vk-gpu-farm", "namespace": "gpuferry-system"}
    assert crb["subjects"] == [subject]
    assert identity("gpuferry-system", "gpu-farm") == "system:serviceaccount:gpuferry-system:gf-vk-gpu-farm"


def test_the_deployment_runs_one_kubelet_for_the_node_never_two() -> None:
    deploy = workload_objects(VN, SETTINGS)[2]
    spec = deploy["spec"]
    assert spec["replicas"] == 1 and spec["strategy"] == {"type": "Recreate"}
    template = spec["template"]
    assert template["metadata"]["annotations"][SPEC_ANNOTATION]
    assert set(spec["selector"]["matchLabels"].items()) <= set(template["metadata"]["labels"].items())
    pod = template["spec"]
    assert pod["serviceAccountName"] == "gf-vk-gpu-farm"
    assert pod["nodeSelector"] == {"gpuferry.io/real-node": "true"}
    assert pod["tolerations"][0]["key"] == "gpuferry.io/real-node"
    (c,) = pod["containers"]
    assert c["image"] == "gpuferry.local/gpuferry:abc" and c["imagePullPolicy"] == "Never"
    assert c["command"] == ["python", "-m", "vk"]
    assert "--virtual-node=gpuferry-system/gpu-farm" in c["args"]
    assert "--node-address=$(POD_IP)" in c["args"] and "--kubelet-api" in c["args"]
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert c["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert c["resources"] == {"requests": {"cpu": "50m"}}


def _template_with(**spec: Any) -> dict[str, Any]:
    vn = {**VN, "metadata": {**VN["metadata"], "generation": 4}, "spec": {**VN["spec"], **spec}}
    template: dict[str, Any] = workload_objects(vn, SETTINGS)[2]["spec"]["template"]
    return template


def test_a_change_the_kubelet_reads_at_start_rolls_it_and_a_new_grant_does_not() -> None:
    before = workload_objects(VN, SETTINGS)[2]["spec"]["template"]
    # the largest free block follows the provider's occupancy: the kubelet computes it live;
    # a new grant and its labels: the running kubelet follows them
    assert _template_with(shape={"nvidia.com/gpu": "2", "pods": "110"}) == before
    assert _template_with(resources={"nvidia.com/gpu": "4", "pods": "110"}) == before
    assert _template_with(labels={"nvidia.com/gpu.product": "NVIDIA-L4"}) == before
    # where twins go, the node's name: read once at start, so a new pod
    assert _template_with(providerNodeSelector={"pool": "b"}) != before
    assert _template_with(nodeName="gpuferry-other") != before


def test_a_long_name_stays_a_valid_label() -> None:
    name = workload_name("p" * 63)
    assert len(name) <= 63 and name != workload_name("p" * 62 + "q")


DEPLOY: dict[str, Any] = {"metadata": {"name": "gf-vk-gpu-farm"}, "status": {}}


def pod(**status: Any) -> dict[str, Any]:
    return {"metadata": {"name": "gf-vk-gpu-farm-1"}, "spec": {"nodeName": "real-0"}, "status": status}


def waiting(
    reason: str, message: str = "", last: dict[str, Any] | None = None, restarts: int = 0
) -> dict[str, Any]:
    cs: dict[str, Any] = {"image": "gpuferry.local/gpuferry:abc", "restartCount": restarts,
                          "state": {"waiting": {"reason": reason, "message": message}}}  # fmt: skip
    if last:
        cs["lastState"] = {"terminated": last}
    return pod(containerStatuses=[cs])


@pytest.mark.parametrize(
    "deploy,pods,phase,reason,words",
    [
        (None, [], "Pending", "KubeletStarting", "creating"),
        (DEPLOY, [], "Pending", "KubeletStarting", "waiting for"),
        (DEPLOY, [pod(podIP="10.244.10.7", conditions=[{"type": "Ready", "status": "True"}])],
         "Running", "KubeletRunning", "on node real-0 at 10.244.10.7"),
        (DEPLOY, [waiting("ErrImageNeverPull", "image is not present with pull policy of Never")],
         "Pending", "ErrImageNeverPull", "image gpuferry.local/gpuferry:abc: image is not present"),
        (DEPLOY, [waiting("CrashLoopBackOff", last={"exitCode": 1, "message": "stopped: 403 forbidden\n"},
                          restarts=4)],
         "Pending", "KubeletCrashed", "exited 1 (4 restarts): stopped: 403 forbidden"),
        (DEPLOY, [waiting("CrashLoopBackOff",
                          last={"exitCode": 2, "message": "cannot run: Secret 'x' not found"})],
         "Failed", "InvalidVirtualNode", "Secret 'x' not found"),
        (DEPLOY, [pod(conditions=[{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                   "message": "0/3 nodes are available"}])],
         "Pending", "Unschedulable", "0/3 nodes are available"),
        ({**DEPLOY, "status": {"conditions": [{"type": "ReplicaFailure", "status": "True",
                                               "reason": "FailedCreate", "message": "forbidden: quota"}]}},
         [], "Pending", "FailedCreate", "forbidden: quota"),
    ],
)  # fmt: skip
def test_the_kubelets_pod_reads_back_onto_the_virtual_node(
    deploy: dict[str, Any] | None, pods: list[dict[str, Any]], phase: str, reason: str, words: str
) -> None:
    state = kubelet_state(deploy, pods)
    assert (state.phase, state.reason) == (phase, reason)
    assert words in state.message
    assert state.running is (phase == "Running")


def test_a_terminating_pod_does_not_count_as_the_running_kubelet() -> None:
    gone = pod(podIP="10.244.10.7", conditions=[{"type": "Ready", "status": "True"}])
    gone["metadata"]["deletionTimestamp"] = "2026-11-24T00:00:00Z"
    assert kubelet_state(DEPLOY, [gone]).phase == "Pending"


def test_the_agents_kubelet_flags_reach_every_kubelets_deployment() -> None:
    parser = argparse.ArgumentParser()
    args = argparse.Namespace(
        virtual_kubelets="pods", virtual_kubelet_image="gpuferry.local/gpuferry:abc",
        virtual_kubelet_pull_policy="Never", virtual_kubelet_pod="{}", namespace="gpuferry-system",
        virtual_kubelet_cluster_role="gpuferry-virtual-kubelet",
        virtual_kubelet_arg=["--provider-events=warnings", "--workers=32"],
    )  # fmt: skip
    settings = kubelet_pod_settings(args, parser)
    assert settings is not None
    (c,) = workload_objects(VN, settings)[2]["spec"]["template"]["spec"]["containers"]
    assert c["args"][-2:] == ["--provider-events=warnings", "--workers=32"]


def test_the_agents_kubelet_flags_reach_every_kubelet_it_runs_as_a_process() -> None:
    settings = SupervisorSettings(consumer_kubeconfig=Path("/k"), python="python3",
                                  extra_args=("--provider-events=none",))  # fmt: skip
    key = ObjectKey("gpuferry-system", "gpu-farm")
    assert kubelet_command(settings, key, 41000) == [
        "python3", "-m", "vk", "--virtual-node", "gpuferry-system/gpu-farm", "--consumer-kubeconfig", "/k",
        "--kubelet-api", "--node-address", "127.0.0.1", "--kubelet-port", "41000", "--provider-events=none",
    ]  # fmt: skip
    without_api = kubelet_command(settings, key, None)
    assert without_api[-3:] == ["--consumer-kubeconfig", "/k", "--provider-events=none"]
