"""The network fabric's lifecycle through the real CLI: ``gpuferry peer`` brings it up between the
two local clusters (both on pod CIDR 10.244.0.0/16), pods on each side reach each other by their
remapped addresses, a killed gateway or a rotated key recovers by itself, and ``gpuferry unpeer``
leaves no interface, rule, route, nft table, key or process behind.

The clusters' gateway networks are hack/localcluster's (root): each cluster's gateway node is a
network namespace on a shared "WAN" bridge; the test attaches a pod with the *same* address,
10.244.1.10, to each side.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from hack.localcluster import LocalCluster
from hack.localcluster.network import GATEWAY_IP, local_network
from kube.clients import KubeClient
from kube.errors import NotFound
from kube.objects import CONFIGMAPS, NAMESPACES, NODES, PEERNETWORKS, SECRETS, TENANTS
from netfabric.objects import rotate_private_key
from netfabric.wireguard import wireguard_go_pids
from peering.localagents import all_agents, find_agent

from .clirunner import Cli, cache_of
from .conftest import NamespaceFactory
from .localnet import Pod, fabric_leftovers, pod_on
from .test_e2e_story import H100
from .waiting import condition, wait_for

pytestmark = pytest.mark.integration

POD_IP = "10.244.1.10"
#: The first block of the default remap pool: how each side sees the other's 10.244.0.0/16.
REMOTE_POD = "10.64.1.10"
FROM_GW = f"provider-pod {GATEWAY_IP}"
CONSUMER_KEY = "gpuferry-gateway-gpu-farm"
PEER = ["--cluster-id", "ml-eu", "--remote-cluster-id", "gpu-farm", "--gpus", "2", "--selector", H100]


def tunnel_mtu(cluster: LocalCluster) -> int:
    """The MTU of the (one) tunnel interface in the cluster's gateway namespace."""
    netns = local_network(cluster.spec).netns
    out = subprocess.run(["ip", "-n", netns, "-o", "link", "show"], capture_output=True, text=True,
                         check=True).stdout  # fmt: skip
    (line,) = [x for x in out.splitlines() if x.split(":")[1].strip().startswith("gf")]
    return int(line.split(" mtu ")[1].split()[0])


