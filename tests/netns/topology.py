"""Two "clusters" made of network namespaces, both on pod CIDR 10.244.0.0/16.

Per cluster ``c`` (``a`` the consumer, ``b`` the provider), with ``rid`` a short run id:

- ``<rid><c>n1`` and ``<rid><c>n2``: nodes, joined by a veth (192.168.100.1 and .2), routing each
  other's pod /24 through the node address (a host-gateway CNI);
- ``<rid><c>p1`` (10.244.1.10, on n1) and ``<rid><c>p2`` (10.244.2.10, on n2): pods;
- ``<rid><c>g``: the gateway pod (10.244.2.5, on n2), with a second veth ``wan`` to the other
  cluster's gateway (172.30.0.1 for a, 172.30.0.2 for b): the provider's endpoint is
  172.30.0.2:51820, as a NodePort or LoadBalancer would publish it.

Pods are attached like Calico does it: a /32 address, a default route via 169.254.1.1 on the
node side of the veth, a /32 route per pod on the node. On the provider's n1 an nftables table
drops forwarded packets to its pod whose source is not in the cluster's pod CIDR (local pods and
the gateway): the anti-spoofing a strict CNI such as Cilium does. Like such a CNI it is stateful:
it judges the packets of whoever opened a connection (``ct direction original``), so the replies
to a connection the provider pod opened itself pass.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from ipaddress import IPv4Address
from pathlib import Path

from netfabric.uapi import socket_path
from netfabric.wireguard import wireguard_go_pids

POD_CIDR = "10.244.0.0/16"
SERVICE_CIDR = "10.96.0.0/16"
GATEWAY_IP = IPv4Address("10.244.2.5")
POD1_IP = IPv4Address("10.244.1.10")
POD2_IP = IPv4Address("10.244.2.10")
NODE1_IP = IPv4Address("192.168.100.1")
NODE2_IP = IPv4Address("192.168.100.2")
WAN = {"a": IPv4Address("172.30.0.1"), "b": IPv4Address("172.30.0.2")}
WG_PORT = 51820
HTTP_PORT = 8080
TCP_PORT = 9000
SPOOF_TABLE = "antispoof"

SERVER = Path(__file__).with_name("echo_server.py")


def sh(
    *argv: str, check: bool = True, timeout: float = 20, input: str | None = None
) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, input=input)
    if check and result.returncode:
        raise RuntimeError(f"{' '.join(argv)} exited {result.returncode}: {result.stderr.strip()}")
    return result


def ns_exec(
    netns: str, *argv: str, check: bool = True, timeout: float = 20, input: str | None = None
) -> subprocess.CompletedProcess[str]:
    return sh("ip", "netns", "exec", netns, *argv, check=check, timeout=timeout, input=input)


@dataclass
class Cluster:
    name: str  # "a" or "b"
    rid: str
    servers: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def ns(self, role: str) -> str:
        return f"gf{self.rid}{self.name}{role}"

    @property
    def gw(self) -> str:
        return self.ns("g")

    @property
    def iface(self) -> str:
        return f"wg{self.rid}{self.name}"

    @property
    def namespaces(self) -> list[str]:
        return [self.ns(role) for role in ("g", "n1", "n2", "p1", "p2")]


@dataclass
class Topology:
    rid: str
    a: Cluster
    b: Cluster

    @property
    def clusters(self) -> tuple[Cluster, Cluster]:
        return (self.a, self.b)

    @property
    def namespaces(self) -> list[str]:
        return self.a.namespaces + self.b.namespaces


def attach_pod(node: str, pod: str, node_if: str, ip: IPv4Address) -> None:
    sh("ip", "link", "add", node_if, "netns", node, "type", "veth", "peer", "name", "eth0", "netns", pod)
    sh("ip", "-n", node, "addr", "add", "169.254.1.1/32", "dev", node_if)
    sh("ip", "-n", node, "link", "set", node_if, "up")
    sh("ip", "-n", node, "route", "add", f"{ip}/32", "dev", node_if, "scope", "link")
    sh("ip", "-n", pod, "addr", "add", f"{ip}/32", "dev", "eth0")
    sh("ip", "-n", pod, "link", "set", "eth0", "up")
    sh("ip", "-n", pod, "route", "add", "169.254.1.1", "dev", "eth0", "scope", "link")
    sh("ip", "-n", pod, "route", "add", "default", "via", "169.254.1.1", "dev", "eth0")


def _build_cluster(cluster: Cluster) -> None:
    for netns in cluster.namespaces:
        sh("ip", "netns", "add", netns)
        sh("ip", "-n", netns, "link", "set", "lo", "up")
    n1, n2 = cluster.ns("n1"), cluster.ns("n2")
    for node in (n1, n2):
        ns_exec(node, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1")
    sh("ip", "link", "add", "node", "netns", n1, "type", "veth", "peer", "name", "node", "netns", n2)
    for node, ip in ((n1, NODE1_IP), (n2, NODE2_IP)):
        sh("ip", "-n", node, "addr", "add", f"{ip}/24", "dev", "node")
        sh("ip", "-n", node, "link", "set", "node", "up")
    sh("ip", "-n", n1, "route", "add", "10.244.2.0/24", "via", str(NODE2_IP))
    sh("ip", "-n", n2, "route", "add", "10.244.1.0/24", "via", str(NODE1_IP))
    attach_pod(n1, cluster.ns("p1"), "vp1", POD1_IP)
    attach_pod(n2, cluster.ns("p2"), "vp2", POD2_IP)
    attach_pod(n2, cluster.gw, "vgw", GATEWAY_IP)


def _antispoof(node: str) -> None:
    script = f"""
