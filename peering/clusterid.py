"""A cluster's gpuferry identity: a short, stable cluster ID kept in the cluster itself.

The ID names the cluster to its peers: twin namespaces are ``<namespace>-<consumer-id>``, the
tenant namespace ``gpuferry-tenant-<consumer-id>``, the virtual node ``gpuferry-<provider-id>``.
It is chosen once (given by the user, or derived from the kubeconfig context's name) and kept
in the ConfigMap ``gpuferry-system/gpuferry-cluster-id``, so that every later command, from any
kubeconfig, agrees on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import re

from kube import api
from kube.clients import KubeClient
from kube.errors import AlreadyExists, NotFound
from kube.objects import CONFIGMAPS, NAMESPACES

from .waits import held_by

__all__ = [
    "CLUSTER_ID_CONFIGMAP",
    "SYSTEM_NAMESPACE",
    "ClusterIDError",
    "choose_cluster_id",
    "derive_cluster_id",
    "ensure_cluster_id",
]

SYSTEM_NAMESPACE = api.SYSTEM_NAMESPACE
CLUSTER_ID_CONFIGMAP = "gpuferry-cluster-id"
MAX_LENGTH = 30
"""Short enough for ``<namespace>-<id>`` twin names and ``gpuferry-tenant-<id>``."""

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


class ClusterIDError(ValueError):
    """An invalid or conflicting cluster ID; the message is one line for the user."""


def derive_cluster_id(name: str) -> str:
    """A valid cluster ID from a free-form name (a kubeconfig context, say). Pure.

    Lower-cased, anything but ``[a-z0-9-]`` turned into ``-``; when too long, cut and suffixed
    with a short hash of the whole name, so that two long names do not collide.
    """
    cleaned = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")
    cleaned = re.sub(r"-{2,}", "-", cleaned) or "cluster"
    if len(cleaned) <= MAX_LENGTH:
        return cleaned
    digest = hashlib.sha256(name.encode()).hexdigest()[:6]
    return f"{cleaned[: MAX_LENGTH - 7].rstrip('-')}-{digest}"


def validate_cluster_id(cluster_id: str) -> str:
    if len(cluster_id) > MAX_LENGTH or not _DNS_LABEL.match(cluster_id):
        raise ClusterIDError(
            f"invalid cluster ID {cluster_id!r}: lower-case letters, digits and '-', "
            f"starting and ending with a letter or digit, at most {MAX_LENGTH} characters"
        )
    return cluster_id


async def _wait_not_terminating(client: KubeClient, timeout: float = 120.0) -> None:
    """A just-unpeered cluster's gpuferry-system may still be terminating: wait until it is gone."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        try:
            ns = await client.get(NAMESPACES, SYSTEM_NAMESPACE)
        except NotFound:
            return
        if not ns["metadata"].get("deletionTimestamp"):
            return
        if asyncio.get_running_loop().time() > deadline:
            raise ClusterIDError(
                f"namespace {SYSTEM_NAMESPACE} is still terminating after {timeout:.0f}s{held_by(ns)}"
            )
        await asyncio.sleep(0.5)


async def read_cluster_id(client: KubeClient) -> str | None:
    """The cluster's recorded ID, or ``None`` when it has none yet."""
    try:
        cm = await client.get(CONFIGMAPS, CLUSTER_ID_CONFIGMAP, SYSTEM_NAMESPACE)
    except NotFound:
        return None
    value = (cm.get("data") or {}).get("clusterID")
    return str(value) if value else None


def choose_cluster_id(recorded: str | None, requested: str | None, fallback: str) -> str:
    """The recorded ID; else ``requested`` (validated) or one derived from ``fallback``. A
    ``requested`` ID that differs from the recorded one is an error (renaming a peered cluster
    would orphan everything named after it). Pure."""
    if recorded is not None:
        if requested and requested != recorded:
            raise ClusterIDError(
                f"this cluster is already known as {recorded!r} (ConfigMap {SYSTEM_NAMESPACE}/"
                f"{CLUSTER_ID_CONFIGMAP}); it cannot also be {requested!r}"
            )
        return recorded
    return validate_cluster_id(requested) if requested else derive_cluster_id(fallback)


async def ensure_cluster_id(client: KubeClient, *, requested: str | None, fallback: str) -> str:
    """The cluster's ID (:func:`choose_cluster_id`), recorded now when it had none."""
    current = await read_cluster_id(client)
    cluster_id = choose_cluster_id(current, requested, fallback)
    if current is not None:
        return current
    await _wait_not_terminating(client)
    with contextlib.suppress(AlreadyExists):
        await client.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace",
                                         "metadata": {"name": SYSTEM_NAMESPACE}})  # fmt: skip
    body = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": CLUSTER_ID_CONFIGMAP, "labels": {"app.kubernetes.io/managed-by": "gpuferry"}},
        "data": {"clusterID": cluster_id},
    }
    try:
        await client.create(CONFIGMAPS, body, SYSTEM_NAMESPACE)
    except AlreadyExists:  # another command got there first: theirs stands
        recorded = await read_cluster_id(client)
        return recorded or cluster_id
    return cluster_id
