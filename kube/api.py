"""gpuferry's vocabulary: every name, label, annotation, taint and naming rule that more than one
of ``vk``, ``peering`` and ``netfabric`` reads or writes. Those packages never import each other;
they meet through Kubernetes objects, and this module is the one place that says how those
objects are named and marked. Pure.
"""

from __future__ import annotations

import enum
import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any

__all__ = [
    "DEMAND_ANNOTATION",
    "DNS1123_LABEL_MAX",
    "DNS1123_SUBDOMAIN_MAX",
    "GATEWAY_PUBLIC_KEY_ANNOTATION",
    "GATEWAY_SLOT_ANNOTATION",
    "GPU_RESOURCE",
    "GRANT_PIN_REFUSAL",
    "KUBELET_SERVING_SIGNER",
    "LABEL_MANAGED_BY",
    "MANAGED_BY",
    "NETWORK_READY",
    "NODE_NAME_PREFIX",
    "NODE_TYPE_LABEL",
    "NODE_TYPE_VIRTUAL_KUBELET",
    "PROVIDER_LABEL",
    "PROVIDER_UNREACHABLE_TAINT_KEY",
    "SYSTEM_NAMESPACE",
    "TENANT_NAMESPACE_PREFIX",
    "VIRTUAL_NODE_TAINT_KEY",
    "WAITING_BLOCK_ANNOTATION",
    "VirtualKubeletExit",
    "is_dns1123_label",
    "is_dns1123_subdomain",
    "is_valid_cluster_id",
    "kubelet_spec_digest",
    "tenant_namespace",
    "twin_namespace",
    "virtual_node_name",
]

GPU_RESOURCE = "nvidia.com/gpu"
"""The extended resource of whole NVIDIA GPUs (the device plugin's name)."""

SYSTEM_NAMESPACE = "gpuferry-system"
"""gpuferry's own namespace in every cluster: VirtualNodes, identities, Leases, PeerNetworks."""

LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY = "gpuferry"

# ---- the virtual node ---------------------------------------------------------------------------

NODE_NAME_PREFIX = "gpuferry-"
NODE_TYPE_LABEL = "type"
NODE_TYPE_VIRTUAL_KUBELET = "virtual-kubelet"
"""``type=virtual-kubelet`` marks a virtual node (as virtual-kubelet and Liqo mark theirs)."""
PROVIDER_LABEL = "gpuferry.io/provider"
"""On a virtual node and on consumer objects made for one peering: the provider's cluster ID."""
VIRTUAL_NODE_TAINT_KEY = "virtual-node.gpuferry.io/not-allowed"
"""``NoExecute`` taint of every virtual node; offloaded namespaces' pods tolerate it."""
PROVIDER_UNREACHABLE_TAINT_KEY = "gpuferry.io/provider-unreachable"
"""``NoSchedule`` taint of a virtual node whose provider API server does not answer: new pods go
elsewhere, the running ones stay (the node itself stays Ready: the provider's workloads run on)."""
KUBELET_SERVING_SIGNER = "kubernetes.io/kubelet-serving"
NETWORK_READY = "NetworkReady"
"""Condition type of a PeerNetwork (its gateway's handshake) and of a virtual node."""


class VirtualKubeletExit(enum.IntEnum):
    """Exit codes of ``python -m vk --virtual-node NS/NAME``, read by whoever supervises it."""

    GONE = 0
    """The VirtualNode was deleted and its node removed: do not restart."""
    INVALID = 2
    """The VirtualNode cannot be run as it is (a missing Secret…): restart when it changes."""
    CHANGED = 75
    """The VirtualNode's spec changed in what the kubelet reads only at start
    (:func:`kubelet_spec_digest`; a new grant it follows while running): start again at once."""


LIVE_SPEC_FIELDS = frozenset({"shape", "resources", "labels"})
"""VirtualNode spec fields its kubelet follows while it runs: ``resources`` and ``labels`` (the
grant in force, which a provider re-evaluates as its own workloads come and go) are applied to
the Node as they change; ``shape``, the provider's largest free block, the kubelet computes live."""


