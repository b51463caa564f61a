"""Kubernetes Events about the objects the provider controller decides on (``kubectl describe``).

The consumer can read the Events of its tenant namespace, so it sees why a peering request
was refused or a slice denied. Failing to record an Event never fails a reconciliation.
"""

from __future__ import annotations

import logging
import uuid
from typing import Literal

from kube.clients import KubeClient
from kube.errors import KubeError
from kube.objects import EVENTS, RawObject, meta

from ..conditions import now_rfc3339

__all__ = ["record_event"]

logger = logging.getLogger(__name__)
COMPONENT = "gpuferry-provider"


async def record_event(
    client: KubeClient,
    obj: RawObject,
    reason: str,
    message: str,
    type_: Literal["Normal", "Warning"] = "Normal",
) -> None:
    """A core/v1 Event about ``obj`` in its namespace (or ``default`` for cluster-scoped ones)."""
    md = meta(obj)
    namespace = md.get("namespace") or "default"
    now = now_rfc3339()
    event: RawObject = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{md.get('name')}.{uuid.uuid4().hex[:12]}", "namespace": namespace},
        "involvedObject": {
            "apiVersion": obj.get("apiVersion"),
            "kind": obj.get("kind"),
            "name": md.get("name"),
            "namespace": md.get("namespace"),
            "uid": md.get("uid"),
            "resourceVersion": md.get("resourceVersion"),
        },
        "reason": reason,
        "message": message[:1024],
        "type": type_,
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }
    try:
        await client.create(EVENTS, event)
    except KubeError as exc:
        logger.warning(
            "%s %s/%s: cannot record Event %s: %s", obj.get("kind"), namespace, md.get("name"), reason, exc
        )
