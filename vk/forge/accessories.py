"""ConfigMaps, Secrets and DRA claims that offloaded pods need, and their copies in the twin
namespace. Pure.

A twin runs on the provider, so whatever its pod spec references by name must exist in the twin
namespace: ConfigMaps and Secrets mounted as volumes (directly or through projected volumes),
read by ``env[].valueFrom`` or ``envFrom``, and Secrets named in ``imagePullSecrets``; and the
ResourceClaimTemplates and ResourceClaims of its ``spec.resourceClaims`` (Dynamic Resource
Allocation). A template's copy makes the provider's own resourceclaim controller create the twin's
claim (and delete it with the twin); the provider's scheduler then allocates it from the
provider's real devices, by the same requests and CEL selectors the consumer wrote. A claim's copy
(a claim shared by name) carries its spec only: its allocation is the provider's.
:func:`references` lists them; :func:`remote_copy` forges the copy (data, type and immutability
kept; metadata reduced to the name, the consumer's labels, and gpuferry's ownership labels and
origin annotations, so that copies are found, compared and collected by label).

Not copied: service-account token Secrets (``kubernetes.io/service-account-token``), which name
a consumer ServiceAccount and are useless on the provider, and ``kube-root-ca.crt`` (every
namespace of the provider has its own, made by its controller-manager).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any, Literal

from vk.forge import labels as lbl

__all__ = [
    "CLAIM",
    "CLAIM_TEMPLATE",
    "CONFIGMAP",
    "SECRET",
    "Kind",
    "copy_differs",
    "matters_to_copies",
    "references",
    "remote_copy",
]

Kind = Literal["configmaps", "secrets", "resourceclaimtemplates", "resourceclaims"]
CONFIGMAP: Kind = "configmaps"
SECRET: Kind = "secrets"
CLAIM_TEMPLATE: Kind = "resourceclaimtemplates"
CLAIM: Kind = "resourceclaims"
_DRA_KINDS: dict[Kind, str] = {CLAIM_TEMPLATE: "ResourceClaimTemplate", CLAIM: "ResourceClaim"}
_DRA_API = "resource.k8s.io/v1"
SPEC_HASH_ANNOTATION = f"{lbl.PREFIX}spec-hash"
"""On a copied claim or claim template: a hash of the consumer spec it was made from."""


def _spec_hash(spec: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]

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


def matters_to_copies(change_type: str, old: Mapping[str, Any] | None, new: Mapping[str, Any] | None) -> bool:
    """Whether a change of a consumer pod on the node can change what is copied for it (the
    ConfigMaps, Secrets and claims it references, the Services of its namespace): the pod
    appearing or going, another pod of its name, or a change of its spec (an ephemeral
    container added). Its status cannot, nor the start of its termination: each woke every
    copier, which looked the pod up and walked its spec again, and woke every Service of the
    namespace (issue 15). Pure."""
    if change_type != "MODIFIED" or old is None or new is None:
        return True
    if (old.get("metadata") or {}).get("uid") != (new.get("metadata") or {}).get("uid"):
        return True
    return bool(old.get("spec") != new.get("spec"))


def references(pod: Mapping[str, Any]) -> dict[Kind, set[str]]:
    """ConfigMap, Secret, ResourceClaimTemplate and ResourceClaim names the pod's spec needs in its
    namespace (``kube-root-ca.crt`` left out: the provider has its own in every namespace)."""
    out: dict[Kind, set[str]] = {CONFIGMAP: set(), SECRET: set(), CLAIM_TEMPLATE: set(), CLAIM: set()}
    spec = pod.get("spec") or {}
    for claim in spec.get("resourceClaims") or ():
        if template := claim.get("resourceClaimTemplateName"):
            out[CLAIM_TEMPLATE].add(str(template))
        if name := claim.get("resourceClaimName"):
            out[CLAIM].add(str(name))
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
        "apiVersion": _DRA_API if kind in _DRA_KINDS else "v1",
        "kind": _DRA_KINDS.get(kind) or ("ConfigMap" if kind == CONFIGMAP else "Secret"),
        "metadata": {
            "name": meta["name"],
            "namespace": namespace,
            "labels": labels,
            "annotations": lbl.origin_annotations(consumer_id, obj),
        },
    }
    if kind in _DRA_KINDS:
        copy["spec"] = obj.get("spec") or {}
        # the API server defaults fields of a claim's spec (allocationMode, count…): the copy is
        # compared by what it was made from, not field by field
        copy["metadata"]["annotations"][SPEC_HASH_ANNOTATION] = _spec_hash(copy["spec"])
        return copy
    for field in ("data", "binaryData", "stringData", "type", "immutable"):
        if field in obj:
            copy[field] = obj[field]
    return copy


def copy_differs(current: Mapping[str, Any], desired: Mapping[str, Any]) -> bool:
    """Whether the copy on the provider must be replaced to match ``desired``."""
    if desired.get("kind") in _DRA_KINDS.values():
        have = ((current.get("metadata") or {}).get("annotations") or {}).get(SPEC_HASH_ANNOTATION)
        if have != desired["metadata"]["annotations"][SPEC_HASH_ANNOTATION]:
            return True
    elif any(current.get(f) != desired.get(f) for f in ("data", "binaryData", "type", "immutable")):
        return True
    have = (current.get("metadata") or {}).get("labels") or {}
    return any(have.get(k) != v for k, v in desired["metadata"]["labels"].items())
