"""ConfigMaps and Secrets that offloaded pods need, and their copies in the twin namespace. Pure.

A twin runs on the provider, so whatever its pod spec references by name must exist in the twin
namespace: ConfigMaps and Secrets mounted as volumes (directly or through projected volumes),
read by ``env[].valueFrom`` or ``envFrom``, and Secrets named in ``imagePullSecrets``.
:func:`references` lists them; :func:`remote_copy` forges the copy (data, type and immutability
kept; metadata reduced to the name, the consumer's labels, and gpuferry's ownership labels and
origin annotations, so that copies are found, compared and collected by label).

Not copied: service-account token Secrets (``kubernetes.io/service-account-token``), which name
a consumer ServiceAccount and are useless on the provider, and ``kube-root-ca.crt`` (every
namespace of the provider has its own, made by its controller-manager).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Literal

from vk.forge import labels as lbl

__all__ = ["CONFIGMAP", "SECRET", "Kind", "copy_differs", "references", "remote_copy"]

Kind = Literal["configmaps", "secrets"]
CONFIGMAP: Kind = "configmaps"
SECRET: Kind = "secrets"

ROOT_CA_CONFIGMAP = "kube-root-ca.crt"
SA_TOKEN_TYPE = "kubernetes.io/service-account-token"
_CONTAINER_LISTS = ("initContainers", "containers", "ephemeralContainers")


def _volume_refs(volume: Mapping[str, Any], out: dict[Kind, set[str]]) -> None:
    if cm := (volume.get("configMap") or {}).get("name"):
        out[CONFIGMAP].add(str(cm))
    if secret := (volume.get("secret") or {}).get("secretName"):
        out[SECRET].add(str(secret))
    for source in (volume.get("projected") or {}).get("sources") or ():
        if cm := (source.get("configMap") or {}).get("name"):
            out[CONFIGMAP].add(str(cm))
        if secret := (source.get("secret") or {}).get("name"):
            out[SECRET].add(str(secret))


def _container_refs(container: Mapping[str, Any], out: dict[Kind, set[str]]) -> None:
    for env in container.get("env") or ():
        source = env.get("valueFrom") or {}
        if cm := (source.get("configMapKeyRef") or {}).get("name"):
            out[CONFIGMAP].add(str(cm))
        if secret := (source.get("secretKeyRef") or {}).get("name"):
            out[SECRET].add(str(secret))
    for env_from in container.get("envFrom") or ():
        if cm := (env_from.get("configMapRef") or {}).get("name"):
            out[CONFIGMAP].add(str(cm))
        if secret := (env_from.get("secretRef") or {}).get("name"):
            out[SECRET].add(str(secret))


def references(pod: Mapping[str, Any]) -> dict[Kind, set[str]]:
    """ConfigMap and Secret names the pod's spec needs in its namespace (``kube-root-ca.crt``
    left out: the provider has its own in every namespace)."""
    out: dict[Kind, set[str]] = {CONFIGMAP: set(), SECRET: set()}
    spec = pod.get("spec") or {}
    for volume in spec.get("volumes") or ():
        _volume_refs(volume, out)
    for field in _CONTAINER_LISTS:
        for container in spec.get(field) or ():
            _container_refs(container, out)
    for pull in spec.get("imagePullSecrets") or ():
        if name := pull.get("name"):
            out[SECRET].add(str(name))
    out[CONFIGMAP].discard(ROOT_CA_CONFIGMAP)
    return out


def referenced_by(pods: Iterable[Mapping[str, Any]], kind: Kind) -> set[str]:
    """Every ``kind`` name that one of ``pods`` references."""
    names: set[str] = set()
    for pod in pods:
        names |= references(pod)[kind]
    return names


def is_copyable(obj: Mapping[str, Any], kind: Kind) -> bool:
    return not (kind == SECRET and obj.get("type") == SA_TOKEN_TYPE)


def remote_copy(obj: Mapping[str, Any], kind: Kind, *, namespace: str, consumer_id: str) -> dict[str, Any]:
    """The copy of the consumer's ``obj`` to create in the twin ``namespace``."""
    meta = obj.get("metadata") or {}
    labels = {**(meta.get("labels") or {}), **lbl.ownership_labels(consumer_id, obj)}
    copy: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "ConfigMap" if kind == CONFIGMAP else "Secret",
        "metadata": {
            "name": meta["name"],
            "namespace": namespace,
            "labels": labels,
            "annotations": lbl.origin_annotations(consumer_id, obj),
        },
    }
    for field in ("data", "binaryData", "stringData", "type", "immutable"):
        if field in obj:
            copy[field] = obj[field]
    return copy


def copy_differs(current: Mapping[str, Any], desired: Mapping[str, Any]) -> bool:
    """Whether the copy on the provider must be replaced to match ``desired``."""
    fields = ("data", "binaryData", "type", "immutable")
    if any(current.get(f) != desired.get(f) for f in fields):
        return True
    have = (current.get("metadata") or {}).get("labels") or {}
    return any(have.get(k) != v for k, v in desired["metadata"]["labels"].items())
