"""Label and annotation keys of gpuferry, and the ownership marks on what it creates.

Everything the virtual kubelet creates on a provider carries labels that say it is managed by
gpuferry on behalf of a consumer cluster, so that a reflector can (a) list exactly its own objects
with a label selector, (b) refuse to touch objects it does not own, and (c) find the consumer
object an orphan came from. What is selectable (cluster ID, origin namespace, origin UID) is a
label; the origin name, which may be longer than a label value allows (253 > 63), is an
annotation, and all four origin fields are repeated as annotations so one read gives them all.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from kube import api

__all__ = [
    "HOSTNAME_LABEL",
    "LABEL_VALUE_MAX",
    "MANAGED_BY",
    "MANAGED_BY_VALUE",
    "NODE_ROLE_LABEL",
    "NODE_ROLE_VALUE",
    "NODE_TYPE_LABEL",
    "NODE_TYPE_VALUE",
    "ORIGIN_CLUSTER_ID",
    "ORIGIN_NAME",
    "ORIGIN_NAMESPACE",
    "ORIGIN_UID",
    "PROVIDER_LABEL",
    "REFLECTED_ANNOTATIONS",
    "REFLECTED_LABELS",
    "VIRTUAL_NODE_TAINT_KEY",
    "Origin",
    "is_owned_by",
    "origin_annotations",
    "origin_of",
    "owner_selector",
    "ownership_labels",
    "virtual_node_identity",
]

PREFIX = "gpuferry.io/"

MANAGED_BY = f"{PREFIX}managed-by"
"""Label on every object gpuferry creates; its value is :data:`MANAGED_BY_VALUE`."""
MANAGED_BY_VALUE = "gpuferry"

ORIGIN_CLUSTER_ID = f"{PREFIX}origin-cluster-id"
"""Label and annotation: ID of the consumer cluster the object was created for."""
ORIGIN_NAMESPACE = f"{PREFIX}origin-namespace"
"""Label and annotation: namespace of the consumer object a twin mirrors."""
ORIGIN_NAME = f"{PREFIX}origin-name"
"""Annotation only (names may exceed 63 characters): name of the consumer object."""
ORIGIN_UID = f"{PREFIX}origin-uid"
"""Label and annotation: UID of the consumer object; a new consumer pod of the same name has a
different UID, which is how a stale twin is told apart from the current one."""

REFLECTED_LABELS = f"{PREFIX}reflected-labels"
"""Annotation on a twin: comma-separated keys of the labels copied from its origin, so that a
label removed on the consumer is removed on the twin and labels added by the provider are kept."""
REFLECTED_ANNOTATIONS = f"{PREFIX}reflected-annotations"
"""Annotation on a twin: the same record for the annotations copied from its origin."""

PROVIDER_LABEL = f"{PREFIX}provider"
"""Virtual node label: the provider cluster ID."""
NODE_TYPE_LABEL = api.NODE_TYPE_LABEL
NODE_TYPE_VALUE = api.NODE_TYPE_VIRTUAL_KUBELET
NODE_ROLE_LABEL = "kubernetes.io/role"
NODE_ROLE_VALUE = "agent"
VIRTUAL_NODE_TAINT_KEY = api.VIRTUAL_NODE_TAINT_KEY
"""Taint (``=true:NoExecute``) on the virtual node; pods opt in with a matching toleration."""

LABEL_VALUE_MAX = 63
HOSTNAME_LABEL = "kubernetes.io/hostname"


class Origin(NamedTuple):
    """Where a twin comes from: the consumer cluster and the consumer object's identity."""

    cluster_id: str
    namespace: str
    name: str
    uid: str


def virtual_node_identity(provider_id: str, node_name: str) -> dict[str, str]:
    """The labels that identify a virtual node and mean nothing on the provider.

    The node registration puts them on the virtual node; the pod forge removes node selectors
    and affinity expressions on them from twins (they were satisfied by the consumer's binding).
    Other node labels, such as the GPU Feature Discovery ones copied from the provider, are not
    identity: they keep their meaning on the provider and are left in place.
    """
    return {
        NODE_TYPE_LABEL: NODE_TYPE_VALUE,
        NODE_ROLE_LABEL: NODE_ROLE_VALUE,
        PROVIDER_LABEL: provider_id,
        HOSTNAME_LABEL: node_name,
    }


def _metadata(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    metadata: Mapping[str, Any] = obj.get("metadata") or {}
    return metadata


def ownership_labels(consumer_id: str, origin: Mapping[str, Any] | None = None) -> dict[str, str]:
    """Labels marking an object as gpuferry's, created for ``consumer_id``.

    With ``origin`` (the consumer object a twin mirrors) the origin namespace and UID are added,
    so that twins can be selected per consumer namespace or looked up by consumer UID.
    """
    if not consumer_id or len(consumer_id) > LABEL_VALUE_MAX:
        raise ValueError(f"consumer cluster ID {consumer_id!r} cannot be a label value")
    labels = {MANAGED_BY: MANAGED_BY_VALUE, ORIGIN_CLUSTER_ID: consumer_id}
    if origin is not None:
        metadata = _metadata(origin)
        if metadata.get("namespace"):
            labels[ORIGIN_NAMESPACE] = metadata["namespace"]
        if metadata.get("uid"):
            labels[ORIGIN_UID] = metadata["uid"]
    return labels


def origin_annotations(consumer_id: str, origin: Mapping[str, Any]) -> dict[str, str]:
    """Annotations naming the consumer object a twin mirrors: cluster, namespace, name, UID."""
    metadata = _metadata(origin)
    return {
        ORIGIN_CLUSTER_ID: consumer_id,
        ORIGIN_NAMESPACE: metadata.get("namespace") or "",
        ORIGIN_NAME: metadata.get("name") or "",
        ORIGIN_UID: metadata.get("uid") or "",
    }


def owner_selector(consumer_id: str) -> str:
    """The label selector of everything gpuferry created for ``consumer_id``."""
    return f"{MANAGED_BY}={MANAGED_BY_VALUE},{ORIGIN_CLUSTER_ID}={consumer_id}"


def is_owned_by(obj: Mapping[str, Any], consumer_id: str) -> bool:
    """Whether ``obj`` was created by gpuferry for ``consumer_id`` (by its labels)."""
    labels = _metadata(obj).get("labels") or {}
    return bool(labels.get(MANAGED_BY) == MANAGED_BY_VALUE and labels.get(ORIGIN_CLUSTER_ID) == consumer_id)


def origin_of(obj: Mapping[str, Any]) -> Origin | None:
    """The origin recorded on a twin, or ``None`` when ``obj`` is not a gpuferry twin."""
    metadata = _metadata(obj)
    labels = metadata.get("labels") or {}
    annotations = metadata.get("annotations") or {}
    if labels.get(MANAGED_BY) != MANAGED_BY_VALUE:
        return None
    fields = [
        annotations.get(key) or labels.get(key) or ""
        for key in (ORIGIN_CLUSTER_ID, ORIGIN_NAMESPACE, ORIGIN_NAME, ORIGIN_UID)
    ]
    if not all(fields):
        return None
    return Origin(*fields)
