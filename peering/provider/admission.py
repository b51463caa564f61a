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

Only what is created is checked for the pod fields (a pod's ``nodeName`` is set by the
scheduler's binding afterwards, and its node selector and priority cannot change); a Service is
checked on update too.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kube.api import GRANT_PIN_REFUSAL
from kube.objects import VALIDATINGADMISSIONPOLICIES, VALIDATINGADMISSIONPOLICYBINDINGS, Resource

from ..resources import LABEL_ORIGIN_NAMESPACE

__all__ = [
    "NODE_SELECTOR_PREFIX",
    "PODS_POLICY",
    "SERVICES_POLICY",
    "pin_annotations",
    "twin_admission_objects",
]

PODS_POLICY = "gpuferry-twin-pods"
SERVICES_POLICY = "gpuferry-twin-services"
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


def _policy(name: str, rules: list[dict[str, Any]], validations: list[dict[str, Any]],
            variables: list[dict[str, str]] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"failurePolicy": "Fail", "matchConstraints": {"resourceRules": rules},
                            "validations": validations}  # fmt: skip
    if variables:
        spec["variables"] = variables
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
        [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
          "resources": ["services"]}],
        [
            {
                "expression": "!has(object.spec.externalIPs) || size(object.spec.externalIPs) == 0",
                "message": "a tenant's Service may not have externalIPs (CVE-2020-8554: they intercept "
                "traffic to those addresses for the whole provider cluster)",
                "reason": "Forbidden",
            },
        ],
    )


def binding(policy_name: str) -> dict[str, Any]:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": policy_name, "labels": dict(_LABELS)},
        "spec": {
            "policyName": policy_name,
            "validationActions": ["Deny"],
            "matchResources": {"namespaceSelector": {"matchExpressions": [TWIN_NAMESPACES]}},
        },
    }


def twin_admission_objects() -> list[tuple[Resource, dict[str, Any]]]:
    """The provider's admission objects for twin namespaces, the policy before its binding."""
    return [
        (VALIDATINGADMISSIONPOLICIES, pods_policy()),
        (VALIDATINGADMISSIONPOLICYBINDINGS, binding(PODS_POLICY)),
        (VALIDATINGADMISSIONPOLICIES, services_policy()),
        (VALIDATINGADMISSIONPOLICYBINDINGS, binding(SERVICES_POLICY)),
    ]
