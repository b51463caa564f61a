"""DRA devices in the GPU pool: how many devices of each DeviceClass a node has, and which are
allocated to whom. Pure: raw objects in, amounts out.

A slice asks for DRA devices by DeviceClass, under ResourceQuota's name for them
(:func:`kube.accelerators.dra_resource`: ``gpu.nvidia.com.deviceclass.resource.k8s.io/devices``).
The pool treats them like any other resource of a node: :func:`node_devices` is what a node
has (its ResourceSlices' devices that the class selects), :func:`allocated` what ResourceClaims
hold there, per namespace, so that twin namespaces are charged to their tenant's grant as
their pods are.

A DeviceClass selects devices by CEL. The pool does not evaluate CEL: it understands the
conjunctions drivers ship (``device.driver == 'gpu.nvidia.com' && device.attributes
['gpu.nvidia.com'].type == 'gpu'``: equality of the driver and of string, integer or boolean
attributes) and ignores any other term, so a class with other terms counts at least the devices
it selects (the scheduler, which evaluates all of it, has the last word).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from kube.accelerators import dra_class, dra_resource
from kube.quantities import ResourceList

__all__ = [
    "ClassSelector",
    "allocated",
    "class_selector",
    "granted_devices",
    "node_devices",
    "project_claim",
    "project_slice",
]

_STRING = r"(?:'(?P<s1>[^']*)'|\"(?P<s2>[^\"]*)\")"
_DRIVER = re.compile(rf"^device\.driver\s*==\s*{_STRING}$")
_ATTRIBUTE = re.compile(
    r"^device\.attributes\[\s*(?:'(?P<d1>[^']*)'|\"(?P<d2>[^\"]*)\")\s*\]\.(?P<name>[A-Za-z_][A-Za-z0-9_]*)"
    rf"\s*==\s*(?:{_STRING}|(?P<int>-?[0-9]+)|(?P<bool>true|false))$"
)


@dataclass(frozen=True)
class ClassSelector:
    """What a DeviceClass's selectors say that the pool understands."""

    driver: str | None
    attributes: tuple[tuple[str, str, object], ...] = ()
    """(domain, name, value) that must hold."""

    def selects(self, driver: str, attributes: Mapping[str, Any]) -> bool:
        """Whether a device of ``driver`` with ``attributes`` (as in a ResourceSlice) is selected."""
        if self.driver is not None and driver != self.driver:
            return False
        for domain, name, value in self.attributes:
            raw = attributes.get(f"{domain}/{name}") or (attributes.get(name) if domain == driver else None)
            if not isinstance(raw, Mapping) or _value(raw) != value:
                return False
        return True


def _value(raw: Mapping[str, Any]) -> object:
    for kind in ("string", "int", "bool", "version"):
        if kind in raw:
            return raw[kind]
    return None


def class_selector(device_class: Mapping[str, Any]) -> ClassSelector:
    """The understood part of a DeviceClass's CEL selectors (see the module docstring)."""
    driver: str | None = None
    attributes: list[tuple[str, str, object]] = []
    for selector in (device_class.get("spec") or {}).get("selectors") or ():
        expression = str((selector.get("cel") or {}).get("expression") or "")
        for term in (t.strip().strip("()").strip() for t in expression.split("&&")):
            if m := _DRIVER.match(term):
                driver = m["s1"] if m["s1"] is not None else m["s2"]
            elif m := _ATTRIBUTE.match(term):
                domain = m["d1"] if m["d1"] is not None else m["d2"]
                value: object
                if m["int"] is not None:
                    value = int(m["int"])
                elif m["bool"] is not None:
                    value = m["bool"] == "true"
                else:
                    value = m["s1"] if m["s1"] is not None else m["s2"]
                attributes.append((domain, m["name"], value))
    return ClassSelector(driver, tuple(attributes))


def project_slice(obj: Mapping[str, Any]) -> dict[str, Any]:
    """What the pool keeps of a ResourceSlice: driver, node, pool and each device's attributes."""
    spec = obj.get("spec") or {}
    return {
        "metadata": {"name": (obj.get("metadata") or {}).get("name")},
        "spec": {
            "driver": spec.get("driver"),
            "nodeName": spec.get("nodeName"),
            "pool": {"name": (spec.get("pool") or {}).get("name")},
            "devices": [
                {k: d.get(k) or {} for k in ("attributes", "capacity")} | {"name": d.get("name")}
                for d in spec.get("devices") or ()
            ],
        },
    }


def project_claim(obj: Mapping[str, Any]) -> dict[str, Any]:
    """What the pool keeps of a ResourceClaim: where it is and the devices allocated to it."""
    md = obj.get("metadata") or {}
    allocation = (obj.get("status") or {}).get("allocation") or {}
    results = ((allocation.get("devices") or {}).get("results")) or ()
    return {
        "metadata": {"name": md.get("name"), "namespace": md.get("namespace")},
        "status": {"allocation": {"devices": {"results": [
            {k: r.get(k) for k in ("driver", "pool", "device")} for r in results
        ]}}},
    }  # fmt: skip


