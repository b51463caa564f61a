from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from vk.forge.pods import (
    ForgeOptions,
    new_ephemeral_containers,
    remote_pod,
    remote_pod_update,
    resize_patch,
    twin_projection,
)

from .builders import CONSUMER_ID, PROVIDER_ID, VIRTUAL_NODE_TOLERATION, consumer_pod, container, pod

OPTS = ForgeOptions(consumer_cluster_id=CONSUMER_ID, provider_cluster_id=PROVIDER_ID)


def test_the_twin_of_a_realistic_pod() -> None:
    local = consumer_pod()
    before = copy.deepcopy(local)
    twin = remote_pod(local, OPTS)
    assert local == before, "the consumer pod is not modified"
    assert twin == {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "finetune-llama-x9q2z",
            "namespace": f"ml-team-{CONSUMER_ID}",
            "labels": {
                "batch.kubernetes.io/job-name": "finetune-llama",
                "job-name": "finetune-llama",
                "app": "finetune",
                "gpuferry.io/managed-by": "gpuferry",
                "gpuferry.io/origin-cluster-id": CONSUMER_ID,
                "gpuferry.io/origin-namespace": "ml-team",
                "gpuferry.io/origin-uid": "5b0e1f2c-3d4a-4b5c-8d6e-7f8091a2b3c4",
            },
            "annotations": {
                "team.example.com/cost-center": "research",
                "gpuferry.io/origin-cluster-id": CONSUMER_ID,
                "gpuferry.io/origin-namespace": "ml-team",
                "gpuferry.io/origin-name": "finetune-llama-x9q2z",
                "gpuferry.io/origin-uid": "5b0e1f2c-3d4a-4b5c-8d6e-7f8091a2b3c4",
                "gpuferry.io/reflected-labels": "app,batch.kubernetes.io/job-name,job-name",
                "gpuferry.io/reflected-annotations": "team.example.com/cost-center",
            },
        },
        "spec": {
            "automountServiceAccountToken": False,
            "restartPolicy": "Never",
            "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
            "tolerations": [
                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                {
                    "key": "node.kubernetes.io/not-ready",
                    "operator": "Exists",
                    "effect": "NoExecute",
                    "tolerationSeconds": 300,
                },
                {
                    "key": "node.kubernetes.io/unreachable",
                    "operator": "Exists",
                    "effect": "NoExecute",
                    "tolerationSeconds": 300,
                },
            ],
            "containers": [
                {
                    "name": "trainer",
                    "image": "nvcr.io/nvidia/pytorch:24.05-py3",
                    "command": ["torchrun", "train.py"],
                    "resources": {
                        "requests": {
                            "cpu": "8",
                            "memory": "64Gi",
                            "nvidia.com/gpu": "4",
                            "nvidia.com/mig-1g.10gb": "1",
                            "cnvrg.io/metagpu": "50",
                        },
                        "limits": {
                            "memory": "64Gi",
                            "nvidia.com/gpu": "4",
                            "nvidia.com/gpu.shared": "2",
                            "nvidia.com/mig-1g.10gb": "1",
                            "cnvrg.io/metagpu": "50",
                        },
                    },
                    "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                    "terminationMessagePath": "/dev/termination-log",
                    "terminationMessagePolicy": "File",
                    "imagePullPolicy": "IfNotPresent",
                }
            ],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "datasets"}}],
            "dnsPolicy": "ClusterFirst",
            "enableServiceLinks": True,
            "securityContext": {},
            "terminationGracePeriodSeconds": 30,
        },
    }


