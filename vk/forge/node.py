"""The virtual node as a ``Node`` object, and the patches that keep it current. Pure.

:func:`virtual_node` builds the whole Node from what the node controller knows: the grant
(capacity = allocatable = the granted resources, verbatim, extended resources included; DRA
devices are its ResourceSlices instead, :mod:`vk.forge.devices`), the GPU
labels copied from the provider (:func:`provider_gpu_labels`), the largest placeable block per
resource (:func:`node_shape`) and the conditions (:func:`node_conditions`).

Labels, by who may rely on them:

* identity (:func:`vk.forge.labels.virtual_node_identity`) plus ``kubernetes.io/os`` and
  ``kubernetes.io/arch``;
* GPU Feature Discovery labels of the provider nodes the grant covers (those with some of a
  granted device: GPUs, MIG instances, shared replicas…), only those with the same value on every
  one of them, sharing included (``nvidia.com/mig.strategy``, ``nvidia.com/gpu.replicas``,
  ``nvidia.com/gpu.sharing-strategy``, a MIG profile's memory and slices; not its per-node
  ``.count``) (a pod selecting ``nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3``
  must land on an H100 whatever provider node the twin gets); ``nvidia.com/gpu.present`` is
  deliberately not copied: GPU-operator DaemonSets select on it and often tolerate every taint;
* ``nvidia.com/gpu.count``: GPUs of the largest covered provider node (at most the grant), as
  GFD means it: how many GPUs one pod could ever get there. It changes with the hardware only;
* ``gpuferry.io/largest-gpu-block``: GPUs free *now* on the best single provider node (at most
  the grant); the annotation ``gpuferry.io/largest-block`` has the same for every granted
  resource, as JSON.

The keys of the labels gpuferry set are recorded in the ``gpuferry.io/managed-labels``
annotation, so a GPU label that stops being uniform is removed while labels added by others
(``kubectl label``) are kept, across restarts.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from decimal import Decimal
from typing import Any, NamedTuple

import orjson

from kube import api
from kube.accelerators import dra_class, is_device
from kube.api import GPU_RESOURCE
from kube.quantities import format_quantity, parse_quantity, parse_resource_list

from .labels import PREFIX, VIRTUAL_NODE_TAINT_KEY, virtual_node_identity

__all__ = [
    "CONTAINER_RUNTIME_VERSION",
    "GPU",
    "GPU_COUNT_LABEL",
    "KUBELET_VERSION",
    "LARGEST_BLOCK_ANNOTATION",
    "LARGEST_GPU_BLOCK_LABEL",
    "MANAGED_LABELS_ANNOTATION",
    "PROVIDER_UNREACHABLE_TAINT",
    "VIRTUAL_NODE_TAINT",
    "Condition",
    "condition",
    "gpu_count_label",
    "is_gfd_label",
    "kubelet_version",
    "node_conditions",
    "node_metadata_patch",
    "node_shape",
    "node_status_patch",
    "provider_gpu_labels",
    "selects",
    "uniform_gpu_labels",
    "virtual_node",
]

GPU = GPU_RESOURCE
GPU_COUNT_LABEL = "nvidia.com/gpu.count"
LARGEST_GPU_BLOCK_LABEL = f"{PREFIX}largest-gpu-block"
"""Node label: GPUs free now on the best single provider node (what one pod can get now)."""
LARGEST_BLOCK_ANNOTATION = f"{PREFIX}largest-block"
"""Node annotation: JSON resource → quantity, the largest block placeable on one provider node."""
MANAGED_LABELS_ANNOTATION = f"{PREFIX}managed-labels"
"""Node annotation: comma-separated keys of the labels gpuferry set on the node."""

VIRTUAL_NODE_TAINT: dict[str, str] = {"key": VIRTUAL_NODE_TAINT_KEY, "value": "true", "effect": "NoExecute"}
PROVIDER_UNREACHABLE_TAINT: dict[str, str] = {
    "key": api.PROVIDER_UNREACHABLE_TAINT_KEY,
    "value": "true",
    "effect": "NoSchedule",
}

KUBELET_VERSION = "v1.36.4-gpuferry"
"""Default ``nodeInfo.kubeletVersion``; the controller uses the consumer's version instead."""
CONTAINER_RUNTIME_VERSION = "gpuferry://0.1.0"

