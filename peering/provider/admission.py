"""What a tenant may create in its twin namespaces, enforced by the provider's own API server.
Pure: builders only.

The tenant's identity may create pods and Services in its twin namespaces (that is how twins
run). Pod Security (baseline or stricter) and the grant's ResourceQuota already bound them; this
ValidatingAdmissionPolicy closes what those do not (issue 16):

* **Pods stay on the nodes of the grant.** A pod may not name its node (``spec.nodeName``: the
  provider's scheduler places it), and its ``nodeSelector`` must carry every ``key=value`` of the
  node selector the tenant's grant was decided for. The twin namespace carries that selector as
  annotations ``node-selector.gpuferry.io/<n>: key=value`` (written by the provider controller;
  the tenant cannot edit namespaces). Without them (no grant yet) nothing is pinned: the quota
  is 0 then anyway.
* **No priority class.** A priority class lets a pod preempt the provider's own workloads
  (``system-node-critical`` is 2000001000). The virtual kubelet drops the consumer's class by
  default; a twin that names one is refused.
* **No Service ``externalIPs``** (CVE-2020-8554: a Service with external IPs intercepts traffic
  to those addresses for the whole cluster). NodePort and LoadBalancer Services are already
  refused by the quota (0 of each).
* **EndpointSlices point at pods only** (CVE-2021-25740: a hand-written EndpointSlice sends a
  Service's traffic anywhere: the API server, a node, a metadata service). The virtual kubelet
  writes EndpointSlices for the consumer's Services; their addresses are twins (the provider's pod
  CIDRs) or consumer pods (the provider's view of the consumer's pod CIDRs). The twin namespace
  carries both as the annotation ``gpuferry.io/endpoint-cidrs``, written by the provider
  controller from its network declaration and the tenant's PeerNetwork; without a declaration
  (the provider does not know its pod CIDRs) nothing is checked.

Only what is created is checked for the pod fields (a pod's ``nodeName`` is set by the
scheduler's binding afterwards, and its node selector and priority cannot change); a Service is
checked on update too.

Two more policies bind what the consumer itself may write in its tenant namespace (matched by who
asks: the consumers' group, or a peering token's ServiceAccount; the provider's own operators and
controller are not matched, which is how they approve):

* **Tenant** (``gpuferry-tenant-self-service``). The consumer sends its CSR, its proof and its
  network. It may make its Pod Security level stricter, never looser (``privileged`` is the
  provider's to give); lower ``maxTwinNamespaces``, never raise it above the default (64) or what
  the provider set; not change ``peeringTokenSecretRef``. Its pod and Service CIDRs, once the
  provider accepted them (``status.acceptedNetwork``, which only the provider writes), stay those:
  the consumer may rotate its gateway key and nothing else of its network (issue 16 §4). A provider
  operator approves new CIDRs by writing them into ``status.acceptedNetwork``.
* **GPUSlice** (``gpuferry-slice-self-service``). What the consumer changes by itself: how much it
  asks for (``resources``) up to the tenant's limit, if the provider set one (the tenant
  namespace's annotation ``sharing.gpuferry.io/max-resources: nvidia.com/gpu=8,cpu=64``), and
  ``allowPartial``. Which nodes the slice covers (``nodeSelector``, ``tolerations``) is chosen when
  the slice is created; a change needs the provider: its operator approves a selector by
  annotating the tenant namespace ``sharing.gpuferry.io/approved-node-selector: k=v,...``
  (issue 16 §5).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kube.api import GRANT_PIN_REFUSAL
from kube.objects import VALIDATINGADMISSIONPOLICIES, VALIDATINGADMISSIONPOLICYBINDINGS, Resource

from ..resources import (
    CONSUMERS_GROUP,
    LABEL_ORIGIN_NAMESPACE,
    PEERING_ACCOUNT,
    TENANT_NAMESPACE_PREFIX,
    TOKEN_SECRET,
)

__all__ = [
    "APPROVED_SELECTOR_ANNOTATION",
    "ENDPOINTS_POLICY",
    "ENDPOINT_CIDRS_ANNOTATION",
    "MAX_RESOURCES_ANNOTATION",
    "NODE_SELECTOR_PREFIX",
    "PODS_POLICY",
    "POLICY_NAMES",
    "SERVICES_POLICY",
    "SLICES_POLICY",
    "TENANTS_POLICY",
    "pin_annotations",
    "twin_admission_objects",
]

PODS_POLICY = "gpuferry-twin-pods"
SERVICES_POLICY = "gpuferry-twin-services"
ENDPOINTS_POLICY = "gpuferry-twin-endpoints"
ENDPOINT_CIDRS_ANNOTATION = "gpuferry.io/endpoint-cidrs"
TENANTS_POLICY = "gpuferry-tenant-self-service"
SLICES_POLICY = "gpuferry-slice-self-service"
POLICY_NAMES = (PODS_POLICY, SERVICES_POLICY, ENDPOINTS_POLICY, TENANTS_POLICY, SLICES_POLICY)
MAX_RESOURCES_ANNOTATION = "sharing.gpuferry.io/max-resources"
APPROVED_SELECTOR_ANNOTATION = "sharing.gpuferry.io/approved-node-selector"
DEFAULT_MAX_TWIN_NAMESPACES = 64
NODE_SELECTOR_PREFIX = "node-selector.gpuferry.io/"
_LABELS = {"gpuferry.io/managed-by": "gpuferry"}
TWIN_NAMESPACES = {"key": LABEL_ORIGIN_NAMESPACE, "operator": "Exists"}


def pin_annotations(selector: Mapping[str, str]) -> dict[str, str]:
    """The twin namespace's annotations for the node selector its pods must carry."""
    return {f"{NODE_SELECTOR_PREFIX}{i}": f"{k}={v}" for i, (k, v) in enumerate(sorted(selector.items()))}


