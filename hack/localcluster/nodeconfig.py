"""Configuration files of a local cluster's real node: containerd, CNI, kubelet, kube-proxy. Pure.

Every path lives under the node's own folder (``NodePaths``), so that the nodes of several
clusters and profiles on one machine never share state: two containerds on one root corrupt
each other, and two kubelets on one ``--root-dir`` fight over the same pods.

Settings this machine needs, measured (../shared/design/REAL-NODES.md): the kubelet on cgroup v1
(``failCgroupV1: false``) with the cgroupfs driver; containerd's ``restrict_oom_score_adj``,
because root here lacks CAP_SYS_RESOURCE and every sandbox would fail on oom_score_adj -998.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .spec import REAL_NODE_LABEL, ClusterSpec, RealNodeSpec

KUBELET_PORT = 10250
KUBELET_HEALTHZ_PORT = 10248
KUBE_PROXY_HEALTHZ_PORT = 10256
CLUSTER_DOMAIN = "cluster.local"


def cluster_dns_ip(spec: ClusterSpec) -> str:
    """The ``kube-dns`` Service's address: the tenth of the service range, as kubeadm picks."""
    net, _ = spec.service_cidr.split("/")
    a, b, c, d = net.split(".")
    return f"{a}.{b}.{c}.{int(d) + 10}"


@dataclass(frozen=True)
class NodePaths:
    """Where one real node keeps everything; all under ``root``."""

    root: Path

    @property
    def containerd_config(self) -> Path:
        return self.root / "containerd.toml"

    @property
    def containerd_root(self) -> Path:
        return self.root / "containerd" / "root"

    @property
    def containerd_state(self) -> Path:
        return self.root / "containerd" / "state"

    @property
    def containerd_socket(self) -> Path:
        return self.root / "containerd.sock"

    @property
    def runc_root(self) -> Path:
        return self.root / "containerd" / "runc"

    @property
    def cni_conf_dir(self) -> Path:
        return self.root / "cni" / "net.d"

    @property
    def cni_ipam_dir(self) -> Path:
        return self.root / "cni" / "ipam"

    @property
    def kubelet_dir(self) -> Path:
        return self.root / "kubelet"

    @property
    def kubelet_config(self) -> Path:
        return self.root / "kubelet.yaml"

    @property
    def kubelet_kubeconfig(self) -> Path:
        return self.root / "kubelet.kubeconfig"

    @property
    def pod_logs(self) -> Path:
        return self.root / "pod-logs"

    @property
    def volume_plugins(self) -> Path:
        return self.root / "volume-plugins"

    @property
    def kube_proxy_config(self) -> Path:
        return self.root / "kube-proxy.yaml"

    @property
    def kube_proxy_kubeconfig(self) -> Path:
        return self.root / "kube-proxy.kubeconfig"


def cgroup_root(spec: ClusterSpec) -> str:
    """The node's own cgroup subtree (kubelet ``cgroupRoot``): its pods never mix with another
    node's, and ``down`` finds every process of them there."""
    return f"/gpuferry/{spec.run_dir.parent.name}-{spec.name}"


def _toml_str(value: str) -> str:
    return json.dumps(value)  # a TOML basic string is a JSON string for the paths we write


def containerd_config(paths: NodePaths, *, cni_bin_dir: Path, sandbox_image: str) -> str:
    """containerd 2 configuration (version 3) for one node."""
    q = _toml_str
    return f"""version = 3
root = {q(str(paths.containerd_root))}
state = {q(str(paths.containerd_state))}
# never merge the host's /etc/containerd/conf.d
imports = []

[grpc]
  address = {q(str(paths.containerd_socket))}

[plugins]
  [plugins.'io.containerd.cri.v1.images']
    snapshotter = 'overlayfs'
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      # built here and imported (no registry); hack/images
      sandbox = {q(sandbox_image)}

  [plugins.'io.containerd.cri.v1.runtime']
    # root here lacks CAP_SYS_RESOURCE: the kubelet's oom_score_adj -998 would fail every sandbox
    restrict_oom_score_adj = true
    # pod network namespaces under our state, not /run/netns (shared with every other node)
    netns_mounts_under_state_dir = true
    enable_cdi = false
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
      Root = {q(str(paths.runc_root))}
      SystemdCgroup = false
    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dirs = [{q(str(cni_bin_dir))}]
      conf_dir = {q(str(paths.cni_conf_dir))}

  [plugins.'io.containerd.grpc.v1.cri']
    stream_server_address = '127.0.0.1'

  [plugins.'io.containerd.internal.v1.opt']
    path = {q(str(paths.root / "containerd" / "opt"))}

  [plugins.'io.containerd.nri.v1.nri']
    # its socket path is machine-wide (/var/run/nri): two nodes would collide
    disable = true
"""


