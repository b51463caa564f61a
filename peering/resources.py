"""Resources, labels and names shared by the provider controller and the consumer-side flow. Pure.

The CRDs themselves are YAML in ``charts/gpuferry/crds``; here are their :class:`Resource`
constants, the RBAC kinds the controller writes, the labels that mark what gpuferry made (so
that teardown and orphan collection find it again), and the naming rules for tenant and twin
namespaces.
"""

from __future__ import annotations

from kube.api import (
    LABEL_MANAGED_BY,
    MANAGED_BY,
    PROVIDER_LABEL,
    SYSTEM_NAMESPACE,
    TENANT_NAMESPACE_PREFIX,
    is_valid_cluster_id,
    tenant_namespace,
    twin_namespace,
)
from kube.objects import GPUSLICES, LIMITRANGES, NAMESPACEOFFLOADINGS, ROLEBINDINGS, ROLES, TENANTS

__all__ = [
    "CONSUMERS_GROUP",
    "CONSUMER_NAMESPACE",
    "GPUSLICES",
    "LABEL_MANAGED_BY",
    "LABEL_ORIGIN_NAMESPACE",
    "LABEL_TENANT",
    "LIMITRANGES",
    "MANAGED_BY",
    "NAMESPACEOFFLOADINGS",
    "PEERING_ACCOUNT",
    "ROLEBINDINGS",
    "ROLES",
    "TENANTS",
    "TENANT_NAMESPACE_PREFIX",
    "TOKEN_SECRET",
    "consumer_username",
    "identity_secret_name",
    "is_valid_cluster_id",
    "tenant_namespace",
    "twin_namespace_name",
]


LABEL_TENANT = "gpuferry.io/tenant"
"""On everything made for a consumer on the provider: the consumer's cluster ID."""
LABEL_ORIGIN_NAMESPACE = "gpuferry.io/origin-namespace"
"""On a twin namespace: the consumer namespace it mirrors."""
LABEL_CONSUMER_PROVIDER = PROVIDER_LABEL
"""On consumer-side objects (the identity Secret): the provider's cluster ID."""

CONSUMER_NAMESPACE = SYSTEM_NAMESPACE
"""Consumer namespace of gpuferry's own objects (the identity Secrets)."""
CONSUMERS_GROUP = "gpuferry:consumers"
PEERING_ACCOUNT = "gpuferry-peering"
"""The ServiceAccount in a tenant namespace whose token is the peering token: it may create the
consumer's Tenant and read and update that one Tenant, nothing else. The consumer uses it once,
to send the CSR (proven with the same token) that gets it its real identity."""
TOKEN_SECRET = "peering-token"
USERNAME_PREFIX = "gpuferry:consumer:"

SYSTEM_NAMESPACE_PREFIXES = ("kube-", "gpuferry-", "openshift-")
"""Namespaces of the cluster itself and of gpuferry: never offloaded, never a twin namespace."""
# names a consumer may not take over with SameName mapping
_RESERVED_PREFIXES = SYSTEM_NAMESPACE_PREFIXES
_RESERVED_NAMES = frozenset({"default", "kube-system", "kube-public", "kube-node-lease"})


def identity_secret_name(provider_id: str) -> str:
    """The consumer Secret holding the key, certificate and kubeconfig for ``provider_id``."""
    return f"gpuferry-identity-{provider_id}"


def consumer_username(consumer_id: str) -> str:
    """The Kubernetes user name (certificate CN) issued to a consumer."""
    return USERNAME_PREFIX + consumer_id


def is_system_namespace(name: str) -> bool:
    """A consumer namespace whose pods are never offloaded (the cluster's own and gpuferry's)."""
    return name.startswith(_RESERVED_PREFIXES)


def is_reserved_namespace(name: str) -> bool:
    """System and gpuferry namespaces a twin namespace may never be."""
    return name in _RESERVED_NAMES or name.startswith(_RESERVED_PREFIXES)


def twin_namespace_name(origin: str, consumer_id: str, strategy: str = "DefaultName") -> str:
    """The provider namespace for consumer namespace ``origin`` under a NamespaceOffloading's
    ``namespaceMappingStrategy`` (the rule itself is :func:`kube.api.twin_namespace`)."""
    if strategy not in ("DefaultName", "SameName"):
        raise ValueError(f"unknown namespace mapping strategy {strategy!r}")
    return twin_namespace(origin, consumer_id, same_name=strategy == "SameName")
