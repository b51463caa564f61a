"""Whether the API server applies the offloading rule to a namespace's pods now.

The admission plugin learns of MutatingAdmissionPolicies, their bindings and their parameters
(the namespace's ``NamespaceOffloading``) through informers, and compiles policies once a second:
for a moment after the policy or the offloading is written, a new pod is admitted unchanged, and
without the virtual-node toleration it never lands on a virtual node. A dry-run pod
(``dryRun=All``: admitted, never stored) shows whether the rule is live, so that an offloading
said Ready means that the very next ``kubectl create`` is offloaded.

A refused dry-run pod tells nothing of the rule. Where the refusal can pass (a server error, the
namespace's ServiceAccount not made yet, the rule's own parameters not loaded yet) the answer is
"not yet". Where it is the namespace's own rule (a quota, a LimitRange, a policy of the
platform's that wants labels the probe lacks: the users' pods pass it, the probe never will) the
answer is "cannot tell": waiting would never end, so the caller goes on and says so.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kube.api import NODE_TYPE_LABEL, NODE_TYPE_VIRTUAL_KUBELET, VIRTUAL_NODE_TAINT_KEY
from kube.clients import KubeClient
from kube.errors import KubeError
from kube.objects import PODS, RawObject

from .admission import POLICY_NAME

__all__ = ["PROBE_PREFIX", "Probe", "admission_in_effect", "not_applied", "probe_pod", "refused"]

PROBE_PREFIX = "gpuferry-offload-probe-"


@dataclass(frozen=True)
class Probe:
    """What a dry-run pod showed of the rule."""

    live: bool | None
    """True: applied; False: not yet; None: cannot tell (the namespace's own rules refuse it)."""
    detail: str = ""
    """Why not, or why it cannot tell."""


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


def refused(exc: KubeError) -> Probe:
    """What a refused dry-run pod says: not yet where the refusal passes by itself (a temporary
    error, the ServiceAccount admission waiting for the namespace's ``default``, the rule itself
    failing while its parameters load); else cannot tell. Pure."""
    detail = f"a dry-run pod was refused: {exc}"
    text = str(exc)
    passing = exc.temporary or "error looking up service account" in text or f"'{POLICY_NAME}'" in text
    return Probe(False if passing else None, detail)


async def admission_in_effect(client: KubeClient, namespace: str, strategy: str | None) -> Probe:
    """One dry-run pod in ``namespace``: what it shows of the rule. Nothing is stored."""
    try:
        admitted = await client.create(PODS, probe_pod(), namespace, dry_run=True)
    except KubeError as exc:
        return refused(exc)
    why = not_applied(admitted, strategy)
    return Probe(why is None, why or "")