_PINNED = (
    "has(namespaceObject.metadata.annotations) ? namespaceObject.metadata.annotations"
    f".filter(k, k.startsWith('{NODE_SELECTOR_PREFIX}'))"
    ".map(k, namespaceObject.metadata.annotations[k]) : []"
)


_SELECTOR = "has(object.spec.nodeSelector) ? object.spec.nodeSelector : {}"


def _policy(
    name: str,
    rules: list[dict[str, Any]],
    validations: list[dict[str, Any]],
    variables: list[dict[str, str]] | None = None,
    match_conditions: list[dict[str, str]] | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {"failurePolicy": "Fail", "matchConstraints": {"resourceRules": rules},
                            "validations": validations}  # fmt: skip
    if variables:
        spec["variables"] = variables
    if match_conditions:
        spec["matchConditions"] = match_conditions
    return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": name, "labels": dict(_LABELS)}, "spec": spec}  # fmt: skip


def pods_policy() -> dict[str, Any]:
    return _policy(
        PODS_POLICY,
        [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}],
        [
            {
                "expression": "!has(object.spec.nodeName) || object.spec.nodeName == ''",
                "message": "a tenant's pod may not name its node: the provider's scheduler places it on "
                "the nodes of the grant",
                "reason": "Forbidden",
            },
            {
                "expression": "variables.pinned.all(p, p.split('=')[0] in variables.selector"
                " && variables.selector[p.split('=')[0]] == p.split('=')[1])",
                "messageExpression": f"'a tenant\\'s pod {GRANT_PIN_REFUSAL}: its "
                "nodeSelector must carry ' + variables.pinned.join(', ')",
                "reason": "Forbidden",
            },
            {
                "expression": "!has(object.spec.priorityClassName) || object.spec.priorityClassName == ''",
                "messageExpression": "'a tenant\\'s pod may not take a priority class (' + "
                "object.spec.priorityClassName + '): it could preempt the provider\\'s own workloads'",
                "reason": "Forbidden",
            },
        ],
        [
            {"name": "pinned", "expression": _PINNED},
            {"name": "selector", "expression": _SELECTOR},
        ],
    )


def services_policy() -> dict[str, Any]:
    return _policy(
        SERVICES_POLICY,
        [
            {
                "apiGroups": [""],
                "apiVersions": ["v1"],
                "operations": ["CREATE", "UPDATE"],
                "resources": ["services"],
            }
        ],
        [
            {
                "expression": "!has(object.spec.externalIPs) || size(object.spec.externalIPs) == 0",
                "message": "a tenant's Service may not have externalIPs (CVE-2020-8554: they intercept "
                "traffic to those addresses for the whole provider cluster)",
                "reason": "Forbidden",
            },
        ],
    )


