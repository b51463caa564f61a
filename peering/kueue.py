"""Kueue objects for borrowed GPUs: a ResourceFlavor per provider's virtual node and a
ClusterQueue whose quota is what the providers grant. Pure.

Kueue admits a Job when its ClusterQueue has quota left in some flavor, then injects the
flavor's ``nodeLabels`` as the pods' node selector and its ``tolerations``: the flavor of a
provider selects its virtual node (``type=virtual-kubelet`` and ``gpuferry.io/provider=<id>``) and
tolerates the virtual nodes' taint, so admitted pods run remotely. The ClusterQueue's nominal
quota per flavor is the grant (GPUs, slices and shares of them, CPU and memory), so Kueue never
admits more than the provider would run; a third Job waits in the queue instead of Pending on a
full virtual node.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kube.accelerators import dra_class, is_accelerator
from kube.api import NODE_TYPE_LABEL, NODE_TYPE_VIRTUAL_KUBELET, PROVIDER_LABEL, VIRTUAL_NODE_TAINT_KEY

__all__ = ["API_VERSION", "cluster_queue", "flavor_name", "resource_flavor"]

API_VERSION = "kueue.x-k8s.io/v1beta1"
_QUEUED = ("cpu", "memory")


def flavor_name(provider_id: str) -> str:
    return f"gpuferry-{provider_id}"


def resource_flavor(provider_id: str) -> dict[str, Any]:
    """The ResourceFlavor of one provider: its virtual node, by labels, with the taint tolerated."""
    return {
        "apiVersion": API_VERSION,
        "kind": "ResourceFlavor",
        "metadata": {"name": flavor_name(provider_id)},
        "spec": {
            "nodeLabels": {NODE_TYPE_LABEL: NODE_TYPE_VIRTUAL_KUBELET, PROVIDER_LABEL: provider_id},
            "tolerations": [{"key": VIRTUAL_NODE_TAINT_KEY, "operator": "Exists", "effect": "NoExecute"}],
        },
    }


def cluster_queue(name: str, grants: Mapping[str, Mapping[str, str]]) -> dict[str, Any]:
    """A ClusterQueue over the flavors of ``grants`` (provider ID → granted resources), each
    flavor's nominal quota its grant. Resources are the accelerators granted by any provider (DRA
    devices left out: Kueue v0.10 counts requests, not claims) and CPU and memory; a provider
    that grants none of one has 0 of it."""
    covered = sorted(
        {r for grant in grants.values() for r in grant if is_accelerator(r) and dra_class(r) is None}
    ) + [r for r in _QUEUED if any(r in g for g in grants.values())]
    flavors = [
        {
            "name": flavor_name(provider_id),
            "resources": [{"name": r, "nominalQuota": str(grant.get(r, "0"))} for r in covered],
        }
        for provider_id, grant in sorted(grants.items())
    ]
    return {
        "apiVersion": API_VERSION,
        "kind": "ClusterQueue",
        "metadata": {"name": name},
        "spec": {
            "namespaceSelector": {},
            "resourceGroups": [{"coveredResources": covered, "flavors": flavors}] if covered else [],
        },
    }
