"""Settings of one virtual kubelet, read once at the entry point (``vk.__main__``).

When the peering controller runs a virtual kubelet for a ``VirtualNode`` object, it fills these
same fields from that object; nothing else reads configuration.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from kube.settings import ClientSettings, QueueSettings, WatchSettings

from .forge.names import NamespaceStrategy, node_name


@dataclass(frozen=True, kw_only=True)
class VirtualKubeletSettings:
    consumer_kubeconfig: Path | None
    """Kubeconfig of the consumer cluster (where the virtual node lives); None: in-cluster."""
    provider_kubeconfig: Path
    """Kubeconfig of the provider cluster: the scoped identity the peering issued."""
    consumer_cluster_id: str
    """ID of the consumer cluster: twin-namespace suffix and ownership label value."""
    provider_cluster_id: str
    """ID of the provider cluster this node stands for."""
    node_name: str = ""
    """Name of the Node object; empty means ``gpuferry-<provider-id>``."""
    resources: dict[str, str] = field(default_factory=dict)
    """Granted capacity (``nvidia.com/gpu``, cpu, memory, pods, any extended resource, verbatim)."""
    node_labels: dict[str, str] = field(default_factory=dict)
    """Extra labels for the Node, on top of the virtual-node identity."""
    provider_node_selector: dict[str, str] = field(default_factory=dict)
    """Which provider nodes the grant covers (e.g. a GPU product); used for labels and fit."""
    namespace_strategy: NamespaceStrategy = "default"
    """Twin namespace rule: ``<namespace>-<consumer-id>`` or the same name."""
    node_address: str = "127.0.0.1"
    """InternalIP the Node reports (where its kubelet API listens)."""
    kubelet_port: int = 10250
    """Port published in ``daemonEndpoints.kubeletEndpoint``."""
    heartbeat_seconds: float = 10.0
    """How often the node Lease is renewed (the kubelet default is 10 s)."""
    status_seconds: float = 60.0
    """Longest interval between two Node status updates when nothing changes."""
    provider_probe_seconds: float = 5.0
    """How often the provider API server's /readyz is probed."""
    workers: int = 16
    """Pods reconciled at the same time (each pod is always handled by one worker at a time)."""
    resync_seconds: float = 300.0
    """Full resync: every pod and twin is reconciled again; orphan twins are collected."""
    consumer_client: ClientSettings = field(default_factory=ClientSettings)
    provider_client: ClientSettings = field(default_factory=ClientSettings)
    watch: WatchSettings = field(default_factory=WatchSettings)
    queue: QueueSettings = field(default_factory=QueueSettings)
    metrics_port: int = 0
    """Port of the /metrics endpoint; 0 disables it."""

    @property
    def effective_node_name(self) -> str:
        return self.node_name or node_name(self.provider_cluster_id)