def endpoints_policy() -> dict[str, Any]:
    return _policy(
        ENDPOINTS_POLICY,
        [
            {
                "apiGroups": ["discovery.k8s.io"],
                "apiVersions": ["v1"],
                "operations": ["CREATE", "UPDATE"],
                "resources": ["endpointslices"],
            }
        ],
        [
            {
                "expression": "size(variables.allowed) == 0 || (object.addressType == 'IPv4' && "
                "object.?endpoints.orValue([]).all(e, e.addresses.all(a, "
                "variables.allowed.exists(c, cidr(c).containsIP(a)))))",
                "messageExpression": "'a tenant\\'s EndpointSlice may point at pods only (IPv4 addresses "
                "in ' + variables.allowed.join(', ') + '): anything else would send its Service\\'s traffic "
                "outside the tenant (CVE-2021-25740)'",
                "reason": "Forbidden",
            },
        ],
        [
            {
                "name": "allowed",
                "expression": "namespaceObject.metadata.?annotations"
                f"[?'{ENDPOINT_CIDRS_ANNOTATION}'].orValue('').split(',').filter(c, c != '')",
            }
        ],
    )


#: The request comes from a consumer: its issued identity, or the peering token it began with.
_FROM_CONSUMER = [{
    "name": "from-a-consumer",
    "expression": f"'{CONSUMERS_GROUP}' in request.userInfo.groups || "
    f"(request.userInfo.username.startsWith('system:serviceaccount:{TENANT_NAMESPACE_PREFIX}') && "
    f"request.userInfo.username.endsWith(':{PEERING_ACCOUNT}'))",
}]  # fmt: skip

_RANK = "{'privileged': 0, 'baseline': 1, 'restricted': 2}"


def tenants_policy() -> dict[str, Any]:
    updating = "request.operation == 'UPDATE'"
    return _policy(
        TENANTS_POLICY,
        [
            {
                "apiGroups": ["core.gpuferry.io"],
                "apiVersions": ["*"],
                "operations": ["CREATE", "UPDATE"],
                "resources": ["tenants"],
            }
        ],
        [
            {
                "expression": f"{_RANK}[object.spec.?podSecurity.orValue('baseline')] >= "
                f"({updating} ? {_RANK}[oldObject.spec.?podSecurity.orValue('baseline')] : 1)",
                "messageExpression": "'a consumer may make its Pod Security level stricter, not looser ('"
                " + object.spec.?podSecurity.orValue('baseline') + '): a looser one is the provider\\'s to "
                "give'",
                "reason": "Forbidden",
            },
            {
                "expression": f"object.spec.?maxTwinNamespaces.orValue({DEFAULT_MAX_TWIN_NAMESPACES}) <= "
                f"({updating} ? oldObject.spec.?maxTwinNamespaces.orValue({DEFAULT_MAX_TWIN_NAMESPACES}) : "
                f"{DEFAULT_MAX_TWIN_NAMESPACES})",
                "messageExpression": "'a consumer may lower maxTwinNamespaces, not raise it (' + "
                "string(object.spec.?maxTwinNamespaces.orValue(0)) + '): more is the provider\\'s to give'",
                "reason": "Forbidden",
            },
            {
                "expression": f"{updating} ? object.spec.peeringTokenSecretRef == "
                "oldObject.spec.peeringTokenSecretRef : "
                f"object.spec.peeringTokenSecretRef.name == '{TOKEN_SECRET}'",
                "message": f"a consumer may not choose the Secret its peering token is checked against "
                f"(spec.peeringTokenSecretRef: {TOKEN_SECRET})",
                "reason": "Forbidden",
            },
            {
                "expression": "!variables.accepted.hasValue() || !has(object.spec.network) || "
                "(object.spec.network.?podCIDRs.orValue([]) == variables.accepted.value().podCIDRs && "
                "object.spec.network.?serviceCIDRs.orValue([]) == "
                "variables.accepted.value().?serviceCIDRs.orValue([]))",
                "messageExpression": "'a consumer may rotate its gateway key, not change its CIDRs: the "
                "provider accepted pod CIDRs ' + variables.accepted.value().podCIDRs.join(', ') + ' and "
                "Service CIDRs ' + variables.accepted.value().?serviceCIDRs.orValue([]).join(', ') + '; new "
                "CIDRs need the provider: its operator accepts them with `gpuferry tenant accept-network ' + "
                "object.metadata.name + ' --pod-cidrs ... --service-cidrs ...`'",
                "reason": "Forbidden",
            },
        ],
        [
            {
                "name": "accepted",
                "expression": f"{updating} ? oldObject.?status.?acceptedNetwork : optional.none()",
            }
        ],
        _FROM_CONSUMER,
    )