_Device = tuple[str, str, str]
"""(driver, pool, device name): how an allocation result names a device."""


def _devices(slices: Iterable[Mapping[str, Any]]) -> dict[_Device, tuple[str, Mapping[str, Any]]]:
    """(driver, pool, device) → (node, the device as its slice lists it), for node-local slices."""
    out: dict[_Device, tuple[str, Mapping[str, Any]]] = {}
    for obj in slices:
        spec = obj.get("spec") or {}
        node = spec.get("nodeName")
        if not node:
            continue  # network-attached devices (allNodes, nodeSelector) are not a node's
        pool = str((spec.get("pool") or {}).get("name") or "")
        for device in spec.get("devices") or ():
            out[(str(spec.get("driver")), pool, str(device.get("name")))] = (str(node), device)
    return out


def _attributes(device: Mapping[str, Any]) -> Mapping[str, Any]:
    return device.get("attributes") or {}


def _count(
    found: Iterable[tuple[str, str, Mapping[str, Any]]], classes: Mapping[str, ClassSelector]
) -> dict[str, ResourceList]:
    out: dict[str, ResourceList] = {}
    for node, driver, attributes in found:
        for name, selector in classes.items():
            if selector.selects(driver, attributes):
                amounts = out.setdefault(node, {})
                key = dra_resource(name)
                amounts[key] = amounts.get(key, Decimal(0)) + 1
    return out


def node_devices(
    slices: Iterable[Mapping[str, Any]], classes: Mapping[str, ClassSelector]
) -> dict[str, ResourceList]:
    """Node → devices per class it has (:func:`kube.accelerators.dra_resource` names)."""
    return _count(((node, key[0], _attributes(d)) for key, (node, d) in _devices(slices).items()), classes)


def allocated(
    claims: Iterable[Mapping[str, Any]],
    slices: Iterable[Mapping[str, Any]],
    classes: Mapping[str, ClassSelector],
) -> dict[tuple[str, str], ResourceList]:
    """(namespace, node) → devices per class that the claims of that namespace hold on that node.

    A device counts for every class that selects it (a device taken through one class is not free
    through another)."""
    devices = _devices(slices)
    by_namespace: dict[str, list[tuple[str, str, Mapping[str, Any]]]] = {}
    for claim in claims:
        namespace = str((claim.get("metadata") or {}).get("namespace") or "")
        allocation = (claim.get("status") or {}).get("allocation") or {}
        for result in (allocation.get("devices") or {}).get("results") or ():
            driver = str(result.get("driver"))
            found = devices.get((driver, str(result.get("pool")), str(result.get("device"))))
            if found is not None:
                by_namespace.setdefault(namespace, []).append((found[0], driver, _attributes(found[1])))
    out: dict[tuple[str, str], ResourceList] = {}
    for namespace, found_here in by_namespace.items():
        for node, amounts in _count(found_here, classes).items():
            out[(namespace, node)] = amounts
    return out


def granted_devices(
    nodes: Mapping[str, Mapping[str, Decimal]],
    slices: Iterable[Mapping[str, Any]],
    classes: Mapping[str, Mapping[str, Any]],
) -> dict[str, Any] | None:
    """The DRA devices of a grant, for its GPUSlice's ``status.devices``: the classes granted
    (name and selectors, for the consumer to define them alike) and, per node of the grant
    (``nodes``: node → granted amounts, the grant's shape), as many of the node's devices of each
    class as granted there, the first by pool and name, with their attributes and capacity. The
    consumer's virtual node publishes them as its own ResourceSlices, so that its scheduler
    allocates claims by the same CEL; the provider's scheduler then allocates the twins' claims
    from whichever real devices are free. None when the grant has no DRA devices."""
    wanted = {
        (node, name): int(amounts[key])
        for node, amounts in nodes.items()
        for key in amounts
        if (name := dra_class(key)) is not None and name in classes and amounts[key] > 0
    }
    if not wanted:
        return None
    selectors = {name: class_selector(classes[name]) for name in {n for _, n in wanted}}
    pools: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    by_node: dict[str, list[tuple[str, str, Mapping[str, Any]]]] = {}
    for (driver, pool, _), (node, device) in sorted(_devices(slices).items()):  # by pool and name
        by_node.setdefault(node, []).append((driver, pool, device))
    for (node, name), count in sorted(wanted.items()):
        found = [d for d in by_node.get(node, ()) if selectors[name].selects(d[0], _attributes(d[2]))]
        for driver, pool, device in found[:count]:
            entry = {k: device[k] for k in ("name", "attributes", "capacity") if device.get(k)}
            if entry not in pools.setdefault((node, driver, pool), []):
                pools[(node, driver, pool)].append(entry)
    return {
        "classes": [
            {"name": name, "selectors": list((classes[name].get("spec") or {}).get("selectors") or ())}
            for name in sorted(selectors)
        ],
        "pools": [
            {"node": node, "driver": driver, "pool": pool, "devices": devices}
            for (node, driver, pool), devices in sorted(pools.items())
        ],
    }
