"""Placement constraints of a twin: what of the consumer's node targeting survives on the provider.

A pod bound to the virtual node got there by satisfying the consumer's scheduler: its node
selector, node affinity and the toleration of the virtual node's taint. On the provider the
virtual node does not exist, so every constraint on the virtual node's *identity* (see
:func:`vk.forge.labels.virtual_node_identity`: ``type``, ``kubernetes.io/role``,
``gpuferry.io/provider``, ``kubernetes.io/hostname``, and ``metadata.name`` fields) is removed,
while constraints on other labels (``nvidia.com/gpu.product: NVIDIA-A100-SXM4-80GB``, zones) are
kept, because the virtual node copies those from the provider nodes and they mean the same there.

Node affinity terms are evaluated, not blindly stripped: required terms are ORed, so a term whose
identity expressions do not hold for this virtual node (it targets another provider) is dropped,
and a term left with nothing after its identity expressions are removed makes the whole required
affinity unconstrained. Node affinity is ``IgnoredDuringExecution``: when no term matches the
virtual node any more (its labels changed after binding), identity expressions are removed from
all terms instead, so that the pod, already bound, can still run.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from vk.forge.labels import VIRTUAL_NODE_TAINT_KEY

__all__ = [
    "forge_affinity",
    "forge_node_selector",
    "forge_tolerations",
    "is_virtual_node_toleration",
]

_NODE_NAME_FIELD = "metadata.name"
_VIRTUAL_ONLY_PREFIX = "gpuferry.io/"
"""Label keys under this prefix exist only on virtual nodes (largest block, managed labels):
a constraint on them was satisfied by the consumer's binding and means nothing on the provider."""


def _virtual_only(key: object) -> bool:
    return isinstance(key, str) and key.startswith(_VIRTUAL_ONLY_PREFIX)


def forge_node_selector(
    selector: Mapping[str, str] | None, identity: Mapping[str, str]
) -> dict[str, str] | None:
    """``spec.nodeSelector`` without identity keys and ``gpuferry.io/`` keys; ``None`` when
    nothing is left."""
    kept = {
        key: value
        for key, value in (selector or {}).items()
        if key not in identity and not _virtual_only(key)
    }
    return kept or None


def is_virtual_node_toleration(toleration: Mapping[str, Any]) -> bool:
    """Whether ``toleration`` is the opt-in to the virtual node's taint."""
    return toleration.get("key") == VIRTUAL_NODE_TAINT_KEY


def forge_tolerations(tolerations: Sequence[Mapping[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Tolerations without the virtual-node one; ``None`` when nothing is left.

    All others are kept: ``nvidia.com/gpu:NoSchedule`` matters on the provider's GPU nodes, and
    a wildcard toleration (no key, ``Exists``) keeps meaning "tolerate everything".
    """
    kept = [copy.deepcopy(dict(t)) for t in tolerations or () if not is_virtual_node_toleration(t)]
    return kept or None


def _holds(requirement: Mapping[str, Any], value: str) -> bool:
    """Whether a node selector requirement holds for a node whose key has ``value``."""
    operator = requirement.get("operator")
    values = requirement.get("values") or []
    if operator == "In":
        return value in values
    if operator == "NotIn":
        return value not in values
    if operator == "Exists":
        return True
    if operator == "DoesNotExist":
        return False
    if operator in ("Gt", "Lt") and len(values) == 1:
        try:
            actual, bound = int(value), int(values[0])
        except ValueError:
            return False
        return actual > bound if operator == "Gt" else actual < bound
    return False


def _split_term(
    term: Mapping[str, Any], identity: Mapping[str, str], node_name: str
) -> tuple[bool, dict[str, Any]]:
    """(whether the term's identity requirements hold, the term without them)."""
    holds = True
    stripped: dict[str, Any] = {}
    for field, values in (("matchExpressions", identity), ("matchFields", {_NODE_NAME_FIELD: node_name})):
        kept = []
        for requirement in term.get(field) or ():
            key = requirement.get("key")
            if key in values:
                holds = holds and _holds(requirement, values[key])
            elif field == "matchExpressions" and _virtual_only(key):
                continue  # satisfied by the binding; no such label on provider nodes
            else:
                kept.append(copy.deepcopy(dict(requirement)))
        if kept:
            stripped[field] = kept
    return holds, stripped


def _forge_required(
    required: Mapping[str, Any], identity: Mapping[str, str], node_name: str
) -> dict[str, Any] | None:
    terms = [_split_term(term, identity, node_name) for term in required.get("nodeSelectorTerms") or ()]
    originally_empty = [
        not (term.get("matchExpressions") or term.get("matchFields"))
        for term in required.get("nodeSelectorTerms") or ()
    ]
    matching = [
        stripped
        for (holds, stripped), empty in zip(terms, originally_empty, strict=True)
        if holds and not empty
    ]
    if not matching:
        # The virtual node's identity no longer satisfies any term: the binding still stands.
        matching = [
            stripped for (_, stripped), empty in zip(terms, originally_empty, strict=True) if not empty
        ]
    if not matching or any(not stripped for stripped in matching):
        return None
    return {"nodeSelectorTerms": matching}


def _forge_preferred(
    preferred: Sequence[Mapping[str, Any]], identity: Mapping[str, str], node_name: str
) -> list[dict[str, Any]]:
    kept = []
    for item in preferred:
        holds, stripped = _split_term(item.get("preference") or {}, identity, node_name)
        if holds and stripped:
            kept.append({**copy.deepcopy(dict(item)), "preference": stripped})
    return kept


def forge_affinity(
    affinity: Mapping[str, Any] | None, identity: Mapping[str, str], node_name: str
) -> dict[str, Any] | None:
    """``spec.affinity`` for the twin; ``None`` when nothing is left.

    Pod affinity and anti-affinity are kept verbatim: without ``namespaces`` they apply to the
    pod's own namespace, which on the provider is the twin namespace holding its siblings' twins.
    """
    if not affinity:
        return None
    forged = copy.deepcopy(dict(affinity))
    node_affinity = forged.pop("nodeAffinity", None) or {}
    new_node_affinity: dict[str, Any] = {}
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    if required:
        forged_required = _forge_required(required, identity, node_name)
        if forged_required is not None:
            new_node_affinity["requiredDuringSchedulingIgnoredDuringExecution"] = forged_required
    preferred = _forge_preferred(
        node_affinity.get("preferredDuringSchedulingIgnoredDuringExecution") or (), identity, node_name
    )
    if preferred:
        new_node_affinity["preferredDuringSchedulingIgnoredDuringExecution"] = preferred
    if new_node_affinity:
        forged["nodeAffinity"] = new_node_affinity
    return forged or None
