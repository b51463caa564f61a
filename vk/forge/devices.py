"""The virtual node's DRA devices: ResourceSlices and DeviceClasses mirroring its grant. Pure.

A pod that asks for a GPU through a ResourceClaim is placed by the consumer's scheduler only on a
node whose ResourceSlices have a device its claim's CEL selects. The provider lists the DRA
devices of a grant in its GPUSlice's ``status.devices`` (per provider node: driver, pool, the
devices with their attributes and capacity; and the DeviceClasses granted, with their selectors).
The virtual node publishes them as its own:

* one ResourceSlice per provider pool (:func:`mirror_slices`): same driver, ``nodeName`` the
  virtual node, pool ``<virtual node>/<provider pool>`` (pool names are per driver and cluster
  wide: two virtual nodes mirroring pools of the same name must not meet), the devices verbatim
  plus the attribute ``gpuferry.io/providerNode`` (which provider node has it: a claim may select
  on it). Owned by the virtual Node, so they go with it;
* each DeviceClass granted, where the consumer has none of that name (:func:`mirror_class`):
  same selectors, so the consumer's scheduler evaluates a claim's CEL against the same attributes
  the provider's will. Owned by every virtual Node that mirrors it; a class the consumer's admins
  made is left alone.

The consumer's allocation is bookkeeping: it picks a mirrored device so that no more devices are
claimed than were granted, and the twin's claim (a copy of the consumer's template, see
:mod:`vk.forge.accessories`) is allocated by the provider's scheduler from its real devices.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

from kube.api import LABEL_MANAGED_BY, MANAGED_BY, PROVIDER_LABEL

__all__ = [
    "PROVIDER_NODE_ATTRIBUTE",
    "claim_device_status",
    "claim_names",
    "class_owners",
    "mirror_class",
    "mirror_slices",
    "owner_reference",
]

PROVIDER_NODE_ATTRIBUTE = "gpuferry.io/providerNode"
_API = "resource.k8s.io/v1"


def owner_reference(node: Mapping[str, Any]) -> dict[str, Any]:
    """An ownerReference to the virtual ``node`` (a Node object as read from the API)."""
    md = node.get("metadata") or {}
    return {"apiVersion": "v1", "kind": "Node", "name": md["name"], "uid": md["uid"]}


def _slice_name(node_name: str, driver: str, pool: str) -> str:
    digest = hashlib.sha256(f"{driver}/{pool}".encode()).hexdigest()[:10]
    return f"{node_name}-{digest}"


def mirror_slices(
    devices: Mapping[str, Any] | None, *, node: Mapping[str, Any], provider_id: str
) -> list[dict[str, Any]]:
    """The ResourceSlices of the virtual ``node`` for a GPUSlice's ``status.devices``."""
    node_name = str(node["metadata"]["name"])
    out = []
    for pool in (devices or {}).get("pools") or ():
        driver, provider_pool = str(pool["driver"]), str(pool["pool"])
        mirrored = []
        for device in pool.get("devices") or ():
            where = {PROVIDER_NODE_ATTRIBUTE: {"string": str(pool["node"])}}
            attributes = {**(device.get("attributes") or {}), **where}
            entry: dict[str, Any] = {"name": device["name"], "attributes": attributes}
            if device.get("capacity"):
                entry["capacity"] = device["capacity"]
            mirrored.append(entry)
        out.append(
            {
                "apiVersion": _API,
                "kind": "ResourceSlice",
                "metadata": {
                    "name": _slice_name(node_name, driver, provider_pool),
                    "labels": {LABEL_MANAGED_BY: MANAGED_BY, PROVIDER_LABEL: provider_id},
                    "ownerReferences": [owner_reference(node)],
                },
                "spec": {
                    "driver": driver,
                    "nodeName": node_name,
                    "pool": {
                        "name": f"{node_name}/{provider_pool}",
                        "generation": 1,
                        "resourceSliceCount": 1,
                    },
                    "devices": mirrored,
                },
            }
        )
    return sorted(out, key=lambda s: s["metadata"]["name"])


def mirror_class(entry: Mapping[str, Any], *, node: Mapping[str, Any]) -> dict[str, Any]:
    """A DeviceClass the consumer lacks, as the provider defines it (``status.devices.classes``)."""
    return {
        "apiVersion": _API,
        "kind": "DeviceClass",
        "metadata": {
            "name": entry["name"],
            "labels": {LABEL_MANAGED_BY: MANAGED_BY},
            "ownerReferences": [owner_reference(node)],
        },
        "spec": {"selectors": list(entry.get("selectors") or ())},
    }


def class_owners(current: Mapping[str, Any], node: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    """The ownerReferences of a DeviceClass gpuferry made, with the virtual ``node`` among them;
    None when nothing changes (or the class is not gpuferry's: never touched)."""
    md = current.get("metadata") or {}
    if (md.get("labels") or {}).get(LABEL_MANAGED_BY) != MANAGED_BY:
        return None
    owners: Sequence[Mapping[str, Any]] = md.get("ownerReferences") or ()
    uid = node["metadata"]["uid"]
    if any(o.get("uid") == uid for o in owners):
        return None
    return [*(dict(o) for o in owners), owner_reference(node)]


def claim_names(pod: Mapping[str, Any]) -> dict[str, str]:
    """A pod's claims: its ``spec.resourceClaims`` name → the ResourceClaim's name (shared claims
    by their name; claims made from a template as the pod's status names them, once made)."""
    made = {
        str(s["name"]): str(s["resourceClaimName"])
        for s in (pod.get("status") or {}).get("resourceClaimStatuses") or ()
        if s.get("resourceClaimName")
    }
    out = {}
    for ref in (pod.get("spec") or {}).get("resourceClaims") or ():
        name = str(ref.get("name"))
        if ref.get("resourceClaimName"):
            out[name] = str(ref["resourceClaimName"])
        elif name in made:
            out[name] = made[name]
    return out


def _results(claim: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    allocation = (claim.get("status") or {}).get("allocation") or {}
    return list((allocation.get("devices") or {}).get("results") or ())


def claim_device_status(
    consumer_claim: Mapping[str, Any], provider_claim: Mapping[str, Any]
) -> list[dict[str, Any]] | None:
    """The consumer claim's ``status.devices``: for each device its scheduler allocated (on the
    virtual node's mirror), the real device the provider's scheduler allocated to the twin's
    claim for the same request, as ``data`` (driver, pool, device; the pool is the provider node's
    in NVIDIA's driver). None while either claim is not allocated."""
    mine, theirs = _results(consumer_claim), _results(provider_claim)
    if not mine or not theirs:
        return None
    by_request: dict[str, list[Mapping[str, Any]]] = {}
    for result in theirs:
        by_request.setdefault(str(result.get("request")), []).append(result)
    out = []
    for result in mine:
        matched = by_request.get(str(result.get("request"))) or []
        if not matched:
            continue
        real = matched.pop(0)
        out.append(
            {
                "driver": result["driver"],
                "pool": result["pool"],
                "device": result["device"],
                "data": {
                    "provider": {k: real.get(k) for k in ("driver", "pool", "device")},
                    "providerClaim": (provider_claim.get("metadata") or {}).get("name"),
                },
            }
        )
    return out or None
