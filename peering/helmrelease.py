"""What ``gpuferry install`` decides about its helm release, from what helm and the cluster
say: where the release stands (deployed, half-way through an operation), what an upgrade keeps
of the last install's values and in which order helm reads them, which roles peerings need, and
the messages that say so. Pure: the callers run helm and talk to the API server."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kube.objects import RawObject

RELEASE = "gpuferry"
ROLES = ("provider", "consumer")
MANAGED_BY = "app.kubernetes.io/managed-by"
RELEASE_NAME = "meta.helm.sh/release-name"


QUOTED = re.compile(r'"(?:[^"\\]|\\.)*"')


def without_long_quotes(text: str, limit: int = 160) -> str:
    """``text`` with each quoted string longer than ``limit`` cut to its start: helm quotes a whole
    object the API server refused (kilobytes of JSON for a Deployment) before saying why. Pure."""
    return QUOTED.sub(lambda m: m[0] if len(m[0]) <= limit else m[0][: limit // 2] + '…"', text)


@dataclass(frozen=True)
class ReleaseState:
    """Where the release stands, from ``helm history -o json``."""

    deployed: int | None = None
    """The revision in force; None: none was ever deployed (an upgrade that failed leaves the one
    before it deployed, and its own values bad)."""
    pending: Mapping[str, Any] | None = None
    """The latest revision when its operation never finished (``pending-install``,
    ``pending-upgrade``, ``pending-rollback``): helm refuses any other until it is cleared."""


def release_state(history: Sequence[Mapping[str, Any]]) -> ReleaseState:
    """:class:`ReleaseState` of a release's history. Pure."""
    revisions = sorted(history, key=lambda r: int(r.get("revision") or 0))
    deployed = [int(r.get("revision") or 0) for r in revisions if r.get("status") == "deployed"]
    latest = revisions[-1] if revisions else None
    pending = latest if latest and str(latest.get("status") or "").startswith("pending-") else None
    return ReleaseState(deployed[-1] if deployed else None, pending)


def pending_message(state: ReleaseState, namespace: str) -> str:
    """Why install stops at a release whose last operation never finished, and what clears it:
    what ``--force`` does. Pure."""
    pending, n = state.pending or {}, state.deployed
    said = (f"helm release {RELEASE} in {namespace} is {pending.get('status')} since "
            f"{pending.get('updated')} (revision {pending.get('revision')}): an install that was "
            "interrupted, or one still running; if none is running, the same command with "
            "--force ")  # fmt: skip
    if n is None:
        how = f"helm uninstall {RELEASE} -n {namespace}"
        return f"{said}removes it first (nothing of it was deployed; as `{how}`)"
    how = f"helm rollback {RELEASE} {n} -n {namespace}"
    return f"{said}goes back to revision {n} first (as `{how}`), then upgrades"


def upgrade_failed(said: str, state: ReleaseState, namespace: str) -> str:
    """helm's error on an upgrade, with the revision to go back to. Pure."""
    if (n := state.deployed) is None:
        return said
    back = f"`helm rollback {RELEASE} {n} -n {namespace}` puts its objects back"
    return f"{said}; revision {n} is the release's last good one ({back})"


def helm_ownership(release_namespace: str) -> dict[str, Any]:
    """The metadata that gives an object made elsewhere to our release (helm refuses to take one
    over without it). Pure."""
    return {
        "labels": {MANAGED_BY: "Helm"},
        "annotations": {RELEASE_NAME: RELEASE, "meta.helm.sh/release-namespace": release_namespace},
    }


def without_helm_ownership(cm: RawObject) -> RawObject:
    """``cm`` (as :func:`configmap_as_was` makes it) without :func:`helm_ownership`'s marks: what
    ``install`` gives a release it takes over again. Pure."""
    meta = dict(cm["metadata"])
    labels = {k: v for k, v in (meta.get("labels") or {}).items() if k != MANAGED_BY}
    notes = {k: v for k, v in (meta.get("annotations") or {}).items() if not k.startswith("meta.helm.sh/")}
    meta.update(labels=labels, annotations=notes)
    return {**cm, "metadata": {k: v for k, v in meta.items() if v or k in ("name", "namespace")}}


