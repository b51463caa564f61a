"""The local clusters' network: a "WAN" between them, the host on it, each cluster's real node and
the network namespace where gpuferry's gateways run in embedded mode.

Per profile (root only, with ``ip`` from iproute2 and ``nft``):

- ``gf-<profile>-wan``: the "internet" between the clusters, a bridge ``br0`` in its own network
  namespace, subnet ``172.31.<p>.0/24`` (``<p>`` per profile: test 0, demo 1, scratch 2, ...).
- the host joins it through the veth ``gfw-<profile>`` at ``172.31.<p>.254``: the clusters' API
  servers (processes on the host) are reached there from the nodes, as a cloud's control plane
  is reached from its machines.
- ``gf-<profile>-<cluster>-node``: the cluster's real node, a "machine" on the WAN
  (``172.31.<p>.1<n>``: consumer 11, provider 12, provider-b 13) whose containerd, kubelet and
  kube-proxy run in that namespace; its pods are routed there (CNI ptp, a /32 per pod) and reach
  the WAN masqueraded behind the node's address, so that both clusters keep the same pod CIDR and
  a pod reaches the other cluster's pods only through the fabric.
- ``gf-<profile>-<cluster>``: the cluster's gateway node. Its ``wan`` interface is on the bridge
  (``172.31.<p>.<n>``: consumer 1, provider 2, provider-b 3); the gateway's pod IP
  ``10.244.0.2`` (inside the pod CIDR, on no node's /24) is on its loopback. Tests attach "pods"
  to it (a veth and a /32 route, as Calico does).

Each cluster then declares its network in the ConfigMap ``kube-system/gpuferry-network``: the pod
and service CIDRs (what every cluster must declare to be peered with the fabric) and where its
gateways run (``gatewayNetns``, ``gatewayIP``) and are reached (``endpointAddress``). Without root
only the CIDRs are declared, there is no real node, and ``gpuferry peer`` needs ``--no-network``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .spec import PROFILE_INDEX, ClusterSpec

__all__ = [
    "DECLARATION",
    "GATEWAY_IP",
    "LocalNetwork",
    "NetworkFailed",
    "can_make_networks",
    "declaration",
    "local_network",
    "remove_network",
    "setup_network",
]

DECLARATION = ("kube-system", "gpuferry-network")
GATEWAY_IP = "10.244.0.2"
_HOSTS = {"consumer": 1, "provider": 2, "provider-b": 3}
HOST_OCTET = 254
NODE_NFT_TABLE = "gpuferry-node"


@dataclass(frozen=True)
class LocalNetwork:
    netns: str
    """The cluster's gateway node (an ``ip netns`` name)."""
    wan_netns: str
    wan_address: str
    """The gateway node's address on the WAN."""
    node_netns: str
    """The cluster's real node (an ``ip netns`` name): containerd, kubelet, kube-proxy run there."""
    node_address: str
    """The real node's InternalIP, on the WAN."""
    host_link: str
    """The host's veth on the WAN."""
    host_address: str
    """The host's address on the WAN, where the nodes reach the clusters' API servers."""
    wan_cidr: str
    node_wan_port: str
    """The bridge port of the real node's veth (in the WAN namespace)."""
    gateway_ip: str = GATEWAY_IP


def local_network(spec: ClusterSpec) -> LocalNetwork:
    """The names and addresses of a cluster's local network. Pure."""
    profile = spec.run_dir.parent.name
    prefix = f"172.31.{PROFILE_INDEX.get(profile, 9)}"  # each profile's own WAN
    host = _HOSTS.get(spec.name, 9)
    return LocalNetwork(
        netns=f"gf-{profile}-{spec.name}",
        wan_netns=f"gf-{profile}-wan",
        wan_address=f"{prefix}.{host}",
        node_netns=f"gf-{profile}-{spec.name}-node",
        node_address=f"{prefix}.{10 + host}",
        host_link=f"gfw-{profile}"[:15],
        host_address=f"{prefix}.{HOST_OCTET}",
        wan_cidr=f"{prefix}.0/24",
        node_wan_port=f"{spec.name[:10]}-node",
    )


def api_advertise_address(spec: ClusterSpec) -> str:
    """Where the cluster's pods and nodes reach its API server (the ``kubernetes`` Service's
    endpoint): the host's WAN address when this process can make the network, else loopback."""
    return local_network(spec).host_address if can_make_networks() else "127.0.0.1"


