"""Whether the API server applies the offloading rule to a namespace's pods now.

The admission plugin learns of MutatingAdmissionPolicies, their bindings and their parameters
(the namespace's ``NamespaceOffloading``) through informers, and compiles policies once a second:
for a moment after the policy or the offloading is written, a new pod is admitted unchanged, and
without the virtual-node toleration it never lands on a virtual node. A dry-run pod
(``dryRun=All``: admitted, never stored) shows whether the rule is live, so that an offloading
said Ready means that the very next ``kubectl create`` is offloaded.

A refused dry-run pod (the namespace's ServiceAccount not made yet, a quota, a server error)
tells nothing about the rule: it counts as not confirmed yet, with the refusal as the reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kube.api import NODE_TYPE_LABEL, NODE_TYPE_VIRTUAL_KUBELET, VIRTUAL_NODE_TAINT_KEY
from kube.clients import KubeClient
from kube.errors import KubeError
from kube.objects import PODS, RawObject

__all__ = ["PROBE_PREFIX", "admission_in_effect", "not_applied", "probe_pod"]

PROBE_PREFIX = "gpuferry-offload-probe-"


def probe_pod() -> RawObject:
    """The dry-run pod: nothing of its own that the rule would leave alone (no tolerations, no
    node selector, no affinity), and a security context the ``restricted`` Pod Security level
    admits, so that a namespace that enforces it does not refuse the probe. Pure."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"generateName": PROBE_PREFIX, "labels": {"gpuferry.io/managed-by": "gpuferry"}},
        "spec": {
            "automountServiceAccountToken": False,
            "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [
                {
                    "name": "probe",
                    "image": "gpuferry-offload-probe",
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "capabilities": {"drop": ["ALL"]},
                    },
                }
            ],
        },
    }


def not_applied(admitted: Mapping[str, Any], strategy: str | None) -> str | None:
    """What of the rule the admitted :func:`probe_pod` lacks (None: it was applied) for an
    offloading with ``podOffloadingStrategy`` ``strategy``. Pure."""
    spec = admitted.get("spec") or {}
    if not any(t.get("key") == VIRTUAL_NODE_TAINT_KEY for t in spec.get("tolerations") or ()):
        return "pods are still admitted without the virtual-node toleration"
    pinned = (spec.get("nodeSelector") or {}).get(NODE_TYPE_LABEL) == NODE_TYPE_VIRTUAL_KUBELET
    if strategy == "Remote" and not pinned:
        selector = f"{NODE_TYPE_LABEL}={NODE_TYPE_VIRTUAL_KUBELET}"
        return f"pods are still admitted without the node selector {selector}"
    return None


async def admission_in_effect(client: KubeClient, namespace: str, strategy: str | None) -> str | None:
    """None when a dry-run pod in ``namespace`` is admitted with the rule applied; else why not
    (yet). One request; nothing is stored."""
    try:
        admitted = await client.create(PODS, probe_pod(), namespace, dry_run=True)
    except KubeError as exc:  # e.g. the namespace's default ServiceAccount is not there yet
        return f"a dry-run pod was refused: {exc}"
    return not_applied(admitted, strategy)
