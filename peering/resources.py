"""Resources, labels and names shared by the provider controller and the consumer-side flow. Pure.

The CRDs themselves are YAML in ``charts/gpuferry/crds``; here are their :class:`Resource`
constants, the RBAC kinds the controller writes, the labels that mark what gpuferry made (so
that teardown and orphan collection find it again), and the naming rules for tenant and twin
namespaces.
"""

from __future__ import annotations

import hashlib
import re

from kube.objects import (
    GPUSLICES,
    LIMITRANGES,
    NAMESPACEOFFLOADINGS,
    ROLEBINDINGS,
    ROLES,
    TENANT_NAMESPACE_PREFIX,
    TENANTS,
)

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
    "ROLEBINDINGS",
    "ROLES",
    "TENANTS",
    "TENANT_NAMESPACE_PREFIX",
    "consumer_username",
    "identity_secret_name",
    "is_valid_cluster_id",
    "tenant_namespace",
    "twin_namespace_name",
]


MANAGED_BY = "gpuferry"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_TENANT = "gpuferry.io/tenant"
"""On everything made for a consumer on the provider: the consumer's cluster ID."""
LABEL_ORIGIN_NAMESPACE = "gpuferry.io/origin-namespace"
"""On a twin namespace: the consumer namespace it mirrors."""
LABEL_CONSUMER_PROVIDER = "gpuferry.io/provider"
"""On consumer-side objects (the identity Secret): the provider's cluster ID."""

CONSUMER_NAMESPACE = "gpuferry-system"
"""Consumer namespace of gpuferry's own objects (the identity Secrets)."""
CONSUMERS_GROUP = "gpuferry:consumers"
USERNAME_PREFIX = "gpuferry:consumer:"

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
# names a consumer may not take over with SameName mapping
_RESERVED_PREFIXES = ("kube-", "gpuferry-", "openshift-")
_RESERVED_NAMES = frozenset({"default", "kube-system", "kube-public", "kube-node-lease"})


def is_valid_cluster_id(cluster_id: str) -> bool:
    """A cluster ID is a DNS-1123 label short enough for ``gpuferry-tenant-<id>`` (≤ 47 chars)."""
    return len(cluster_id) <= 63 - len(TENANT_NAMESPACE_PREFIX) and bool(_DNS_LABEL.match(cluster_id))


def tenant_namespace(consumer_id: str) -> str:
    """The provider namespace holding a consumer's Tenant, token, GPUSlices and twin requests."""
    if not is_valid_cluster_id(consumer_id):
        raise ValueError(f"invalid cluster ID {consumer_id!r}: a DNS-1123 label of at most 47 characters")
    return TENANT_NAMESPACE_PREFIX + consumer_id


def identity_secret_name(provider_id: str) -> str:
    """The consumer Secret holding the key, certificate and kubeconfig for ``provider_id``."""
    return f"gpuferry-identity-{provider_id}"


def consumer_username(consumer_id: str) -> str:
    """The Kubernetes user name (certificate CN) issued to a consumer."""
    return USERNAME_PREFIX + consumer_id


def is_reserved_namespace(name: str) -> bool:
    """System and gpuferry namespaces a twin namespace may never be."""
    return name in _RESERVED_NAMES or name.startswith(_RESERVED_PREFIXES)


def twin_namespace_name(origin: str, consumer_id: str, strategy: str = "DefaultName") -> str:
    """The provider namespace for consumer namespace ``origin``.

    ``DefaultName``: ``<origin>-<consumer-id>``, shortened with a hash when longer than 63
    characters; ``SameName``: ``origin`` itself (the caller checks that it is free).
    """
    if not _DNS_LABEL.match(origin) or len(origin) > 63:
        raise ValueError(f"invalid namespace name {origin!r}")
    if strategy == "SameName":
        return origin
    if strategy != "DefaultName":
        raise ValueError(f"unknown namespace mapping strategy {strategy!r}")
    name = f"{origin}-{consumer_id}"
    if len(name) <= 63:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{name[:54].rstrip('-')}-{digest}"
