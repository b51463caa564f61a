"""Objects the provider makes for a tenant: twin namespaces, quotas, limit ranges, RBAC. Pure.

RBAC is namespaced only — Roles and RoleBindings in the tenant namespace and in each twin
namespace, bound to the consumer's *user* (``gpuferry:consumer:<id>``), never to the shared
``gpuferry:consumers`` group, so one consumer's grants never reach another. No ClusterRole and
no ClusterRoleBinding is created: a consumer's identity needs nothing cluster-wide (what every
authenticated user gets from the built-in ``system:basic-user``/``system:discovery`` roles —
self-subject reviews, discovery — is enough).
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from kube.objects import RawObject
from kube.quantities import format_resource_list

from ..resources import (
    LABEL_MANAGED_BY,
    LABEL_ORIGIN_NAMESPACE,
    LABEL_TENANT,
    MANAGED_BY,
)
from .quotas import FIXED_LIMITS

__all__ = [
    "CONSUMER_ROLE",
    "GRANT_QUOTA",
    "consumer_rolebinding",
    "grant_quota",
    "limit_range",
    "owned_labels",
    "tenant_role",
    "twin_namespace",
    "twin_role",
]

CONSUMER_ROLE = "gpuferry-consumer"
GRANT_QUOTA = "gpuferry-grant"
DEFAULTS_LIMITRANGE = "gpuferry-defaults"
POD_SECURITY_VERSION = "latest"

_RW = ["get", "list", "watch", "create", "update", "patch", "delete"]
_RO = ["get", "list", "watch"]

# Tenant namespace: the consumer writes its requests (spec only: no status subresource), reads
# its Tenant; it can read no Secret here (the peering token lives here).
_TENANT_RULES: list[dict[str, Any]] = [
    {"apiGroups": ["sharing.gpuferry.io"], "resources": ["gpuslices"], "verbs": _RW},
    {"apiGroups": ["offloading.gpuferry.io"], "resources": ["namespaceoffloadings"], "verbs": _RW},
    {"apiGroups": ["core.gpuferry.io"], "resources": ["tenants"], "verbs": _RO},
    {"apiGroups": [""], "resources": ["events"], "verbs": _RO},
    # its network as the provider sees it: the consumer agent carries a rotated gateway key across
    {"apiGroups": ["net.gpuferry.io"], "resources": ["peernetworks"], "verbs": [*_RO, "patch"]},
]

# Twin namespace: what a virtual kubelet needs to run twin pods and reflect their accessories.
_TWIN_RULES: list[dict[str, Any]] = [
    {"apiGroups": [""], "resources": ["pods"], "verbs": [*_RW, "deletecollection"]},
    {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
    {"apiGroups": [""], "resources": ["pods/exec", "pods/attach", "pods/portforward"],
     "verbs": ["get", "create"]},
    {"apiGroups": [""], "resources": ["configmaps", "secrets", "services"], "verbs": _RW},
    {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": _RW},
    {"apiGroups": [""], "resources": ["events"], "verbs": _RO},
    {"apiGroups": [""], "resources": ["resourcequotas", "limitranges"], "verbs": _RO},
]


def owned_labels(consumer_id: str, **extra: str) -> dict[str, str]:
    return {LABEL_MANAGED_BY: MANAGED_BY, LABEL_TENANT: consumer_id, **extra}


def twin_namespace(name: str, consumer_id: str, origin: str, pod_security: str) -> RawObject:
    """A twin namespace, labelled as the tenant's, with Pod Security admission enforced."""
    labels = owned_labels(consumer_id, **{LABEL_ORIGIN_NAMESPACE: origin})
    for mode in ("enforce", "audit", "warn"):
        labels[f"pod-security.kubernetes.io/{mode}"] = pod_security
        labels[f"pod-security.kubernetes.io/{mode}-version"] = POD_SECURITY_VERSION
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}


def grant_quota(namespace: str, consumer_id: str, hard: Mapping[str, Decimal]) -> RawObject:
    return {
        "apiVersion": "v1", "kind": "ResourceQuota",
        "metadata": {"name": GRANT_QUOTA, "namespace": namespace, "labels": owned_labels(consumer_id)},
        "spec": {"hard": format_resource_list({**hard, **FIXED_LIMITS})},
    }


def limit_range(namespace: str, consumer_id: str, hard: Mapping[str, Decimal]) -> RawObject | None:
    """Default container requests for cpu/memory when the quota limits them (a quota on
    ``requests.cpu`` refuses pods that do not say how much they request)."""
    defaults = {}
    if "requests.cpu" in hard:
        defaults["cpu"] = "100m"
    if "requests.memory" in hard:
        defaults["memory"] = "128Mi"
    if not defaults:
        return None
    return {
        "apiVersion": "v1", "kind": "LimitRange",
        "metadata": {"name": DEFAULTS_LIMITRANGE, "namespace": namespace,
                     "labels": owned_labels(consumer_id)},
        "spec": {"limits": [{"type": "Container", "defaultRequest": defaults}]},
    }


def _role(namespace: str, consumer_id: str, rules: list[dict[str, Any]]) -> RawObject:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": CONSUMER_ROLE, "namespace": namespace, "labels": owned_labels(consumer_id)},
        "rules": [dict(r) for r in rules],
    }


def tenant_role(namespace: str, consumer_id: str) -> RawObject:
    return _role(namespace, consumer_id, _TENANT_RULES)


def twin_role(namespace: str, consumer_id: str) -> RawObject:
    return _role(namespace, consumer_id, _TWIN_RULES)


def consumer_rolebinding(namespace: str, consumer_id: str, username: str) -> RawObject:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": CONSUMER_ROLE, "namespace": namespace, "labels": owned_labels(consumer_id)},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": CONSUMER_ROLE},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": username}],
    }
