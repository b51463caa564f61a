"""The consumer pod's status, built from its twin's: the "status back" half of pod reflection.

The consumer pod must look like a pod on any node. From the twin it takes the phase, conditions,
container statuses of all three kinds, start time, reason and message. Addresses are
translated: ``podIP``/``podIPs`` go through ``remap_ip`` (the network fabric's view of the
provider's pod CIDR from the consumer), ``hostIP``/``hostIPs`` become the virtual node's address.

Three things are deliberately not copied:

* the twin's ``PodScheduled`` condition: on the consumer the pod *is* scheduled (bound to the
  virtual node by the consumer's scheduler) and that condition is kept from the consumer pod, as
  are conditions set by consumer-side controllers (readiness gates, ``DisruptionTarget``).
  When the provider cannot place the twin, that is said through ``status.reason`` and
  ``status.message`` (see :func:`pending_explanation`), which ``kubectl get pods`` shows as STATUS;
* ``observedGeneration`` (in status and conditions): it counts the *twin's* generations;
* ``qosClass``: immutable once set, and computed from each pod's own requests; a provider
  LimitRange that adds default requests to twins makes them Burstable where the consumer pod
  is BestEffort, and copying that would be refused (422) — the consumer's own class stays;
* ``nominatedNodeName``, ``resize``, ``resourceClaimStatuses``: provider-side scheduling and
  resource state naming provider objects.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple

from kube.objects import copy_json

from .labels import origin_of

__all__ = [
    "MANAGED_STATUS_FIELDS",
    "Explanation",
    "local_status",
    "pending_explanation",
    "status_patch",
    "status_patch_needed",
    "twin_status_inputs",
]

_COPIED = ("phase", "startTime", "reason", "message")
_CONTAINER_STATUSES = ("initContainerStatuses", "containerStatuses", "ephemeralContainerStatuses")
MANAGED_STATUS_FIELDS: tuple[str, ...] = (
    *_COPIED,
    "conditions",
    *_CONTAINER_STATUSES,
    "podIP",
    "podIPs",
    "hostIP",
    "hostIPs",
)
"""The status fields that reflection owns on the consumer pod (and clears when the twin lacks
them); any other status field of the consumer pod is left alone."""

_SCHEDULED = "PodScheduled"
# Conditions the kubelet owns: on the consumer they come from the twin only.
_KUBELET_CONDITIONS = frozenset(
    {
        _SCHEDULED,
        "PodReadyToStartContainers",
        "Initialized",
        "ContainersReady",
        "Ready",
        # an in-place resize's, which the kubelet removes once it is done: gone from the twin,
        # gone from the pod (kept as the consumer's own, one stayed True for good)
        "PodResizePending",
        "PodResizeInProgress",
    }
)
_MESSAGE_MAX = 1024
# Provider scheduling conditions and events → the reason the consumer pod shows.
_CONDITION_REASONS = {"Unschedulable": "ProviderUnschedulable", "SchedulingGated": "ProviderSchedulingGated"}
_EVENT_REASONS = {
    "FailedScheduling": "ProviderUnschedulable",
    "FailedMount": "ProviderFailedMount",
    "FailedAttachVolume": "ProviderFailedMount",
    "FailedCreatePodSandBox": "ProviderFailedSandbox",
}
_EVENT_SOURCES = {
    "ProviderUnschedulable": "provider scheduler",
    "ProviderFailedMount": "provider kubelet",
    "ProviderFailedSandbox": "provider kubelet",
}


class Explanation(NamedTuple):
    """Why a twin is Pending, for the consumer pod's ``status.reason`` and ``status.message``."""

    reason: str
    message: str


def _shorten(message: str) -> str:
    message = " ".join(message.split())
    return message if len(message) <= _MESSAGE_MAX else message[: _MESSAGE_MAX - 1] + "…"


def _event_time(event: Mapping[str, Any]) -> str:
    series = event.get("series") or {}
    # RFC 3339 timestamps of one API server compare correctly as strings.
    return str(
        series.get("lastObservedTime")
        or event.get("lastTimestamp")
        or event.get("eventTime")
        or (event.get("metadata") or {}).get("creationTimestamp")
        or ""
    )


def pending_explanation(
    remote: Mapping[str, Any], events: Iterable[Mapping[str, Any]] = ()
) -> Explanation | None:
    """Why the twin ``remote`` is not running yet, in words for the consumer; ``None`` if it is
    not Pending or nothing explains it.

    The twin's ``PodScheduled=False`` condition comes first (reason ``Unschedulable`` →
    ``ProviderUnschedulable``, message ``"provider scheduler: 0/7 nodes are available: …"``);
    otherwise the latest provider event about this twin (matched by UID when both have one) among
    FailedScheduling, FailedMount, FailedAttachVolume and FailedCreatePodSandBox.
    """
    status = remote.get("status") or {}
    if status.get("phase", "Pending") != "Pending":
        return None
    for condition in status.get("conditions") or ():
        if condition.get("type") == _SCHEDULED and condition.get("status") == "False":
            reason = _CONDITION_REASONS.get(str(condition.get("reason")), "ProviderNotScheduled")
            detail = condition.get("message") or condition.get("reason") or "not scheduled"
            return Explanation(reason, _shorten(f"provider scheduler: {detail}"))
    uid = (remote.get("metadata") or {}).get("uid")
    relevant = [
        e
        for e in events
        if e.get("reason") in _EVENT_REASONS
        and (
            not uid
            or not (e.get("involvedObject") or {}).get("uid")
            or (e.get("involvedObject") or {}).get("uid") == uid
        )
    ]
    if not relevant:
        return None
    latest = max(relevant, key=_event_time)
    reason = _EVENT_REASONS[latest["reason"]]
    detail = latest.get("message") or latest["reason"]
    return Explanation(reason, _shorten(f"{_EVENT_SOURCES[reason]}: {detail}"))


