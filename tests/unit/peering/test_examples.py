"""The chart's examples say what the code does: a provider's admin who applies
``examples/peering-token.yaml`` gets exactly what ``gpuferry peer`` creates there."""

from __future__ import annotations

from pathlib import Path

import yaml

from peering.consumer.builders import desired_slice_spec
from peering.provider.builders import TOKEN_SECRET, peering_token_manifests

EXAMPLES = Path(__file__).resolve().parents[3] / "charts" / "gpuferry" / "examples"


def test_the_peering_token_example_is_what_the_builders_make() -> None:
    documents = list(yaml.safe_load_all((EXAMPLES / "peering-token.yaml").read_text()))
    assert documents == peering_token_manifests("ml-eu")
    kinds = [d["kind"] for d in documents]
    assert kinds == ["Namespace", "ServiceAccount", "Role", "RoleBinding", "Secret"]
    (secret,) = [d for d in documents if d["kind"] == "Secret"]
    assert secret["metadata"]["name"] == TOKEN_SECRET
    assert secret["type"] == "kubernetes.io/service-account-token"


def test_the_foreign_cluster_example_asks_for_a_slice_with_its_token() -> None:
    fc = yaml.safe_load((EXAMPLES / "foreigncluster.yaml").read_text())
    spec = fc["spec"]
    assert spec["role"] == "Provider" and spec["peeringTokenSecretRef"]["name"]
    asked = desired_slice_spec("ml-eu", spec["slice"])["resources"]
    assert asked == {"nvidia.com/gpu": "8", "cpu": "64", "memory": "512Gi", "pods": "110"}, (
        "what its comment promises"
    )