_GFD_KEYS = frozenset(
    {
        "nvidia.com/gpu.product",
        "nvidia.com/gpu.memory",
        "nvidia.com/gpu.family",
        "nvidia.com/mig.capable",
        "nvidia.com/mig.strategy",
        "nvidia.com/gpu.replicas",
        "nvidia.com/gpu.sharing-strategy",
    }
)
_MIG_PROFILE_PREFIX = "nvidia.com/mig-"
_GFD_PREFIXES = ("nvidia.com/gpu.compute.", "nvidia.com/cuda.")
_UUID_NAMESPACE = uuid.UUID("5f0c7a52-2b8e-4c63-9d0e-0b6f4f0e9a11")

# Standard node conditions: (type, reason) when healthy. A virtual node has no memory, disk or
# PID of its own to run short of; NetworkUnavailable is False (the network fabric may own it).
_STEADY: tuple[tuple[str, str, str], ...] = (
    ("MemoryPressure", "KubeletHasSufficientMemory", "the virtual kubelet has sufficient memory"),
    ("DiskPressure", "KubeletHasNoDiskPressure", "the virtual kubelet has no disk pressure"),
    ("PIDPressure", "KubeletHasSufficientPID", "the virtual kubelet has sufficient PIDs"),
    ("NetworkUnavailable", "ProviderNetwork", "pods use the provider cluster's network"),
)
PROVIDER_REACHABLE = "ProviderReachable"
NETWORK_READY = api.NETWORK_READY


class Condition(NamedTuple):
    """A node condition without its timestamps (those come from :func:`virtual_node`)."""

    type: str
    status: str
    reason: str
    message: str


def condition(type_: str, ok: bool, reason: str, message: str) -> Condition:
    return Condition(type_, "True" if ok else "False", reason, message)


def network_condition(peer_network: Mapping[str, Any] | None) -> Condition:
    """The custom ``NetworkReady``: the tunnel to the provider as its gateway reports it in the
    PeerNetwork's own NetworkReady (None: no fabric for this provider, so nothing to wait for)."""
    if peer_network is None:
        return Condition(
            NETWORK_READY,
            "True",
            "NoNetworkFabric",
            "no network fabric for this provider (peered without one): nothing to wait for",
        )
    for c in (peer_network.get("status") or {}).get("conditions") or []:
        if c.get("type") == NETWORK_READY:
            status = str(c.get("status"))
            status = status if status in ("True", "False") else "Unknown"
            message = f"tunnel to the provider: {c.get('message', '')}"
            return Condition(NETWORK_READY, status, str(c.get("reason") or "Unknown"), message)
    return Condition(NETWORK_READY, "Unknown", "GatewayNotReported", "the gateway has not reported yet")


def node_conditions(
    *, provider_reachable: bool | None, provider_error: str = "", network: Condition | None = None
) -> list[Condition]:
    """Ready (and the custom ``ProviderReachable``) follow the provider API server's /readyz;
    ``network`` (see `network_condition`) is added as it is.

    ``None``: not probed yet. The pressure conditions are always False.
    """
    if provider_reachable:
        ready = Condition(
            "Ready",
            "True",
            "ProviderReachable",
            "virtual kubelet is posting ready status; the provider API server is reachable",
        )
        reach = Condition(PROVIDER_REACHABLE, "True", "ProbeSucceeded", "provider /readyz answered ok")
    elif provider_reachable is None:
        ready = Condition("Ready", "False", "ProviderNotProbed", "the provider API server was not probed yet")
        reach = Condition(PROVIDER_REACHABLE, "Unknown", "ProviderNotProbed", "not probed yet")
    else:
        # still Ready: a provider's API server that does not answer says nothing of its
        # workloads, and Ready=False would let the consumer's taint manager evict every pod here
        # after 300 s. New pods are kept off by PROVIDER_UNREACHABLE_TAINT instead.
        detail = provider_error or "no answer"
        ready = Condition(
            "Ready",
            "True",
            "ProviderUnreachable",
            f"the provider API server is unreachable ({detail}); the pods here keep "
            f"running, and new ones are not scheduled here until it answers "
            f"(taint {api.PROVIDER_UNREACHABLE_TAINT_KEY}:NoSchedule)",
        )
        reach = Condition(PROVIDER_REACHABLE, "False", "ProbeFailed", f"provider /readyz failed: {detail}")
    steady = [Condition(t, "False", reason, message) for t, reason, message in _STEADY]
    return [ready, *steady, reach, *([network] if network is not None else [])]


