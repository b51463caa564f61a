"""What one pass of the ForeignCluster controller learns, and how a step says it must wait."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["Pass", "Waiting", "differs"]


class Waiting(Exception):
    """A step cannot go on yet; the message says for what (the condition's message)."""

    def __init__(self, condition: str, reason: str, message: str, *, retry: float | None = None) -> None:
        super().__init__(message)
        self.condition, self.reason, self.message, self.retry = condition, reason, message, retry


@dataclass
class Pass:
    """What one reconciliation learned, written to the ForeignCluster's status at its end."""

    conditions: dict[str, tuple[bool, str, str]] = field(default_factory=dict)
    status: dict[str, Any] = field(default_factory=dict)
    slice_in_force: bool = False
    """The provider's API server refused this pass's change of the slice: the one in force stays."""

    def set(self, condition: str, ok: bool, reason: str, message: str) -> None:
        self.conditions[condition] = (ok, reason, message)


def differs(current: dict[str, Any], wanted: dict[str, Any]) -> bool:
    """Whether any field of ``wanted`` differs from ``current`` (values compared as strings)."""

    def norm(value: Any) -> Any:
        if isinstance(value, dict):
            return {str(k): norm(v) for k, v in value.items()}
        if isinstance(value, list):
            return [norm(v) for v in value]
        return str(value)

    return any(norm(current.get(k)) != norm(v) for k, v in wanted.items())
