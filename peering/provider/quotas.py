"""Partitioning a tenant's grant into ResourceQuotas of its twin namespaces. Pure.

The real API server enforces ResourceQuotas even while gpuferry's controller is down, but each
quota only bounds its own namespace. So the tenant's grant is *partitioned*: the hard limits of
all its twin namespaces' quotas add up to at most the grant, and the sum over namespaces can
never exceed it, whatever the consumer does with its own credentials.

* :func:`quota_totals` maps a grant (``nvidia.com/gpu: 4, cpu: 8``) to quota keys
  (``requests.nvidia.com/gpu: 4, requests.cpu: 8``). GPUs, cpu, memory and pods are always
  limited, to 0 when not granted (fail closed: what was not granted cannot be used); so is every
  accelerator resource the provider's nodes offer (MIG instances, shared replicas, HAMi's memory
  and cores, MetaGPU units: ``offered``), and any other granted resource
  (``ephemeral-storage``…) is limited too.
* :data:`FIXED_LIMITS` are not partitioned: NodePort and LoadBalancer Services are refused in
  twin namespaces (they would open ports on the provider's nodes).
* :func:`partition` splits the totals: an equal share per namespace, but never below what a
  namespace already uses; whatever that costs is taken from the others' unused share, so
  ``Σ hard ≤ max(total, Σ used)`` — new pods can never take the tenant above its grant.
* :func:`lowering_step` is the first half of a move: every quota that must shrink is lowered
  (and the quota controller must have synced ``status.hard``) before any quota is raised, so
  headroom is never available in two namespaces at once.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from decimal import ROUND_FLOOR, Decimal
from typing import Any

from kube.accelerators import dra_class, is_accelerator
from kube.api import GPU_RESOURCE
from kube.quantities import ResourceList

__all__ = [
    "ALWAYS_LIMITED",
    "FIXED_LIMITS",
    "lowering_step",
    "needs_lowering",
    "offered_accelerators",
    "partition",
    "quota_key",
    "quota_totals",
]

_MILLI = Decimal("0.001")
ALWAYS_LIMITED = (GPU_RESOURCE, "cpu", "memory", "pods")
FIXED_LIMITS: dict[str, Decimal] = {"services.nodeports": Decimal(0), "services.loadbalancers": Decimal(0)}


def quota_key(resource: str) -> str:
    """The ResourceQuota key limiting the requests of ``resource`` (``pods`` counts pods)."""
    if resource == "pods" or dra_class(resource) is not None:
        return resource  # DRA devices: ResourceQuota's own name for them, per DeviceClass
    return f"requests.{resource}"


def offered_accelerators(nodes: Iterable[Mapping[str, Any]]) -> set[str]:
    """The accelerator resources (:func:`kube.accelerators.is_accelerator`) ``nodes`` advertise."""
    return {
        res
        for node in nodes
        for res in ((node.get("status") or {}).get("allocatable") or {})
        if is_accelerator(res)
    }


def quota_totals(grant: Mapping[str, Decimal], offered: Iterable[str] = ()) -> ResourceList:
    """The quota hard limits for a grant (see the module docstring), without :data:`FIXED_LIMITS`;
    ``offered``: the accelerator resources the provider's nodes advertise, limited to 0 unless
    granted (a grant of whole GPUs does not let twins take MIG instances)."""
    out = {quota_key(res): amount for res, amount in grant.items()}
    for res in (*ALWAYS_LIMITED, *sorted(offered)):
        out.setdefault(quota_key(res), Decimal(0))
    return out


def _unit(key: str, total: Decimal) -> Decimal:
    if key == "requests.cpu":
        return _MILLI
    return Decimal(1) if total == total.to_integral_value() else _MILLI


def _split(total: Decimal, n: int, unit: Decimal) -> list[Decimal]:
    units = int((total / unit).to_integral_value(rounding=ROUND_FLOOR))
    base, rem = divmod(units, n)
    return [Decimal(base + (1 if i < rem else 0)) * unit for i in range(n)]


def partition(
    totals: Mapping[str, Decimal],
    namespaces: Sequence[str],
    used: Mapping[str, Mapping[str, Decimal]],
    demand: Mapping[str, Mapping[str, Decimal]] | None = None,
) -> dict[str, ResourceList]:
    """Hard limits per namespace for ``totals`` (see the module docstring). Namespaces are
    shares in sorted order; the first ones get the remainder of an uneven split.

    ``demand`` (per namespace, quota keys) is what pods waiting for room there need beyond the
    namespace's usage, as the consumer's virtual kubelet reports it: it is served from the
    headroom first (in sorted order), before the rest is shared equally — so a Job that needs
    3 of a 4-GPU grant runs even when the tenant has two twin namespaces."""
    names = sorted(namespaces)
    out: dict[str, ResourceList] = {ns: {} for ns in names}
    if not names:
        return out
    for key, total in totals.items():
        shares = _split(max(total, Decimal(0)), len(names), _unit(key, total))
        usage = [max(used.get(ns, {}).get(key, Decimal(0)), Decimal(0)) for ns in names]
        headroom = max(total - sum(usage, Decimal(0)), Decimal(0))
        for i, ns in enumerate(names):
            extra = min(max((demand or {}).get(ns, {}).get(key, Decimal(0)), Decimal(0)), headroom)
            usage[i] += extra
            headroom -= extra
        hard = [max(u, s) for u, s in zip(usage, shares, strict=True)]
        excess = sum(hard, Decimal(0)) - max(total, sum(usage, Decimal(0)))
        for i in reversed(range(len(names))):
            if excess <= 0:
                break
            cut = min(excess, hard[i] - usage[i])
            hard[i] -= cut
            excess -= cut
        for ns, value in zip(names, hard, strict=True):
            out[ns][key] = value
    return out


def needs_lowering(current: Mapping[str, Decimal] | None, planned: Mapping[str, Decimal]) -> bool:
    """Whether moving from ``current`` to ``planned`` lowers a limit (no quota, or a missing key,
    is no limit at all)."""
    if current is None:
        return True
    return any(key not in current or amount < current[key] for key, amount in planned.items())


def lowering_step(current: Mapping[str, Decimal] | None, planned: Mapping[str, Decimal]) -> ResourceList:
    """The limits to set first: per key the lower of the current and the planned limit.

    A quota that does not exist yet is created with zeros: the other namespaces may not have
    given up their share yet, so the new one gets its share only in the raising step."""
    if current is None:
        return {key: Decimal(0) for key in planned}
    return {key: min(amount, current[key]) if key in current else amount for key, amount in planned.items()}
