"""What crosses between a consumer and a provider through objects, as pure functions: the GPU
slice asked for, the VirtualNode that follows the grant, and the network each side tells the other
(CIDRs, gateway keys, where the provider's gateway listens) through the Tenant."""

from __future__ import annotations

from typing import Any

from kube.declaration import Declaration
from kube.errors import Forbidden, Unreachable
from kube.objects import ObjectKey
from peering.consumer.builders import (
    consumer_network,
    consumer_peer_network,
    desired_slice_spec,
    same_slice_spec,
    slice_decided,
    virtual_node,
    virtual_node_spec_from_grant,
)
from peering.consumer.enrolment import request_failed
from peering.provider.networks import consumer_foreign_cluster, provider_peer_network, published_network

KEY_A = "xTIBA5rboUvnH4htodjb6e697QjLERt1NAB4mZqp8Dg="
KEY_B = "TrMvSoP4jYQlY6RIzBgbssQqY3vxI2Pi+y71lOWWXX0="
CONSUMER = Declaration(pod_cidrs=("10.244.0.0/16",), service_cidrs=("10.96.0.0/16",))
PROVIDER = Declaration(
    pod_cidrs=("10.244.0.0/16",), service_cidrs=("10.96.0.0/16",), endpoint_address="172.31.0.2"
)


def test_the_slice_asked_for_and_when_it_is_decided() -> None:
    spec = desired_slice_spec(
        "ml-eu",
        {"resources": {"nvidia.com/gpu": 4, "cpu": "32"}, "nodeSelector": {"nvidia.com/gpu.product": "H100"}},
    )
    assert spec == {
        "consumerClusterID": "ml-eu",
        "resources": {"nvidia.com/gpu": "4", "cpu": "32", "pods": "110", "memory": "256Gi"},
        "nodeSelector": {"nvidia.com/gpu.product": "H100"},
        "allowPartial": False,
    }, "pods default to a kubelet's 110: a virtual node without pods in its grant fits no pod"
    asked = desired_slice_spec("ml-eu", {"resources": {"nvidia.com/gpu": 2, "pods": 20}})
    assert asked["resources"] == {"nvidia.com/gpu": "2", "pods": "20", "cpu": "16", "memory": "128Gi"}, (
        "what GPUs need beside them, per GPU, when not named: the provider enforces the grant to the letter"
    )
    assert desired_slice_spec("ml-eu", {"resources": {"cpu": "4"}})["resources"] == {
        "cpu": "4",
        "pods": "110",
    }
    # the API server returns quantities as it stores them: "4" and 4 ask for the same
    assert same_slice_spec(
        {**spec, "resources": {"nvidia.com/gpu": 4, "cpu": "32", "pods": 110, "memory": "256Gi"}}, spec
    )
    assert not same_slice_spec({**spec, "allowPartial": True}, spec)
    decided = {"metadata": {"generation": 2}, "status": {"phase": "Granted", "observedGeneration": 2}}
    assert slice_decided(decided)
    assert not slice_decided({**decided, "status": {"phase": "Granted", "observedGeneration": 1}}), (
        "older spec"
    )
    assert not slice_decided(
        {"metadata": {"generation": 1}, "status": {"phase": "Pending", "observedGeneration": 1}}
    )


def test_the_virtual_node_follows_the_grant_and_a_denial_leaves_it_alone() -> None:
    granted = {
        "status": {
            "phase": "PartiallyGranted",
            "granted": {"nvidia.com/gpu": "2"},
            "shape": {"largest": {"nvidia.com/gpu": "1"}},
            "labels": {"nvidia.com/gpu.product": "L4"},
        }
    }
    grant = virtual_node_spec_from_grant(granted)
    assert grant == {
        "resources": {"nvidia.com/gpu": "2"},
        "shape": {"nvidia.com/gpu": "1"},
        "labels": {"nvidia.com/gpu.product": "L4"},
    }
    assert virtual_node_spec_from_grant({"status": {"phase": "Denied", "granted": {}}}) is None
    vn = virtual_node(
        provider_id="farm",
        consumer_id="ml-eu",
        grant=grant,
        selector={"a": "b"},
        secret="gpuferry-identity-farm",
    )
    assert vn["metadata"] == {
        "name": "farm",
        "namespace": "gpuferry-system",
        "labels": {"gpuferry.io/provider": "farm"},
    }
    assert (
        vn["spec"]["nodeName"] == "gpuferry-farm" and vn["spec"]["tenantNamespace"] == "gpuferry-tenant-ml-eu"
    )
    assert vn["spec"]["kubeconfigSecretRef"] == {"name": "gpuferry-identity-farm", "key": "kubeconfig"}


