"""Taints and tolerations, as the scheduler reads them (core/v1 ``ToleratesTaint``). Pure.

Shared by the provider's slice planner (which nodes a slice may be granted) and the virtual
kubelet (which nodes a twin may land on), so that the two never disagree.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = ["BLOCKING_EFFECTS", "blocking_taints", "format_taint", "tolerates", "untolerated"]

BLOCKING_EFFECTS = frozenset({"NoSchedule", "NoExecute"})
"""Effects that keep a new pod off a node (PreferNoSchedule only discourages it)."""


def tolerates(tolerations: Iterable[Mapping[str, Any]], taint: Mapping[str, Any]) -> bool:
    """Whether some toleration tolerates ``taint``."""
    for toleration in tolerations:
        effect = toleration.get("effect")
        if effect and effect != taint.get("effect"):
            continue
        key = toleration.get("key")
        if key and key != taint.get("key"):
            continue
        if toleration.get("operator") == "Exists":
            return True
        if key and toleration.get("value", "") == taint.get("value", ""):
            return True
    return False


def blocking_taints(node: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The node's NoSchedule and NoExecute taints."""
    return [t for t in (node.get("spec") or {}).get("taints") or () if t.get("effect") in BLOCKING_EFFECTS]


def untolerated(taints: Iterable[Mapping[str, Any]], tolerations: Sequence[Mapping[str, Any]]) -> list[str]:
    """Those of ``taints`` that ``tolerations`` do not tolerate, formatted."""
    return [format_taint(t) for t in taints if not tolerates(tolerations, t)]


def format_taint(taint: Mapping[str, Any]) -> str:
    """``key=value:Effect`` (``key:Effect`` without a value)."""
    value = f"={taint['value']}" if taint.get("value") else ""
    return f"{taint.get('key')}{value}:{taint.get('effect')}"
