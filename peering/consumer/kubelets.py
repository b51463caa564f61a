"""One virtual-kubelet Deployment per VirtualNode, in the cluster (the chart's mode).

Keyed by the VirtualNode's ``ObjectKey``. While the VirtualNode lives, the reconciler applies the
objects :mod:`peering.kubeletworkload` builds (its ServiceAccount, ClusterRoleBinding and
Deployment) and mirrors how the kubelet's pod is doing into ``status.phase`` and the
``KubeletRunning`` condition. It holds a finalizer on the VirtualNode, so that deleting one
ends in this order: the Deployment is deleted, its pods are gone (no kubelet can register the
node again), then the Node, its Lease and the ClusterRoleBinding go, then the finalizer. The
ServiceAccount goes with its owner.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from kube.clients import KubeClient
from kube.errors import NotFound
from kube.informers import Informer
from kube.objects import (
    CLUSTERROLEBINDINGS,
    DEPLOYMENTS,
    LEASES,
    NODES,
    SERVICEACCOUNTS,
    VIRTUALNODES,
    ObjectKey,
    RawObject,
    Resource,
)
from kube.reconciling import Requeue

from ..conditions import set_condition
from ..kubeletworkload import (
    VIRTUAL_NODE_LABEL,
    VIRTUAL_NODE_NAMESPACE_LABEL,
    KubeletWorkloadSettings,
    kubelet_state,
    workload_name,
    workload_objects,
)

__all__ = ["FIELD_MANAGER", "FINALIZER", "VirtualKubeletDeployer", "virtual_node_key"]

logger = logging.getLogger(__name__)

FINALIZER = "gpuferry.io/virtual-kubelet"
FIELD_MANAGER = "gpuferry-consumer"
NODE_LEASE_NAMESPACE = "kube-node-lease"
_RESOURCES: dict[str, Resource] = {r.kind: r for r in (SERVICEACCOUNTS, CLUSTERROLEBINDINGS, DEPLOYMENTS)}


def virtual_node_key(obj: RawObject) -> ObjectKey | None:
    """The VirtualNode a Deployment or pod of ours is for (from its labels)."""
    labels = obj["metadata"].get("labels") or {}
    name, namespace = labels.get(VIRTUAL_NODE_LABEL), labels.get(VIRTUAL_NODE_NAMESPACE_LABEL)
    return ObjectKey(namespace, name) if name and namespace else None


class VirtualKubeletDeployer:
    def __init__(
        self,
        consumer: KubeClient,
        settings: KubeletWorkloadSettings,
        *,
        deployments: Informer,
        pods: Informer,
    ) -> None:
        self.consumer = consumer
        self.settings = settings
        self.deployments = deployments
        self.pods = pods

    def _pods_of(self, key: ObjectKey) -> list[RawObject]:
        return [p for p in self.pods.values() if virtual_node_key(p) == key]

    async def reconcile(self, key: ObjectKey) -> Requeue | None:
        try:
            vn = await self.consumer.get(VIRTUALNODES, key.name, key.namespace)
        except NotFound:
            await self._delete_bindings(key)  # someone removed our finalizer: tidy what is left
            return None
        meta = vn["metadata"]
        if meta.get("deletionTimestamp"):
            return await self._remove(key, vn)
        if FINALIZER not in (meta.get("finalizers") or []):
            vn = await self.consumer.patch(
                VIRTUALNODES, key.name,
                {"metadata": {"finalizers": [*(meta.get("finalizers") or []), FINALIZER],
                              "resourceVersion": meta["resourceVersion"]}},
                key.namespace,
            )  # fmt: skip
        for body in workload_objects(vn, self.settings):
            await self._apply(body)
        deploy = self.deployments.get(ObjectKey(key.namespace, workload_name(key.name)))
        state = kubelet_state(deploy, self._pods_of(key))
        await self._write_status(vn, state.phase, state.running, state.reason, state.message)
        return None

    async def _apply(self, body: RawObject) -> None:
        meta = body["metadata"]
        await self.consumer.patch(
            _RESOURCES[body["kind"]], meta["name"], body, meta.get("namespace"),
            patch_type="apply", field_manager=FIELD_MANAGER, force=True,
        )  # fmt: skip

    async def _write_status(
        self, vn: RawObject, phase: str, running: bool, reason: str, message: str
    ) -> None:
        status = vn.get("status") or {}
        conditions = set_condition(status.get("conditions"), "KubeletRunning", running, reason, message,
                                   generation=vn["metadata"].get("generation"))  # fmt: skip
        if status.get("phase") == phase and _same(status.get("conditions"), conditions):
            return
        meta = vn["metadata"]
        with contextlib.suppress(NotFound):
            await self.consumer.patch(
                VIRTUALNODES, meta["name"], {"status": {"phase": phase, "conditions": conditions}},
                meta["namespace"], subresource="status",
            )  # fmt: skip

    async def _remove(self, key: ObjectKey, vn: RawObject) -> Requeue | None:
        name = workload_name(key.name)
        with contextlib.suppress(NotFound):
            await self.consumer.delete(DEPLOYMENTS, name, key.namespace, propagation_policy="Background")
        left = self._pods_of(key)
        if left:
            await self._write_status(vn, "Terminating", False, "KubeletStopping",
                                     f"waiting for pod {left[0]['metadata']['name']} to end")  # fmt: skip
            return Requeue(1.0)
        node = str((vn.get("spec") or {}).get("nodeName") or "")
        if node:
            with contextlib.suppress(NotFound):
                await self.consumer.delete(NODES, node)
            with contextlib.suppress(NotFound):
                await self.consumer.delete(LEASES, node, NODE_LEASE_NAMESPACE)
        await self._delete_bindings(key)
        meta = vn["metadata"]
        finalizers = [f for f in meta.get("finalizers") or [] if f != FINALIZER]
        with contextlib.suppress(NotFound):
            await self.consumer.patch(
                VIRTUALNODES, key.name,
                {"metadata": {"finalizers": finalizers, "resourceVersion": meta["resourceVersion"]}},
                key.namespace,
            )  # fmt: skip
        logger.info("VirtualNode %s: virtual kubelet removed, node %s deleted", key, node or "-")
        return None

    async def _delete_bindings(self, key: ObjectKey) -> None:
        selector = f"{VIRTUAL_NODE_LABEL}={key.name},{VIRTUAL_NODE_NAMESPACE_LABEL}={key.namespace}"
        for crb in (await self.consumer.list(CLUSTERROLEBINDINGS, label_selector=selector))["items"]:
            with contextlib.suppress(NotFound):
                await self.consumer.delete(CLUSTERROLEBINDINGS, crb["metadata"]["name"])


def _same(old: Any, new: list[dict[str, Any]]) -> bool:
    def strip(cs: Any) -> list[dict[str, Any]]:
        return [{k: v for k, v in c.items() if k != "lastTransitionTime"} for c in cs or []]

    return strip(old) == strip(new)