def kubelet_spec_digest(spec: Mapping[str, Any] | None) -> str:
    """A digest of what the kubelet of a VirtualNode reads once, at start: its ``spec`` less
    :data:`LIVE_SPEC_FIELDS`. The kubelet ends (:attr:`VirtualKubeletExit.CHANGED`) and its
    Deployment rolls when it changes, and only then: the generation did, so every new largest
    free block or grant restarted the kubelet, which relists every pod on both sides (issue 15:
    30 restarts in 4 minutes while a benchmark ran pods on the provider's nodes of the demo's
    grant)."""
    kept = {k: v for k, v in (spec or {}).items() if k not in LIVE_SPEC_FIELDS}
    return hashlib.sha256(json.dumps(kept, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]


DNS1123_LABEL_MAX = 63
DNS1123_SUBDOMAIN_MAX = 253
_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def is_dns1123_label(name: str) -> bool:
    """RFC 1123 label: lowercase alphanumerics and '-', alphanumeric at both ends, ≤ 63 chars."""
    return len(name) <= DNS1123_LABEL_MAX and _LABEL.fullmatch(name) is not None


def is_dns1123_subdomain(name: str) -> bool:
    """RFC 1123 subdomain: dot-separated labels, ≤ 253 chars (the rule for Node names)."""
    return len(name) <= DNS1123_SUBDOMAIN_MAX and _SUBDOMAIN.fullmatch(name) is not None


def virtual_node_name(provider_id: str) -> str:
    """The virtual node standing for ``provider_id``: ``gpuferry-<provider-id>``, a valid Node
    name (DNS-1123 subdomain). It also becomes the node's ``kubernetes.io/hostname`` label, a value
    of at most 63 characters: a longer name is refused too."""
    name = f"{NODE_NAME_PREFIX}{provider_id}"
    if not provider_id or not is_dns1123_subdomain(name) or len(name) > DNS1123_LABEL_MAX:
        raise ValueError(
            f"provider ID {provider_id!r} does not give a valid node name "
            f"({name!r}: lowercase alphanumerics, '-' and '.', at most 63 characters)"
        )
    return name


# ---- provider namespaces ------------------------------------------------------------------------

TENANT_NAMESPACE_PREFIX = "gpuferry-tenant-"
"""A consumer's tenant namespace on a provider is ``gpuferry-tenant-<consumer-id>``."""


def is_valid_cluster_id(cluster_id: str) -> bool:
    """A cluster ID is a DNS-1123 label short enough for ``gpuferry-tenant-<id>`` (≤ 47 chars)."""
    longest = DNS1123_LABEL_MAX - len(TENANT_NAMESPACE_PREFIX)
    return len(cluster_id) <= longest and is_dns1123_label(cluster_id)


def tenant_namespace(consumer_id: str) -> str:
    """The provider namespace of a consumer's Tenant, peering token, GPUSlices, twin requests and
    PeerNetwork."""
    if not is_valid_cluster_id(consumer_id):
        raise ValueError(f"invalid cluster ID {consumer_id!r}: a DNS-1123 label of at most 47 characters")
    return TENANT_NAMESPACE_PREFIX + consumer_id


# Hex characters of sha256 kept in shortened names: 40 bits, a collision among long names of one
# consumer needs ~10^6 of them to reach a one-in-a-million chance.
_HASH_CHARS = 10
# Shortest namespace prefix kept before the hash; below it the consumer ID is shortened instead.
_MIN_PREFIX = 8


def _prefix(text: str, length: int) -> str:
    """The first ``length`` characters of a label, without a trailing '-' (never empty)."""
    return text[:length].rstrip("-") or text[0]


def twin_namespace(origin: str, consumer_id: str, *, same_name: bool = False) -> str:
    """The provider namespace holding the twins of consumer namespace ``origin``.

    ``<origin>-<consumer-id>``, or ``origin`` itself with ``same_name`` (a provider dedicated to
    one consumer). When the joined name is longer than a namespace name may be, the origin part is
    shortened and a stable hash of the *full* pair is inserted before the consumer ID::

        research-computer-vision-experiments-2024  +  0f3c2a91-1b2c-4d5e-8f90-123456789abc
        → research-comput-376e7cea74-0f3c2a91-1b2c-4d5e-8f90-123456789abc

    so that the consumer ID stays readable, the name valid, and two long namespaces that share a
    prefix never map to the same twin. One-way: a twin's origin is read from its labels, never
    parsed from its name. Raises ``ValueError`` for names that are not DNS-1123 labels.
    """
    if not is_dns1123_label(origin):
        raise ValueError(f"namespace {origin!r} is not a DNS-1123 label")
    if not is_dns1123_label(consumer_id):
        raise ValueError(f"consumer cluster ID {consumer_id!r} is not a DNS-1123 label")
    if same_name:
        return origin
    joined = f"{origin}-{consumer_id}"
    if len(joined) <= DNS1123_LABEL_MAX:
        return joined
    digest = hashlib.sha256(f"{origin}\x00{consumer_id}".encode()).hexdigest()[:_HASH_CHARS]
    room = DNS1123_LABEL_MAX - len(consumer_id) - len(digest) - 2
    if room >= _MIN_PREFIX:
        return f"{_prefix(origin, room)}-{digest}-{consumer_id}"
    # a consumer ID too long to keep whole: shorten the joined name and end with the hash
    return f"{_prefix(joined, DNS1123_LABEL_MAX - len(digest) - 1)}-{digest}"


# ---- annotations shared across packages ----------------------------------------------------------

DEMAND_ANNOTATION = "gpuferry.io/demand"
"""On a twin namespace: what the consumer's pods of its origin wait for, for lack of quota (JSON
resource list); written by the virtual kubelet, read by the provider controller."""

GRANT_PIN_REFUSAL = "must keep to the nodes of its grant"
"""In the provider's refusal of a twin whose node selector leaves the nodes of the tenant's grant
(its admission policy): while a grant moves to other nodes, a twin made for the old ones is
refused so for a moment; the virtual kubelet waits rather than fail the pod."""

WAITING_BLOCK_ANNOTATION = "gpuferry.io/waiting-block"
"""On a twin namespace's request: the largest consumer pod of its origin that waits because no
node of the grant has a block that large (JSON resource list); written by the virtual kubelet,
read by the provider's pool, which then places the grant so that one node holds such a block."""

GATEWAY_PUBLIC_KEY_ANNOTATION = "net.gpuferry.io/local-public-key"
"""On a gateway's key Secret and on the PeerNetwork it reconciles: its WireGuard public key, which
the peering carries to the other side."""

GATEWAY_SLOT_ANNOTATION = "net.gpuferry.io/slot"
"""On a PeerNetwork: the slot of its gateway among those sharing a network namespace (firewall
mark, routing table, listen port), kept across restarts of the gateways' process."""
