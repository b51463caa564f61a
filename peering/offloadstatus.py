"""What a consumer's NamespaceOffloading status says, for the agent that writes it and the CLI
that waits on it. Pure.

Each peered provider the offloading selects has an entry in ``status.remoteNamespaces``: its twin
namespace, a phase (Pending, Ready, Failed) and, when not Ready, a one-word ``reason``. The
overall phase is Ready only when every entry is. An entry Pending because its provider does not
answer (:data:`UNREACHABLE`: the provider's virtual node has the unreachable taint) may stay so for
as long as the outage lasts; the namespace's pods still go to the providers that are Ready, and
the agent asks the missing one when its taint goes. ``gpuferry offload namespace`` therefore
does not wait for it (:func:`offload_settled`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .conditions import find_condition

__all__ = [
    "NO_IDENTITY",
    "REFUSED",
    "REQUESTED",
    "REQUEST_FAILED",
    "UNREACHABLE",
    "Settled",
    "offload_settled",
    "pending_message",
    "why_waiting",
]

UNREACHABLE = "ProviderUnreachable"
"""The provider's virtual node has the ``gpuferry.io/provider-unreachable`` taint: not asked."""
NO_IDENTITY = "NoIdentity"
"""The consumer has no identity on the provider yet (peering not finished)."""
REQUEST_FAILED = "RequestFailed"
"""Asking the provider failed; the message has the error."""
REQUESTED = "Requested"
"""Asked; the provider has not answered yet."""
REFUSED = "Refused"
"""The provider refused the twin namespace (a Failed entry)."""


def pending_message(entries: Sequence[Mapping[str, Any]]) -> str:
    """The Ready condition's message of an offloading that waits: which providers are ready and
    what each of the others waits for. Pure."""
    ready = [str(e.get("clusterID")) for e in entries if e.get("phase") == "Ready"]
    waiting = [
        f"{e.get('clusterID')}: {e.get('message') or 'asked, not answered yet'}"
        for e in entries
        if e.get("phase") != "Ready"
    ]
    said = f"waiting for {'; '.join(waiting)}" if waiting else "waiting for the twin namespaces"
    return f"twin namespaces ready on {', '.join(ready)}; {said}" if ready else said


@dataclass(frozen=True)
class Settled:
    """How an offload ended, for whoever waits on it."""

    ok: bool
    message: str = ""
    """Why it failed (``ok`` False)."""
    unreachable: tuple[str, ...] = field(default=())
    """Providers that do not answer, whose twin namespaces come when they answer again."""


def offload_settled(obj: Mapping[str, Any], generation: int) -> Settled | None:
    """Whether the offloading ``obj``, as of spec ``generation``, is settled, and how. Pure.

    Ready is; so is a failure (SomeFailed, AllFailed, NoClusterSelected). A Pending offloading
    is settled too, and usable, when each of its providers is either Ready or does not answer
    (:data:`UNREACHABLE`) and at least one is Ready: waiting would be waiting for an outage to
    end. Anything else (a provider still answering, the admission rule not applied yet) is not
    settled: None."""
    status = obj.get("status") or {}
    cond = find_condition(status.get("conditions"), "Ready")
    if cond is None or cond.get("observedGeneration") != generation:
        return None  # not looked at by the agent since this spec
    phase = status.get("phase")
    if phase == "Ready":
        return Settled(True)
    if phase in ("SomeFailed", "AllFailed"):
        return Settled(False, str(cond.get("message")))
    if phase == "NoClusterSelected":
        return Settled(False, "no peered provider is selected")
    if phase != "Pending" or cond.get("reason") != "Pending":
        return None  # e.g. AdmissionPending: every provider ready, the rule not applied yet
    entries = status.get("remoteNamespaces") or []
    ready = [e for e in entries if e.get("phase") == "Ready"]
    down = [e for e in entries if e.get("phase") != "Ready"]
    if ready and down and all(e.get("phase") == "Pending" and e.get("reason") == UNREACHABLE for e in down):
        return Settled(True, unreachable=tuple(str(e.get("clusterID")) for e in down))
    return None


def why_waiting(obj: Mapping[str, Any] | None, generation: int) -> str:
    """Why the offloading ``obj`` (last seen; None: never) is not settled as of ``generation``, in
    the words of the agent that looks at it, or saying that none did. Pure."""
    cond = find_condition(((obj or {}).get("status") or {}).get("conditions"), "Ready")
    if cond is None or cond.get("observedGeneration") != generation:
        return "the consumer agent has not looked at it (is it running? see `gpuferry agents`)"
    return str(cond.get("message") or cond.get("reason"))
