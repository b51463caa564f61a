"""What a virtual kubelet runs as inside the consumer cluster, and how it is doing. Pure.

For each VirtualNode the consumer agent (installed by the chart) keeps:

* a ServiceAccount ``gf-vk-<name>``, owned by the VirtualNode: the kubelet's own identity, the
  only one whose kubelet-serving requests for that node the agent approves;
* a ClusterRoleBinding of that account to the chart's virtual-kubelet ClusterRole (cluster-scoped,
  so it cannot be owned by the namespaced VirtualNode: labelled, and removed by the agent);
* a Deployment ``gf-vk-<name>``, owned by the VirtualNode: one replica, ``Recreate`` (two kubelets
  for one node never overlap), ``python -m vk --virtual-node NS/NAME`` with its kubelet API on
  the pod's IP, a digest of the VirtualNode's spec in the pod template (a change of what the
  kubelet reads at start rolls it; see :func:`kube.api.kubelet_spec_digest`).

:func:`kubelet_state` reads the Deployment and its pods into the VirtualNode's
``status.phase`` and ``KubeletRunning`` condition, with the reason a user needs (an image not on
the node, a crash loop and the kubelet's last words, a pod that cannot be scheduled).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kube.api import SYSTEM_NAMESPACE, VirtualKubeletExit, kubelet_spec_digest
from kube.objects import CLUSTERROLEBINDINGS, DEPLOYMENTS, SERVICEACCOUNTS, VIRTUALNODES, RawObject

from .conditions import status_condition
from .podtrouble import pod_trouble

__all__ = [
    "COMPONENT",
    "SPEC_ANNOTATION",
    "VIRTUAL_NODE_LABEL",
    "VIRTUAL_NODE_NAMESPACE_LABEL",
    "KubeletState",
    "KubeletWorkloadSettings",
    "cluster_role_binding",
    "deployment",
    "identity",
    "kubelet_state",
    "service_account",
    "workload_name",
    "workload_objects",
]

COMPONENT = "virtual-kubelet"
VIRTUAL_NODE_LABEL = "gpuferry.io/virtual-node"
VIRTUAL_NODE_NAMESPACE_LABEL = "gpuferry.io/virtual-node-namespace"
SPEC_ANNOTATION = "gpuferry.io/virtual-node-spec"

MANAGED_BY = "gpuferry-consumer"


@dataclass(frozen=True, kw_only=True)
class KubeletWorkloadSettings:
    """How the agent runs virtual kubelets as pods (from the chart, through its flags)."""

    image: str
    pull_policy: str = "IfNotPresent"
    namespace: str = SYSTEM_NAMESPACE
    cluster_role: str = "gpuferry-virtual-kubelet"
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: Sequence[Mapping[str, Any]] = ()
    resources: Mapping[str, Any] = field(default_factory=dict)
    kubelet_port: int = 10250
    probe_port: int = 8081
    extra_args: Sequence[str] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    """Added to every object (the chart's release labels)."""


def workload_name(vn_name: str) -> str:
    """``gf-vk-<name>``; a name too long for a label gets a hash suffix instead of its tail."""
    name = f"gf-vk-{vn_name}"
    if len(name) <= 63:
        return name
    digest = hashlib.sha256(vn_name.encode()).hexdigest()[:8]
    return f"{name[:54]}-{digest}"


def identity(namespace: str, vn_name: str) -> str:
    """The user name the API server gives the kubelet of ``vn_name`` (its ServiceAccount)."""
    return f"system:serviceaccount:{namespace}:{workload_name(vn_name)}"


def _binding_name(namespace: str, vn_name: str) -> str:
    name = f"gpuferry-vk-{namespace}-{vn_name}"
    if len(name) <= 253:
        return name
    return f"{name[:240]}-{hashlib.sha256(name.encode()).hexdigest()[:8]}"


def _labels(vn: RawObject, settings: KubeletWorkloadSettings) -> dict[str, str]:
    meta = vn["metadata"]
    return {
        **settings.labels,
        "app.kubernetes.io/name": "gpuferry",
        "app.kubernetes.io/component": COMPONENT,
        "app.kubernetes.io/managed-by": MANAGED_BY,
        VIRTUAL_NODE_LABEL: meta["name"],
        VIRTUAL_NODE_NAMESPACE_LABEL: meta["namespace"],
    }


def _owner(vn: RawObject) -> list[dict[str, Any]]:
    meta = vn["metadata"]
    return [{
        "apiVersion": VIRTUALNODES.api_version,
        "kind": VIRTUALNODES.kind,
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
    }]  # fmt: skip


def service_account(vn: RawObject, settings: KubeletWorkloadSettings) -> RawObject:
    meta = vn["metadata"]
    return {
        "apiVersion": SERVICEACCOUNTS.api_version,
        "kind": SERVICEACCOUNTS.kind,
        "metadata": {
            "name": workload_name(meta["name"]),
            "namespace": meta["namespace"],
            "labels": _labels(vn, settings),
            "ownerReferences": _owner(vn),
        },
    }


def cluster_role_binding(vn: RawObject, settings: KubeletWorkloadSettings) -> RawObject:
    meta = vn["metadata"]
    return {
        "apiVersion": CLUSTERROLEBINDINGS.api_version,
        "kind": CLUSTERROLEBINDINGS.kind,
        "metadata": {"name": _binding_name(meta["namespace"], meta["name"]), "labels": _labels(vn, settings)},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": settings.cluster_role,
        },
        "subjects": [
            {"kind": "ServiceAccount", "name": workload_name(meta["name"]), "namespace": meta["namespace"]}
        ],
    }