def flat_keys(values: Mapping[str, Any], prefix: str = "") -> list[str]:
    """The dotted keys of ``values``' leaves (a list is one), as ``--set`` names them. Pure."""
    keys: list[str] = []
    for key, value in values.items():
        name = f"{prefix}{key}"
        keys += flat_keys(value, f"{name}.") if isinstance(value, Mapping) and value else [name]
    return keys


def set_keys(pairs: Sequence[str]) -> set[str]:
    """The dotted keys that ``--set`` arguments name, as helm reads them: ``a.b=1,c={x,y}`` names
    ``a.b`` and ``c``; ``a\\.b=1`` names ``a.b``; ``l[0].x=1`` names ``l``. Pure."""
    keys: set[str] = set()
    for pair in pairs:
        depth, start, parts = 0, 0, []
        for i, ch in enumerate(pair):
            escaped = i > 0 and pair[i - 1] == "\\"
            depth += (ch == "{") - (ch == "}") if not escaped else 0
            if ch == "," and depth == 0 and not escaped:
                parts.append(pair[start:i])
                start = i + 1
        parts.append(pair[start:])
        for part in parts:
            key = re.split(r"(?<!\\)=", part, maxsplit=1)[0].split("[", 1)[0]  # a list is one value
            keys.add(key.replace("\\.", "."))
    return keys


def values_arguments(*, last: str | None, files: Sequence[str], ours: str, sets: Sequence[str]) -> list[str]:
    """helm's values arguments, each over the one before: the last install's values (``last``,
    a file; None: from the chart's defaults), the user's files, install's own (what its flags say
    wins over a file), then each ``--set``. Pure."""
    args = ["-f", last] if last else []
    for path in [*files, ours]:
        args += ["-f", path]
    for pair in sets:
        args += ["--set", pair]
    return args


def configmap_as_was(cm: RawObject) -> RawObject:
    """The ConfigMap ``cm`` to create again: its name, namespace, labels, annotations and data,
    without what the API server sets. Pure."""
    meta = cm["metadata"]
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {k: meta[k] for k in ("name", "namespace", "labels", "annotations") if k in meta},
        "data": cm.get("data") or {},
    }


def peers_by_role(
    foreign_clusters: Sequence[RawObject], tenants: Sequence[RawObject]
) -> dict[str, list[str]]:
    """Which of this cluster's roles its peerings need, and for which peers: a provider's
    ForeignCluster makes it a consumer; a consumer's, or a Tenant, a provider. Pure."""
    needs: dict[str, set[str]] = {role: set() for role in ROLES}
    for fc in foreign_clusters:
        spec = fc.get("spec") or {}
        peer = str(spec.get("clusterID") or fc["metadata"]["name"])
        if spec.get("role") == "Provider":
            needs["consumer"].add(peer)
        elif spec.get("role") == "Consumer":
            needs["provider"].add(peer)
    for tenant in tenants:
        spec = tenant.get("spec") or {}
        needs["provider"].add(str(spec.get("consumerClusterID") or tenant["metadata"]["name"]))
    return {role: sorted(peers) for role, peers in needs.items()}


def dropped_in_use(had: Sequence[str], roles: Sequence[str], in_use: Mapping[str, Sequence[str]]) -> str:
    """Why an upgrade from roles ``had`` to ``roles`` would cut peerings off (its controller gone
    while peers rely on it), or "" when it would not. Pure."""
    said = []
    for role in had:
        if role not in roles and in_use.get(role):
            peers = ", ".join(in_use[role])
            whom = "lends GPUs to" if role == "provider" else "borrows GPUs from"
            said.append(f"the {role} role goes, but this cluster still {whom} {peers}")
    if not said:
        return ""
    return (f"{'; '.join(said)}: `gpuferry unpeer` first, or --role both; --force installs it all the same "
            "(the peerings stop working)")  # fmt: skip
