"""Real local Kubernetes clusters (etcd, kube-apiserver, kube-controller-manager, kube-scheduler,
kwok) on loopback, used by the demo and by the integration tests alike."""

from __future__ import annotations

from .binaries import Binaries, BinariesMissing, ensure_built
from .cluster import COMPONENTS, LocalCluster, build_node_images
from .processes import ComponentFailed, PortBusy
from .realnode import NODE_COMPONENTS, NodeFailed
from .spec import REAL_NODE_LABEL, ClusterSpec, NodeSpec, cluster_specs, second_provider_spec

__all__ = [
    "COMPONENTS",
    "NODE_COMPONENTS",
    "REAL_NODE_LABEL",
    "Binaries",
    "BinariesMissing",
    "ClusterSpec",
    "ComponentFailed",
    "LocalCluster",
    "NodeFailed",
    "NodeSpec",
    "PortBusy",
    "build_node_images",
    "cluster_specs",
    "ensure_built",
    "profile_clusters",
    "second_provider",
]


def profile_clusters(profile: str, *, build: bool = True) -> dict[str, LocalCluster]:
    """The consumer and provider clusters of ``profile``, binaries built when missing."""
    binaries = ensure_built(build=build)
    return {name: LocalCluster(spec, binaries) for name, spec in cluster_specs(profile).items()}


def second_provider(profile: str, *, build: bool = True) -> LocalCluster:
    """The optional second provider cluster of ``profile`` (not started by ``profile_clusters``)."""
    return LocalCluster(second_provider_spec(profile), ensure_built(build=build))