def is_gfd_label(key: str) -> bool:
    """Whether ``key`` is a GPU Feature Discovery label that is copied when uniform."""
    if key in _GFD_KEYS or key.startswith(_GFD_PREFIXES):
        return True
    # a MIG profile's memory, multiprocessors and slices describe it wherever it is; how many a
    # node has does not describe a virtual node
    return key.startswith(_MIG_PROFILE_PREFIX) and not key.endswith(".count")


def selects(node: Mapping[str, Any], selector: Mapping[str, str] | None) -> bool:
    """Whether ``node``'s labels carry every ``key=value`` of ``selector`` (empty: all nodes)."""
    labels = (node.get("metadata") or {}).get("labels") or {}
    return all(labels.get(key) == value for key, value in (selector or {}).items())


def _amount(raw: Any) -> Decimal:
    """A node's quantity; an unreadable one is none."""
    try:
        return parse_quantity(raw) if raw is not None else Decimal(0)
    except ValueError:
        return Decimal(0)


def _gpus(node: Mapping[str, Any]) -> Decimal:
    status = node.get("status") or {}
    return _amount((status.get("allocatable") or status.get("capacity") or {}).get(GPU))


def _gpu_nodes(
    nodes: Iterable[Mapping[str, Any]], selector: Mapping[str, str] | None
) -> list[Mapping[str, Any]]:
    return [n for n in nodes if selects(n, selector) and _gpus(n) > 0]


def _has_device(node: Mapping[str, Any], devices: frozenset[str] | None) -> bool:
    """Whether ``node`` has some of ``devices`` (None: of any device resource)."""
    status = node.get("status") or {}
    for res, raw in (status.get("allocatable") or status.get("capacity") or {}).items():
        if (res in devices if devices is not None else is_device(res)) and _amount(raw) > 0:
            return True
    return False