def node_nft_script(net: LocalNetwork, pod_cidr: str) -> str:
    """The real node's own nftables table: pods reach the WAN (the API servers) masqueraded behind
    the node's address, as a CNI's ipMasq does; traffic between pods and to gateways inside the
    node keeps its source. Pure."""
    return (
        f"table ip {NODE_NFT_TABLE} {{}}\n"
        f"delete table ip {NODE_NFT_TABLE}\n"
        f"table ip {NODE_NFT_TABLE} {{\n"
        "  chain postrouting {\n"
        "    type nat hook postrouting priority srcnat; policy accept;\n"
        f'    oifname "wan" ip saddr {pod_cidr} ip daddr != {pod_cidr} masquerade\n'
        "  }\n"
        "}\n"
    )


def declaration(spec: ClusterSpec, network: LocalNetwork | None) -> dict[str, Any]:
    """The ConfigMap that declares the cluster's network to gpuferry. Pure."""
    data = {"podCIDRs": spec.pod_cidr, "serviceCIDRs": spec.service_cidr}
    if network is not None:
        data |= {
            "gatewayNetns": network.netns,
            "gatewayIP": network.gateway_ip,
            "endpointAddress": network.wan_address,
        }
    namespace, name = DECLARATION
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"app.kubernetes.io/part-of": "gpuferry"},
        },
        "data": data,
    }


class NetworkFailed(RuntimeError):
    """The local network could not be made; the message says which command failed and why."""


def can_make_networks() -> bool:
    return os.geteuid() == 0 and shutil.which("ip") is not None


