"""The consumer's admission rules for offloaded namespaces: a MutatingAdmissionPolicy for their
pods, a ValidatingAdmissionPolicy for the NamespaceOffloadings themselves.

A namespace is offloaded when it holds a ``NamespaceOffloading`` named ``offloading``. The
policy takes that object as its parameter (a namespaced ``paramKind`` with no namespace in the
binding's ``paramRef`` is looked up in the namespace of the pod being admitted; a namespace
without one is left alone), and mutates every pod created there:

* the toleration of the virtual nodes' taint is added (pods become *eligible* for them);
* with ``podOffloadingStrategy: Remote``, ``nodeSelector`` gets ``type: virtual-kubelet``,
  so the pods run on virtual nodes only (``LocalAndRemote`` lets the scheduler choose);
* with a provider restriction (``status.allowedProviders``, computed from the
  ``clusterSelector`` by the offloading controller), a node affinity term on
  ``gpuferry.io/provider`` is added — only when the pod has no required node affinity of its
  own, which is then left as the user wrote it.

A ValidatingAdmissionPolicy refuses a NamespaceOffloading in a system namespace (``kube-*``,
``gpuferry-*``, ``openshift-*``): the CRD's schema cannot see an object's namespace. It matches
the consumer's objects only (a provider's requests, in its tenant namespaces, carry
``spec.originNamespace``).

They run inside the API server: no webhook server to deploy, secure or keep available, and the
rule cannot be bypassed by a pod created while a gpuferry process is down. These builders are
pure; the CLI and the controllers apply them with server-side apply.
"""

from __future__ import annotations

from typing import Any

from kube import api
from kube.api import NODE_TYPE_LABEL, NODE_TYPE_VIRTUAL_KUBELET, VIRTUAL_NODE_TAINT_KEY
from kube.objects import (
    MUTATINGADMISSIONPOLICIES,
    MUTATINGADMISSIONPOLICYBINDINGS,
    VALIDATINGADMISSIONPOLICIES,
    VALIDATINGADMISSIONPOLICYBINDINGS,
    Resource,
)

from .resources import SYSTEM_NAMESPACE_PREFIXES

__all__ = [
    "BINDING_NAME",
    "OFFLOADING_NAME",
    "POLICY_NAME",
    "SYSTEM_NAMESPACE_PREFIXES",
    "VALIDATION_NAME",
    "admission_binding",
    "admission_objects",
    "admission_policy",
    "validation_binding",
    "validation_policy",
]

POLICY_NAME = "gpuferry-offloading"
BINDING_NAME = "gpuferry-offloading"
VALIDATION_NAME = "gpuferry-offloading-namespaces"
_LABELS = {"gpuferry.io/managed-by": "gpuferry"}
OFFLOADING_NAME = "offloading"
"""The name of the one NamespaceOffloading per offloaded namespace (the policy's parameter)."""

TAINT_KEY = VIRTUAL_NODE_TAINT_KEY
NODE_TYPE_VALUE = NODE_TYPE_VIRTUAL_KUBELET
PROVIDER_LABEL = api.PROVIDER_LABEL

_TOLERATION = f'Object.spec.tolerations{{key: "{TAINT_KEY}", operator: "Exists", effect: "NoExecute"}}'

# CEL: a list of JSONPatch operations; each part is empty when it has nothing to do, so the
# policy is idempotent (reinvocation and re-admission add nothing twice).
_TOLERATE = f"""
(has(object.spec.tolerations) && object.spec.tolerations.exists(t,
    has(t.key) && t.key == "{TAINT_KEY}") ? [] :
  has(object.spec.tolerations)
    ? [JSONPatch{{op: "add", path: "/spec/tolerations/-", value: {_TOLERATION}}}]
    : [JSONPatch{{op: "add", path: "/spec/tolerations", value: [{_TOLERATION}]}}])
"""
_REMOTE_ONLY = f"""
(!has(params.spec.podOffloadingStrategy) || params.spec.podOffloadingStrategy != "Remote" ? [] :
  has(object.spec.nodeSelector)
    ? [JSONPatch{{op: "add", path: "/spec/nodeSelector/{NODE_TYPE_LABEL}", value: "{NODE_TYPE_VALUE}"}}]
    : [JSONPatch{{op: "add", path: "/spec/nodeSelector",
                  value: {{"{NODE_TYPE_LABEL}": "{NODE_TYPE_VALUE}"}}}}])
"""
_AFFINITY = f"""Object.spec.affinity.nodeAffinity{{
  requiredDuringSchedulingIgnoredDuringExecution:
    Object.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution{{
      nodeSelectorTerms: [
        Object.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms{{
          matchExpressions: [
            Object.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms.matchExpressions{{
              key: "{PROVIDER_LABEL}", operator: "In", values: params.status.allowedProviders}}]}}]}}}}"""
