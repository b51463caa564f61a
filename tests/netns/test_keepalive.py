"""An API server gone without a word ends our streams with an error, not a wait of hours.

A server in a network namespace streams one log line and then nothing, as ``logs -f`` of a quiet
container does; then nftables in that namespace drops every packet, as a partition or a cluster
powered off would: no reset, no FIN. The client's stream must fail once its keepalive probes go
unanswered. Without keepalive a reading socket waits for the kernel's 2 h default.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from kube.clients import KubeClient
from kube.errors import NetworkError
from kube.kubeconfigs import Connection
from kube.settings import ClientSettings

from .topology import ns_exec, sh

HOST_IP, SERVER_IP, PORT = "198.51.100.1", "198.51.100.2", 8080

DROP_ALL = "add table inet cut\nadd chain inet cut input { type filter hook input priority 0; policy drop; }"

QUIET_LOG = """
import socket, sys, time
srv = socket.create_server(("0.0.0.0", int(sys.argv[1])))
print("ready", flush=True)
conn, _ = srv.accept()
conn.recv(65536)
conn.sendall(b"HTTP/1.1 200 OK\\r\\nContent-Type: text/plain\\r\\nTransfer-Encoding: chunked\\r\\n\\r\\n"
             b"7\\r\\nline 1\\n\\r\\n")
time.sleep(3600)
"""


@dataclass
class Remote:
    netns: str
    server: subprocess.Popen[str]

    def partition(self) -> None:
        """Drop everything that reaches the namespace, silently."""
        ns_exec(self.netns, "nft", "-f", "-", input=DROP_ALL)


@pytest.fixture
def remote() -> Iterator[Remote]:
    rid = uuid.uuid4().hex[:6]
    netns, host_end, ns_end = f"gf{rid}ka", f"gf{rid}h", f"gf{rid}n"
    sh("ip", "netns", "add", netns)
    server: subprocess.Popen[str] | None = None
    try:
        sh("ip", "link", "add", host_end, "type", "veth", "peer", "name", ns_end, "netns", netns)
        sh("ip", "addr", "add", f"{HOST_IP}/30", "dev", host_end)
        sh("ip", "link", "set", host_end, "up")
        ns_exec(netns, "ip", "addr", "add", f"{SERVER_IP}/30", "dev", ns_end)
        ns_exec(netns, "ip", "link", "set", ns_end, "up")
        ns_exec(netns, "ip", "link", "set", "lo", "up")
        server = subprocess.Popen(
            ["ip", "netns", "exec", netns, sys.executable, "-c", QUIET_LOG, str(PORT)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        yield Remote(netns, server)
    finally:
        if server is not None:
            server.kill()
            server.wait()
        sh("ip", "link", "del", host_end, check=False)
        sh("ip", "netns", "del", netns, check=False)


async def test_a_log_stream_from_a_server_gone_silent_fails_within_its_keepalive(remote: Remote) -> None:
    # 1 s of silence, then 2 probes 1 s apart: the stream fails after about 3 s
    settings = ClientSettings(tcp_keepalive_seconds=1, tcp_keepalive_probes=2)
    got: list[bytes] = []
    async with KubeClient(Connection(server=f"http://{SERVER_IP}:{PORT}"), settings=settings) as client:
        with pytest.raises(NetworkError) as failed:
            path = "/api/v1/namespaces/ml/pods/trainer/log"
            async with client.stream("GET", path, {"follow": "true"}) as log:
                got.append(await log.content.readline())
                remote.partition()
                # without keepalive this read waits for the kernel's 2 h: given up here instead,
                # which the stream reports as its own Timeout
                async with asyncio.timeout(30) as limit:
                    got.append(await log.content.readline())
    assert got == [b"line 1\n"]
    assert not limit.expired(), "the stream waited on after the server went silent"
    assert "timed out" in str(failed.value).lower() or "Connection" in str(failed.value), failed.value