def _ip(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(["ip", *argv], capture_output=True, text=True, timeout=20)
    if check and result.returncode:
        raise NetworkFailed(f"ip {' '.join(argv)} exited {result.returncode}: {result.stderr.strip()}")
    return result


def _netns_exists(name: str) -> bool:
    return Path(f"/run/netns/{name}").exists()


def _link_exists(netns: str, name: str) -> bool:
    return _ip("-n", netns, "link", "show", name, check=False).returncode == 0


def _host_link_exists(name: str) -> bool:
    return _ip("link", "show", name, check=False).returncode == 0


def setup_network(spec: ClusterSpec, *, pod_cidr: str | None = None) -> LocalNetwork | None:
    """Make the cluster's network (idempotent); None when this process may not (not root).
    ``pod_cidr``: the real node's pod range, masqueraded towards the WAN (no real node: None)."""
    if not can_make_networks():
        return None
    net = local_network(spec)
    if not _netns_exists(net.wan_netns):
        _ip("netns", "add", net.wan_netns)
        _ip("-n", net.wan_netns, "link", "set", "lo", "up")
    if not _link_exists(net.wan_netns, "br0"):
        _ip("-n", net.wan_netns, "link", "add", "br0", "type", "bridge")
        _ip("-n", net.wan_netns, "link", "set", "br0", "up")
    if not _host_link_exists(net.host_link):
        taken = _ip("-o", "route", "show", "to", "match", net.host_address).stdout.split("\n")
        if clash := [r for r in taken if r.strip() and not r.startswith("default")]:
            raise NetworkFailed(
                f"the local clusters' WAN {net.wan_cidr} is already routed on this machine "
                f"({clash[0].strip()}); free it, or use another profile (each has its own 172.31.<n>.0/24)"
            )
        _ip("link", "add", net.host_link, "type", "veth", "peer", "name", "host", "netns", net.wan_netns)
        _ip("-n", net.wan_netns, "link", "set", "host", "master", "br0", "up")
        _ip("addr", "add", f"{net.host_address}/24", "dev", net.host_link)
        _ip("link", "set", net.host_link, "up")
    if pod_cidr is not None:
        _setup_node(net, pod_cidr)
    if not _netns_exists(net.netns):
        _ip("netns", "add", net.netns)
        _ip("-n", net.netns, "link", "set", "lo", "up")
        _ip("-n", net.netns, "addr", "add", f"{net.gateway_ip}/32", "dev", "lo")
    if not _link_exists(net.netns, "wan"):
        port = spec.name[:15]
        _ip("link", "add", "wan", "netns", net.netns, "type", "veth", "peer", "name", port,
            "netns", net.wan_netns)  # fmt: skip
        _ip("-n", net.wan_netns, "link", "set", port, "master", "br0", "up")
        _ip("-n", net.netns, "addr", "add", f"{net.wan_address}/24", "dev", "wan")
        _ip("-n", net.netns, "link", "set", "wan", "up")
    return net


def _setup_node(net: LocalNetwork, pod_cidr: str) -> None:
    """The real node's namespace: on the WAN at its address, forwarding for its pods, and its
    masquerade table (applied again each time: one ``nft -f`` transaction)."""
    if not _netns_exists(net.node_netns):
        _ip("netns", "add", net.node_netns)
        _ip("-n", net.node_netns, "link", "set", "lo", "up")
    if not _link_exists(net.node_netns, "wan"):
        _ip("link", "add", "wan", "netns", net.node_netns, "type", "veth", "peer", "name", net.node_wan_port,
            "netns", net.wan_netns)  # fmt: skip
        _ip("-n", net.wan_netns, "link", "set", net.node_wan_port, "master", "br0", "up")
        _ip("-n", net.node_netns, "addr", "add", f"{net.node_address}/24", "dev", "wan")
        _ip("-n", net.node_netns, "link", "set", "wan", "up")
    # a default gateway, as every machine has: a Service address must be routable before
    # kube-proxy's DNAT rewrites it (from the node's own processes, e.g. hostNetwork pods). The host
    # has no route into any cluster's pod range, so this opens no path between clusters.
    _ip("-n", net.node_netns, "route", "replace", "default", "via", net.host_address, "dev", "wan")
    _ip("netns", "exec", net.node_netns, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1")
    nft = subprocess.run(
        ["ip", "netns", "exec", net.node_netns, "nft", "-f", "-"],
        input=node_nft_script(net, pod_cidr), capture_output=True, text=True, timeout=20,
    )  # fmt: skip
    if nft.returncode:
        raise NetworkFailed(f"nft in {net.node_netns} exited {nft.returncode}: {nft.stderr.strip()}")
    # the control plane reaches the node's pods, as in a real cluster (a kubelet API or a webhook
    # served from a pod): the host routes the node's pod range to it. The host itself never
    # forwards from the WAN back to the WAN (host_nft_script), so this opens no path between clusters
    nft = subprocess.run(["nft", "-f", "-"], input=host_nft_script(net), capture_output=True, text=True,
                         timeout=20)  # fmt: skip
    if nft.returncode:
        raise NetworkFailed(f"nft on the host exited {nft.returncode}: {nft.stderr.strip()}")
    # each profile's real nodes have pod ranges of their own (spec.real_node_cidr): the route is
    # this node's alone, whatever another profile up at the same time routes
    _ip("route", "replace", pod_cidr, "via", net.node_address, "dev", net.host_link)


def host_nft_table(net: LocalNetwork) -> str:
    return f"gf-{net.host_link}"


def host_nft_script(net: LocalNetwork) -> str:
    """The host's guard (one per profile): nothing that comes in from the WAN is forwarded back
    to it, whatever ``net.ipv4.ip_forward`` says, so routes to the nodes' pods open no path from one
    cluster to another. Pure."""
    table = host_nft_table(net)
    return (
        f"table inet {table}\n"
        f"delete table inet {table}\n"
        f"table inet {table} {{\n"
        "  chain forward {\n"
        "    type filter hook forward priority filter; policy accept;\n"
        f'    iifname "{net.host_link}" oifname "{net.host_link}" drop\n'
        "  }\n"
        "}\n"
    )


def _kill_inside(netns: str) -> None:
    """End what still runs in the namespace (a wireguard-go of a gateway nobody stopped)."""
    pids = _ip("netns", "pids", netns, check=False).stdout.split()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)
    deadline = time.monotonic() + 5
    while pids and time.monotonic() < deadline and _ip("netns", "pids", netns, check=False).stdout.split():
        time.sleep(0.05)


def remove_network(spec: ClusterSpec) -> bool:
    """Remove the cluster's network namespace (and the profile's WAN once no cluster uses it)."""
    if not can_make_networks():
        return False
    net = local_network(spec)
    removed = False
    if spec.real_node is not None:  # its route goes with the node (the host's link may stay)
        _ip("route", "del", spec.real_node.pod_cidr, "via", net.node_address, check=False)
    for netns in (net.netns, net.node_netns):
        if _netns_exists(netns):
            _kill_inside(netns)
            _ip("netns", "del", netns, check=False)
            removed = True
    for sock in Path("/var/run/wireguard").glob("gf*.sock") if Path("/var/run/wireguard").is_dir() else []:
        # a userspace WireGuard socket whose process is gone (killed above)
        with contextlib.suppress(OSError):
            if not _socket_alive(sock):
                sock.unlink()
    profile = spec.run_dir.parent.name
    others = [n for n in Path("/run/netns").glob(f"gf-{profile}-*") if n.name != net.wan_netns]
    if _netns_exists(net.wan_netns) and not others:
        _ip("netns", "del", net.wan_netns, check=False)  # its veths go with it, the host's too
    if not others and _host_link_exists(net.host_link):
        _ip("link", "del", net.host_link, check=False)
    if not others:
        subprocess.run(["nft", "delete", "table", "inet", host_nft_table(net)],
                       capture_output=True, timeout=20, check=False)  # fmt: skip
    return removed


def _socket_alive(sock: Path) -> bool:
    import socket

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        try:
            s.connect(str(sock))
        except OSError:
            return False
    return True
