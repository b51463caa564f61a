"""Names of the objects the virtual kubelet creates: twin namespaces and the virtual node.

The rules are gpuferry's shared vocabulary (:mod:`kube.api`), since the provider controller names
twin namespaces too; here they are adapted to the virtual kubelet's settings, whose namespace
strategy is ``"default"`` (``<namespace>-<consumer-id>``) or ``"same"`` (the namespace itself).
"""

from __future__ import annotations

from typing import Literal

from kube import api
from kube.api import (
    DNS1123_LABEL_MAX,
    DNS1123_SUBDOMAIN_MAX,
    NODE_NAME_PREFIX,
    is_dns1123_label,
    is_dns1123_subdomain,
)

__all__ = [
    "DNS1123_LABEL_MAX",
    "DNS1123_SUBDOMAIN_MAX",
    "NODE_NAME_PREFIX",
    "NamespaceStrategy",
    "is_dns1123_label",
    "is_dns1123_subdomain",
    "node_name",
    "twin_namespace",
]

NamespaceStrategy = Literal["default", "same"]
"""How a consumer namespace maps to its twin: ``<namespace>-<consumer-id>``, or unchanged."""


def twin_namespace(
    namespace: str, consumer_cluster_id: str, *, strategy: NamespaceStrategy = "default"
) -> str:
    """The provider namespace that holds the twins of ``namespace``'s pods
    (:func:`kube.api.twin_namespace`). Raises ``ValueError`` for invalid names or strategies."""
    if strategy not in ("default", "same"):
        raise ValueError(f"unknown twin-namespace strategy {strategy!r} (expected 'default' or 'same')")
    return api.twin_namespace(namespace, consumer_cluster_id, same_name=strategy == "same")


def node_name(provider_id: str) -> str:
    """The virtual node's name (:func:`kube.api.virtual_node_name`)."""
    return api.virtual_node_name(provider_id)
