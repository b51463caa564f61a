"""Kubernetes resource quantities, exactly: parsing, canonical formatting, resource-list maths.

Quantities are parsed into :class:`decimal.Decimal` with enough precision that every valid
Kubernetes quantity (``100m``, ``1.5Gi``, ``2e3``, ``7Ei``) is represented exactly; nothing here
goes through ``float``. A resource list is a plain ``dict[str, Decimal]`` keyed by resource name,
the way the API returns ``resources.requests`` once parsed.

:func:`pod_requests` computes a pod's effective request the way kube-scheduler does
(``k8s.io/component-helpers/resource.PodRequests``): the larger of the sum of the app containers
and any single init container, with restartable ("sidecar", KEP-753) init containers running
alongside everything that starts after them, pod-level requests (KEP-2837) overriding cpu and
memory, plus the RuntimeClass overhead. :func:`sum_requests` totals pods, one ``pods`` slot each.
Not modelled: in-place resize (``status.allocatedResources`` / pending resizes), which the
scheduler also takes into account for pods being resized.
"""

from __future__ import annotations

import decimal
import functools
import re
from collections.abc import Iterable, Mapping
from decimal import Decimal
from typing import Any

__all__ = [
    "ResourceList",
    "SharedLists",
    "add",
    "container_requests",
    "fits",
    "format_quantity",
    "format_resource_list",
    "is_byte_resource",
    "parse_quantity",
    "parse_resource_list",
    "pod_requests",
    "sub",
    "sum_requests",
]

ResourceList = dict[str, Decimal]
"""Resource name → amount, e.g. ``{"cpu": Decimal("0.5"), "nvidia.com/gpu": Decimal(4)}``."""

# 60 significant digits: 7Ei with nano precision needs 29, headroom for sums of many of them.
_CONTEXT = decimal.Context(prec=60, rounding=decimal.ROUND_HALF_EVEN, traps=[decimal.InvalidOperation])

_DECIMAL_SUFFIXES: dict[str, int] = {
    "n": -9,
    "u": -6,
    "m": -3,
    "": 0,
    "k": 3,
    "M": 6,
    "G": 9,
    "T": 12,
    "P": 15,
    "E": 18,
}
_BINARY_SUFFIXES: dict[str, int] = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_QUANTITY = re.compile(r"(?P<sign>[+-]?)(?P<number>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?P<suffix>[a-zA-Z0-9+-]*)")
_EXPONENT = re.compile(r"[eE](?P<exp>[+-]?[0-9]+)")
# Bound on exponent forms, so that a hostile "1e999999999" cannot build an enormous number.
_MAX_EXPONENT = 100

_NANO = Decimal("1e-9")
_MILLI = Decimal("1e-3")

# Resources whose amounts are bytes (formatted with binary suffixes when exact).
_BYTE_RESOURCES = frozenset(
    {
        "memory",
        "storage",
        "ephemeral-storage",
        "requests.memory",
        "limits.memory",
        "requests.storage",
        "requests.ephemeral-storage",
        "limits.ephemeral-storage",
    }
)
# Resources that may be set at pod level (spec.resources, KEP-2837) and override container sums.
_POD_LEVEL_RESOURCES = ("cpu", "memory")


def parse_quantity(value: str | int | Decimal) -> Decimal:
    """Parse a Kubernetes quantity (``"100m"``, ``"1.5Gi"``, ``"2e3"``, ``4``) exactly.

    Accepts the API's string form and the ints that YAML-loaded manifests carry. Raises
    :class:`ValueError` naming the offending text for anything Kubernetes would refuse
    (``"1.5GB"``, ``"one"``, ``""``, ``"1e"``, floats and bools).
    """
    if isinstance(value, bool):
        raise ValueError(f"invalid quantity {value!r}: booleans are not quantities")
    if isinstance(value, int):
        return Decimal(value)
    if isinstance(value, Decimal):
        if not value.is_finite():
            raise ValueError(f"invalid quantity {value!r}: not finite")
        return value
    if not isinstance(value, str):
        raise ValueError(f"invalid quantity {value!r}: expected a string or an int")
    return _parse_text(value)