async def eventually(what: str, probe: Callable[[], Awaitable[bool]], timeout: float = 60) -> None:
    """Until ``probe()`` holds; each probe has its own timeout, so this polls by nature."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not await probe():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"{what}: not after {timeout:.0f}s")


def answers(pod: Pod, target: str, expected: str) -> Callable[[], Awaitable[bool]]:
    async def probe() -> bool:
        return await asyncio.to_thread(pod.http, target) == expected

    return probe


async def test_peer_brings_the_fabric_up_it_recovers_and_unpeer_removes_it(
    cli: Cli,
    consumer: LocalCluster,
    provider: LocalCluster,
    consumer_client: KubeClient,
    provider_client: KubeClient,
    make_namespace: NamespaceFactory,
) -> None:
    # the consumer's underlay encapsulates already: it declares a smaller tunnel MTU
    declared = await consumer_client.get(CONFIGMAPS, "gpuferry-network", "kube-system")
    await consumer_client.patch(CONFIGMAPS, "gpuferry-network", {"data": {"mtu": "1380"}}, "kube-system")
    try:
        result = json.loads(await cli.ok("peer", "--kubeconfig", cli.c, "--remote-kubeconfig", cli.p, *PEER,
                                         "-o", "json"))  # fmt: skip
    finally:
        await consumer_client.patch(CONFIGMAPS, "gpuferry-network", {"data": {"mtu": None}}, "kube-system")
    assert "mtu" not in (await consumer_client.get(CONFIGMAPS, "gpuferry-network", "kube-system"))["data"]
    assert declared["data"].get("mtu") is None
    assert tunnel_mtu(consumer) == 1380 and tunnel_mtu(provider) == 1420
    assert result["network"]["endpoint"] == "172.31.0.2:51820"
    assert result["network"]["consumer"]["remappedPodCIDRs"] == ["10.64.0.0/16"]
    assert result["network"]["provider"]["remappedPodCIDRs"] == ["10.64.0.0/16"]
    # the virtual node says the tunnel is up (its own NetworkReady follows the gateway's)
    def tunnel_up(node: dict[str, Any]) -> bool:
        return (condition(node, "NetworkReady") or {}).get("reason") == "HandshakeRecent"

    await wait_for(consumer_client, NODES, "gpuferry-gpu-farm", tunnel_up)

    with pod_on(consumer, POD_IP, "consumer-pod") as here, pod_on(provider, POD_IP, "provider-pod") as there:
        # both ways, each by the other's remapped address; the same 10.244.1.10 on both sides does
        # not collide, and each pod sees the traffic come from its own gateway (what a strict CNI accepts)
        assert here.http(REMOTE_POD) == f"provider-pod {GATEWAY_IP}"
        assert there.http(REMOTE_POD) == f"consumer-pod {GATEWAY_IP}"
        assert here.ping(REMOTE_POD) and there.ping(REMOTE_POD)

        status = json.loads(await cli.ok("network", "status", "--kubeconfig", cli.c, "-o", "json"))
        (row,) = status["networks"]
        assert row["ready"] is True and row["peer"] == "gpu-farm" and row["endpoint"] == "172.31.0.2:51820"
        assert row["bytes"]["received"] > 0 and row["handshakeAge"] is not None
        provider_side = json.loads(await cli.ok("network", "status", "--kubeconfig", cli.p, "-o", "json"))
        (row,) = provider_side["networks"]
        assert row["peer"] == "ml-eu" and row["ready"] is True and row["endpoint"] is None
        assert row["peerSeenFrom"].startswith("172.31.0.1:")  # the consumer dialled in
        assert row["remaps"][0] == {"peer": "10.244.0.0/16", "here": "10.64.0.0/16"}
        assert "network fabric" in await cli.ok("network", "status", "--kubeconfig", cli.p)

        with cache_of(cli):
            # the tunnel's process dies (wireguard-go): the running gateway notices and re-applies
            netns = "gf-test-provider"
            gateway = find_agent("gateway", "gpu-farm-ml-eu")
            assert gateway is not None
            # the gateway publishes the interface it made (an internal name: a hash of the object)
            provider_pn = await provider_client.get(PEERNETWORKS, "ml-eu", "gpuferry-tenant-ml-eu")
            iface = provider_pn["status"]["interface"]
            (wg_pid,) = wireguard_go_pids(iface, netns=netns)
            os.kill(wg_pid, signal.SIGKILL)
            await eventually("traffic after wireguard-go was killed", answers(here, REMOTE_POD, FROM_GW))

            # the gateway process itself is killed and started again (as a Deployment would):
            # it converges from the objects, with the same remaps
            pid = gateway.pid()
            assert pid is not None
            os.killpg(pid, signal.SIGKILL)
        again = json.loads(await cli.ok("peer", "--kubeconfig", cli.c, "--remote-kubeconfig", cli.p, *PEER,
                                        "-o", "json"))  # fmt: skip
        assert again["network"]["provider"]["remappedPodCIDRs"] == ["10.64.0.0/16"]
        await eventually("traffic after the gateway restarted", answers(here, REMOTE_POD, FROM_GW))

        # the consumer's key is rotated (its Secret replaced): its gateway takes the new key, the
        # consumer agent carries the public key to the provider's PeerNetwork, traffic recovers
        before = await provider_client.get(PEERNETWORKS, "ml-eu", "gpuferry-tenant-ml-eu")
        await rotate_private_key(consumer_client, namespace="gpuferry-system", name=CONSUMER_KEY)

        async def carried() -> bool:
            obj = await provider_client.get(PEERNETWORKS, "ml-eu", "gpuferry-tenant-ml-eu")
            return bool(obj["spec"]["publicKey"] != before["spec"]["publicKey"])

        await eventually("the rotated key on the provider's PeerNetwork", carried)
        back = answers(there, REMOTE_POD, f"consumer-pod {GATEWAY_IP}")
        await eventually("traffic after the key rotation", back)

    # a twin namespace's EndpointSlices may point at the provider's pods and, through the fabric,
    # the consumer's (its remapped 10.64.0.0/16), nowhere else (CVE-2021-25740)
    ns = await make_namespace(consumer_client)
    await cli.ok("offload", "namespace", ns, "--kubeconfig", cli.c, "-q")
    twin = await wait_for(provider_client, NAMESPACES, f"{ns}-ml-eu", lambda n: True)
    assert twin["metadata"]["annotations"]["gpuferry.io/endpoint-cidrs"] == "10.244.0.0/16,10.64.0.0/16"

    # issue 16 §4: the provider routes the CIDRs it accepted when the consumer peered (the consumer
    # may not change them, tests/integration/test_hostile_consumer.py); and were its operator to
    # approve a range over its own gateway's (172.16.0.0/12 holds the WAN), the gateway refuses it
    tns = "gpuferry-tenant-ml-eu"
    tenant = await provider_client.get(TENANTS, "ml-eu", tns)
    accepted = tenant["status"]["acceptedNetwork"]
    assert accepted == {"podCIDRs": ["10.244.0.0/16"], "serviceCIDRs": ["10.96.0.0/16"]}, accepted
    await cli.ok("tenant", "accept-network", "ml-eu", "--kubeconfig", cli.p, "--pod-cidrs", "172.16.0.0/12",
                 "--service-cidrs", "10.96.0.0/16")  # fmt: skip

    def refused(obj: dict[str, Any]) -> bool:
        ready = condition(obj, "NetworkReady") or {}
        return ready.get("status") == "False" and "the peer's CIDR 172.16.0.0/12 overlaps this" in ready.get(
            "message", "")  # fmt: skip

    pnet = await wait_for(provider_client, PEERNETWORKS, "ml-eu", refused, namespace=tns, timeout=30)
    assert pnet["spec"]["podCIDRs"] == ["172.16.0.0/12"]
    message = condition(pnet, "NetworkReady")["message"]  # type: ignore[index]
    assert "routing it to the tunnel would hand this side's own traffic to the peer" in message, message

    await cli.ok("unpeer", "--kubeconfig", cli.c, "--remote-kubeconfig", cli.p, "-q")
    assert fabric_leftovers(consumer) == [] and fabric_leftovers(provider) == []
    with cache_of(cli):
        assert not [a for a in all_agents() if a.pid() is not None]
    for client, ns, name in (
        (consumer_client, "gpuferry-system", CONSUMER_KEY),
        (provider_client, "gpuferry-tenant-ml-eu", "gpuferry-gateway-ml-eu"),
    ):
        with pytest.raises(NotFound):
            await client.get(SECRETS, name, ns)
    assert (await consumer_client.list(PEERNETWORKS))["items"] == []
    assert (await provider_client.list(PEERNETWORKS))["items"] == []


async def test_a_malformed_declaration_stops_peer_before_any_change(
    cli: Cli, consumer_client: KubeClient
) -> None:
    declared = await consumer_client.get(CONFIGMAPS, "gpuferry-network", "kube-system")
    try:
        await consumer_client.patch(CONFIGMAPS, "gpuferry-network", {"data": {"podCIDRs": "10.244.0.1/16"}},
                                    "kube-system")  # fmt: skip
        code, _, err = await cli("peer", "--kubeconfig", cli.c, "--remote-kubeconfig", cli.p, *PEER)
        assert code != 0 and "Traceback" not in err
        assert "podCIDRs '10.244.0.1/16' is not an IPv4 network address" in err, err
        with pytest.raises(NotFound):  # not even the cluster ID was recorded
            await consumer_client.get(CONFIGMAPS, "gpuferry-cluster-id", "gpuferry-system")
    finally:
        await consumer_client.patch(CONFIGMAPS, "gpuferry-network", {"data": declared["data"]}, "kube-system")


NOWHERE = "gf-test-nowhere"


@pytest.mark.parametrize(
    "declared,expected",
    [
        # the declared gateway namespace is not there (a typo, a node without the fabric's network)
        ({"gatewayNetns": NOWHERE}, ["the consumer's gateway exited", f"{NOWHERE} does not exist"]),
        # local services fill the whole remap pool: the provider's pods have no free view
        ({"serviceCIDRs": "10.64.0.0/10"}, ["reports RemapPoolExhausted", "the peering itself stays"]),
    ],
)
async def test_a_gateway_that_cannot_come_up_fails_peer_at_once_and_unpeer_still_cleans_up(
    cli: Cli,
    consumer: LocalCluster,
    provider: LocalCluster,
    consumer_client: KubeClient,
    declared: dict[str, str],
    expected: list[str],
) -> None:
    before = await consumer_client.get(CONFIGMAPS, "gpuferry-network", "kube-system")
    try:
        await consumer_client.patch(CONFIGMAPS, "gpuferry-network", {"data": declared}, "kube-system")
        code, _, err = await cli("peer", "--kubeconfig", cli.c, "--remote-kubeconfig", cli.p, *PEER)
        assert code != 0 and "Traceback" not in err
        (line,) = [x for x in err.splitlines() if x.startswith("error:")]
        assert all(part in err for part in expected), err
        assert "after 120s" not in line, "a gateway that cannot come up is reported at once"
    finally:
        await consumer_client.patch(CONFIGMAPS, "gpuferry-network", {"data": before["data"]}, "kube-system")
    await cli.ok("unpeer", "--kubeconfig", cli.c, "--remote-kubeconfig", cli.p, "-q")
    assert fabric_leftovers(consumer) == [] and fabric_leftovers(provider) == []
    assert not await asyncio.to_thread(Path("/run/netns", NOWHERE).exists), "a gateway made its namespace"
    with cache_of(cli):
        assert not [a for a in all_agents() if a.pid() is not None]
