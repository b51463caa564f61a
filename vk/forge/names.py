"""Names of the objects the virtual kubelet creates: twin namespaces and the virtual node.

A twin namespace is ``<namespace>-<consumer-id>`` (strategy ``"default"``), or the consumer's
namespace name itself (strategy ``"same"``, for providers dedicated to one consumer). Namespace
names are DNS-1123 labels, at most 63 characters; when the joined name is longer, the namespace
part is shortened and a stable hash of the *full* pair is inserted before the consumer ID::

    research-computer-vision-experiments-2024  +  0f3c2a91-1b2c-4d5e-8f90-123456789abc
    → research-comput-376e7cea74-0f3c2a91-1b2c-4d5e-8f90-123456789abc

so that the consumer ID stays readable at the end, the name stays valid, and two long namespaces
that share a prefix never map to the same twin. The mapping is one-way; the origin of a twin is
read back from its ownership labels (:mod:`vk.forge.labels`), never parsed from its name.
"""

from __future__ import annotations

import hashlib
import re
from typing import Literal

__all__ = [
    "DNS1123_LABEL_MAX",
    "DNS1123_SUBDOMAIN_MAX",
    "NODE_NAME_PREFIX",
    "NamespaceStrategy",
    "is_dns1123_label",
    "is_dns1123_subdomain",
    "node_name",
    "twin_namespace",
]

NamespaceStrategy = Literal["default", "same"]
"""How a consumer namespace maps to its twin: ``<namespace>-<consumer-id>``, or unchanged."""

DNS1123_LABEL_MAX = 63
DNS1123_SUBDOMAIN_MAX = 253
NODE_NAME_PREFIX = "gpuferry-"

# Hex characters of sha256 kept in shortened names: 40 bits, a collision among long names of one
# consumer needs ~10^6 of them to reach a one-in-a-million chance.
_HASH_CHARS = 10
# Shortest namespace prefix kept before the hash; below it the consumer ID is shortened instead.
_MIN_PREFIX = 8

_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def is_dns1123_label(name: str) -> bool:
    """RFC 1123 label: lowercase alphanumerics and '-', alphanumeric at both ends, ≤ 63 chars."""
    return len(name) <= DNS1123_LABEL_MAX and _LABEL.fullmatch(name) is not None


def is_dns1123_subdomain(name: str) -> bool:
    """RFC 1123 subdomain: dot-separated labels, ≤ 253 chars (the rule for Node names)."""
    return len(name) <= DNS1123_SUBDOMAIN_MAX and _SUBDOMAIN.fullmatch(name) is not None


def _short_hash(*parts: str) -> str:
    digest = hashlib.sha256("\x00".join(parts).encode()).hexdigest()
    return digest[:_HASH_CHARS]


def _prefix(text: str, length: int) -> str:
    """The first ``length`` characters of a label, without a trailing '-' (never empty)."""
    return text[:length].rstrip("-") or text[0]


def twin_namespace(
    namespace: str, consumer_cluster_id: str, *, strategy: NamespaceStrategy = "default"
) -> str:
    """The provider namespace that holds the twins of ``namespace``'s pods.

    Raises :class:`ValueError` when ``namespace`` or ``consumer_cluster_id`` is not a DNS-1123
    label, or when ``strategy`` is unknown.
    """
    if not is_dns1123_label(namespace):
        raise ValueError(f"namespace {namespace!r} is not a DNS-1123 label")
    if not is_dns1123_label(consumer_cluster_id):
        raise ValueError(f"consumer cluster ID {consumer_cluster_id!r} is not a DNS-1123 label")
    if strategy == "same":
        return namespace
    if strategy != "default":
        raise ValueError(f"unknown twin-namespace strategy {strategy!r} (expected 'default' or 'same')")
    joined = f"{namespace}-{consumer_cluster_id}"
    if len(joined) <= DNS1123_LABEL_MAX:
        return joined
    digest = _short_hash(namespace, consumer_cluster_id)
    room = DNS1123_LABEL_MAX - len(consumer_cluster_id) - len(digest) - 2
    if room >= _MIN_PREFIX:
        return f"{_prefix(namespace, room)}-{digest}-{consumer_cluster_id}"
    # A consumer ID too long to keep whole: shorten the joined name and end with the hash.
    return f"{_prefix(joined, DNS1123_LABEL_MAX - len(digest) - 1)}-{digest}"


def node_name(provider_id: str) -> str:
    """The virtual node's name, ``gpuferry-<provider-id>``: a valid DNS-1123 subdomain.

    Node names also become the ``kubernetes.io/hostname`` label, a DNS label of at most 63
    characters; a longer name would still be a valid Node but refused as a label value, so it is
    refused here too (cluster IDs are UUIDs or short names: 45 characters at most in practice).
    """
    name = f"{NODE_NAME_PREFIX}{provider_id}"
    if not provider_id or not is_dns1123_subdomain(name) or len(name) > DNS1123_LABEL_MAX:
        raise ValueError(
            f"provider ID {provider_id!r} does not give a valid node name "
            f"({name!r}: lowercase alphanumerics, '-' and '.', at most 63 characters)"
        )
    return name