def cni_config(paths: NodePaths, node: RealNodeSpec, *, mtu: int = 1500) -> dict[str, Any]:
    """A CNI network list: ``ptp`` (a veth and a /32 route per pod, as Calico routes) with
    host-local addresses from the node's range, and ``portmap`` for hostPort (nftables backend).

    ptp rather than a bridge: every packet between pods crosses the node's routing and netfilter,
    so a Service whose endpoint is on the same node answers through conntrack without
    br_netfilter (a bridge would deliver the reply at layer 2, un-NATed).
    """
    return {
        "cniVersion": "1.0.0",
        "name": "gpuferry-local",
        "plugins": [
            {
                "type": "ptp",
                "mtu": mtu,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": node.pod_cidr}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": str(paths.cni_ipam_dir),
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}, "backend": "nftables"},
        ],
    }


def kubelet_config(
    spec: ClusterSpec, paths: NodePaths, *, node_address: str, serving_cert: Path, serving_key: Path
) -> dict[str, Any]:
    """KubeletConfiguration (kubelet.config.k8s.io/v1beta1) of the real node."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        # authenticated and authorised like any production kubelet: the API server by its client
        # certificate, anyone else by TokenReview and SubjectAccessReview
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(spec.pki_dir / "ca.crt")},
        },
        "authorization": {"mode": "Webhook"},
        "address": node_address,
        "port": KUBELET_PORT,
        "readOnlyPort": 0,
        "tlsCertFile": str(serving_cert),
        "tlsPrivateKeyFile": str(serving_key),
        "rotateCertificates": False,
        # on the node's WAN address, so that the host can probe it (plain HTTP, no credentials)
        "healthzBindAddress": node_address,
        "healthzPort": KUBELET_HEALTHZ_PORT,
        "containerRuntimeEndpoint": f"unix://{paths.containerd_socket}",
        "imageServiceEndpoint": f"unix://{paths.containerd_socket}",
        # this machine: cgroup v1 (hybrid), no systemd managing the node
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": cgroup_root(spec),
        "failSwapOn": False,
        "clusterDNS": [cluster_dns_ip(spec)],
        "clusterDomain": CLUSTER_DOMAIN,
        # pods with dnsPolicy Default get no upstream: the clusters have no internet to resolve
        "resolvConf": "",
        "podLogsDir": str(paths.pod_logs),
        "volumePluginDir": str(paths.volume_plugins),
        "staticPodPath": "",
        # images are imported, not pulled: never garbage-collect them, and evict only when the
        # machine is really out of room (a development disk may be nearly full)
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {
            "memory.available": "100Mi",
            "nodefs.available": "1%",
            "nodefs.inodesFree": "1%",
            "imagefs.available": "1%",
        },
        "serializeImagePulls": False,
        "registerWithTaints": [{"key": REAL_NODE_LABEL, "value": "true", "effect": "NoSchedule"}],
        "shutdownGracePeriod": "0s",
        # gpuferry's gateway pod sets forwarding and the reverse-path filter in its own network
        # namespace (the chart's networking.gateway.sysctls), as a production node must allow
        "allowedUnsafeSysctls": ["net.ipv4.ip_forward", "net.ipv4.conf.*"],
    }


def kube_proxy_config(
    spec: ClusterSpec, paths: NodePaths, node: RealNodeSpec, *, node_address: str
) -> dict[str, Any]:
    """KubeProxyConfiguration (kubeproxy.config.k8s.io/v1alpha1): nftables mode in the node's
    namespace. conntrack sizes are left alone (``nf_conntrack_max`` is machine-wide and not
    writable from a network namespace)."""
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(paths.kube_proxy_kubeconfig)},
        "mode": "nftables",
        "hostnameOverride": node.name,
        "clusterCIDR": spec.pod_cidr,
        "healthzBindAddress": f"{node_address}:{KUBE_PROXY_HEALTHZ_PORT}",
        "metricsBindAddress": "127.0.0.1:10249",
        "conntrack": {"maxPerCore": 0, "min": 0},
    }


def node_labels(node: RealNodeSpec) -> dict[str, str]:
    """Labels the kubelet registers the node with (NodeRestriction allows these prefixes)."""
    return {REAL_NODE_LABEL: "true", **node.gpu_labels}