def test_the_consumer_tells_its_network_and_a_rotated_key() -> None:
    assert consumer_network(CONSUMER, None) == {
        "podCIDRs": ["10.244.0.0/16"],
        "serviceCIDRs": ["10.96.0.0/16"],
    }
    assert consumer_network(CONSUMER, KEY_A)["publicKey"] == KEY_A
    assert consumer_network(CONSUMER, KEY_B)["publicKey"] == KEY_B  # a rotated key crosses the same way
    # the provider turns it into the PeerNetwork its gateway reconciles: the consumer dials in
    pn = provider_peer_network("ml-eu", consumer_network(CONSUMER, KEY_A))
    assert pn["metadata"]["namespace"] == "gpuferry-tenant-ml-eu" and pn["metadata"]["name"] == "ml-eu"
    assert pn["spec"] == {
        "clusterID": "ml-eu",
        "podCIDRs": ["10.244.0.0/16"],
        "serviceCIDRs": ["10.96.0.0/16"],
        "publicKey": KEY_A,
    }
    assert "publicKey" not in provider_peer_network("ml-eu", consumer_network(CONSUMER, None))["spec"]


def peer_network(key: str | None, port: int | None, ready: bool) -> dict[str, Any]:
    return {
        "metadata": {"annotations": {"net.gpuferry.io/local-public-key": key} if key else {}},
        "status": {
            **({"listenPort": port} if port else {}),
            "conditions": [{"type": "NetworkReady", "status": "True" if ready else "False"}],
        },
    }


def test_the_provider_publishes_its_side_as_its_gateway_learns_it() -> None:
    assert published_network(PROVIDER, None) == {
        "podCIDRs": ["10.244.0.0/16"],
        "serviceCIDRs": ["10.96.0.0/16"],
    }
    waiting = published_network(PROVIDER, peer_network(KEY_B, None, False))
    assert waiting["publicKey"] == KEY_B and "endpoint" not in waiting and waiting["ready"] is False
    up = published_network(PROVIDER, peer_network(KEY_B, 51823, True))
    assert up["endpoint"] == {"address": "172.31.0.2", "port": 51823} and up["ready"] is True
    nowhere = Declaration(pod_cidrs=("10.244.0.0/16",), service_cidrs=("10.96.0.0/16",))
    assert "endpoint" not in published_network(nowhere, peer_network(KEY_B, 51823, True)), (
        "no endpointAddress"
    )


def test_the_consumer_describes_the_provider_once_it_published_its_cidrs() -> None:
    assert consumer_peer_network("farm", {}) is None
    partial = consumer_peer_network("farm", published_network(PROVIDER, None))
    assert partial is not None and "publicKey" not in partial["spec"] and "endpoint" not in partial["spec"]
    full = consumer_peer_network("farm", published_network(PROVIDER, peer_network(KEY_B, 51823, True)))
    assert full is not None
    assert full["spec"]["publicKey"] == KEY_B
    assert full["spec"]["endpoint"] == {"address": "172.31.0.2", "port": 51823}
    assert full["metadata"] == {
        "name": "farm",
        "namespace": "gpuferry-system",
        "labels": {"app.kubernetes.io/managed-by": "gpuferry", "gpuferry.io/peer": "farm"},
    }


def test_a_consumer_of_this_provider_is_a_foreign_cluster_here() -> None:
    fc = consumer_foreign_cluster("ml-eu")
    assert fc["spec"] == {"clusterID": "ml-eu", "role": "Consumer"}


def test_a_failed_enrolment_request_names_its_cause() -> None:
    away = request_failed(Unreachable("connection refused"), "https://gpu-farm:6443")
    assert (away.reason, away.retry) == ("ProviderUnreachable", 5)
    assert away.message.startswith("https://gpu-farm:6443: ")
    denied = request_failed(
        Forbidden("secrets is forbidden", status=403, reason="Forbidden",
                  object_key=ObjectKey("gpuferry-system", "gpuferry-identity-gpu-farm")),
        "https://gpu-farm:6443",
    )  # fmt: skip
    assert denied.reason == "RequestFailed", "an answer that says no is not an unreachable provider"
    assert "secrets is forbidden" in denied.message and "gpuferry-identity-gpu-farm" in denied.message
    assert "https://gpu-farm" not in denied.message
