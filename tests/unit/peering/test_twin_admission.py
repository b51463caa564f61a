"""The twin namespaces' admission objects and the pin they read (the policies themselves are
checked against the real API server in tests/integration/test_e2e_story.py)."""

from __future__ import annotations

import re
from pathlib import Path

from peering.provider.admission import (
    ENDPOINTS_POLICY,
    PODS_POLICY,
    POLICY_NAMES,
    SERVICES_POLICY,
    pin_annotations,
    twin_admission_objects,
)
from peering.provider.builders import twin_namespace
from peering.provider.twins import endpoint_cidrs, pinned_selector


def test_the_pin_is_the_selector_every_grant_in_force_was_decided_for() -> None:
    def granted(selector: dict[str, str], phase: str = "Granted") -> dict[str, object]:
        return {"metadata": {"name": "s"}, "status": {"phase": phase, "nodeSelector": selector}}

    h100 = {"nvidia.com/gpu.product": "H100", "zone": "a"}
    assert pinned_selector([granted(h100)]) == h100
    assert pinned_selector([granted(h100), granted({"nvidia.com/gpu.product": "H100"})]) == {
        "nvidia.com/gpu.product": "H100"}  # fmt: skip
    assert pinned_selector([granted(h100, "Denied")]) == {}  # no grant: quota 0, nothing to pin
    ns = twin_namespace("ml-c", "c", "ml", "baseline", h100)
    assert ns["metadata"]["annotations"] == {"node-selector.gpuferry.io/0": "nvidia.com/gpu.product=H100",
                                             "node-selector.gpuferry.io/1": "zone=a"}  # fmt: skip
    assert "annotations" not in twin_namespace("ml-c", "c", "ml", "baseline")["metadata"]
    assert pin_annotations({}) == {}


def test_policies_come_before_their_bindings_and_bind_what_they_guard() -> None:
    objects = twin_admission_objects()
    kinds = [body["kind"] for _, body in objects]
    assert kinds == ["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"] * 5
    names = [body["metadata"]["name"] for _, body in objects]
    assert names[::2] == names[1::2] == list(POLICY_NAMES)
    twin_only = {"matchExpressions": [{"key": "gpuferry.io/origin-namespace", "operator": "Exists"}]}
    for _, body in objects[1::2]:
        assert body["spec"]["validationActions"] == ["Deny"]
        guards_twins = body["metadata"]["name"] in (PODS_POLICY, SERVICES_POLICY, ENDPOINTS_POLICY)
        assert body["spec"].get("matchResources", {}).get("namespaceSelector") == (
            twin_only if guards_twins else None), body  # fmt: skip
    # what the consumer writes itself is checked for consumers only: the provider's operators approve
    for _, body in objects[6::2]:
        (condition,) = body["spec"]["matchConditions"]
        assert "'gpuferry:consumers' in request.userInfo.groups" in condition["expression"]
        assert ":gpuferry-peering'" in condition["expression"]


def test_the_chart_lets_the_provider_controller_keep_every_policy_and_no_other() -> None:
    template = (Path(__file__).parents[3] / "charts/gpuferry/templates/provider.yaml").read_text()
    (names,) = re.findall(r'resourceNames: \[("gpuferry-twin-pods"[^\]]*)\]', template)
    assert sorted(re.findall(r'"([^"]+)"', names)) == sorted(POLICY_NAMES)


def test_endpoint_slices_may_point_at_the_provider_pods_and_the_consumers_through_the_fabric() -> None:
    declaration = {"data": {"podCIDRs": "10.244.0.0/16, 10.245.0.0/16", "serviceCIDRs": "10.96.0.0/16"}}
    network = {"status": {"remappedPodCIDRs": ["10.64.0.0/16"]}}
    assert endpoint_cidrs(declaration, network) == ("10.244.0.0/16", "10.245.0.0/16", "10.64.0.0/16")
    assert endpoint_cidrs(declaration, None) == ("10.244.0.0/16", "10.245.0.0/16")  # no fabric
    assert endpoint_cidrs(None, network) == ()  # no declaration: the pod CIDRs are not known
    ns = twin_namespace("ml-c", "c", "ml", "baseline", None, ("10.244.0.0/16", "10.64.0.0/16"))
    assert ns["metadata"]["annotations"] == {"gpuferry.io/endpoint-cidrs": "10.244.0.0/16,10.64.0.0/16"}