def test_resources_are_passed_verbatim_and_not_shared() -> None:
    local = consumer_pod()
    twin = remote_pod(local, OPTS)
    assert twin["spec"]["containers"][0]["resources"] == local["spec"]["containers"][0]["resources"]
    twin["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "8"
    assert local["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "4"


def test_options_keep_scheduler_priority_class_and_service_account_volumes() -> None:
    opts = ForgeOptions(
        consumer_cluster_id=CONSUMER_ID,
        provider_cluster_id=PROVIDER_ID,
        provider_scheduler="volcano",
        keep_priority_class=True,
        keep_service_account_volumes=True,
        namespace_strategy="same",
    )
    twin = remote_pod(consumer_pod(), opts)
    spec = twin["spec"]
    assert twin["metadata"]["namespace"] == "ml-team"
    assert spec["schedulerName"] == "volcano"
    assert spec["priorityClassName"] == "research-high"
    assert "priority" not in spec and "preemptionPolicy" not in spec
    assert [v["name"] for v in spec["volumes"]] == ["data", "kube-api-access-x7k2p"]
    assert [m["name"] for m in spec["containers"][0]["volumeMounts"]] == ["data", "kube-api-access-x7k2p"]
    assert spec["automountServiceAccountToken"] is False
    assert "serviceAccountName" not in spec


def test_dropped_spec_fields() -> None:
    local = pod(
        node="gpuferry-x",
        readinessGates=[{"conditionType": "target-health.elbv2.k8s.aws/x"}],
        ephemeralContainers=[{"name": "debugger", "image": "busybox"}],
        overhead={"cpu": "250m"},
        runtimeClassName="nvidia",
    )
    spec = remote_pod(local, OPTS)["spec"]
    for field in ("nodeName", "readinessGates", "ephemeralContainers", "overhead"):
        assert field not in spec
    assert spec["runtimeClassName"] == "nvidia"


def test_only_the_api_access_volume_is_dropped() -> None:
    look_alike = {"name": "kube-api-access-mine", "configMap": {"name": "settings"}}
    projected = {"name": "tokens", "projected": {"sources": [{"serviceAccountToken": {"path": "t"}}]}}
    local = pod(
        containers=[
            container(
                volumeMounts=[
                    {"name": "kube-api-access-mine", "mountPath": "/a"},
                    {"name": "tokens", "mountPath": "/t"},
                ]
            )
        ],
        init_containers=[container("init", volumeMounts=[{"name": "tokens", "mountPath": "/t"}])],
        volumes=[look_alike, projected],
    )
    spec = remote_pod(local, OPTS)["spec"]
    assert spec["volumes"] == [look_alike, projected]
    assert len(spec["containers"][0]["volumeMounts"]) == 2


def test_mounts_of_the_api_access_volume_are_dropped_from_init_containers_too() -> None:
    volume = consumer_pod()["spec"]["volumes"][1]
    mount = {"name": volume["name"], "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}
    local = pod(
        containers=[container(volumeMounts=[mount])],
        init_containers=[container("i", volumeMounts=[mount])],
        volumes=[volume],
    )
    spec = remote_pod(local, OPTS)["spec"]
    assert "volumes" not in spec
    assert "volumeMounts" not in spec["containers"][0] and "volumeMounts" not in spec["initContainers"][0]


def test_consumer_labels_cannot_forge_ownership() -> None:
    local = pod()
    local["metadata"]["labels"] = {"gpuferry.io/origin-cluster-id": "evil", "gpuferry.io/managed-by": "me"}
    labels = remote_pod(local, OPTS)["metadata"]["labels"]
    assert labels["gpuferry.io/origin-cluster-id"] == CONSUMER_ID
    assert labels["gpuferry.io/managed-by"] == "gpuferry"
    assert remote_pod(local, OPTS)["metadata"]["annotations"]["gpuferry.io/reflected-labels"] == ""


def test_a_pod_without_name_or_namespace_is_refused() -> None:
    with pytest.raises(ValueError, match=r"metadata\.name"):
        remote_pod({"metadata": {"name": "x"}, "spec": {}}, OPTS)


def _twin_as_read(local: dict[str, Any]) -> dict[str, Any]:
    """The twin as the provider returns it: admission added a toleration, a label, an annotation."""
    twin = remote_pod(local, OPTS)
    twin["metadata"]["labels"]["provider.example.com/queue"] = "gpu"
    twin["metadata"]["annotations"]["cni.projectcalico.org/podIP"] = "10.244.3.7/32"
    twin["spec"]["containers"][0]["env"] = [{"name": "INJECTED_BY_WEBHOOK", "value": "1"}]
    twin["spec"]["nodeName"] = "gpu-node-3"
    return twin


def test_no_update_when_nothing_changed() -> None:
    local = consumer_pod()
    assert remote_pod_update(local, _twin_as_read(local), OPTS) is None


def test_update_images_deadline_and_added_tolerations() -> None:
    local = consumer_pod()
    remote = _twin_as_read(local)
    local["spec"]["containers"][0]["image"] = "nvcr.io/nvidia/pytorch:24.06-py3"
    local["spec"]["activeDeadlineSeconds"] = 3600
    extra = {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}
    local["spec"]["tolerations"].append(extra)
    patch = remote_pod_update(local, remote, OPTS)
    assert patch is not None
    assert set(patch) == {"spec"}
    # a strategic merge patch: the container is merged by name, so what the provider added stays
    name = remote["spec"]["containers"][0]["name"]
    assert patch["spec"]["containers"] == [{"name": name, "image": "nvcr.io/nvidia/pytorch:24.06-py3"}]
    assert patch["spec"]["activeDeadlineSeconds"] == 3600
    assert patch["spec"]["tolerations"] == [*remote["spec"]["tolerations"], extra]
    assert VIRTUAL_NODE_TOLERATION not in patch["spec"]["tolerations"]


def test_update_labels_and_annotations_keeps_provider_keys_and_ours() -> None:
    local = consumer_pod()
    remote = _twin_as_read(local)
    del local["metadata"]["labels"]["app"]
    local["metadata"]["labels"]["stage"] = "eval"
    local["metadata"]["labels"]["gpuferry.io/origin-uid"] = "spoofed"
    local["metadata"]["annotations"] = {"note": "hi"}
    patch = remote_pod_update(local, remote, OPTS)
    assert patch == {
        "metadata": {
            "labels": {"stage": "eval", "app": None},
            "annotations": {
                "note": "hi",
                "team.example.com/cost-center": None,
                "gpuferry.io/reflected-labels": "batch.kubernetes.io/job-name,job-name,stage",
                "gpuferry.io/reflected-annotations": "note",
            },
        }
    }


def test_update_restores_tampered_ownership() -> None:
    local = consumer_pod()
    remote = _twin_as_read(local)
    remote["metadata"]["labels"]["gpuferry.io/managed-by"] = "someone"
    assert remote_pod_update(local, remote, OPTS) == {
        "metadata": {"labels": {"gpuferry.io/managed-by": "gpuferry"}}
    }


def test_update_never_unsets_the_deadline_or_removes_tolerations() -> None:
    local = consumer_pod()
    remote = _twin_as_read(local)
    remote["spec"]["activeDeadlineSeconds"] = 600
    remote["spec"]["tolerations"].append({"key": "provider-only", "operator": "Exists"})
    assert remote_pod_update(local, remote, OPTS) is None


def test_the_grant_selector_keeps_twins_inside_the_granted_nodes() -> None:
    opts = ForgeOptions(
        consumer_cluster_id=CONSUMER_ID,
        provider_cluster_id=PROVIDER_ID,
        grant_node_selector={"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "pool": "lent"},
    )
    local = consumer_pod()
    local["spec"]["nodeSelector"] = {"kubernetes.io/hostname": opts.node, "zone": "a"}
    twin = remote_pod(local, opts)
    assert twin["spec"]["nodeSelector"] == {
        "zone": "a",
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
        "pool": "lent",
    }
    assert remote_pod_update(local, twin, opts) is None  # nodeSelector is immutable: never patched


def test_twins_carry_the_grants_tolerations_of_tainted_provider_nodes() -> None:
    """The consumer's pods cannot know the provider's taints (nvidia.com/gpu:NoSchedule): the
    grant's tolerations are added to every twin, once, and an update adds nothing more."""
    gpu = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    opts = ForgeOptions(
        consumer_cluster_id=CONSUMER_ID, provider_cluster_id=PROVIDER_ID, grant_tolerations=(gpu,)
    )
    local = consumer_pod()
    local["spec"]["tolerations"] = [VIRTUAL_NODE_TOLERATION, {"key": "zone", "operator": "Exists"}]
    twin = remote_pod(local, opts)
    assert twin["spec"]["tolerations"] == [{"key": "zone", "operator": "Exists"}, gpu]
    local["spec"]["tolerations"].append(gpu)  # the user tolerates it too: still once
    assert remote_pod(local, opts)["spec"]["tolerations"] == [{"key": "zone", "operator": "Exists"}, gpu]
    assert remote_pod_update(local, twin, opts) is None


def test_a_projected_twin_patches_as_the_whole_twin_would() -> None:
    """The twin informers keep a projection (issue 15, memory at 10,000 pods): what the update
    reads must be in it, so the patch is the same as from the whole twin."""
    local = consumer_pod()
    remote = _twin_as_read(local)
    remote["spec"]["activeDeadlineSeconds"] = 600
    remote["status"] = {"phase": "Running", "podIP": "10.244.3.7", "containerStatuses": [{"name": "x"}]}
    projected = twin_projection(remote)
    assert remote_pod_update(local, projected, OPTS) is None
    local["spec"]["containers"][0]["image"] = "nvcr.io/nvidia/pytorch:24.06-py3"
    local["spec"]["activeDeadlineSeconds"] = 300
    local["spec"]["tolerations"].append({"key": "dedicated", "operator": "Exists"})
    local["metadata"]["labels"]["stage"] = "eval"
    whole = remote_pod_update(local, remote, OPTS)
    assert whole is not None and set(whole["spec"]) == {"containers", "activeDeadlineSeconds", "tolerations"}
    assert remote_pod_update(local, projected, OPTS) == whole
    assert projected["spec"]["nodeName"] == "gpu-node-3"
    assert projected["metadata"] == remote["metadata"] and projected["status"] == remote["status"]
    assert projected["spec"]["containers"] == [
        {
            "name": c["name"],
            "image": c["image"],
            "resources": {"requests": {"cpu": "8", "memory": "64Gi"}, "limits": {"memory": "64Gi"}},
        }
        for c in remote["spec"]["containers"]
    ]
    assert len(json.dumps(projected["spec"])) < len(json.dumps(remote["spec"])) / 2


def _debugged(local: dict[str, Any], *names: str) -> dict[str, Any]:
    """``local`` as ``kubectl debug`` leaves it: an ephemeral container per name, the first one
    mounting the data volume and the API-access volume (as a custom debug profile may)."""
    debugged = copy.deepcopy(local)
    debugged["spec"]["ephemeralContainers"] = [
        {
            "name": name,
            "image": "busybox",
            "command": ["sh"],
            "stdin": True,
            "tty": True,
            "targetContainerName": "trainer",
            "terminationMessagePolicy": "File",
            **(
                {
                    "volumeMounts": [
                        {"name": "data", "mountPath": "/data"},
                        {
                            "name": "kube-api-access-x7k2p",
                            "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
                        },
                    ]
                }
                if i == 0
                else {}
            ),
        }
        for i, name in enumerate(names)
    ]
    return debugged


def test_no_ephemeral_container_to_add_when_the_pod_has_none() -> None:
    local = consumer_pod()
    assert new_ephemeral_containers(local, _twin_as_read(local), OPTS) == []


def test_ephemeral_containers_the_twin_lacks_are_forged_for_it() -> None:
    """kubectl debug added two; the twin has the first already: the second is added, as the
    consumer wrote it. Mounts of a volume the twin lacks (the API access, dropped) are dropped."""
    local = consumer_pod()
    twin = _twin_as_read(local)
    debugged = _debugged(local, "debugger-a", "debugger-b")
    before = copy.deepcopy(debugged)
    first = new_ephemeral_containers(debugged, twin, OPTS)
    assert debugged == before, "the consumer pod is not modified"
    assert [c["name"] for c in first] == ["debugger-a", "debugger-b"]
    assert first[0]["volumeMounts"] == [{"name": "data", "mountPath": "/data"}]
    assert first[0]["targetContainerName"] == "trainer" and first[0]["stdin"] is True
    assert first[1] == debugged["spec"]["ephemeralContainers"][1]
    twin["spec"]["ephemeralContainers"] = [first[0]]
    assert new_ephemeral_containers(debugged, twin, OPTS) == [first[1]]
    assert new_ephemeral_containers(debugged, twin_projection(twin), OPTS) == [first[1]]
    assert new_ephemeral_containers(debugged, twin, OPTS, frozenset({"debugger-b"})) == []
    twin["spec"]["ephemeralContainers"].append(first[1])
    assert new_ephemeral_containers(debugged, twin_projection(twin), OPTS) == []


def test_an_ephemeral_container_keeps_the_api_access_when_the_twin_does() -> None:
    """With the consumer's tokens reflected, the twin keeps the API-access volume (reading the
    token Secret): a debugger that mounts it keeps the mount."""
    opts = ForgeOptions(consumer_cluster_id=CONSUMER_ID, provider_cluster_id=PROVIDER_ID,
                        service_account_tokens=True)  # fmt: skip
    local = consumer_pod()
    debugged = _debugged(local, "debugger-a")
    (added,) = new_ephemeral_containers(debugged, remote_pod(local, opts), opts)
    assert [m["name"] for m in added["volumeMounts"]] == ["data", "kube-api-access-x7k2p"]


def test_a_resize_of_the_consumer_pod_is_the_twins_resize() -> None:
    """kubectl patch --subresource resize on the consumer: the twin gets the cpu and memory the
    pod now asks for through its own resize subresource; from the projection as from the whole
    twin. The same quantity written otherwise is no change."""
    local = consumer_pod()
    twin = _twin_as_read(local)
    assert resize_patch(local, twin) is None
    assert resize_patch(local, twin_projection(twin)) is None
    resized = copy.deepcopy(local)
    resources = resized["spec"]["containers"][0]["resources"]
    resources["requests"]["cpu"] = "12"
    resources["limits"]["cpu"] = "12"
    want = {
        "spec": {
            "containers": [
                {
                    "name": "trainer",
                    "resources": {
                        "requests": {"cpu": "12", "memory": "64Gi"},
                        "limits": {"memory": "64Gi", "cpu": "12"},
                    },
                }
            ]
        }
    }
    assert resize_patch(resized, twin) == want
    assert resize_patch(resized, twin_projection(twin)) == want
    resources["requests"]["cpu"] = "8000m"
    del resources["limits"]["cpu"]
    assert resize_patch(resized, twin) is None  # 8000m is 8


def test_what_the_providers_limit_range_filled_in_is_not_a_resize() -> None:
    """The provider's LimitRange gave the twin a cpu limit the consumer's pod does not name:
    nothing to resize, until the consumer names one that differs."""
    local = consumer_pod()
    twin = _twin_as_read(local)
    twin["spec"]["containers"][0]["resources"]["limits"]["cpu"] = "16"
    assert resize_patch(local, twin_projection(twin)) is None
    resized = copy.deepcopy(local)
    resized["spec"]["containers"][0]["resources"]["limits"]["cpu"] = "10"
    patch = resize_patch(resized, twin_projection(twin))
    assert patch is not None and patch["spec"]["containers"][0]["resources"]["limits"]["cpu"] == "10"