@functools.lru_cache(maxsize=1024)
def _parse_text(value: str) -> Decimal:
    """A quantity's text, parsed once: pods and nodes repeat the same few (``"1"``, ``"4Gi"``), and
    parsing them again for every pod event was 2 % of a virtual kubelet's CPU in a burst (issue 15).
    Decimals are immutable; a refused text raises again each time (errors are not cached)."""
    match = _QUANTITY.fullmatch(value)
    if match is None:
        raise ValueError(f"invalid quantity {value!r}: expected <number><suffix>, e.g. 100m, 1.5Gi, 2e3")
    number = Decimal(match["number"], context=_CONTEXT)
    if match["sign"] == "-":
        number = -number
    suffix = match["suffix"]
    if suffix in _DECIMAL_SUFFIXES:
        return _CONTEXT.multiply(number, Decimal(1).scaleb(_DECIMAL_SUFFIXES[suffix]))
    if suffix in _BINARY_SUFFIXES:
        return _CONTEXT.multiply(number, Decimal(2 ** _BINARY_SUFFIXES[suffix]))
    exponent = _EXPONENT.fullmatch(suffix)
    if exponent is None:
        raise ValueError(
            f"invalid quantity {value!r}: unknown suffix {suffix!r} (expected one of "
            "n u m k M G T P E Ki Mi Gi Ti Pi Ei or an exponent like e3)"
        )
    exp = int(exponent["exp"])
    if abs(exp) > _MAX_EXPONENT:
        raise ValueError(f"invalid quantity {value!r}: exponent {exp} out of range")
    return _CONTEXT.multiply(number, Decimal(1).scaleb(exp))


def is_byte_resource(name: str) -> bool:
    """Whether amounts of ``name`` are bytes (memory, storage, hugepages-*)."""
    return name in _BYTE_RESOURCES or name.startswith(("hugepages-", "requests.hugepages-"))


def format_quantity(value: Decimal | int, like: str = "") -> str:
    """The canonical string for ``value`` as an amount of the resource named ``like``.

    * counts (``nvidia.com/gpu``, ``pods``, any extended resource, the default): the plain
      integer, ``"4"``; fractional counts fall back to milli/nano units like cpu;
    * ``cpu``: whole cores as ``"2"``, fractions in millicores ``"1500m"`` (nanocores ``"n"`` when
      finer than a millicore);
    * bytes (``memory``, ``ephemeral-storage``, ``hugepages-*``): the shortest exact form, binary
      suffixes first (``"1536Mi"``, ``"16Gi"``), then decimal ones (``"1G"``), then plain bytes.

    Like Kubernetes, precision finer than a nano-unit is rounded up.
    """
    amount = Decimal(value) if isinstance(value, int) else value
    if not amount.is_finite():
        raise ValueError(f"cannot format quantity {value!r}: not finite")
    amount = amount.quantize(_NANO, rounding=decimal.ROUND_CEILING, context=_CONTEXT)
    if amount == amount.to_integral_value():
        integer = int(amount)
        if is_byte_resource(like) and integer != 0:
            return _format_bytes(integer)
        return str(integer)
    millis = _CONTEXT.divide(amount, _MILLI)
    if millis == millis.to_integral_value():
        return f"{int(millis)}m"
    return f"{int(_CONTEXT.divide(amount, _NANO))}n"


def _format_bytes(integer: int) -> str:
    candidates = [str(integer)]
    for suffix, power in _BINARY_SUFFIXES.items():
        if integer % (2**power) == 0:
            candidates.append(f"{integer // 2**power}{suffix}")
    for suffix in ("k", "M", "G", "T", "P", "E"):
        unit = 10 ** _DECIMAL_SUFFIXES[suffix]
        if integer % unit == 0:
            candidates.append(f"{integer // unit}{suffix}")
    # The shortest exact form; on a tie the binary one (listed first), as memory is usually Mi/Gi.
    return min(candidates, key=len)


def parse_resource_list(raw: Mapping[str, Any] | None) -> ResourceList:
    """``{"cpu": "500m", "nvidia.com/gpu": "1"}`` → ``{"cpu": Decimal("0.5"), ...}``.

    ``None`` (an absent field) is the empty list. An invalid quantity raises :class:`ValueError`
    naming the resource.
    """
    parsed: ResourceList = {}
    for name, quantity in (raw or {}).items():
        try:
            parsed[name] = parse_quantity(quantity)
        except ValueError as e:
            raise ValueError(f"resource {name}: {e}") from e
    return parsed


def format_resource_list(resources: Mapping[str, Decimal]) -> dict[str, str]:
    """The API form of a resource list, each amount formatted for its resource."""
    return {name: format_quantity(amount, like=name) for name, amount in sorted(resources.items())}


def add(*lists: Mapping[str, Decimal]) -> ResourceList:
    """The sum of resource lists; a resource missing from one counts as zero there."""
    total: ResourceList = {}
    for resources in lists:
        for name, amount in resources.items():
            total[name] = _CONTEXT.add(total.get(name, Decimal(0)), amount)
    return total


