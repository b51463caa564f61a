"""Node manifests for kwok-simulated nodes. Pure."""

from __future__ import annotations

from typing import Any

from .spec import NodeSpec

FAKE_NODE_ANNOTATION = "kwok.x-k8s.io/node"
KWOK_NODE_LABEL, KWOK_NODE_VALUE = "type", "kwok"
"""The label every kwok node carries (metrics-server leaves them out)."""


def node_manifest(node: NodeSpec) -> dict[str, Any]:
    """A Node created *with* its status: kwok's node-initialize stage keeps capacity and
    allocatable as given, so ``nvidia.com/gpu`` stays, and adds conditions and addresses."""
    resources = {"cpu": node.cpu, "memory": node.memory, "pods": node.pods, "ephemeral-storage": "1Ti"}
    if node.gpus:
        resources["nvidia.com/gpu"] = str(node.gpus)
    resources.update(node.devices)
    labels = {
        KWOK_NODE_LABEL: KWOK_NODE_VALUE,
        "kubernetes.io/hostname": node.name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "node-role.kubernetes.io/worker": "",
        **node.gpu_labels,
    }
    manifest: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": node.name,
            "labels": labels,
            "annotations": {FAKE_NODE_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
        },
        "spec": {},
        "status": {
            "capacity": dict(resources),
            "allocatable": dict(resources),
        },
    }
    if node.pod_cidr:
        manifest["spec"] = {"podCIDR": node.pod_cidr, "podCIDRs": [node.pod_cidr]}
    if node.taints:
        manifest["spec"]["taints"] = [dict(t) for t in node.taints]
    return manifest
