"""The local clusters' network: where gpuferry's gateways run in embedded mode.

kwok clusters have no pod network, so the gateways that ``gpuferry peer`` starts locally need one
made for them. Per profile (root only, with ``ip`` from iproute2):

- ``gf-<profile>-wan``: the "internet" between the clusters, a bridge ``br0`` in its own network
  namespace; no address of the host is involved and nothing is routed through the host.
- ``gf-<profile>-<cluster>``: the cluster's gateway node. Its ``wan`` interface is on that bridge
  (``172.31.0.<n>/24``: consumer 1, provider 2, provider-b 3); the gateway's pod IP
  ``10.244.0.2`` (inside the pod CIDR, on no node's /24) is on its loopback. Tests attach "pods"
  to it (a veth and a /32 route, as Calico does).

Each cluster then declares its network in the ConfigMap ``kube-system/gpuferry-network``: the pod
and service CIDRs (what every cluster must declare to be peered with the fabric) and where its
gateways run (``gatewayNetns``, ``gatewayIP``) and are reached (``endpointAddress``). Without root
only the CIDRs are declared, and ``gpuferry peer`` needs ``--no-network``.
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

from .spec import ClusterSpec

__all__ = [
    "DECLARATION",
    "GATEWAY_IP",
    "LocalNetwork",
    "declaration",
    "local_network",
    "remove_network",
    "setup_network",
]

DECLARATION = ("kube-system", "gpuferry-network")
GATEWAY_IP = "10.244.0.2"
WAN_PREFIX = "172.31.0"
_HOSTS = {"consumer": 1, "provider": 2, "provider-b": 3}


@dataclass(frozen=True)
class LocalNetwork:
    netns: str
    """The cluster's gateway node (an ``ip netns`` name)."""
    wan_netns: str
    wan_address: str
    gateway_ip: str = GATEWAY_IP


def local_network(spec: ClusterSpec) -> LocalNetwork:
    """The names and addresses of a cluster's local network. Pure."""
    profile = spec.run_dir.parent.name
    host = _HOSTS.get(spec.name, 9)
    return LocalNetwork(
        netns=f"gf-{profile}-{spec.name}",
        wan_netns=f"gf-{profile}-wan",
        wan_address=f"{WAN_PREFIX}.{host}",
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


def can_make_networks() -> bool:
    return os.geteuid() == 0 and shutil.which("ip") is not None


def _ip(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(["ip", *argv], capture_output=True, text=True, timeout=20)
    if check and result.returncode:
        raise RuntimeError(f"ip {' '.join(argv)} exited {result.returncode}: {result.stderr.strip()}")
    return result


def _netns_exists(name: str) -> bool:
    return Path(f"/run/netns/{name}").exists()


def _link_exists(netns: str, name: str) -> bool:
    return _ip("-n", netns, "link", "show", name, check=False).returncode == 0


def setup_network(spec: ClusterSpec) -> LocalNetwork | None:
    """Make the cluster's network (idempotent); None when this process may not (not root)."""
    if not can_make_networks():
        return None
    net = local_network(spec)
    if not _netns_exists(net.wan_netns):
        _ip("netns", "add", net.wan_netns)
        _ip("-n", net.wan_netns, "link", "set", "lo", "up")
    if not _link_exists(net.wan_netns, "br0"):
        _ip("-n", net.wan_netns, "link", "add", "br0", "type", "bridge")
        _ip("-n", net.wan_netns, "link", "set", "br0", "up")
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
    if _netns_exists(net.netns):
        _kill_inside(net.netns)
        _ip("netns", "del", net.netns, check=False)
        removed = True
    for sock in Path("/var/run/wireguard").glob("gf*.sock") if Path("/var/run/wireguard").is_dir() else []:
        # a userspace WireGuard socket whose process is gone (killed above)
        with contextlib.suppress(OSError):
            if not _socket_alive(sock):
                sock.unlink()
    profile = spec.run_dir.parent.name
    others = [n for n in Path("/run/netns").glob(f"gf-{profile}-*") if n.name != net.wan_netns]
    if _netns_exists(net.wan_netns) and not others:
        _ip("netns", "del", net.wan_netns, check=False)
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
