"""Objects the provider makes for a tenant: twin namespaces, quotas, limit ranges, RBAC. Pure.

RBAC is namespaced only — Roles and RoleBindings in the tenant namespace and in each twin
namespace, bound to the consumer's *user* (``gpuferry:consumer:<id>``), never to the shared
``gpuferry:consumers`` group, so one consumer's grants never reach another. No ClusterRole and
no ClusterRoleBinding is created: a consumer's identity needs nothing cluster-wide (what every
authenticated user gets from the built-in ``system:basic-user``/``system:discovery`` roles —
self-subject reviews, discovery — is enough).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any

from kube.api import tenant_namespace
from kube.objects import RawObject
from kube.quantities import format_resource_list

from ..resources import (
    LABEL_MANAGED_BY,
    LABEL_ORIGIN_NAMESPACE,
    LABEL_TENANT,
    MANAGED_BY,
    PEERING_ACCOUNT,
    TOKEN_SECRET,
)
from .admission import ENDPOINT_CIDRS_ANNOTATION, pin_annotations
from .quotas import FIXED_LIMITS

__all__ = [
    "CONSUMER_ROLE",
    "GRANT_QUOTA",
    "PEERING_ACCOUNT",
    "TOKEN_SECRET",
    "consumer_rolebinding",
    "grant_quota",
    "limit_range",
    "owned_labels",
    "peering_account",
    "peering_role",
    "peering_rolebinding",
    "peering_token_manifests",
    "peering_token_secret",
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
# its Tenant and writes its network into it (spec.network, which the provider turns into the
# PeerNetwork); it can read no Secret here (the peering token lives here) and write no PeerNetwork.
def _tenant_rules(consumer_id: str) -> list[dict[str, Any]]:
    return [
        {"apiGroups": ["sharing.gpuferry.io"], "resources": ["gpuslices"], "verbs": _RW},
        {"apiGroups": ["offloading.gpuferry.io"], "resources": ["namespaceoffloadings"], "verbs": _RW},
        {"apiGroups": ["core.gpuferry.io"], "resources": ["tenants"], "verbs": _RO},
        {
            "apiGroups": ["core.gpuferry.io"],
            "resources": ["tenants"],
            "resourceNames": [consumer_id],
            "verbs": ["patch", "update"],
        },
        {"apiGroups": [""], "resources": ["events"], "verbs": _RO},
        # its network as the provider sees it (the virtual kubelet maps addresses with it)
        {"apiGroups": ["net.gpuferry.io"], "resources": ["peernetworks"], "verbs": _RO},
    ]


def peering_account(namespace: str, consumer_id: str) -> RawObject:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": PEERING_ACCOUNT, "namespace": namespace, "labels": owned_labels(consumer_id)},
    }


def peering_role(namespace: str, consumer_id: str) -> RawObject:
    rules = [
        {"apiGroups": ["core.gpuferry.io"], "resources": ["tenants"], "verbs": ["create"]},
        {
            "apiGroups": ["core.gpuferry.io"],
            "resources": ["tenants"],
            "resourceNames": [consumer_id],
            "verbs": ["get", "list", "watch", "patch", "update"],
        },
    ]
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": PEERING_ACCOUNT, "namespace": namespace, "labels": owned_labels(consumer_id)},
        "rules": rules,
    }


def peering_rolebinding(namespace: str, consumer_id: str) -> RawObject:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": PEERING_ACCOUNT, "namespace": namespace, "labels": owned_labels(consumer_id)},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": PEERING_ACCOUNT},
        "subjects": [{"kind": "ServiceAccount", "name": PEERING_ACCOUNT, "namespace": namespace}],
    }


def peering_token_secret(namespace: str, consumer_id: str, name: str) -> RawObject:
    """The peering token: a token of the peering ServiceAccount, filled in by the API server's
    token controller (``data.token``)."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "kubernetes.io/service-account-token",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": owned_labels(consumer_id),
            "annotations": {"kubernetes.io/service-account.name": PEERING_ACCOUNT},
        },
    }


