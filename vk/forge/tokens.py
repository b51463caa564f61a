"""The consumer's service-account token, given to a twin. Pure.

A pod's ``kube-api-access-*`` projected volume (added by the consumer's admission) holds three
things: a service-account token, the cluster CA (``kube-root-ca.crt``) and the namespace. On the
provider, each would be the *provider's* if left as it is. The twin gets them from one Secret per
pod instead (:func:`token_secret_name`), written by the token reflector with a token issued by
the consumer's TokenRequest API for the consumer pod (bound to it: it dies with the pod), the
consumer's CA, and the consumer namespace — so the workload keeps calling the consumer's API as
itself. :func:`rewrite_token_volumes` turns the projected sources into items of that Secret; the
paths inside the volume (``token``, ``ca.crt``, ``namespace``) stay where client libraries look.
"""

from __future__ import annotations

import base64
import copy
import hashlib
from collections.abc import Mapping
from typing import Any

from vk.forge import labels as lbl

__all__ = [
    "TOKEN_KEY",
    "has_token_volume",
    "matters_to_token",
    "rewrite_token_volumes",
    "token_request",
    "token_secret",
    "token_secret_name",
    "token_volume_audiences",
]

SERVICE_ACCOUNT_VOLUME_PREFIX = "kube-api-access-"
TOKEN_KEY, CA_KEY, NAMESPACE_KEY = "token", "ca.crt", "namespace"
DEFAULT_EXPIRATION = 3607  # what the kubelet asks for the kube-api-access volume
_SUFFIX = "-gpuferry-token"


def token_secret_name(pod_name: str) -> str:
    """The Secret holding a twin's consumer token (a valid name whatever the pod's length)."""
    if len(pod_name) + len(_SUFFIX) <= 253:
        return pod_name + _SUFFIX
    digest = hashlib.sha256(pod_name.encode()).hexdigest()[:10]
    return f"{pod_name[: 253 - len(_SUFFIX) - 11]}-{digest}{_SUFFIX}"


def _token_sources(volume: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    sources = (volume.get("projected") or {}).get("sources") or ()
    return [s for s in sources if "serviceAccountToken" in s]


def has_token_volume(pod: Mapping[str, Any]) -> bool:
    return any(_token_sources(v) for v in (pod.get("spec") or {}).get("volumes") or ())


_FINISHED = frozenset({"Succeeded", "Failed"})


def matters_to_token(change_type: str, old: Mapping[str, Any] | None, new: Mapping[str, Any] | None) -> bool:
    """Whether a change of a consumer pod can change what its token needs: written while the pod
    runs, removed once it is terminating or finished, renewed on its own schedule. So: an
    addition, a deletion, another pod of that name, the start of its termination (not its
    deletionTimestamp moving after that), a change of its spec (volumes, service account), or its
    phase becoming or ceasing to be final. A status written back (Pending to Running, new
    conditions) cannot; it woke a pass for every pod that only found the token fresh (issue 15).
    Pure."""
    if change_type != "MODIFIED" or old is None or new is None:
        return True
    old_meta, new_meta = old.get("metadata") or {}, new.get("metadata") or {}
    if old_meta.get("uid") != new_meta.get("uid"):
        return True
    if bool(old_meta.get("deletionTimestamp")) != bool(new_meta.get("deletionTimestamp")):
        # its start only: a grace period cut short moves the timestamp of a pod whose token
        # went when it began terminating (issue 15: a pass per pod that found nothing to do)
        return True
    if old.get("spec") != new.get("spec"):
        return True
    old_phase, new_phase = (old.get("status") or {}).get("phase"), (new.get("status") or {}).get("phase")
    return (old_phase in _FINISHED) != (new_phase in _FINISHED)


def token_volume_audiences(pod: Mapping[str, Any]) -> tuple[list[str], int]:
    """(audiences, expirationSeconds) of the pod's projected token (the API server's by default)."""
    for volume in (pod.get("spec") or {}).get("volumes") or ():
        for source in _token_sources(volume):
            token = source["serviceAccountToken"]
            audience = token.get("audience")
            return ([audience] if audience else []), int(token.get("expirationSeconds") or DEFAULT_EXPIRATION)
    return [], DEFAULT_EXPIRATION


def rewrite_token_volumes(spec: dict[str, Any], pod_name: str) -> None:
    """In place: projected token, CA and namespace sources read the pod's token Secret instead."""
    secret = token_secret_name(pod_name)
    for volume in spec.get("volumes") or ():
        projected = volume.get("projected")
        if not projected or not _token_sources(volume):
            continue
        rewritten = []
        for source in projected.get("sources") or ():
            if "serviceAccountToken" in source:
                path = source["serviceAccountToken"].get("path") or TOKEN_KEY
                rewritten.append({"secret": {"name": secret, "items": [{"key": TOKEN_KEY, "path": path}]}})
            elif (source.get("configMap") or {}).get("name") == "kube-root-ca.crt":
                items = source["configMap"].get("items") or [{"key": CA_KEY, "path": CA_KEY}]
                rewritten.append(
                    {
                        "secret": {
                            "name": secret,
                            "items": [{"key": CA_KEY, "path": i.get("path", CA_KEY)} for i in items],
                        }
                    }
                )
            elif "downwardAPI" in source:
                items, kept = [], []
                for item in source["downwardAPI"].get("items") or ():
                    if (item.get("fieldRef") or {}).get("fieldPath") == "metadata.namespace":
                        items.append({"key": NAMESPACE_KEY, "path": item.get("path", NAMESPACE_KEY)})
                    else:
                        kept.append(copy.deepcopy(item))
                if items:
                    rewritten.append({"secret": {"name": secret, "items": items}})
                if kept:
                    rewritten.append({"downwardAPI": {**source["downwardAPI"], "items": kept}})
            else:
                rewritten.append(copy.deepcopy(dict(source)))
        projected["sources"] = rewritten


def token_request(pod: Mapping[str, Any]) -> dict[str, Any]:
    """The TokenRequest for the consumer pod's service account, bound to the pod."""
    audiences, expiration = token_volume_audiences(pod)
    meta = pod["metadata"]
    spec: dict[str, Any] = {
        "expirationSeconds": expiration,
        "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": meta["name"], "uid": meta["uid"]},
    }
    if audiences:
        spec["audiences"] = audiences
    return {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}


def token_secret(
    pod: Mapping[str, Any], *, token: str, ca_pem: str, namespace: str, consumer_id: str, expires: str
) -> dict[str, Any]:
    """The Secret in the twin ``namespace`` that the twin's rewritten volume reads."""
    meta = pod["metadata"]

    def b64(text: str) -> str:
        return base64.b64encode(text.encode()).decode()

    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {
            "name": token_secret_name(meta["name"]),
            "namespace": namespace,
            "labels": lbl.ownership_labels(consumer_id, pod),
            "annotations": {**lbl.origin_annotations(consumer_id, pod), "gpuferry.io/token-expires": expires},
        },
        "data": {TOKEN_KEY: b64(token), CA_KEY: b64(ca_pem), NAMESPACE_KEY: b64(meta["namespace"])},
    }
