"""What the consumer's controllers write for a peering: the GPUSlice request, the VirtualNode, the
PeerNetwork, the consumer's network in the Tenant, the ForeignCluster's conditions. Pure."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any

from kube.accelerators import gpu_equivalent
from kube.api import PROVIDER_LABEL, SYSTEM_NAMESPACE, tenant_namespace, virtual_node_name
from kube.declaration import Declaration
from kube.objects import GPUSLICES, PEERNETWORKS, VIRTUALNODES, RawObject
from kube.quantities import parse_quantity

__all__ = [
    "DECIDED",
    "FIELD_MANAGER",
    "consumer_network",
    "consumer_peer_network",
    "desired_slice_spec",
    "gpuslice",
    "slice_decided",
    "virtual_node",
    "virtual_node_spec_from_grant",
    "with_defaults",
]

FIELD_MANAGER = "gpuferry-consumer"  # server-side apply of what the consumer controllers own

DECIDED = frozenset({"Granted", "PartiallyGranted", "Denied"})


def with_defaults(resources: Mapping[str, Any]) -> dict[str, str]:
    """What a slice asks for, with what its GPUs need beside them when not named: 8 CPUs and
    64 GiB per GPU (as a typical GPU node has) and 110 pods (a kubelet's default ``--max-pods``).
    Slices and shares of GPUs count for the part of a GPU they are
    (:func:`kube.accelerators.gpu_equivalent`: 7 MIG ``1g.10gb`` or 4 shared replicas are one GPU),
    rounded up. The provider enforces the grant to the letter, so a slice of GPUs alone would fit
    no pod."""
    out = {str(k): str(v) for k, v in resources.items()}
    gpus = sum((gpu_equivalent(k, parse_quantity(v)) for k, v in out.items()), Decimal(0))
    if gpus > 0:
        out.setdefault("cpu", str(math.ceil(8 * gpus)))
        out.setdefault("memory", f"{math.ceil(64 * gpus)}Gi")
    out.setdefault("pods", "110")
    return out


def desired_slice_spec(consumer_id: str, request: Mapping[str, Any]) -> dict[str, Any]:
    """The GPUSlice spec for a ForeignCluster's ``spec.slice`` (see :func:`with_defaults`)."""
    spec = {
        "consumerClusterID": consumer_id,
        "resources": with_defaults(request.get("resources") or {}),
        "nodeSelector": {str(k): str(v) for k, v in (request.get("nodeSelector") or {}).items()},
        "allowPartial": bool(request.get("allowPartial", False)),
    }
    if request.get("tolerations"):
        spec["tolerations"] = [dict(t) for t in request["tolerations"]]
    return spec


def gpuslice(consumer_id: str, spec: Mapping[str, Any]) -> RawObject:
    return {
        "apiVersion": GPUSLICES.api_version,
        "kind": GPUSLICES.kind,
        "metadata": {"name": consumer_id, "namespace": tenant_namespace(consumer_id)},
        "spec": dict(spec),
    }


def same_slice_spec(current: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
    """Whether a GPUSlice already asks for ``wanted`` (quantities compared as strings)."""

    def norm(spec: Mapping[str, Any]) -> tuple[Any, ...]:
        return (
            spec.get("consumerClusterID"),
            {str(k): str(v) for k, v in (spec.get("resources") or {}).items()},
            {str(k): str(v) for k, v in (spec.get("nodeSelector") or {}).items()},
            bool(spec.get("allowPartial", False)),
            [dict(t) for t in spec.get("tolerations") or ()],
        )

    return norm(current) == norm(wanted)


def slice_decided(obj: RawObject) -> bool:
    """Whether the provider has decided the slice's current spec."""
    md, status = obj.get("metadata") or {}, obj.get("status") or {}
    return status.get("phase") in DECIDED and status.get("observedGeneration") == md.get("generation")


def virtual_node_spec_from_grant(
    slice_obj: RawObject, advertised: Mapping[str, Any] | None = None
) -> dict[str, Any] | None:
    """The VirtualNode fields a decided GPUSlice implies: always the grant in force (a change the
    provider refused keeps the grant before it, and the slice says so).

    Withdrawn (Denied) while a virtual node advertises something (``advertised``: its spec):
    every resource at zero, so that nothing more is scheduled there while the pods already
    running stay. None when nothing is granted and there is no node."""
    status = slice_obj.get("status") or {}
    if status.get("phase") not in ("Granted", "PartiallyGranted") or not status.get("granted"):
        if status.get("phase") != "Denied" or not advertised or not advertised.get("resources"):
            return None
        zeros = dict.fromkeys((str(k) for k in advertised["resources"]), "0")
        return {
            "resources": zeros,
            "shape": dict(zeros),  # not {}: server-side apply would make an empty map null
            "labels": {str(k): str(v) for k, v in (advertised.get("labels") or {}).items()},
        }
    return {
        "resources": {str(k): str(v) for k, v in status["granted"].items()},
        "shape": {str(k): str(v) for k, v in ((status.get("shape") or {}).get("largest") or {}).items()},
        "labels": {str(k): str(v) for k, v in (status.get("labels") or {}).items()},
    }


def virtual_node(
    *,
    provider_id: str,
    consumer_id: str,
    grant: Mapping[str, Any],
    selector: Mapping[str, str],
    secret: str,
    tolerations: Sequence[Mapping[str, Any]] = (),
) -> RawObject:
    """The VirtualNode standing for a granted slice (its kubelet reads everything from it)."""
    return {
        "apiVersion": VIRTUALNODES.api_version,
        "kind": VIRTUALNODES.kind,
        "metadata": {
            "name": provider_id,
            "namespace": SYSTEM_NAMESPACE,
            "labels": {PROVIDER_LABEL: provider_id},
        },
        "spec": {
            "providerClusterID": provider_id,
            "consumerClusterID": consumer_id,
            "nodeName": virtual_node_name(provider_id),
            "tenantNamespace": tenant_namespace(consumer_id),
            "sliceName": consumer_id,
            "providerNodeSelector": dict(selector),
            "labels": dict(grant["labels"]),
            "resources": dict(grant["resources"]),
            "shape": dict(grant["shape"]),
            "kubeconfigSecretRef": {"name": secret, "key": "kubeconfig"},
            **({"providerTolerations": [dict(t) for t in tolerations]} if tolerations else {}),
        },
    }


def consumer_network(declaration: Declaration, public_key: str | None) -> dict[str, Any]:
    """This cluster's network as the provider is told it (the Tenant's ``spec.network``)."""
    out: dict[str, Any] = {
        "podCIDRs": list(declaration.pod_cidrs),
        "serviceCIDRs": list(declaration.service_cidrs),
    }
    if public_key:
        out["publicKey"] = public_key
    return out


def consumer_peer_network(provider_id: str, provider: Mapping[str, Any]) -> RawObject | None:
    """The PeerNetwork describing the provider to this cluster's gateway, from what the provider
    published (the Tenant's ``status.network``); None until it published its CIDRs."""
    if not provider.get("podCIDRs") or not provider.get("serviceCIDRs"):
        return None
    spec: dict[str, Any] = {
        "clusterID": provider_id,
        "podCIDRs": list(provider["podCIDRs"]),
        "serviceCIDRs": list(provider["serviceCIDRs"]),
    }
    if provider.get("publicKey"):
        spec["publicKey"] = provider["publicKey"]
    endpoint = provider.get("endpoint") or {}
    if endpoint.get("address") and endpoint.get("port"):
        spec["endpoint"] = {"address": endpoint["address"], "port": int(endpoint["port"])}
    return {
        "apiVersion": PEERNETWORKS.api_version,
        "kind": PEERNETWORKS.kind,
        "metadata": {
            "name": provider_id,
            "namespace": SYSTEM_NAMESPACE,
            "labels": {"app.kubernetes.io/managed-by": "gpuferry", "gpuferry.io/peer": provider_id},
        },
        "spec": spec,
    }