def _without_generation(item: Mapping[str, Any]) -> dict[str, Any]:
    return {k: copy_json(v) for k, v in item.items() if k != "observedGeneration"}


def _conditions(remote_status: Mapping[str, Any], local: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """PodScheduled from the consumer, the kubelet's conditions from the twin, and the consumer's
    other conditions (readiness gates, DisruptionTarget set by consumer controllers) kept."""
    local_conditions = [dict(c) for c in ((local or {}).get("status") or {}).get("conditions") or ()]
    remote_conditions = [
        _without_generation(c) for c in remote_status.get("conditions") or () if c.get("type") != _SCHEDULED
    ]
    scheduled = [c for c in local_conditions if c.get("type") == _SCHEDULED]
    if not scheduled:
        scheduled = [{"type": _SCHEDULED, "status": "True"}]
    reflected = {c.get("type") for c in remote_conditions} | _KUBELET_CONDITIONS
    consumer_only = [c for c in local_conditions if c.get("type") not in reflected]
    return scheduled + remote_conditions + consumer_only


def local_status(
    remote: Mapping[str, Any],
    *,
    remap_ip: Callable[[str], str],
    host_ip: str,
    local: Mapping[str, Any] | None = None,
    events: Iterable[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """The consumer pod's ``status``, built from the twin ``remote``.

    ``remap_ip`` maps a provider pod IP to the address the consumer reaches it at (identity
    until the network fabric lands); ``host_ip`` is the virtual node's address. ``local`` is the
    consumer pod as last read, whose ``PodScheduled`` condition is kept; ``events`` are provider
    events about the twin, used to explain a Pending twin (:func:`pending_explanation`).
    """
    remote_status = remote.get("status") or {}
    status: dict[str, Any] = {key: copy_json(remote_status[key]) for key in _COPIED if key in remote_status}
    status.setdefault("phase", "Pending")
    status["conditions"] = _conditions(remote_status, local)
    for field in _CONTAINER_STATUSES:
        if remote_status.get(field):
            status[field] = copy_json(remote_status[field])
    pod_ips = [entry["ip"] for entry in remote_status.get("podIPs") or () if entry.get("ip")]
    if not pod_ips and remote_status.get("podIP"):
        pod_ips = [remote_status["podIP"]]
    if pod_ips:
        mapped = [remap_ip(ip) for ip in pod_ips]
        status["podIP"] = mapped[0]
        status["podIPs"] = [{"ip": ip} for ip in mapped]
    if host_ip and (remote_status.get("hostIP") or pod_ips):
        status["hostIP"] = host_ip
        status["hostIPs"] = [{"ip": host_ip}]
    explanation = pending_explanation(remote, events)
    if explanation is not None:
        status["reason"], status["message"] = explanation
    return status


def twin_status_inputs(remote: Mapping[str, Any]) -> tuple[Any, ...]:
    """What status back reads from the twin ``remote``: its origin and its status, less a
    ``PodScheduled=True`` condition (:func:`local_status` keeps the consumer's own). Two twins
    with equal inputs give the consumer pod the same status, so a twin change that leaves them
    equal (its binding, a label) needs no status pass (issue 15: 4.1 passes per pod, one write).
    Pure; compares without copying."""
    status = remote.get("status") or {}
    conditions = [
        c
        for c in status.get("conditions") or ()
        if not (c.get("type") == _SCHEDULED and c.get("status") == "True")
    ]
    rest = {k: v for k, v in status.items() if k != "conditions"}
    return origin_of(remote), rest, conditions


def _keyed(items: Iterable[Mapping[str, Any]], key: str) -> dict[Any, Mapping[str, Any]]:
    return {item.get(key): item for item in items}


def _same(field: str, current: Any, new: Any) -> bool:
    """Field equality that ignores list order where the API does not give it meaning."""
    if field == "conditions" and isinstance(current, list) and isinstance(new, list):
        return _keyed(current, "type") == _keyed(new, "type")
    if field in _CONTAINER_STATUSES and isinstance(current, list) and isinstance(new, list):
        return _keyed(current, "name") == _keyed(new, "name")
    return bool(current == new)


def status_patch(current: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any] | None:
    """The merge patch (for the ``status`` subresource) taking the consumer pod's ``current``
    status to ``new``, or ``None`` when the managed fields already agree. Managed fields absent
    from ``new`` are deleted (``null``): a cleared ``reason`` must disappear on the consumer."""
    patch: dict[str, Any] = {}
    for field in MANAGED_STATUS_FIELDS:
        if field in new:
            if field not in current or not _same(field, current[field], new[field]):
                patch[field] = new[field]
        elif field in current:
            patch[field] = None
    return {"status": patch} if patch else None


def status_patch_needed(current: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """Whether the consumer pod's ``current`` status differs from ``new`` in a managed field."""
    return status_patch(current, new) is not None
