"""Fabric throughput and latency: pod to pod through the fabric (WireGuard + prefix NAT + source
NAT) against a plain veth between the same two pod namespaces (the baseline).

Builds the two-cluster namespace topology of tests/netns (both clusters on 10.244.0.0/16), adds a
veth straight between the consumer's pod and the provider's pod, and measures from the consumer
pod to the provider pod (by its remapped address 10.64.1.10 through the fabric, by 172.31.0.2 on
the veth):

- TCP throughput with iperf3 (Debian's), one stream, ``--seconds`` long;
- request latency: 1-byte request/response round trips on one TCP connection (p50, p99), and
  ICMP round trips.

The fabric is measured once per wireguard-go found: the current build from
hack/build-wireguard-go.sh (cached in ~/.cache/gpuferry) and Debian's, unless ``--wireguard-go``
names binaries. Kernel WireGuard is measured instead when the kernel has it. Needs root.

    .venv/bin/python bench/fabric.py [--seconds 5] [--requests 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from netfabric.wireguard import find_wireguard_go, kernel_wireguard_available
from tests.netns.fabric import fabric_down, fabric_up, make_fabric
from tests.netns.topology import Topology, ns_exec, sh, two_clusters

REMOTE_POD1 = "10.64.1.10"
BASE_A, BASE_B = "172.31.0.1", "172.31.0.2"
RR_PORT = 9100

_RR_SERVER = f"""
import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", {RR_PORT})); s.listen(8); print("ready", flush=True)
while True:
    c, _ = s.accept()
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    while (b := c.recv(1)):
        c.sendall(b)
    c.close()
"""

_RR_CLIENT = f"""
import socket, sys, time, json
n = int(sys.argv[2])
c = socket.create_connection((sys.argv[1], {RR_PORT}), timeout=5)
c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
for _ in range(50):
    c.sendall(b"x"); c.recv(1)
out = []
for _ in range(n):
    t = time.perf_counter_ns(); c.sendall(b"x"); c.recv(1); out.append(time.perf_counter_ns() - t)
print(json.dumps(out))
"""


@dataclass
class Figures:
    name: str
    gbps: float
    rr_p50_ms: float
    rr_p99_ms: float
    ping_ms: float


def measure(topo: Topology, name: str, target: str, *, seconds: int, requests: int) -> Figures:
    client, server = topo.a.ns("p1"), topo.b.ns("p1")
    iperf = subprocess.Popen(["ip", "netns", "exec", server, "iperf3", "-s", "-1"], stdout=subprocess.DEVNULL)
    try:
        time.sleep(0.3)
        out = ns_exec(client, "iperf3", "-c", target, "-t", str(seconds), "-J", timeout=seconds + 30).stdout
    finally:
        iperf.kill()
        iperf.wait()
    gbps = json.loads(out)["end"]["sum_received"]["bits_per_second"] / 1e9
    rr = subprocess.Popen(
        ["ip", "netns", "exec", server, sys.executable, "-c", _RR_SERVER], stdout=subprocess.PIPE
    )
    try:
        assert rr.stdout is not None and rr.stdout.readline().strip() == b"ready"
        samples = json.loads(ns_exec(client, sys.executable, "-c", _RR_CLIENT, target, str(requests)).stdout)
    finally:
        rr.kill()
        rr.wait()
    samples_ms = sorted(s / 1e6 for s in samples)
    ping = ns_exec(client, "ping", "-n", "-q", "-c", "50", "-i", "0.01", target).stdout
    avg = float(ping.rsplit("=", 1)[1].split("/")[1])
    return Figures(
        name=name,
        gbps=gbps,
        rr_p50_ms=statistics.median(samples_ms),
        rr_p99_ms=samples_ms[int(len(samples_ms) * 0.99) - 1],
        ping_ms=avg,
    )


def add_baseline_veth(topo: Topology) -> None:
    a, b = topo.a.ns("p1"), topo.b.ns("p1")
    sh("ip", "link", "add", "base", "netns", a, "type", "veth", "peer", "name", "base", "netns", b)
    for ns, ip in ((a, BASE_A), (b, BASE_B)):
        sh("ip", "-n", ns, "addr", "add", f"{ip}/30", "dev", "base")
        sh("ip", "-n", ns, "link", "set", "base", "up")


def _version(binary: str) -> str:
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10).stdout
    return out.split()[1] if len(out.split()) > 1 else "unknown version"


def binaries(explicit: list[str]) -> list[tuple[str, str | None]]:
    """(label, path) of each wireguard-go to measure: the cached current build, then Debian's."""
    paths = list(explicit)
    if not paths:
        current = find_wireguard_go()
        if current is not None and ".cache" in str(current):
            paths.append(str(current))
        debian = shutil.which("wireguard-go")
        if debian:
            paths.append(debian)
    return [(f"wireguard-go {_version(path)} ({'cached build' if '.cache' in path else path})", path)
            for path in paths]


async def run(args: argparse.Namespace) -> None:
    results: list[Figures] = []
    with two_clusters(antispoof=False) as topo:
        add_baseline_veth(topo)
        sizes = {"seconds": args.seconds, "requests": args.requests}
        results.append(measure(topo, "plain veth (baseline)", BASE_B, **sizes))
        kernel = await kernel_wireguard_available(netns=topo.a.gw)
        variants = [("kernel WireGuard", None)] if kernel else binaries(args.wireguard_go)
        for name, binary in variants:
            if binary:
                os.environ["GPUFERRY_WIREGUARD_GO"] = binary
            fabric = make_fabric(topo)
            try:
                await fabric_up(fabric)
                results.append(measure(topo, f"fabric, {name}", REMOTE_POD1, **sizes))
            finally:
                await fabric_down(fabric)
    base = results[0]
    print(f"{'path':60} {'Gbit/s':>8} {'ratio':>7} {'RR p50 ms':>10} {'RR p99 ms':>10} {'ping ms':>8}")
    for r in results:
        print(
            f"{r.name:60} {r.gbps:8.2f} {r.gbps / base.gbps:7.1%} {r.rr_p50_ms:10.3f} {r.rr_p99_ms:10.3f}"
            f" {r.ping_ms:8.3f}"
        )
    for r in results[1:]:
        print(
            f"{r.name}: {r.gbps / base.gbps:.1%} of the baseline's throughput,"
            f" +{r.rr_p50_ms - base.rr_p50_ms:.3f} ms request latency (p50),"
            f" +{r.ping_ms - base.ping_ms:.3f} ms ICMP round trip"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=int, default=5, help="iperf3 duration per path")
    parser.add_argument("--requests", type=int, default=2000, help="request/response round trips per path")
    parser.add_argument("--wireguard-go", action="append", default=[], help="wireguard-go binary to measure")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench/fabric.py needs root (network namespaces)")
    if not shutil.which("iperf3"):
        sys.exit("bench/fabric.py needs iperf3 (apt-get install iperf3)")
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
