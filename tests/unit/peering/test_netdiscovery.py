"""What gpuferry install finds of a cluster's network: pod CIDRs from the nodes (widened to the
cluster CIDR they come from), service CIDRs from the ServiceCIDRs, a real node's address."""

from __future__ import annotations

from typing import Any

from peering.netdiscovery import endpoint_address, pod_cidrs, service_cidrs


def node(name: str, cidrs: list[str], addresses: dict[str, str] | None = None, *, fake: bool = False,
         ready: bool = True) -> dict[str, Any]:  # fmt: skip
    meta: dict[str, Any] = {"name": name, "annotations": {"kwok.x-k8s.io/node": "fake"} if fake else {}}
    return {
        "metadata": meta,
        "spec": {"podCIDRs": cidrs},
        "status": {
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            "addresses": [{"type": k, "address": v} for k, v in (addresses or {}).items()],
        },
    }


def test_node_pod_cidrs_widen_to_the_cluster_cidr_they_come_from() -> None:
    assert pod_cidrs([node("a", ["10.244.10.0/24"]), node("b", ["10.244.1.0/24"])]) == ["10.244.0.0/16"]
    assert pod_cidrs([node("a", ["10.244.10.0/24"])]) == ["10.244.0.0/16"]
    # nodes spread wider than a /16: the smallest supernet holding them all
    assert pod_cidrs([node("a", ["10.244.0.0/24"]), node("b", ["10.245.0.0/24"])]) == ["10.244.0.0/15"]
    # IPv6 halves of dual-stack nodes are left out; no CIDR at all is nothing found
    assert pod_cidrs([node("a", ["10.244.3.0/24", "fd00::/64"])]) == ["10.244.0.0/16"]
    assert pod_cidrs([node("a", [])]) == []


def test_service_cidrs_come_from_the_servicecidr_objects_default_first() -> None:
    objects = [
        {"metadata": {"name": "extra"}, "spec": {"cidrs": ["10.200.0.0/16"]}},
        {"metadata": {"name": "kubernetes"}, "spec": {"cidrs": ["10.96.0.0/12", "fd00:10:96::/112"]}},
    ]
    assert service_cidrs(objects) == ["10.96.0.0/12", "10.200.0.0/16"]
    assert service_cidrs([]) == []


def test_the_endpoint_is_a_ready_real_nodes_address() -> None:
    nodes = [
        node("kwok-0", [], {"InternalIP": "127.0.0.1"}, fake=True),
        node("real-1", [], {"InternalIP": "172.31.0.13"}, ready=False),
        node("real-0", [], {"InternalIP": "172.31.0.12"}),
    ]
    assert endpoint_address(nodes) == "172.31.0.12"
    nodes.append(node("edge", [], {"InternalIP": "172.31.0.14", "ExternalIP": "203.0.113.7"}))
    assert endpoint_address(nodes) == "203.0.113.7"  # peers may be outside the node network
    assert endpoint_address(nodes[:2]) is None
