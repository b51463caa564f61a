"""The route agent's choices: which next hop (the gateway pod here, its node elsewhere, none
when no gateway pod runs) and which CIDRs (every PeerNetwork's remaps, once)."""

from __future__ import annotations

from ipaddress import IPv4Address
from typing import Any

from netfabric.routeagent import NextHop, next_hop, wanted_remaps


def pod(name: str, node: str, ip: str | None, host: str = "172.31.0.12", *, ready: bool = True,
        phase: str = "Running", created: str = "2026-11-24T10:00:00Z",
        deleting: bool = False) -> dict[str, Any]:  # fmt: skip
    meta: dict[str, Any] = {"name": name, "creationTimestamp": created}
    if deleting:
        meta["deletionTimestamp"] = "2026-11-24T11:00:00Z"
    ready_condition = {"type": "Ready", "status": "True" if ready else "False"}
    status: dict[str, Any] = {"phase": phase, "hostIP": host, "conditions": [ready_condition]}
    if ip:
        status["podIP"] = ip
    return {"metadata": meta, "spec": {"nodeName": node}, "status": status}


def test_the_gateway_pod_is_the_next_hop_on_its_node_and_its_node_elsewhere() -> None:
    gateway = pod("gw", "real-0", "10.244.10.7", host="172.31.0.12")
    assert next_hop([gateway], "real-0") == NextHop(IPv4Address("10.244.10.7"), local=True)
    assert next_hop([gateway], "real-1") == NextHop(IPv4Address("172.31.0.12"), local=False)


def test_no_running_gateway_pod_means_no_next_hop() -> None:
    assert next_hop([], "real-0") is None
    assert next_hop([pod("gw", "real-0", None, phase="Pending")], "real-0") is None
    assert next_hop([pod("gw", "real-0", "10.244.10.7", deleting=True)], "real-0") is None
    assert next_hop([pod("gw", "real-0", "10.244.10.7", phase="Succeeded")], "real-0") is None


def test_during_a_rollout_the_ready_and_newer_pod_wins() -> None:
    old = pod("old", "real-0", "10.244.10.7", created="2026-11-24T10:00:00Z")
    new_unready = pod("new", "real-0", "10.244.10.8", created="2026-11-24T10:05:00Z", ready=False)
    assert next_hop([old, new_unready], "real-0") == NextHop(IPv4Address("10.244.10.7"), local=True)
    new_ready = pod("new", "real-0", "10.244.10.8", created="2026-11-24T10:05:00Z")
    assert next_hop([old, new_ready], "real-0") == NextHop(IPv4Address("10.244.10.8"), local=True)


def peer_network(pods: list[str], services: list[str], remapped_pods: list[str],
                 remapped_services: list[str]) -> dict[str, Any]:  # fmt: skip
    return {
        "metadata": {"name": "p", "namespace": "ns"},
        "spec": {"podCIDRs": pods, "serviceCIDRs": services},
        "status": {"remappedPodCIDRs": remapped_pods, "remappedServiceCIDRs": remapped_services},
    }


def test_every_peer_networks_remaps_are_routed_once_in_a_stable_order() -> None:
    a = peer_network(["10.244.0.0/16"], ["10.96.0.0/12"], ["10.64.0.0/16"], ["10.80.0.0/12"])
    b = peer_network(["10.245.0.0/16"], [], ["10.65.0.0/16"], [])
    not_yet = peer_network(["10.246.0.0/16"], [], [], [])  # its gateway has not remapped it yet
    views = [str(r.local_view) for r in wanted_remaps([b, a, a, not_yet])]
    assert views == ["10.64.0.0/16", "10.65.0.0/16", "10.80.0.0/12"]
