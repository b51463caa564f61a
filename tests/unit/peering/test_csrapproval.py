"""The consumer agent's verdict on kubelet-serving CSRs: only its own virtual kubelets' requests,
for their own node and its own addresses, as serving certificates."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from peering.csrapproval import Decision, decide
from vk.kubelet.certificates import csr_object, make_key_and_csr

AGENT = "kubernetes-admin"
NODE = "gpuferry-farm"


def request(node: str = NODE, addresses: tuple[str, ...] = ("127.0.0.1",), **spec: Any) -> dict[str, Any]:
    csr = csr_object("n-serving-1", make_key_and_csr(node, addresses).csr_pem, expiration_seconds=3600)
    csr["spec"] |= {"username": AGENT, **spec}
    return csr


def node(address: str = "127.0.0.1", kind: str = "virtual-kubelet") -> dict[str, Any]:
    return {
        "metadata": {"name": NODE, "labels": {"type": kind}},
        "status": {"addresses": [{"type": "InternalIP", "address": address}]},
    }


def verdict(
    csr: dict[str, Any], n: dict[str, Any] | None = None, nodes: set[str] | None = None
) -> tuple[Decision, str]:
    kubelets = {name: AGENT for name in ({NODE} if nodes is None else nodes)}
    v = decide(csr, kubelets=kubelets, node=n)
    return v.decision, v.reason


def test_our_kubelets_request_for_its_own_node_and_address_is_approved() -> None:
    assert verdict(request(), node())[0] is Decision.APPROVE


def test_a_request_whose_node_is_not_registered_yet_waits() -> None:
    assert verdict(request(), None)[0] is Decision.WAIT


@pytest.mark.parametrize(
    "csr,n,nodes,why",
    [
        (request(addresses=("10.1.2.3",)), node(), None, "are not addresses node"),
        (request(addresses=("127.0.0.1", "evil.example.com")), node(), None, "are not addresses node"),
        (request(node="worker-0"), node(), None, "not one of gpuferry's virtual nodes"),
        (request(), node(kind="real"), None, "not registered as a virtual kubelet"),
        (request(usages=["client auth"]), node(), None, "not a serving certificate's"),
        (request(usages=["server auth", "cert sign"]), node(), None, "not a serving certificate's"),
        (request(), node(), {"gpuferry-other"}, "not one of gpuferry's virtual nodes"),
        (request(request=base64.b64encode(b"junk").decode()), node(), None, "not a PEM CSR"),
    ],
)
def test_a_request_of_ours_that_fails_a_check_is_denied_with_the_reason(
    csr: dict[str, Any], n: dict[str, Any], nodes: set[str] | None, why: str
) -> None:
    decision, reason = verdict(csr, n, nodes)
    assert decision is Decision.DENY and why in reason, reason


@pytest.mark.parametrize(
    "csr",
    [
        request(username="system:node:worker-0"),  # someone else's: the cluster's own approver judges it
        request(signerName="kubernetes.io/kube-apiserver-client"),
        {**request(), "status": {"conditions": [{"type": "Approved", "status": "True"}]}},
    ],
)
def test_requests_that_are_not_ours_or_already_decided_are_left_alone(csr: dict[str, Any]) -> None:
    assert verdict(csr, node())[0] is Decision.IGNORE


def test_a_kubelet_running_as_its_own_account_gets_only_its_own_nodes_certificate() -> None:
    """In the cluster each VirtualNode's kubelet runs as its own ServiceAccount."""
    mine, other = "system:serviceaccount:gpuferry-system:gf-vk-farm", "system:serviceaccount:x:gf-vk-b"
    kubelets = {NODE: mine, "gpuferry-b": other}
    assert decide(request(username=mine), kubelets=kubelets, node=node()).decision is Decision.APPROVE
    stolen = decide(request(username=other), kubelets=kubelets, node=node())
    assert stolen.decision is Decision.DENY and f"runs as {mine}, not {other}" in stolen.reason
    assert decide(request(username=AGENT), kubelets=kubelets, node=node()).decision is Decision.IGNORE
