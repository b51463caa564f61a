"""Pure builders of the virtual kubelet: no I/O, no clock, raw JSON dicts in and out.

* :mod:`vk.forge.names` — twin namespaces, the virtual node's name;
* :mod:`vk.forge.labels` — gpuferry's label/annotation keys, ownership marks, origins;
* :mod:`vk.forge.placement` — node selectors, affinity and tolerations of a twin;
* :mod:`vk.forge.pods` — the twin pod and the patch that updates it;
* :mod:`vk.forge.podstatus` — the consumer pod's status built from its twin's;
* :mod:`vk.forge.fit` — free resources per provider node and "fits on one node?".
"""

from vk.forge.fit import (
    FitResult,
    fits_somewhere,
    largest_blocks,
    node_free,
    per_node_free,
    placement_request,
)
from vk.forge.labels import Origin, is_owned_by, origin_of, ownership_labels
from vk.forge.names import node_name, twin_namespace
from vk.forge.pods import ForgeOptions, remote_pod, remote_pod_update
from vk.forge.podstatus import (
    Explanation,
    local_status,
    pending_explanation,
    status_patch,
    status_patch_needed,
)

__all__ = [
    "Explanation",
    "FitResult",
    "ForgeOptions",
    "Origin",
    "fits_somewhere",
    "is_owned_by",
    "largest_blocks",
    "local_status",
    "node_free",
    "node_name",
    "origin_of",
    "ownership_labels",
    "pending_explanation",
    "per_node_free",
    "placement_request",
    "remote_pod",
    "remote_pod_update",
    "status_patch",
    "status_patch_needed",
    "twin_namespace",
]
