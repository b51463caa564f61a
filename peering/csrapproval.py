"""Whether a kubelet-serving CSR is one of our virtual kubelets' and may be approved. Pure.

The consumer's controller-manager signs ``kubernetes.io/kubelet-serving`` requests once they are
approved, and nothing approves them by default (a real cluster runs an approver that checks them
against the Node). The consumer agent is that approver for gpuferry's virtual nodes: it approves a
request only when all of this holds, as a careful kubelet CSR approver does:

- it was made by an identity our virtual kubelets run as (the agent's own when it runs them as
  processes; each VirtualNode's own ServiceAccount when they run as pods);
- its subject is ``CN=system:node:<node>, O=system:nodes`` and ``<node>`` is the node of one of
  our VirtualNodes, registered as a virtual kubelet, and the requester is that node's kubelet
  (one virtual kubelet never gets a certificate for another's node);
- its IP SANs are addresses the Node reports, its DNS SANs its hostnames, nothing else;
- its usages are a serving certificate's (``server auth``, with digital signature and
  optionally key encipherment).

A request from another identity is not ours to judge (left alone). One of ours that fails a
check is denied, with the reason.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from cryptography import x509
from cryptography.x509.oid import NameOID

from kube.api import KUBELET_SERVING_SIGNER, NODE_TYPE_LABEL, NODE_TYPE_VIRTUAL_KUBELET

__all__ = ["SIGNER", "Decision", "Verdict", "decide", "node_of"]

SIGNER = KUBELET_SERVING_SIGNER
_ALLOWED_USAGES = {"digital signature", "key encipherment", "server auth"}


class Decision(Enum):
    APPROVE = "approve"
    DENY = "deny"
    IGNORE = "ignore"
    """Not ours to judge (another signer, another requester), or already decided."""
    WAIT = "wait"
    """Ours, but its Node is not registered yet: ask again later."""


@dataclass(frozen=True)
class Verdict:
    decision: Decision
    reason: str


def _pending(csr: Mapping[str, Any]) -> bool:
    conditions = (csr.get("status") or {}).get("conditions") or []
    return not any(c.get("type") in ("Approved", "Denied", "Failed") for c in conditions)


def node_of(csr: Mapping[str, Any]) -> str | None:
    """The node a kubelet-serving request is for (from its subject), None if unreadable."""
    try:
        request = x509.load_pem_x509_csr(base64.b64decode((csr.get("spec") or {}).get("request") or ""))
    except ValueError:
        return None
    cns = request.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    cn = str(cns[0].value) if len(cns) == 1 else ""
    return cn.removeprefix("system:node:") if cn.startswith("system:node:") else None


def decide(
    csr: Mapping[str, Any],
    *,
    kubelets: Mapping[str, str],
    node: Mapping[str, Any] | None,
) -> Verdict:
    """The verdict on ``csr``. ``kubelets`` maps the node of each of our VirtualNodes to the
    identity its kubelet runs as; ``node`` is the Node the subject names (None if not registered)."""
    spec = csr.get("spec") or {}
    if spec.get("signerName") != SIGNER or not _pending(csr):
        return Verdict(Decision.IGNORE, "not a pending kubelet-serving request")
    username = spec.get("username")
    if username not in set(kubelets.values()):
        return Verdict(Decision.IGNORE, f"requested by {username!r}, not by the virtual kubelets")
    try:
        request = x509.load_pem_x509_csr(base64.b64decode(spec.get("request") or ""))
    except ValueError as e:
        return Verdict(Decision.DENY, f"the request is not a PEM CSR: {e}")
    if not request.is_signature_valid:
        return Verdict(Decision.DENY, "the CSR's signature is invalid")
    name = node_of(csr)
    orgs = [str(a.value) for a in request.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)]
    if name is None or orgs != ["system:nodes"]:
        return Verdict(Decision.DENY, f"subject {request.subject.rfc4514_string()} is not a kubelet's")
    if name not in kubelets:
        return Verdict(Decision.DENY, f"node {name} is not one of gpuferry's virtual nodes")
    if kubelets[name] != username:
        return Verdict(Decision.DENY, f"node {name}'s kubelet runs as {kubelets[name]}, not {username}")
    usages = set(spec.get("usages") or [])
    if "server auth" not in usages or not usages <= _ALLOWED_USAGES:
        return Verdict(Decision.DENY, f"usages {sorted(usages)} are not a serving certificate's")
    if node is None:
        return Verdict(Decision.WAIT, f"node {name} is not registered yet")
    labels = (node.get("metadata") or {}).get("labels") or {}
    if labels.get(NODE_TYPE_LABEL) != NODE_TYPE_VIRTUAL_KUBELET:
        return Verdict(Decision.DENY, f"node {name} is not registered as a virtual kubelet")
    reported = {str(a.get("address")) for a in (node.get("status") or {}).get("addresses") or []}
    try:
        sans = request.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return Verdict(Decision.DENY, "the request names no address (subject alternative names)")
    ips = {str(ip) for ip in sans.get_values_for_type(x509.IPAddress)}
    dns = set(sans.get_values_for_type(x509.DNSName))
    if len(ips) + len(dns) != len(list(sans)):
        return Verdict(Decision.DENY, "the request has SANs other than IP addresses and DNS names")
    if not ips | dns or not (ips | dns) <= reported:
        named = sorted(ips | dns)
        message = f"SANs {named} are not addresses node {name} reports ({sorted(reported)})"
        return Verdict(Decision.DENY, message)
    return Verdict(Decision.APPROVE, f"serving certificate of virtual node {name} at {sorted(ips | dns)}")