_PROVIDERS = f"""
(!has(params.status) || !has(params.status.allowedProviders) || size(params.status.allowedProviders) == 0
  || (has(object.spec.affinity) && has(object.spec.affinity.nodeAffinity)
      && has(object.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution)) ? [] :
  !has(object.spec.affinity)
    ? [JSONPatch{{op: "add", path: "/spec/affinity",
                  value: Object.spec.affinity{{nodeAffinity: {_AFFINITY}}}}}]
  : !has(object.spec.affinity.nodeAffinity)
    ? [JSONPatch{{op: "add", path: "/spec/affinity/nodeAffinity", value: {_AFFINITY}}}]
    : [JSONPatch{{op: "add",
        path: "/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution",
        value: {_AFFINITY}.requiredDuringSchedulingIgnoredDuringExecution}}])
"""


def _cel(text: str) -> str:
    return " ".join(text.split())


def admission_policy() -> dict[str, Any]:
    """The MutatingAdmissionPolicy (cluster-scoped) applied to pods of offloaded namespaces."""
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingAdmissionPolicy",
        "metadata": {"name": POLICY_NAME, "labels": {"gpuferry.io/managed-by": "gpuferry"}},
        "spec": {
            "paramKind": {"apiVersion": "offloading.gpuferry.io/v1alpha1", "kind": "NamespaceOffloading"},
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE"],
                        "resources": ["pods"],
                    }
                ]
            },
            "matchConditions": [
                # a NamespaceOffloading being deleted (unoffload) no longer makes pods eligible
                {"name": "offloading-active", "expression": "!has(params.metadata.deletionTimestamp)"},
            ],
            "failurePolicy": "Fail",
            "reinvocationPolicy": "IfNeeded",
            "mutations": [
                {"patchType": "JSONPatch", "jsonPatch": {"expression": _cel(_TOLERATE)}},
                {"patchType": "JSONPatch", "jsonPatch": {"expression": _cel(_REMOTE_ONLY)}},
                {"patchType": "JSONPatch", "jsonPatch": {"expression": _cel(_PROVIDERS)}},
            ],
        },
    }


def admission_binding() -> dict[str, Any]:
    """The binding: parameters are the ``offloading`` NamespaceOffloading of the pod's namespace;
    namespaces without one are not touched (``parameterNotFoundAction: Allow``)."""
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingAdmissionPolicyBinding",
        "metadata": {"name": BINDING_NAME, "labels": {"gpuferry.io/managed-by": "gpuferry"}},
        "spec": {
            "policyName": POLICY_NAME,
            "paramRef": {"name": OFFLOADING_NAME, "parameterNotFoundAction": "Allow"},
        },
    }


def validation_policy() -> dict[str, Any]:
    """The ValidatingAdmissionPolicy refusing a NamespaceOffloading in a system namespace."""
    system = " || ".join(f"request.namespace.startsWith('{p}')" for p in SYSTEM_NAMESPACE_PREFIXES)
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": VALIDATION_NAME, "labels": dict(_LABELS)},
        "spec": {
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": ["offloading.gpuferry.io"],
                        "apiVersions": ["*"],
                        "operations": ["CREATE", "UPDATE"],
                        "resources": ["namespaceoffloadings"],
                    }
                ]
            },
            # the consumer's objects: a provider's requests name their origin namespace
            "matchConditions": [{"name": "consumer-side", "expression": "!has(object.spec.originNamespace)"}],
            "failurePolicy": "Fail",
            "validations": [
                {
                    "expression": f"!({system})",
                    "messageExpression": "request.namespace + ' is a system namespace: its pods are not "
                    "offloaded (kube-*, gpuferry-*, openshift-*)'",
                    "reason": "Forbidden",
                }
            ],
        },
    }


def validation_binding() -> dict[str, Any]:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": VALIDATION_NAME, "labels": dict(_LABELS)},
        "spec": {"policyName": VALIDATION_NAME, "validationActions": ["Deny"]},
    }


def admission_objects() -> list[tuple[Resource, dict[str, Any]]]:
    """Every admission object of the consumer, each policy before its binding."""
    return [
        (MUTATINGADMISSIONPOLICIES, admission_policy()),
        (MUTATINGADMISSIONPOLICYBINDINGS, admission_binding()),
        (VALIDATINGADMISSIONPOLICIES, validation_policy()),
        (VALIDATINGADMISSIONPOLICYBINDINGS, validation_binding()),
    ]
