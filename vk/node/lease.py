"""The node heartbeat: the Lease ``kube-node-lease/<node>``, renewed like a kubelet renews it.

The consumer's node lifecycle controller takes a node's health from two signals, whichever moved
last: the Lease's ``renewTime`` and the Node's status. While either moves within its grace
period (``--node-monitor-grace-period``, 50 s by default), the node's Ready condition is taken
as posted; otherwise the controller sets it Unknown and taints the node
``node.kubernetes.io/unreachable``. The Lease is owned by the Node, so the garbage collector
removes it with the Node.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from kube.clients import KubeClient
from kube.errors import AlreadyExists, NotFound
from kube.objects import LEASES, RawObject

__all__ = ["LEASE_DURATION_SECONDS", "LEASE_NAMESPACE", "lease_body", "micro_time", "renew_lease"]

LEASE_NAMESPACE = "kube-node-lease"
LEASE_DURATION_SECONDS = 40
"""What a kubelet sets (``--node-lease-duration-seconds``)."""


def micro_time(now: datetime | None = None) -> str:
    """A ``MicroTime``: RFC 3339 with microseconds, in UTC (``2024-06-01T10:00:00.123456Z``)."""
    return (now or datetime.now(UTC)).astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _owner(node_name: str, node_uid: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "name": node_name, "uid": node_uid}


def lease_body(
    node_name: str, node_uid: str, *, renew_time: str, duration: int = LEASE_DURATION_SECONDS
) -> RawObject:
    """The Lease of ``node_name``, held by the node itself and owned by its Node object."""
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": node_name,
            "namespace": LEASE_NAMESPACE,
            "ownerReferences": [_owner(node_name, node_uid)],
        },
        "spec": {
            "holderIdentity": node_name,
            "leaseDurationSeconds": duration,
            "renewTime": renew_time,
        },
    }


async def renew_lease(
    client: KubeClient, node_name: str, node_uid: str, *, duration: int = LEASE_DURATION_SECONDS
) -> RawObject:
    """Move ``renewTime`` to now (creating the Lease when it is missing); returns the Lease.

    The owner reference is rewritten each time, so a Node recreated under the same name (new
    UID) owns its Lease again. Errors are raised classified (:mod:`kube.errors`).
    """
    body = lease_body(node_name, node_uid, renew_time=micro_time(), duration=duration)
    patch = {"metadata": {"ownerReferences": body["metadata"]["ownerReferences"]}, "spec": body["spec"]}
    try:
        return await client.patch(LEASES, node_name, patch, LEASE_NAMESPACE)
    except NotFound:
        pass
    try:
        return await client.create(LEASES, body, LEASE_NAMESPACE)
    except AlreadyExists:  # created meanwhile (a second process?): renew it
        return await client.patch(LEASES, node_name, patch, LEASE_NAMESPACE)
