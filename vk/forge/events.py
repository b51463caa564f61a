"""Which provider Events about twins are copied onto their consumer pods. Pure."""

from __future__ import annotations

from typing import Literal

__all__ = ["PROVIDER_EVENTS", "ProviderEvents", "event_selector"]

ProviderEvents = Literal["all", "warnings", "none"]
PROVIDER_EVENTS: tuple[ProviderEvents, ...] = ("all", "warnings", "none")


def event_selector(which: ProviderEvents) -> str | None:
    """The field selector of the provider Events to copy (``type`` is one of the fields the API
    server selects Events by, so the others are never sent); None: copy none."""
    if which == "none":
        return None
    return "involvedObject.kind=Pod" + (",type=Warning" if which == "warnings" else "")