def sub(minuend: Mapping[str, Decimal], subtrahend: Mapping[str, Decimal]) -> ResourceList:
    """``minuend - subtrahend`` per resource; results may be negative (an over-committed node)."""
    result: ResourceList = dict(minuend)
    for name, amount in subtrahend.items():
        result[name] = _CONTEXT.subtract(result.get(name, Decimal(0)), amount)
    return result


def _max(into: ResourceList, other: Mapping[str, Decimal]) -> None:
    for name, amount in other.items():
        if name not in into or amount > into[name]:
            into[name] = amount


def covers(free: Mapping[str, Decimal], request: Mapping[str, Decimal]) -> bool:
    """Whether ``free`` has all of ``request`` (:func:`fits` finds nothing missing), without
    building the list: the check a fit makes per node, thousands of times in a burst."""
    return all(amount <= 0 or amount <= free.get(name, Decimal(0)) for name, amount in request.items())


def fits(request: Mapping[str, Decimal], free: Mapping[str, Decimal]) -> list[str]:
    """Names (sorted) of the resources of ``request`` that ``free`` cannot cover.

    Zero or negative requests always fit; a resource absent from ``free`` has none free.
    """
    return sorted(
        name for name, amount in request.items() if amount > 0 and amount > free.get(name, Decimal(0))
    )


def container_requests(container: Mapping[str, Any]) -> ResourceList:
    """A container's requests as the API server defaults them: a resource with a limit and no
    request requests its limit (this is how ``nvidia.com/gpu: 1`` under ``limits`` is counted)."""
    resources = container.get("resources") or {}
    requests = parse_resource_list(resources.get("limits"))
    requests.update(parse_resource_list(resources.get("requests")))
    return requests


def _aggregate_containers(spec: Mapping[str, Any]) -> ResourceList:
    requests = add(*(container_requests(c) for c in spec.get("containers") or ()))
    sidecars: ResourceList = {}
    init_peak: ResourceList = {}
    for init in spec.get("initContainers") or ():
        own = container_requests(init)
        if init.get("restartPolicy") == "Always":
            # A sidecar keeps running next to the app containers and every later init container.
            requests = add(requests, own)
            sidecars = add(sidecars, own)
            during = sidecars
        else:
            during = add(own, sidecars)
        _max(init_peak, during)
    _max(requests, init_peak)
    return requests


def pod_requests(pod: Mapping[str, Any]) -> ResourceList:
    """The effective request of ``pod`` as kube-scheduler's NodeResourcesFit computes it.

    ``max(Σ app containers + Σ sidecars, each init container + the sidecars started before it)``
    per resource, then pod-level ``spec.resources`` requests (or limits, defaulted) replace cpu
    and memory when set, then ``spec.overhead`` is added. Resources requested as zero are kept
    (as zero); the ``pods`` resource is not included — a pod takes one pod slot on its node.
    """
    spec = pod.get("spec") or {}
    requests = _aggregate_containers(spec)
    pod_level = container_requests(spec)
    for name in _POD_LEVEL_RESOURCES:
        if name in pod_level:
            requests[name] = pod_level[name]
    return add(requests, parse_resource_list(spec.get("overhead")))


def sum_requests(pods: Iterable[Mapping[str, Any]]) -> ResourceList:
    """The total effective request of ``pods``, counting one ``pods`` slot for each."""
    total: ResourceList = {}
    count = 0
    for pod in pods:
        total = add(total, pod_requests(pod))
        count += 1
    if count:
        total["pods"] = _CONTEXT.add(total.get("pods", Decimal(0)), Decimal(count))
    return total


class SharedLists:
    """One dict per distinct resource list: the pods of a Job ask for the same, and ten thousand
    copies of it were ~3 MB (issue 15: ~1 MiB at 3,000 pods in a heap snapshot). What it hands
    out is shared: never mutate it. Past ``limit`` distinct lists it starts over rather than grow."""

    __slots__ = ("_limit", "_lists")

    def __init__(self, limit: int = 256) -> None:
        self._limit = limit
        self._lists: dict[tuple[tuple[str, Decimal], ...], ResourceList] = {}

    def __call__(self, amounts: ResourceList) -> ResourceList:
        """The shared list equal to ``amounts`` (``amounts`` itself the first time)."""
        signature = tuple(sorted(amounts.items()))
        shared = self._lists.get(signature)
        if shared is None:
            if len(self._lists) >= self._limit:
                self._lists.clear()
            shared = self._lists[signature] = amounts
        return shared