def _security_context() -> dict[str, Any]:
    return {
        "runAsNonRoot": True,
        "runAsUser": 65532,
        "runAsGroup": 65532,
        "readOnlyRootFilesystem": True,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def deployment(vn: RawObject, settings: KubeletWorkloadSettings) -> RawObject:
    meta = vn["metadata"]
    name = workload_name(meta["name"])
    labels = _labels(vn, settings)
    selector = {k: labels[k] for k in ("app.kubernetes.io/component", VIRTUAL_NODE_LABEL)}
    args = [
        f"--virtual-node={meta['namespace']}/{meta['name']}",
        "--kubelet-api",
        "--node-address=$(POD_IP)",
        f"--kubelet-port={settings.kubelet_port}",
        "--probe-bind-address=0.0.0.0",
        f"--probe-port={settings.probe_port}",
        *settings.extra_args,
    ]
    container: dict[str, Any] = {
        "name": "virtual-kubelet",
        "image": settings.image,
        "imagePullPolicy": settings.pull_policy,
        "command": ["python", "-m", "vk"],
        "args": args,
        "env": [
            {"name": "HOME", "value": "/tmp"},
            {"name": "PYTHONDONTWRITEBYTECODE", "value": "1"},
            {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        ],
        "ports": [
            {"name": "kubelet", "containerPort": settings.kubelet_port, "protocol": "TCP"},
            {"name": "probes", "containerPort": settings.probe_port, "protocol": "TCP"},
        ],
        "readinessProbe": {"httpGet": {"path": "/readyz", "port": "probes"}, "periodSeconds": 5},
        "livenessProbe": {"httpGet": {"path": "/healthz", "port": "probes"}, "periodSeconds": 10,
                          "failureThreshold": 3},
        "startupProbe": {"httpGet": {"path": "/healthz", "port": "probes"}, "periodSeconds": 2,
                         "failureThreshold": 60},
        # the kubelet's last log lines become the termination message: the VirtualNode shows them
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": _security_context(),
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
    }  # fmt: skip
    if settings.resources:
        container["resources"] = dict(settings.resources)
    pod_spec: dict[str, Any] = {
        "serviceAccountName": name,
        "securityContext": {"runAsNonRoot": True, "fsGroup": 65532},
        "containers": [container],
        "volumes": [{"name": "tmp", "emptyDir": {}}],
        "terminationGracePeriodSeconds": 30,
    }
    if settings.node_selector:
        pod_spec["nodeSelector"] = dict(settings.node_selector)
    if settings.tolerations:
        pod_spec["tolerations"] = [dict(t) for t in settings.tolerations]
    return {
        "apiVersion": DEPLOYMENTS.api_version,
        "kind": DEPLOYMENTS.kind,
        "metadata": {
            "name": name,
            "namespace": meta["namespace"],
            "labels": labels,
            "ownerReferences": _owner(vn),
        },
        "spec": {
            "replicas": 1,
            "strategy": {"type": "Recreate"},  # never two kubelets for one node
            "revisionHistoryLimit": 2,
            "selector": {"matchLabels": selector},
            "template": {
                "metadata": {
                    "labels": labels,
                    "annotations": {SPEC_ANNOTATION: kubelet_spec_digest(vn.get("spec"))},
                },
                "spec": pod_spec,
            },
        },
    }


def workload_objects(vn: RawObject, settings: KubeletWorkloadSettings) -> list[RawObject]:
    """What the agent applies for ``vn``, in the order it applies them."""
    return [service_account(vn, settings), cluster_role_binding(vn, settings), deployment(vn, settings)]


@dataclass(frozen=True)
class KubeletState:
    """A VirtualNode's ``status.phase`` and its ``KubeletRunning`` condition."""

    phase: str
    running: bool
    reason: str
    message: str


def _pod_trouble(pod: Mapping[str, Any]) -> KubeletState | None:
    trouble = pod_trouble(pod)
    if trouble is None:
        return None
    if trouble.exit_code == VirtualKubeletExit.INVALID:  # the VirtualNode cannot be run as it is
        return KubeletState("Failed", False, "InvalidVirtualNode", trouble.message)
    reason = "KubeletCrashed" if trouble.reason == "Crashed" else trouble.reason
    return KubeletState("Pending", False, reason, trouble.message)


def kubelet_state(deploy: RawObject | None, pods: Sequence[RawObject]) -> KubeletState:
    """Where the virtual kubelet of one VirtualNode stands, from its Deployment and pods."""
    if deploy is None:
        return KubeletState("Pending", False, "KubeletStarting", "creating the virtual kubelet's Deployment")
    live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
    ready = [p for p in live if status_condition(p, "Ready").get("status") == "True"]
    if ready:
        pod = ready[0]
        status = pod.get("status") or {}
        node = (pod.get("spec") or {}).get("nodeName")
        where = f"pod {pod['metadata']['name']} on node {node} at {status.get('podIP')}"
        return KubeletState("Running", True, "KubeletRunning", where)
    for pod in live:
        trouble = _pod_trouble(pod)
        if trouble is not None:
            return trouble
    progressing = status_condition(deploy, "Progressing")
    if progressing.get("status") == "False":
        return KubeletState("Pending", False, str(progressing.get("reason")), str(progressing.get("message")))
    replica_failure = status_condition(deploy, "ReplicaFailure")
    if replica_failure.get("status") == "True":
        return KubeletState("Pending", False, str(replica_failure.get("reason") or "ReplicaFailure"),
                            str(replica_failure.get("message")))  # fmt: skip
    if live:
        starting = f"pod {live[0]['metadata']['name']} is starting"
        return KubeletState("Pending", False, "KubeletStarting", starting)
    return KubeletState("Pending", False, "KubeletStarting", "waiting for the virtual kubelet's pod")