table inet {SPOOF_TABLE} {{
    chain forward {{
        type filter hook forward priority filter; policy accept;
        oifname "vp1" ct direction original ip saddr != {POD_CIDR} counter drop
    }}
}}
"""
    subprocess.run(
        ["ip", "netns", "exec", node, "nft", "-f", "-"], input=script, text=True, check=True, timeout=10
    )


def antispoof_drops(topo: Topology) -> int:
    """Packets the provider's anti-spoofing rule has dropped so far."""
    out = ns_exec(topo.b.ns("n1"), "nft", "list", "table", "inet", SPOOF_TABLE).stdout
    for line in out.splitlines():
        if "counter packets" in line:
            return int(line.split("counter packets")[1].split()[0])
    raise AssertionError(f"no counter in the anti-spoofing table:\n{out}")


def _start_servers(cluster: Cluster) -> None:
    for role in ("p1", "p2"):
        server = subprocess.Popen(
            ["ip", "netns", "exec", cluster.ns(role), sys.executable, str(SERVER), f"{cluster.name}-{role}"],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        assert server.stdout is not None
        if server.stdout.readline().strip() != b"ready":
            raise RuntimeError(f"echo server in {cluster.ns(role)} did not start")
        cluster.servers.append(server)


def teardown(topo: Topology) -> None:
    """Remove everything, even what a failed test or a failed fabric teardown left behind."""
    for cluster in topo.clusters:
        for server in cluster.servers:
            server.kill()
            server.wait(timeout=10)
        cluster.servers.clear()
        # A wireguard-go left running would keep its namespace alive after `ip netns del`.
        for iface in (cluster.iface, f"wg{topo.rid}c"):
            if netns_exists(cluster.gw):
                for pid in wireguard_go_pids(iface, netns=cluster.gw):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
            socket_path(iface).unlink(missing_ok=True)
    for netns in topo.namespaces:
        sh("ip", "netns", "del", netns, check=False)


@contextmanager
def two_clusters(*, antispoof: bool = True) -> Iterator[Topology]:
    """Build the two clusters with echo servers in every pod; removes everything on exit."""
    rid = uuid.uuid4().hex[:4]
    topo = Topology(rid=rid, a=Cluster("a", rid), b=Cluster("b", rid))
    try:
        for cluster in topo.clusters:
            _build_cluster(cluster)
            _start_servers(cluster)
        sh("ip", "link", "add", "wan", "netns", topo.a.gw, "type", "veth",
           "peer", "name", "wan", "netns", topo.b.gw)
        for cluster in topo.clusters:
            sh("ip", "-n", cluster.gw, "addr", "add", f"{WAN[cluster.name]}/30", "dev", "wan")
            sh("ip", "-n", cluster.gw, "link", "set", "wan", "up")
        if antispoof:
            _antispoof(topo.b.ns("n1"))
        yield topo
    finally:
        teardown(topo)


# --- probes from a pod ---------------------------------------------------------------------------

_CLIENT = """
import socket, sys, urllib.request
kind, host, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
if kind == "http":
    print(urllib.request.urlopen(f"http://{host}:{port}/", timeout=float(sys.argv[4])).read().decode())
else:
    with socket.create_connection((host, port), timeout=float(sys.argv[4])) as s:
        s.sendall(b"ping\\n")
        print(s.makefile().readline().strip())
"""


def ping(pod_ns: str, target: IPv4Address | str, *, deadline: int = 5) -> bool:
    argv = ["ping", "-n", "-q", "-c", "2", "-i", "0.2", "-w", str(deadline), str(target)]
    result = ns_exec(pod_ns, *argv, check=False)
    return result.returncode == 0


def request(pod_ns: str, kind: str, target: IPv4Address | str, *, timeout: float = 5) -> str | None:
    """``http`` or ``tcp`` request from a pod; the server's answer, or None when it failed."""
    port = HTTP_PORT if kind == "http" else TCP_PORT
    result = ns_exec(
        pod_ns, sys.executable, "-c", _CLIENT, kind, str(target), str(port), str(timeout),
        check=False, timeout=timeout + 10,
    )
    return result.stdout.strip() if result.returncode == 0 else None


def netns_exists(name: str) -> bool:
    return os.path.exists(f"/run/netns/{name}")
