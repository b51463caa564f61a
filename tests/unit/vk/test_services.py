"""Service copies and their EndpointSlice, as the provider reaches the endpoints. Pure."""

from __future__ import annotations

from typing import Any

from vk.forge.addresses import remapper
from vk.forge.services import remote_endpoint_slice, remote_service, slice_name, translator

NODE = "gpuferry-farm"


def svc(**spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "llm", "namespace": "ml", "uid": "u1", "labels": {"app": "llm"}},
        "spec": {"selector": {"app": "llm"}, "ports": [{"name": "http", "port": 80, "targetPort": 8000,
                                                          "protocol": "TCP", "nodePort": 30080}], **spec},
    }  # fmt: skip


def test_the_copy_has_no_selector_and_is_never_a_node_port() -> None:
    copy = remote_service(svc(type="NodePort", clusterIP="10.96.4.4"), namespace="ml-c", consumer_id="c")
    assert copy["metadata"]["namespace"] == "ml-c" and copy["metadata"]["labels"]["app"] == "llm"
    assert copy["metadata"]["labels"]["gpuferry.io/origin-cluster-id"] == "c"
    assert copy["spec"] == {
        "type": "ClusterIP",
        "ports": [{"name": "http", "protocol": "TCP", "port": 80, "targetPort": 8000}],
    }
    headless = remote_service(svc(clusterIP="None"), namespace="ml-c", consumer_id="c")
    assert headless["spec"]["clusterIP"] == "None"
    external = remote_service(svc(type="ExternalName", externalName="db.example.com"), namespace="x",
                              consumer_id="c")  # fmt: skip
    assert external["spec"] == {"type": "ExternalName", "externalName": "db.example.com"}


def consumer_slice(*endpoints: tuple[str, str]) -> dict[str, Any]:
    return {
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8000, "protocol": "TCP"}],
        "endpoints": [
            {"addresses": [ip], "nodeName": node, "conditions": {"ready": True}} for ip, node in endpoints
        ],
    }


def test_twins_are_listed_at_their_own_address_consumer_pods_in_the_providers_view() -> None:
    twin_back = remapper(["10.64.0.0/16"], ["10.244.0.0/16"])  # our view of the provider's pods, reversed
    to_provider = remapper(["10.244.0.0/16"], ["10.64.0.0/16"])  # the provider's view of our pods
    slices = [consumer_slice(("10.64.3.7", NODE), ("10.244.1.5", "worker-0")),
              {"addressType": "IPv6", "endpoints": [{"addresses": ["fd00::1"]}]}]  # fmt: skip
    body = remote_endpoint_slice(svc(), slices, namespace="ml-c", consumer_id="c",
                                 translate=translator(NODE, twin_back, to_provider))  # fmt: skip
    assert body["metadata"]["name"] == slice_name("llm") == "llm-gpuferry"
    assert body["metadata"]["labels"]["kubernetes.io/service-name"] == "llm"
    assert [e["addresses"] for e in body["endpoints"]] == [["10.244.3.7"], ["10.64.1.5"]]
    assert body["ports"] == [{"name": "http", "port": 8000, "protocol": "TCP"}]
    # without the fabric the provider cannot reach consumer pods: only the twin is listed
    alone = remote_endpoint_slice(svc(), slices, namespace="ml-c", consumer_id="c",
                                  translate=translator(NODE, twin_back, None))  # fmt: skip
    assert [e["addresses"] for e in alone["endpoints"]] == [["10.244.3.7"]]


def test_a_long_service_name_still_gives_a_valid_slice_name() -> None:
    assert len(slice_name("s" * 63)) <= 63
