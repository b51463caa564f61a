"""Pods on the local clusters' gateway networks (hack/localcluster/network.py), and what a gateway
may leave behind there. Root only, like the networks themselves."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from ipaddress import IPv4Address
from pathlib import Path

from hack.localcluster import LocalCluster
from hack.localcluster.network import can_make_networks, local_network

from ..netns.topology import attach_pod

ECHO_SERVER = Path(__file__).parents[1] / "netns" / "echo_server.py"
HTTP_PORT = 8080

_CLIENT = """
import sys, urllib.request
print(urllib.request.urlopen(f"http://{sys.argv[1]}:8080/", timeout=float(sys.argv[2])).read().decode())
"""


def sh(*argv: str, check: bool = True, timeout: float = 20) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if check and result.returncode:
        raise RuntimeError(f"{' '.join(argv)} exited {result.returncode}: {result.stderr.strip()}")
    return result


@dataclass
class Pod:
    netns: str
    ip: str
    server: subprocess.Popen[bytes]

    def http(self, target: str, *, timeout: float = 3) -> str | None:
        """GET http://target:8080/ from this pod: the answer ("<server name> <source it saw>") or None."""
        result = sh("ip", "netns", "exec", self.netns, sys.executable, "-c", _CLIENT, target, str(timeout),
                    check=False, timeout=timeout + 10)  # fmt: skip
        return result.stdout.strip() if result.returncode == 0 else None

    def ping(self, target: str) -> bool:
        argv = ["ping", "-n", "-q", "-c", "2", "-i", "0.2", "-w", "3", target]
        return sh("ip", "netns", "exec", self.netns, *argv, check=False).returncode == 0


@contextlib.contextmanager
def pod_on(cluster: LocalCluster, ip: str, name: str) -> Iterator[Pod]:
    """A pod with ``ip`` attached to the cluster's gateway node (a /32 and a veth, as Calico does),
    serving HTTP with the echo server that answers with its name and the caller's address."""
    node = local_network(cluster.spec).netns
    netns = f"gfpod-{uuid.uuid4().hex[:6]}"
    veth = f"vp{uuid.uuid4().hex[:8]}"
    sh("ip", "netns", "add", netns)
    server: subprocess.Popen[bytes] | None = None
    try:
        sh("ip", "-n", netns, "link", "set", "lo", "up")
        attach_pod(node, netns, veth, IPv4Address(ip))
        sh("ip", "netns", "exec", node, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1")
        server = subprocess.Popen(
            ["ip", "netns", "exec", netns, sys.executable, str(ECHO_SERVER), name],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        assert server.stdout is not None
        if server.stdout.readline().strip() != b"ready":
            raise RuntimeError(f"echo server in {netns} did not start")
        yield Pod(netns, ip, server)
    finally:
        if server is not None:
            server.kill()
            server.wait(timeout=10)
        sh("ip", "-n", node, "link", "del", veth, check=False)
        sh("ip", "netns", "del", netns, check=False)


def fabric_leftovers(cluster: LocalCluster) -> list[str]:
    """What of any gateway is still in the cluster's gateway node: tunnel interfaces, nft tables,
    policy rules, routes of the gateways' tables, processes."""
    netns = local_network(cluster.spec).netns
    found = []
    for line in sh("ip", "-n", netns, "-o", "link", "show").stdout.splitlines():
        name = line.split(":")[1].strip().split("@")[0]
        if name.startswith("gf"):
            found.append(f"interface {name}")
    tables = sh("ip", "netns", "exec", netns, "nft", "list", "tables").stdout.split()
    found += [f"nft table {t}" for t in tables if t.startswith("gpuferry")]
    found += [f"rule {r}" for r in sh("ip", "-n", netns, "rule").stdout.splitlines() if "fwmark" in r]
    routes = sh("ip", "-n", netns, "route", "show", "table", "all").stdout.splitlines()
    found += [f"route {r}" for r in routes if "table 47" in r]
    pids = sh("ip", "netns", "pids", netns).stdout.split()
    for pid in pids:
        with contextlib.suppress(OSError):
            found.append(f"process {pid}: {Path(f'/proc/{pid}/cmdline').read_bytes()!r}")
    return found


__all__ = ["HTTP_PORT", "Pod", "can_make_networks", "fabric_leftovers", "pod_on"]
