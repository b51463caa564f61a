"""Small builders of realistic pod and node dicts, shaped like what the API server returns."""

from __future__ import annotations

import copy
from typing import Any

CONSUMER_ID = "c7d2a9e4"
PROVIDER_ID = "p3f81b06"
VIRTUAL_NODE = f"gpuferry-{PROVIDER_ID}"
VIRTUAL_NODE_TOLERATION = {
    "key": "virtual-node.gpuferry.io/not-allowed",
    "operator": "Exists",
    "effect": "NoExecute",
}


def container(
    name: str = "main",
    *,
    image: str = "nvcr.io/nvidia/pytorch:24.05-py3",
    requests: dict[str, Any] | None = None,
    limits: dict[str, Any] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    resources: dict[str, Any] = {}
    if requests is not None:
        resources["requests"] = requests
    if limits is not None:
        resources["limits"] = limits
    return {"name": name, "image": image, "resources": resources, **extra}


def pod(
    name: str = "train-0",
    namespace: str = "ml",
    *,
    containers: list[dict[str, Any]] | None = None,
    init_containers: list[dict[str, Any]] | None = None,
    node: str | None = None,
    phase: str | None = None,
    **spec: Any,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{namespace}-{name}"},
        "spec": {
            "containers": containers
            if containers is not None
            else [container(limits={"nvidia.com/gpu": "1"})],
            **spec,
        },
    }
    if init_containers is not None:
        body["spec"]["initContainers"] = init_containers
    if node is not None:
        body["spec"]["nodeName"] = node
    if phase is not None:
        body["status"] = {"phase": phase}
    return body


def gpu_pod(
    name: str,
    node: str | None = None,
    *,
    gpus: int = 1,
    cpu: str = "1",
    memory: str = "4Gi",
    phase: str | None = "Running",
) -> dict[str, Any]:
    limits = {"nvidia.com/gpu": str(gpus), "memory": memory}
    return pod(
        name,
        containers=[container(requests={"cpu": cpu, "memory": memory}, limits=limits)],
        node=node,
        phase=phase,
    )


def node(
    name: str,
    *,
    gpus: int = 8,
    cpu: str = "64",
    memory: str = "512Gi",
    pods: str = "110",
    ready: bool = True,
    unschedulable: bool = False,
    taints: list[dict[str, Any]] | None = None,
    labels: dict[str, str] | None = None,
    extra: dict[str, str] | None = None,
) -> dict[str, Any]:
    allocatable = {"cpu": cpu, "memory": memory, "pods": pods, "nvidia.com/gpu": str(gpus), **(extra or {})}
    spec: dict[str, Any] = {}
    if unschedulable:
        spec["unschedulable"] = True
    if taints:
        spec["taints"] = taints
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
                **(labels or {}),
            },
        },
        "spec": spec,
        "status": {
            "capacity": dict(allocatable),
            "allocatable": allocatable,
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True" if ready else "False",
                    "reason": "KubeletReady" if ready else "KubeletNotReady",
                }
            ],
        },
    }


_API_ACCESS_VOLUME = {
    "name": "kube-api-access-x7k2p",
    "projected": {
        "defaultMode": 420,
        "sources": [
            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
            {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
            {
                "downwardAPI": {
                    "items": [
                        {
                            "path": "namespace",
                            "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"},
                        }
                    ]
                }
            },
        ],
    },
}
_API_ACCESS_MOUNT = {
    "name": "kube-api-access-x7k2p",
    "readOnly": True,
    "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
}


def consumer_pod() -> dict[str, Any]:
    """A Job's GPU pod as the consumer's API server returns it once bound to the virtual node."""
    return copy.deepcopy(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "finetune-llama-x9q2z",
                "generateName": "finetune-llama-",
                "namespace": "ml-team",
                "uid": "5b0e1f2c-3d4a-4b5c-8d6e-7f8091a2b3c4",
                "resourceVersion": "48213",
                "generation": 1,
                "creationTimestamp": "2024-06-01T10:00:00Z",
                "labels": {
                    "batch.kubernetes.io/job-name": "finetune-llama",
                    "job-name": "finetune-llama",
                    "app": "finetune",
                },
                "annotations": {
                    "kubectl.kubernetes.io/last-applied-configuration": '{"apiVersion":"batch/v1"}',
                    "team.example.com/cost-center": "research",
                },
                "ownerReferences": [
                    {
                        "apiVersion": "batch/v1",
                        "kind": "Job",
                        "name": "finetune-llama",
                        "uid": "0a1b2c3d-0000-4000-8000-000000000001",
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
                "finalizers": ["batch.kubernetes.io/job-tracking"],
                "managedFields": [
                    {
                        "manager": "kube-controller-manager",
                        "operation": "Update",
                        "apiVersion": "v1",
                        "time": "2024-06-01T10:00:00Z",
                    }
                ],
            },
            "spec": {
                "nodeName": VIRTUAL_NODE,
                "schedulerName": "default-scheduler",
                "priorityClassName": "research-high",
                "priority": 100000,
                "preemptionPolicy": "PreemptLowerPriority",
                "serviceAccountName": "trainer",
                "serviceAccount": "trainer",
                "restartPolicy": "Never",
                "nodeSelector": {
                    "type": "virtual-kubelet",
                    "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
                },
                "tolerations": [
                    VIRTUAL_NODE_TOLERATION,
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
                        "volumeMounts": [{"name": "data", "mountPath": "/data"}, dict(_API_ACCESS_MOUNT)],
                        "terminationMessagePath": "/dev/termination-log",
                        "terminationMessagePolicy": "File",
                        "imagePullPolicy": "IfNotPresent",
                    }
                ],
                "volumes": [
                    {"name": "data", "persistentVolumeClaim": {"claimName": "datasets"}},
                    copy.deepcopy(_API_ACCESS_VOLUME),
                ],
                "dnsPolicy": "ClusterFirst",
                "enableServiceLinks": True,
                "securityContext": {},
                "terminationGracePeriodSeconds": 30,
            },
            "status": {
                "phase": "Pending",
                "qosClass": "Burstable",
                "conditions": [
                    {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2024-06-01T10:00:01Z"}
                ],
            },
        }
    )
