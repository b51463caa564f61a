"""Why a pod of ours is not running, in words a user can act on. Pure.

Read from the pod's status as the kubelet reports it: an image that cannot be had (not on the
node with ``imagePullPolicy: Never``, no registry), a container that cannot be created, a crash
loop and the container's last words (its termination message, which ``FallbackToLogsOnError``
fills with the last log lines), a pod that no node accepts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .conditions import status_condition

__all__ = ["PodTrouble", "pod_trouble"]

IMAGE_TROUBLE = frozenset({"ErrImagePull", "ImagePullBackOff", "ErrImageNeverPull", "InvalidImageName"})
CONFIG_TROUBLE = frozenset({"CreateContainerConfigError", "CreateContainerError", "RunContainerError"})


@dataclass(frozen=True)
class PodTrouble:
    reason: str
    """The kubelet's or scheduler's reason (``ErrImageNeverPull``…), or ``Crashed``."""
    message: str
    exit_code: int | None = None
    """For a container that ended: its last exit code."""


def pod_trouble(pod: Mapping[str, Any]) -> PodTrouble | None:
    """The first thing that keeps ``pod`` from running, or None (running, or just starting)."""
    name = (pod.get("metadata") or {}).get("name")
    status = pod.get("status") or {}
    statuses = [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]
    for cs in statuses:
        waiting = (cs.get("state") or {}).get("waiting") or {}
        last = (cs.get("lastState") or {}).get("terminated") or {}
        reason = str(waiting.get("reason") or "")
        if reason in IMAGE_TROUBLE:
            said = waiting.get("message") or reason
            return PodTrouble(reason, f"pod {name}: image {cs.get('image')}: {said}")
        if reason in CONFIG_TROUBLE:
            return PodTrouble(reason, f"pod {name}: {waiting.get('message') or reason}")
        if last and reason == "CrashLoopBackOff":
            words = " ".join(str(last.get("message") or "").split())[-600:]
            code = last.get("exitCode")
            restarts = cs.get("restartCount", 0)
            message = f"pod {name}: container {cs.get('name')} exited {code} ({restarts} restarts): {words}"
            return PodTrouble("Crashed", message.rstrip(": "), code if isinstance(code, int) else None)
    scheduled = status_condition(pod, "PodScheduled")
    if scheduled.get("status") == "False":
        reason = str(scheduled.get("reason") or "Unschedulable")
        return PodTrouble(reason, f"pod {name}: {scheduled.get('message') or 'not scheduled'}")
    return None
