"""The network side of a peering, as the peering reads it. Pure.

Each cluster declares its network in the ConfigMap ``kube-system/gpuferry-network``
(:mod:`kube.declaration`). A peering has one PeerNetwork on each side, each describing *the
other* cluster: on the consumer ``gpuferry-system/<provider-id>`` (with the provider's endpoint:
the consumer dials), on the provider ``<tenant namespace>/<consumer-id>``. The controllers write
them (the consumer agent the one here, the provider controller the one there, from what the
consumer put in its Tenant); each cluster's gateways reconcile them and report ``NetworkReady``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kube.api import GATEWAY_PUBLIC_KEY_ANNOTATION, NETWORK_READY
from kube.declaration import (
    DECLARATION_NAME,
    DECLARATION_NAMESPACE,
    Declaration,
    DeclarationError,
    declaration_from_configmap,
)

__all__ = [
    "DECLARATION_NAME",
    "DECLARATION_NAMESPACE",
    "FAILED_REASONS",
    "PUBLIC_KEY_ANNOTATION",
    "Declaration",
    "DeclarationError",
    "declaration_from_configmap",
    "network_ready",
]

PUBLIC_KEY_ANNOTATION = GATEWAY_PUBLIC_KEY_ANNOTATION
_MARK_BASE = 0x47


#: NetworkReady reasons that waiting does not cure: the input must change (or the node be fixed).
FAILED_REASONS = frozenset({"InvalidConfig", "RemapPoolExhausted", "EndpointUnresolvable", "ApplyFailed"})


def network_ready(obj: Mapping[str, Any]) -> tuple[bool | None, str, str]:
    """A PeerNetwork's NetworkReady: True/False (None before its gateway reported), reason, message."""
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == NETWORK_READY:
            return c.get("status") == "True", str(c.get("reason")), str(c.get("message"))
    return None, "NotReported", "no gateway has reported on it yet"
