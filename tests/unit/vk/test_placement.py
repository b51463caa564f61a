from __future__ import annotations

from typing import Any

from vk.forge.labels import virtual_node_identity
from vk.forge.placement import forge_affinity, forge_node_selector, forge_tolerations

from .builders import PROVIDER_ID, VIRTUAL_NODE, VIRTUAL_NODE_TOLERATION

IDENTITY = virtual_node_identity(PROVIDER_ID, VIRTUAL_NODE)
PROVIDER = "gpuferry.io/provider"
H100 = {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-H100-80GB-HBM3"]}


def _expr(key: str, operator: str, *values: str) -> dict[str, Any]:
    return {"key": key, "operator": operator, **({"values": list(values)} if values else {})}


def _required(*terms: dict[str, Any]) -> dict[str, Any]:
    required = {"nodeSelectorTerms": list(terms)}
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}}


def test_node_selector_loses_identity_keys_only() -> None:
    selector = {
        "type": "virtual-kubelet",
        "gpuferry.io/provider": PROVIDER_ID,
        "kubernetes.io/role": "agent",
        "kubernetes.io/hostname": VIRTUAL_NODE,
        "topology.kubernetes.io/zone": "eu-1a",
    }
    assert forge_node_selector(selector, IDENTITY) == {"topology.kubernetes.io/zone": "eu-1a"}
    assert forge_node_selector({"type": "virtual-kubelet"}, IDENTITY) is None
    assert forge_node_selector(None, IDENTITY) is None


def test_tolerations_lose_the_virtual_node_one() -> None:
    gpu = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    wildcard = {"operator": "Exists"}
    assert forge_tolerations([VIRTUAL_NODE_TOLERATION, gpu, wildcard]) == [gpu, wildcard]
    assert forge_tolerations([VIRTUAL_NODE_TOLERATION]) is None


def test_identity_expressions_removed_other_kept() -> None:
    affinity = _required({"matchExpressions": [_expr("gpuferry.io/provider", "In", PROVIDER_ID), H100]})
    assert forge_affinity(affinity, IDENTITY, VIRTUAL_NODE) == _required({"matchExpressions": [H100]})


def test_term_with_only_identity_makes_required_unconstrained() -> None:
    affinity = _required(
        {"matchExpressions": [_expr("type", "In", "virtual-kubelet")]}, {"matchExpressions": [H100]}
    )
    assert forge_affinity(affinity, IDENTITY, VIRTUAL_NODE) is None


def test_terms_targeting_another_provider_are_dropped() -> None:
    # ORed terms: this pod landed here through the first; the second names another provider.
    affinity = _required(
        {"matchExpressions": [_expr("gpuferry.io/provider", "In", PROVIDER_ID), H100]},
        {"matchExpressions": [_expr("gpuferry.io/provider", "In", "other")]},
    )
    assert forge_affinity(affinity, IDENTITY, VIRTUAL_NODE) == _required({"matchExpressions": [H100]})


def test_match_fields_on_the_virtual_node_name() -> None:
    affinity = _required({"matchFields": [_expr("metadata.name", "In", VIRTUAL_NODE)]})
    assert forge_affinity(affinity, IDENTITY, VIRTUAL_NODE) is None


def test_operators_are_evaluated() -> None:
    affinity = _required(
        {"matchExpressions": [_expr("type", "NotIn", "virtual-kubelet"), _expr("zone", "In", "a")]},
        {"matchExpressions": [_expr("kubernetes.io/hostname", "Exists"), _expr("zone", "In", "b")]},
        {"matchExpressions": [_expr("gpuferry.io/provider", "DoesNotExist"), _expr("zone", "In", "c")]},
    )
    assert forge_affinity(affinity, IDENTITY, VIRTUAL_NODE) == _required(
        {"matchExpressions": [_expr("zone", "In", "b")]}
    )


def test_labels_changed_after_binding_still_let_the_pod_run() -> None:
    affinity = _required({"matchExpressions": [_expr("gpuferry.io/provider", "In", "old-id"), H100]})
    assert forge_affinity(affinity, IDENTITY, VIRTUAL_NODE) == _required({"matchExpressions": [H100]})


def test_preferred_terms_and_pod_affinity() -> None:
    anti = {
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {"matchLabels": {"app": "finetune"}},
                    "topologyKey": "kubernetes.io/hostname",
                }
            ]
        }
    }
    affinity = {
        **anti,
        "nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 10, "preference": {"matchExpressions": [_expr("type", "In", "virtual-kubelet")]}},
                {"weight": 5, "preference": {"matchExpressions": [_expr(PROVIDER, "In", "other"), H100]}},
                {
                    "weight": 1,
                    "preference": {"matchExpressions": [_expr("kubernetes.io/role", "In", "agent"), H100]},
                },
            ]
        },
    }
    assert forge_affinity(affinity, IDENTITY, VIRTUAL_NODE) == {
        **anti,
        "nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 1, "preference": {"matchExpressions": [H100]}}
            ]
        },
    }
    assert forge_affinity(None, IDENTITY, VIRTUAL_NODE) is None
    exists = _required({"matchExpressions": [_expr("type", "Exists")]})
    assert forge_affinity(exists, IDENTITY, VIRTUAL_NODE) is None


def test_numeric_operators() -> None:
    identity = {**IDENTITY, "gpuferry.io/provider": "7"}
    gt = _required(
        {"matchExpressions": [_expr("gpuferry.io/provider", "Gt", "5"), H100]},
        {"matchExpressions": [_expr("gpuferry.io/provider", "Lt", "5"), _expr("zone", "In", "x")]},
    )
    assert forge_affinity(gt, identity, VIRTUAL_NODE) == _required({"matchExpressions": [H100]})


def test_virtual_only_labels_are_dropped_from_selector_and_affinity() -> None:
    from vk.forge.placement import forge_affinity, forge_node_selector

    identity = {"type": "virtual-node"}
    selector = {"gpuferry.io/largest-gpu-block": "4", "nvidia.com/gpu.product": "H100"}
    assert forge_node_selector(selector, identity) == {"nvidia.com/gpu.product": "H100"}
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {"key": "gpuferry.io/largest-gpu-block", "operator": "Gt", "values": ["2"]},
                            {"key": "zone", "operator": "In", "values": ["a"]},
                        ]
                    }
                ]
            }
        }
    }
    forged = forge_affinity(affinity, identity, "vk-1")
    assert forged is not None
    terms = forged["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}]
