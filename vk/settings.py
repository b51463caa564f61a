"""Settings of one virtual kubelet, read once at the entry point (``vk.__main__``).

When the peering controller runs a virtual kubelet for a ``VirtualNode`` object, it fills these
same fields from that object; nothing else reads configuration.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from kube import api
from kube.api import SYSTEM_NAMESPACE
from kube.quantities import parse_resource_list
from kube.settings import ClientSettings, ProbeSettings, QueueSettings, WatchSettings

from .forge.events import ProviderEvents
from .forge.names import NamespaceStrategy, node_name


@dataclass(frozen=True, kw_only=True)
class VirtualKubeletSettings:
    consumer_kubeconfig: Path | None
    """Kubeconfig of the consumer cluster (where the virtual node lives); None: in-cluster."""
    provider_kubeconfig: Path | None
    """Kubeconfig file of the provider cluster: the scoped identity the peering issued."""
    provider_kubeconfig_data: bytes | None = field(default=None, repr=False)
    """The same kubeconfig held in memory (read from the VirtualNode's Secret); wins over the file."""
    virtual_node: str = ""
    """``namespace/name`` of the VirtualNode these settings were read from (empty: from flags)."""
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
    provider_tolerations: tuple[dict[str, Any], ...] = ()
    """The provider taints the grant tolerates: twins carry them, fit counts those nodes."""
    tenant_namespace: str = ""
    """With a scoped identity: the consumer's tenant namespace on the provider. Twin namespaces
    then come from its NamespaceOffloading requests and capacity from the GPUSlice there;
    empty: an admin identity (tests, development) watches provider Nodes and Pods directly.
    Read once, where :func:`vk.remote.remote_side` picks the one or the other."""
    slice_name: str = ""
    """The GPUSlice (in ``tenant_namespace``) whose per-node grant is the room pods fit into."""
    peer_network_namespace: str = SYSTEM_NAMESPACE
    """Where the consumer's PeerNetwork for this provider lives (its remapped pod CIDRs)."""
    service_account_tokens: bool = True
    """Give twins their consumer pod's service-account token (TokenRequest on the consumer,
    refreshed) in place of the projected token the provider would issue; False drops the volume."""
    provider_events: ProviderEvents = "all"
    """Which provider Events about twins are copied onto their consumer pods: ``all`` (the
    provider's scheduler placing it, its kubelet pulling and starting it, and every Warning),
    ``warnings`` (only what went wrong: a failed mount or pull, a crash loop), ``none``. Each
    copy is one Event written on the consumer; a real provider node makes five or so per pod
    that starts well, all Normal."""
    namespace_strategy: NamespaceStrategy = "default"
    """Twin namespace rule: ``<namespace>-<consumer-id>`` or the same name."""
    node_address: str = "127.0.0.1"
    """InternalIP the Node reports (where its kubelet API listens)."""
    kubelet_port: int = 10250
    """Port published in ``daemonEndpoints.kubeletEndpoint``."""
    kubelet_api: bool = False
    """Serve the kubelet API (logs, exec, attach, port-forward, pods, stats) over TLS on
    ``node_address:kubelet_port`` and declare ``ExtendWebSocketsToKubelet`` on the Node; off by
    default so that several embedded kubelets (tests) do not contend for one port."""
    kubelet_csr_self_approve: bool = False
    """Approve the kubelet API's own serving-certificate CSR with the consumer identity: for
    local/dev clusters only; in production an approver checks and approves it."""
    kubelet_cert_seconds: int = 86400
    """Requested lifetime of the serving certificate (``expirationSeconds``, at least 600);
    it is renewed at 80 % of its lifetime."""
    log_resume_seconds: float = 30.0
    """How long ``kubectl logs -f`` of a pod whose stream from the provider is cut keeps trying
    to go on where it was (:mod:`vk.kubelet.logresume`) before it ends: a restart of the
    provider's API server passes unnoticed, an outage ends the follow."""
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
    probes: ProbeSettings = field(default_factory=ProbeSettings)
    """Where ``/healthz``, ``/readyz`` and ``/metrics`` are served (no credentials)."""
    metrics_port: int = 0
    """The older name of the probe port: when set, ``/metrics`` (with ``/healthz`` and
    ``/readyz``) is served on it, on ``probes.bind_address``; 0: ``probes.port`` decides."""

    @property
    def effective_node_name(self) -> str:
        return self.node_name or node_name(self.provider_cluster_id)

    @property
    def probe_settings(self) -> ProbeSettings:
        """``probes``, on ``metrics_port`` when that is set."""
        return replace(self.probes, port=self.metrics_port) if self.metrics_port else self.probes

    @property
    def provider_peer_network_namespace(self) -> str:
        """Where the provider's PeerNetwork for this consumer lives: the tenant namespace (by its
        naming rule when none is set)."""
        return self.tenant_namespace or api.tenant_namespace(self.consumer_cluster_id)


class VirtualNodeError(ValueError):
    """A VirtualNode (or its Secret) that cannot be run as it is: a permanent error until edited."""


def grant_of(spec: Mapping[str, Any]) -> tuple[dict[str, str], dict[str, str]]:
    """The grant a VirtualNode's ``spec`` gives: its ``resources`` and its node ``labels``, as
    strings (a merge patch may have written a number). What the kubelet takes at start and, as
    they change, while it runs (:class:`vk.app.VirtualNodeFollower`)."""
    return ({str(k): str(v) for k, v in (spec.get("resources") or {}).items()},
            {str(k): str(v) for k, v in (spec.get("labels") or {}).items()})  # fmt: skip


def from_virtual_node(
    virtual_node: Mapping[str, Any],
    kubeconfig_secret: Mapping[str, Any],
    base: VirtualKubeletSettings,
) -> VirtualKubeletSettings:
    """Settings for the ``VirtualNode`` object and the Secret its ``kubeconfigSecretRef`` names,
    on top of ``base`` (tuning and the consumer kubeconfig, from the entry point).

    Pure: the caller reads both objects. Raises :class:`VirtualNodeError` with the object named
    when the Secret lacks the key or the spec lacks what a node needs.
    """
    import base64
    import binascii

    meta = virtual_node.get("metadata") or {}
    where = f"VirtualNode {meta.get('namespace', '')}/{meta.get('name', '')}"
    spec = virtual_node.get("spec") or {}
    for required in ("providerClusterID", "consumerClusterID", "nodeName", "kubeconfigSecretRef"):
        if not spec.get(required):
            raise VirtualNodeError(f"{where}: spec.{required} is missing")
    ref = spec["kubeconfigSecretRef"]
    key = ref.get("key") or "kubeconfig"
    encoded = (kubeconfig_secret.get("data") or {}).get(key)
    if not encoded:
        raise VirtualNodeError(f"{where}: Secret {ref.get('name')} has no key {key!r}")
    try:
        data = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise VirtualNodeError(f"{where}: Secret {ref.get('name')} key {key!r} is not base64: {exc}") from exc
    resources, node_labels = grant_of(spec)
    try:  # a grant that is not quantities: exit 2 with this message, not a traceback from the node
        parse_resource_list(resources)
    except ValueError as exc:
        raise VirtualNodeError(f"{where}: spec.resources: {exc}") from None
    return replace(
        base,
        provider_kubeconfig=None,
        provider_kubeconfig_data=data,
        virtual_node=f"{meta.get('namespace', '')}/{meta.get('name', '')}",
        consumer_cluster_id=str(spec["consumerClusterID"]),
        provider_cluster_id=str(spec["providerClusterID"]),
        node_name=str(spec["nodeName"]),
        resources=resources,
        node_labels=node_labels,
        provider_node_selector={str(k): str(v) for k, v in (spec.get("providerNodeSelector") or {}).items()},
        provider_tolerations=tuple(dict(t) for t in spec.get("providerTolerations") or ()),
        tenant_namespace=str(spec.get("tenantNamespace") or ""),
        slice_name=str(spec.get("sliceName") or ""),
    )