def uniform_gpu_labels(
    provider_nodes: Iterable[Mapping[str, Any]],
    selector: Mapping[str, str] | None = None,
    granted: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """GFD labels with the same value on every provider node with devices that ``selector`` picks.

    Only nodes with some of a device the grant covers count (a twin asking for MIG instances never
    lands on a whole-GPU node); with no device in the grant (or no grant given), nodes with any
    device. No such node: none.
    """
    devices = frozenset(r for r in (granted or {}) if is_device(r)) or None
    gpu_nodes = [n for n in provider_nodes if selects(n, selector) and _has_device(n, devices)]
    if not gpu_nodes:
        return {}
    first, *rest = (dict((n.get("metadata") or {}).get("labels") or {}) for n in gpu_nodes)
    uniform = {k: v for k, v in first.items() if is_gfd_label(k)}
    for labels in rest:
        uniform = {k: v for k, v in uniform.items() if labels.get(k) == v}
    return uniform


def gpu_count_label(
    provider_nodes: Iterable[Mapping[str, Any]],
    selector: Mapping[str, str] | None,
    granted: Mapping[str, str],
) -> str | None:
    """``nvidia.com/gpu.count``: GPUs of the largest picked provider node, at most the grant."""
    counts = [_gpus(n) for n in _gpu_nodes(provider_nodes, selector)]
    if not counts or GPU not in granted:
        return None
    return format_quantity(min(max(counts), parse_quantity(granted[GPU])), like=GPU)


def provider_gpu_labels(
    provider_nodes: Iterable[Mapping[str, Any]],
    selector: Mapping[str, str] | None,
    granted: Mapping[str, str],
) -> dict[str, str]:
    """The labels copied or derived from the provider: uniform GFD labels and ``gpu.count``."""
    nodes = list(provider_nodes)
    labels = uniform_gpu_labels(nodes, selector, granted)
    count = gpu_count_label(nodes, selector, granted)
    if count is not None:
        labels[GPU_COUNT_LABEL] = count
    return labels


def node_shape(largest: Mapping[str, Decimal], granted: Mapping[str, str]) -> dict[str, str]:
    """Per granted resource, the largest block one pod can get: the largest free amount on one
    provider node (see :func:`vk.forge.fit.largest_blocks`), at most the grant, never negative."""
    grant = parse_resource_list(granted)
    return {
        name: format_quantity(max(min(largest.get(name, Decimal(0)), amount), Decimal(0)), like=name)
        for name, amount in sorted(grant.items())
        if dra_class(name) is None  # claimed from ResourceSlices, not placed as a block
    }


def kubelet_version(server_version: str | None) -> str:
    """``nodeInfo.kubeletVersion`` for a consumer API server at ``server_version`` (gitVersion).

    Same major.minor.patch as the server, so version-skew rules and tools that parse it are
    happy, with a ``-gpuferry`` pre-release tag to tell it apart.
    """
    if not server_version:
        return KUBELET_VERSION
    core = server_version.split("+", 1)[0].split("-", 1)[0]
    parts = core.lstrip("v").split(".")
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        return KUBELET_VERSION
    return f"v{core.lstrip('v')}-gpuferry"


def _timestamped(
    conditions: Sequence[Condition], previous: Sequence[Mapping[str, Any]], now: str
) -> list[dict[str, str]]:
    before = {c.get("type"): c for c in previous}
    out = []
    for cond in conditions:
        old = before.get(cond.type)
        transition = old.get("lastTransitionTime") if old and old.get("status") == cond.status else None
        out.append(
            {
                "type": cond.type,
                "status": cond.status,
                "reason": cond.reason,
                "message": cond.message,
                "lastHeartbeatTime": now,
                "lastTransitionTime": transition or now,
            }
        )
    return out


def _stable_id(name: str, what: str) -> uuid.UUID:
    return uuid.uuid5(_UUID_NAMESPACE, f"{name}/{what}")


def virtual_node(
    *,
    name: str,
    provider_id: str,
    resources: Mapping[str, str],
    node_address: str,
    kubelet_port: int,
    provider_labels: Mapping[str, str],
    shape: Mapping[str, str],
    conditions: Sequence[Condition],
    now: str,
    extra_labels: Mapping[str, str] | None = None,
    previous_conditions: Sequence[Mapping[str, Any]] = (),
    version: str = KUBELET_VERSION,
    boot_id: str = "",
    provider_unreachable: bool = False,
) -> dict[str, Any]:
    """The virtual Node. ``resources`` is the grant (capacity = allocatable, verbatim);
    ``provider_labels`` from :func:`provider_gpu_labels`; ``shape`` from :func:`node_shape`;
    ``previous_conditions`` (the Node's current ones) keep each ``lastTransitionTime`` while
    the status stays the same; ``now`` is RFC 3339 (``2024-06-01T10:00:00Z``)."""
    labels: dict[str, str] = {
        **(extra_labels or {}),
        **provider_labels,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        **virtual_node_identity(provider_id, name),
    }
    if GPU in shape:
        labels[LARGEST_GPU_BLOCK_LABEL] = shape[GPU]
    annotations = {
        LARGEST_BLOCK_ANNOTATION: orjson.dumps(dict(shape), option=orjson.OPT_SORT_KEYS).decode(),
        MANAGED_LABELS_ANNOTATION: ",".join(sorted(labels)),
    }
    # DRA devices are not a node resource: they are the node's ResourceSlices (vk.forge.devices)
    granted = {key: str(value) for key, value in resources.items() if dra_class(key) is None}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels, "annotations": annotations},
        "spec": {
            "taints": [
                dict(VIRTUAL_NODE_TAINT),
                *([dict(PROVIDER_UNREACHABLE_TAINT)] if provider_unreachable else []),
            ]
        },
        "status": {
            "capacity": dict(granted),
            "allocatable": dict(granted),
            "conditions": _timestamped(conditions, previous_conditions, now),
            "addresses": [
                {"type": "InternalIP", "address": node_address},
                {"type": "Hostname", "address": name},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": kubelet_port}},
            "nodeInfo": {
                "machineID": _stable_id(name, "machine").hex,
                "systemUUID": str(_stable_id(name, "system")),
                "bootID": boot_id or str(_stable_id(name, "boot")),
                "kernelVersion": "",
                "osImage": "gpuferry virtual node",
                "containerRuntimeVersion": CONTAINER_RUNTIME_VERSION,
                "kubeletVersion": version,
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
        },
    }


def _is_ours(taint: Mapping[str, Any]) -> bool:
    return taint.get("key") in (VIRTUAL_NODE_TAINT_KEY, api.PROVIDER_UNREACHABLE_TAINT_KEY)


def node_metadata_patch(current: Mapping[str, Any], desired: Mapping[str, Any]) -> dict[str, Any] | None:
    """A JSON merge patch that brings ``current``'s labels, annotations and taints to ``desired``.

    Labels gpuferry set before (per ``current``'s managed-labels annotation) and no longer wants
    are removed; labels of others are kept. Taints of others (the node lifecycle controller's
    ``node.kubernetes.io/*``) are kept; a taint change carries ``resourceVersion`` so that it
    fails with Conflict rather than drop a taint added meanwhile. ``None``: nothing to change.
    """
    cur_meta = current.get("metadata") or {}
    want_meta = desired.get("metadata") or {}
    cur_labels = cur_meta.get("labels") or {}
    cur_annotations = cur_meta.get("annotations") or {}
    want_labels = want_meta.get("labels") or {}
    previously = {k for k in (cur_annotations.get(MANAGED_LABELS_ANNOTATION) or "").split(",") if k}
    labels: dict[str, str | None] = {k: v for k, v in want_labels.items() if cur_labels.get(k) != v}
    labels.update({k: None for k in sorted(previously - set(want_labels)) if k in cur_labels})
    annotations = {
        k: v for k, v in (want_meta.get("annotations") or {}).items() if cur_annotations.get(k) != v
    }
    patch: dict[str, Any] = {}
    metadata: dict[str, Any] = {}
    if labels:
        metadata["labels"] = labels
    if annotations:
        metadata["annotations"] = annotations
    cur_taints = list((current.get("spec") or {}).get("taints") or [])
    ours = [t for t in (desired.get("spec") or {}).get("taints") or [] if _is_ours(t)]
    have = [{k: t.get(k) for k in ("key", "value", "effect")} for t in cur_taints if _is_ours(t)]
    if have != [{k: t.get(k) for k in ("key", "value", "effect")} for t in ours]:
        patch["spec"] = {"taints": [t for t in cur_taints if not _is_ours(t)] + ours}
        if cur_meta.get("resourceVersion"):
            metadata["resourceVersion"] = cur_meta["resourceVersion"]
    if metadata:
        patch["metadata"] = metadata
    return patch or None


def _condition_key(cond: Mapping[str, Any]) -> tuple[Any, ...]:
    return tuple(cond.get(k) for k in ("status", "reason", "message"))


def _resources_patch(current: Mapping[str, Any], desired: Mapping[str, Any]) -> dict[str, str | None] | None:
    if dict(current) == dict(desired):
        return None
    patch: dict[str, str | None] = {k: v for k, v in desired.items() if current.get(k) != v}
    patch.update({k: None for k in current if k not in desired})
    return patch


def node_status_patch(
    current: Mapping[str, Any], desired: Mapping[str, Any], *, heartbeat: bool = False
) -> dict[str, Any] | None:
    """A strategic merge patch of ``nodes/<name>/status`` from ``current`` to ``desired``.

    Conditions are compared without their timestamps; with ``heartbeat`` they are sent anyway
    (their ``lastHeartbeatTime`` moves on). Conditions are merged by type, so conditions set by
    others survive. A granted resource that is no longer granted is removed. ``None``: nothing
    to change (and no heartbeat asked).
    """
    cur = current.get("status") or {}
    want = desired.get("status") or {}
    patch: dict[str, Any] = {}
    for field in ("capacity", "allocatable"):
        change = _resources_patch(cur.get(field) or {}, want.get(field) or {})
        if change is not None:
            patch[field] = change
    cur_conditions = {c.get("type"): _condition_key(c) for c in cur.get("conditions") or ()}
    want_conditions = list(want.get("conditions") or ())
    if heartbeat or any(cur_conditions.get(c["type"]) != _condition_key(c) for c in want_conditions):
        patch["conditions"] = want_conditions
    for field in ("addresses", "daemonEndpoints"):
        if cur.get(field) != want.get(field):
            patch[field] = want.get(field)
    cur_info = cur.get("nodeInfo") or {}
    want_info = want.get("nodeInfo") or {}
    info = {k: v for k, v in want_info.items() if cur_info.get(k) != v}
    if info:
        patch["nodeInfo"] = info
    return {"status": patch} if patch else None
