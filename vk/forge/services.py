"""Consumer Services reflected into a twin namespace, with their endpoints in the provider's view. Pure.

Pods on the provider (twins) resolve the Services of their namespace as on the consumer: each
consumer Service gets a selector-less copy in the twin namespace (the provider allocates its
ClusterIP; DNS names are the same) and one EndpointSlice, managed by gpuferry, that lists the
consumer Service's endpoints as the provider reaches them:

- an endpoint on this virtual node is a twin: its address, reported in the consumer's view, is
  translated back to the twin's own provider address (``twin_back``);
- any other endpoint is a consumer pod: it is reached through the network fabric, at its address
  in the provider's view of the consumer's pod CIDRs (``to_provider_view``; ``None`` without a
  fabric, and the endpoint is left out).

``ExternalName`` Services are copied as they are (no endpoints). NodePort and LoadBalancer
Services become ClusterIP copies: the provider gives tenants none of those.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from vk.forge import labels as lbl

__all__ = [
    "MANAGED_BY",
    "SERVICE_NAME_LABEL",
    "Translate",
    "remote_endpoint_slice",
    "remote_service",
    "slice_name",
    "translator",
]

SERVICE_NAME_LABEL = "kubernetes.io/service-name"
MANAGED_BY = "virtual-kubelet.gpuferry.io"
_MANAGED_BY_LABEL = "endpointslice.kubernetes.io/managed-by"
_PORT_FIELDS = ("name", "port", "protocol", "appProtocol")

Translate = Callable[[str, str | None], str | None]
"""(address, nodeName) → the address on the provider, or None when the provider cannot reach it."""


def _ownership(source: Mapping[str, Any], consumer_id: str) -> tuple[dict[str, str], dict[str, str]]:
    meta = source.get("metadata") or {}
    labels = {**(meta.get("labels") or {}), **lbl.ownership_labels(consumer_id, source)}
    return labels, lbl.origin_annotations(consumer_id, source)


def remote_service(source: Mapping[str, Any], *, namespace: str, consumer_id: str) -> dict[str, Any]:
    """The copy of a consumer Service in ``namespace`` on the provider (a server-side apply body)."""
    spec = source.get("spec") or {}
    labels, annotations = _ownership(source, consumer_id)
    out_spec: dict[str, Any]
    if spec.get("type") == "ExternalName":
        out_spec = {"type": "ExternalName", "externalName": spec.get("externalName")}
    else:
        ports = [
            {k: p[k] for k in ("name", "protocol", "port", "targetPort", "appProtocol") if k in p}
            for p in spec.get("ports") or []
        ]
        out_spec = {"type": "ClusterIP", "ports": ports}
        if spec.get("clusterIP") == "None":
            out_spec["clusterIP"] = "None"
        if spec.get("sessionAffinity"):
            out_spec["sessionAffinity"] = spec["sessionAffinity"]
        if spec.get("publishNotReadyAddresses"):
            out_spec["publishNotReadyAddresses"] = True
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": (source.get("metadata") or {})["name"],
            "namespace": namespace,
            "labels": labels,
            "annotations": annotations,
        },
        "spec": out_spec,
    }


def slice_name(service: str) -> str:
    """The one EndpointSlice gpuferry keeps for a reflected Service (at most 63 characters)."""
    return f"{service[:53]}-gpuferry"


def remote_endpoint_slice(
    service: Mapping[str, Any],
    slices: Iterable[Mapping[str, Any]],
    *,
    namespace: str,
    consumer_id: str,
    translate: Translate,
) -> dict[str, Any]:
    """The EndpointSlice of the copy: every IPv4 endpoint of the consumer's ``slices`` that the
    provider can reach, at its provider address; ports as the consumer's slices have them."""
    name = (service.get("metadata") or {})["name"]
    endpoints: list[dict[str, Any]] = []
    ports: dict[tuple[Any, Any, Any], dict[str, Any]] = {}
    seen: set[str] = set()
    for slice_ in slices:
        if slice_.get("addressType") != "IPv4":
            continue
        for port in slice_.get("ports") or []:
            key = (port.get("name"), port.get("port"), port.get("protocol"))
            ports.setdefault(key, {k: port[k] for k in _PORT_FIELDS if k in port})
        for endpoint in slice_.get("endpoints") or []:
            node = endpoint.get("nodeName")
            translated = (translate(str(address), node) for address in endpoint.get("addresses") or [])
            addresses = [a for a in translated if a is not None and a not in seen]
            if not addresses:
                continue
            seen.update(addresses)
            out: dict[str, Any] = {"addresses": addresses}
            for field in ("conditions", "hostname"):  # readiness; a headless Service's DNS names
                if field in endpoint:
                    out[field] = endpoint[field]
            endpoints.append(out)
    labels, annotations = _ownership(service, consumer_id)
    labels[SERVICE_NAME_LABEL] = name
    labels[_MANAGED_BY_LABEL] = MANAGED_BY
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"name": slice_name(name), "namespace": namespace, "labels": labels,
                     "annotations": annotations},
        "addressType": "IPv4",
        "endpoints": sorted(endpoints, key=lambda e: e["addresses"]),
        "ports": sorted(ports.values(), key=lambda p: (str(p.get("name")), int(p.get("port") or 0))),
    }  # fmt: skip


def translator(
    node: str, twin_back: Callable[[str], str], to_provider_view: Callable[[str], str] | None
) -> Translate:
    """The `Translate` for endpoints as seen from the virtual node ``node``."""

    def translate(address: str, node_name: str | None) -> str | None:
        if node_name == node:
            return twin_back(address)
        return to_provider_view(address) if to_provider_view is not None else None

    return translate
