"""Fit, not sum: whether a pod can be placed on one provider node, and why not.

A virtual node advertises the sum of what its provider grants: 4 nodes with 2 free GPUs each
show as 8 GPUs, and the consumer's scheduler will happily bind a pod asking for 4. No single
provider node can run it, and the twin would stay Pending forever. The builders here compute what
is free on each provider node (allocatable minus the effective requests of the pods bound to it,
as kube-scheduler's NodeResourcesFit does) and answer, for a pod's request taken as a whole,
whether some single node can hold all of it, with a message a user can act on::

    pod needs 4 nvidia.com/gpu but the largest free block on any provider node is 2
    (8 free in total across 4 nodes)

Only nodes a twin could land on count: not cordoned, Ready, matching the slice's node selector,
and without a NoSchedule/NoExecute taint that the given tolerations do not tolerate.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from decimal import Decimal
from typing import Any, NamedTuple

from kube.quantities import (
    ResourceList,
    add,
    covers,
    fits,
    format_quantity,
    parse_resource_list,
    pod_requests,
    sub,
)
from kube.taints import BLOCKING_EFFECTS, format_taint, tolerates

__all__ = [
    "FitResult",
    "fits_somewhere",
    "is_terminal",
    "largest_blocks",
    "node_free",
    "per_node_free",
    "placement_request",
    "tolerates",
    "unschedulable_reason",
]

TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})
# The one-per-pod slot: left out of messages about a pod's needs unless it is what is short.
_PODS = "pods"


class FitResult(NamedTuple):
    """The answer of :func:`fits_somewhere`: ``reason`` is CamelCase for an Event or a pod
    status; ``node`` is a provider node that fits, when ``ok``."""

    ok: bool
    reason: str
    message: str
    node: str | None = None


def is_terminal(pod: Mapping[str, Any]) -> bool:
    """Whether ``pod`` has finished (its resources are free again on its node)."""
    return (pod.get("status") or {}).get("phase") in TERMINAL_PHASES


def placement_request(pod: Mapping[str, Any]) -> ResourceList:
    """What placing ``pod`` takes from a node: its effective requests and one ``pods`` slot."""
    return add(pod_requests(pod), {_PODS: Decimal(1)})


def unschedulable_reason(
    node: Mapping[str, Any],
    *,
    selector: Mapping[str, str] | None = None,
    tolerations: Sequence[Mapping[str, Any]] = (),
) -> str | None:
    """Why no new pod can be placed on ``node`` (``None`` when one can)."""
    metadata = node.get("metadata") or {}
    spec = node.get("spec") or {}
    labels = metadata.get("labels") or {}
    for key, value in (selector or {}).items():
        if labels.get(key) != value:
            return f"does not match node selector {key}={value}"
    if spec.get("unschedulable"):
        return "cordoned"
    ready = [c for c in (node.get("status") or {}).get("conditions") or () if c.get("type") == "Ready"]
    if not ready or ready[0].get("status") != "True":
        return "not Ready"
    for taint in spec.get("taints") or ():
        if taint.get("effect") in BLOCKING_EFFECTS and not tolerates(tolerations, taint):
            return f"has taint {format_taint(taint)}"
    return None


def _allocatable(node: Mapping[str, Any]) -> ResourceList:
    status = node.get("status") or {}
    return parse_resource_list(status.get("allocatable") or status.get("capacity"))


def _free(node: Mapping[str, Any], bound: Iterable[Mapping[str, Any]]) -> ResourceList:
    return sub(_allocatable(node), add(*(placement_request(pod) for pod in bound)))


def node_free(node: Mapping[str, Any], pods: Iterable[Mapping[str, Any]]) -> ResourceList:
    """Allocatable of ``node`` minus the requests of the non-terminal ``pods`` bound to it.

    ``pods`` may hold pods of any node; those bound elsewhere are ignored. Each bound pod also
    takes one ``pods`` slot. Amounts can be negative on an over-committed node.
    """
    name = (node.get("metadata") or {}).get("name")
    return _free(
        node,
        (pod for pod in pods if (pod.get("spec") or {}).get("nodeName") == name and not is_terminal(pod)),
    )


def per_node_free(
    nodes: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
    *,
    selector: Mapping[str, str] | None = None,
    tolerations: Sequence[Mapping[str, Any]] = (),
) -> dict[str, ResourceList]:
    """Node name → free resources, for the nodes a twin could be placed on."""
    by_node: dict[str, list[Mapping[str, Any]]] = {}
    for pod in pods:
        bound_to = (pod.get("spec") or {}).get("nodeName")
        if bound_to and not is_terminal(pod):
            by_node.setdefault(bound_to, []).append(pod)
    return {
        node["metadata"]["name"]: _free(node, by_node.get(node["metadata"]["name"], ()))
        for node in nodes
        if unschedulable_reason(node, selector=selector, tolerations=tolerations) is None
    }


def _largest(free_by_node: Mapping[str, Mapping[str, Decimal]]) -> ResourceList:
    largest: ResourceList = {}
    for free in free_by_node.values():
        for name, amount in free.items():
            largest[name] = max(largest.get(name, Decimal(0)), amount, Decimal(0))
    return largest


def largest_blocks(
    nodes: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
    *,
    selector: Mapping[str, str] | None = None,
    tolerations: Sequence[Mapping[str, Any]] = (),
) -> ResourceList:
    """Per resource, the largest amount free on any single schedulable, Ready provider node.

    This is what the virtual node advertises as the largest placeable block, next to the sum.
    """
    return _largest(per_node_free(nodes, pods, selector=selector, tolerations=tolerations))


def _amount(value: Decimal, resource: str) -> str:
    return f"{format_quantity(value, like=resource)} {resource}"


def _nodes(count: int) -> str:
    return f"{count} node" if count == 1 else f"{count} nodes"


def _listing(items: list[str]) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def _closest(request: Mapping[str, Decimal], free_by_node: Mapping[str, Mapping[str, Decimal]]) -> str:
    """The node short of the fewest requested resources (then by name), described."""
    name = min(sorted(free_by_node), key=lambda n: len(fits(request, free_by_node[n])))
    free = free_by_node[name]
    short = fits(request, free)
    enough = [r for r in sorted(request) if r not in short and r != _PODS]
    has = f" has {_listing([_amount(free.get(r, Decimal(0)), r) for r in enough])} but" if enough else ""
    lacks = _listing([_amount(max(free.get(r, Decimal(0)), Decimal(0)), r) for r in short])
    return f"the closest, {name},{has} only {lacks} free"


def fits_somewhere(
    pod_request: Mapping[str, Decimal], per_node_free: Mapping[str, Mapping[str, Decimal]]
) -> FitResult:
    """Whether one provider node has *all* of ``pod_request`` free, and if not, why not.

    ``per_node_free`` is node name → free resources (see :func:`per_node_free`). Resources are
    considered jointly: a node with 4 GPUs free but no CPU left does not fit a pod asking for both.
    Reasons: ``Fits``, ``NoProviderNodes``, ``ExceedsLargestBlock`` (one resource is larger than
    any node's free amount), ``NoNodeFitsAll`` (each resource fits somewhere, never together).
    """
    request = {name: amount for name, amount in pod_request.items() if amount > 0}
    if not per_node_free:
        return FitResult(
            False,
            "NoProviderNodes",
            "no provider node can take pods (none is Ready, uncordoned and untainted)",
        )
    for name in sorted(per_node_free):
        if covers(per_node_free[name], request):
            return FitResult(True, "Fits", f"fits on provider node {name}", name)
    largest = _largest(per_node_free)
    count = len(per_node_free)
    too_big = [r for r in sorted(request) if request[r] > largest.get(r, Decimal(0))]
    if too_big:
        parts = []
        for resource in too_big:
            total = sum(
                (max(free.get(resource, Decimal(0)), Decimal(0)) for free in per_node_free.values()),
                Decimal(0),
            )
            block = format_quantity(largest.get(resource, Decimal(0)), like=resource)
            parts.append(
                f"pod needs {_amount(request[resource], resource)} but the largest free block on "
                f"any provider node is {block} ({format_quantity(total, like=resource)} free in "
                f"total across {_nodes(count)})"
            )
        return FitResult(False, "ExceedsLargestBlock", "; ".join(parts))
    wanted = _listing([_amount(request[r], r) for r in sorted(request) if r != _PODS])
    return FitResult(
        False,
        "NoNodeFitsAll",
        f"pod needs {wanted} on a single node, but none of {_nodes(count)} has all of them "
        f"free: {_closest(request, per_node_free)}",
    )