_APPROVED = f"namespaceObject.metadata.?annotations[?'{APPROVED_SELECTOR_ANNOTATION}'].orValue('')"
_LIMITS = (
    f"namespaceObject.metadata.?annotations[?'{MAX_RESOURCES_ANNOTATION}'].orValue('')"
    ".split(',').filter(l, l.contains('='))"
)


def slices_policy() -> dict[str, Any]:
    same_nodes = (
        "object.spec.?nodeSelector.orValue({}) == oldObject.spec.?nodeSelector.orValue({}) && "
        "object.spec.?tolerations.orValue([]) == oldObject.spec.?tolerations.orValue([])"
    )
    approved = (
        "variables.approved != '' && "
        "size(variables.approved.split(',')) == size(variables.selector) && "
        "variables.approved.split(',').all(p, p.split('=')[0] in variables.selector && "
        "variables.selector[p.split('=')[0]] == p.split('=')[1])"
    )
    return _policy(
        SLICES_POLICY,
        [
            {
                "apiGroups": ["sharing.gpuferry.io"],
                "apiVersions": ["*"],
                "operations": ["CREATE", "UPDATE"],
                "resources": ["gpuslices"],
            }
        ],
        [
            {
                "expression": f"request.operation == 'CREATE' || ({same_nodes}) || ({approved})",
                "messageExpression": "'which nodes a slice covers (nodeSelector, tolerations) is the "
                "provider\\'s to change: its operator approves them with `gpuferry tenant approve ' + "
                "object.metadata.name + ' --selector ' + "
                "variables.selector.map(k, k + '=' + variables.selector[k]).join(' --selector ') + '` "
                f"(the annotation {APPROVED_SELECTOR_ANNOTATION} on namespace ' + "
                "namespaceObject.metadata.name + ')'",
                "reason": "Forbidden",
            },
            {
                "expression": "variables.limits.all(l, !(l.split('=')[0] in object.spec.resources) || "
                "quantity(string(object.spec.resources[l.split('=')[0]])).compareTo("
                "quantity(l.split('=')[1])) <= 0)",
                "messageExpression": "'a consumer may ask for at most ' + variables.limits.join(', ') + "
                "' (the provider\\'s limit for this tenant; its operator changes it with `gpuferry tenant "
                "limit ' + object.metadata.name + '`)'",
                "reason": "Forbidden",
            },
        ],
        [
            {"name": "selector", "expression": "object.spec.?nodeSelector.orValue({})"},
            {"name": "approved", "expression": _APPROVED},
            {"name": "limits", "expression": _LIMITS},
        ],
        _FROM_CONSUMER,
    )


def binding(policy_name: str, *, twin_namespaces: bool = True) -> dict[str, Any]:
    spec: dict[str, Any] = {"policyName": policy_name, "validationActions": ["Deny"]}
    if twin_namespaces:
        spec["matchResources"] = {"namespaceSelector": {"matchExpressions": [TWIN_NAMESPACES]}}
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": policy_name, "labels": dict(_LABELS)},
        "spec": spec,
    }


def twin_admission_objects() -> list[tuple[Resource, dict[str, Any]]]:
    """The provider's admission objects for tenants, the policy before its binding."""
    return [
        (VALIDATINGADMISSIONPOLICIES, pods_policy()),
        (VALIDATINGADMISSIONPOLICYBINDINGS, binding(PODS_POLICY)),
        (VALIDATINGADMISSIONPOLICIES, services_policy()),
        (VALIDATINGADMISSIONPOLICYBINDINGS, binding(SERVICES_POLICY)),
        (VALIDATINGADMISSIONPOLICIES, endpoints_policy()),
        (VALIDATINGADMISSIONPOLICYBINDINGS, binding(ENDPOINTS_POLICY)),
        (VALIDATINGADMISSIONPOLICIES, tenants_policy()),
        (VALIDATINGADMISSIONPOLICYBINDINGS, binding(TENANTS_POLICY, twin_namespaces=False)),
        (VALIDATINGADMISSIONPOLICIES, slices_policy()),
        (VALIDATINGADMISSIONPOLICYBINDINGS, binding(SLICES_POLICY, twin_namespaces=False)),
    ]