# Twin namespace: what a virtual kubelet needs to run twin pods and reflect their accessories.
_TWIN_RULES: list[dict[str, Any]] = [
    {"apiGroups": [""], "resources": ["pods"], "verbs": [*_RW, "deletecollection"]},
    {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
    {
        "apiGroups": [""],
        "resources": ["pods/exec", "pods/attach", "pods/portforward"],
        "verbs": ["get", "create"],
    },
    # kubectl debug: ephemeral containers added to a running twin, as to the consumer's pod;
    # the twin namespace's Pod Security level checks them as it checks the pod
    {"apiGroups": [""], "resources": ["pods/ephemeralcontainers"], "verbs": ["get", "patch", "update"]},
    # in-place resize: cpu and memory, within the tenant's quota
    {"apiGroups": [""], "resources": ["pods/resize"], "verbs": ["get", "patch", "update"]},
    {"apiGroups": [""], "resources": ["configmaps", "secrets", "services"], "verbs": _RW},
    {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": _RW},
    {"apiGroups": [""], "resources": ["events"], "verbs": _RO},
    {"apiGroups": [""], "resources": ["resourcequotas", "limitranges"], "verbs": _RO},
    # the twins' usage, which the virtual node's kubelet API gives metrics-server (kubectl top)
    {"apiGroups": ["metrics.k8s.io"], "resources": ["pods"], "verbs": ["get", "list"]},
    # DRA: the twins' claim templates and shared claims, copied from the consumer; the devices
    # they may take are bounded by the quota (<class>.deviceclass.resource.k8s.io/devices)
    {
        "apiGroups": ["resource.k8s.io"],
        "resources": ["resourceclaimtemplates", "resourceclaims"],
        "verbs": _RW,
    },
]


"""The Secret in a tenant namespace that holds the peering token."""


def peering_token_manifests(consumer_id: str) -> list[RawObject]:
    """Everything a provider's admin applies to let ``consumer_id`` peer (what ``gpuferry peer``
    creates, and ``kubectl apply`` of ``charts/gpuferry/examples/peering-token.yaml``): the tenant
    namespace, the peering ServiceAccount with its Role and RoleBinding, and the token Secret that
    the API server fills in."""
    ns = tenant_namespace(consumer_id)
    namespace = {"apiVersion": "v1", "kind": "Namespace",
                 "metadata": {"name": ns, "labels": owned_labels(consumer_id)}}  # fmt: skip
    return [
        namespace,
        peering_account(ns, consumer_id),
        peering_role(ns, consumer_id),
        peering_rolebinding(ns, consumer_id),
        peering_token_secret(ns, consumer_id, TOKEN_SECRET),
    ]


def owned_labels(consumer_id: str, **extra: str) -> dict[str, str]:
    return {LABEL_MANAGED_BY: MANAGED_BY, LABEL_TENANT: consumer_id, **extra}


def twin_namespace(
    name: str,
    consumer_id: str,
    origin: str,
    pod_security: str,
    pinned: Mapping[str, str] | None = None,
    endpoint_cidrs: Sequence[str] = (),
) -> RawObject:
    """A twin namespace, labelled as the tenant's, with Pod Security admission enforced, the
    node selector its pods must carry (``pinned``) and where its EndpointSlices may point
    (``endpoint_cidrs``): see :mod:`peering.provider.admission`."""
    labels = owned_labels(consumer_id, **{LABEL_ORIGIN_NAMESPACE: origin})
    for mode in ("enforce", "audit", "warn"):
        labels[f"pod-security.kubernetes.io/{mode}"] = pod_security
        labels[f"pod-security.kubernetes.io/{mode}-version"] = POD_SECURITY_VERSION
    metadata: dict[str, Any] = {"name": name, "labels": labels}
    annotations = pin_annotations(pinned or {})
    if endpoint_cidrs:
        annotations[ENDPOINT_CIDRS_ANNOTATION] = ",".join(endpoint_cidrs)
    if annotations:
        metadata["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": metadata}


def grant_quota(namespace: str, consumer_id: str, hard: Mapping[str, Decimal]) -> RawObject:
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
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
        "apiVersion": "v1",
        "kind": "LimitRange",
        "metadata": {
            "name": DEFAULTS_LIMITRANGE,
            "namespace": namespace,
            "labels": owned_labels(consumer_id),
        },
        "spec": {"limits": [{"type": "Container", "defaultRequest": defaults}]},
    }


def _role(namespace: str, consumer_id: str, rules: list[dict[str, Any]]) -> RawObject:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": CONSUMER_ROLE, "namespace": namespace, "labels": owned_labels(consumer_id)},
        "rules": [dict(r) for r in rules],
    }


def tenant_role(namespace: str, consumer_id: str) -> RawObject:
    return _role(namespace, consumer_id, _tenant_rules(consumer_id))


def twin_role(namespace: str, consumer_id: str) -> RawObject:
    return _role(namespace, consumer_id, _TWIN_RULES)


def consumer_rolebinding(namespace: str, consumer_id: str, username: str) -> RawObject:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": CONSUMER_ROLE, "namespace": namespace, "labels": owned_labels(consumer_id)},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": CONSUMER_ROLE},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": username}],
    }
