"""metav1.Condition lists: setting one condition without disturbing the others. Pure."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kube.times import rfc3339

__all__ = ["CHANGE_REFUSED", "SLICE_REFUSED", "find_condition", "now_rfc3339", "set_condition"]

CHANGE_REFUSED = "ChangeRefused"
SLICE_REFUSED = "NotTheConsumers"
"""The provider's API server refused a slice the consumer may not ask for by itself (another
product, more than the tenant's limit): it needs the provider's operator."""
"""SliceGranted's reason when the provider refused the slice's new spec and kept the grant before it."""


def now_rfc3339() -> str:
    """The current time as the API server writes it (second precision, ``Z``)."""
    return rfc3339()


def find_condition(conditions: Sequence[Mapping[str, Any]] | None, type_: str) -> dict[str, Any] | None:
    for cond in conditions or ():
        if cond.get("type") == type_:
            return dict(cond)
    return None


def status_condition(obj: Mapping[str, Any], type_: str) -> dict[str, Any]:
    """The condition ``type_`` of an object's ``status.conditions`` ({} when it has none)."""
    return find_condition((obj.get("status") or {}).get("conditions"), type_) or {}


def set_condition(
    conditions: Sequence[Mapping[str, Any]] | None,
    type_: str,
    status: bool,
    reason: str,
    message: str,
    *,
    generation: int | None = None,
    now: str | None = None,
) -> list[dict[str, Any]]:
    """A copy of ``conditions`` with ``type_`` set; ``lastTransitionTime`` moves only when the
    status changes."""
    value = "True" if status else "False"
    out: list[dict[str, Any]] = []
    found = False
    for cond in conditions or ():
        if cond.get("type") != type_:
            out.append(dict(cond))
            continue
        found = True
        changed = cond.get("status") != value
        new = {
            "type": type_,
            "status": value,
            "reason": reason,
            "message": message,
            "lastTransitionTime": (now or now_rfc3339())
            if changed
            else cond.get("lastTransitionTime") or now or now_rfc3339(),
        }
        if generation is not None:
            new["observedGeneration"] = generation
        out.append(new)
    if not found:
        new = {
            "type": type_,
            "status": value,
            "reason": reason,
            "message": message,
            "lastTransitionTime": now or now_rfc3339(),
        }
        if generation is not None:
            new["observedGeneration"] = generation
        out.append(new)
    return out
