"""The twin namespaces' admission objects and the pin they read (the policies themselves are
checked against the real API server in tests/integration/test_e2e_story.py)."""

from __future__ import annotations

from peering.provider.admission import pin_annotations, twin_admission_objects
from peering.provider.builders import twin_namespace
from peering.provider.twins import pinned_selector


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


def test_policies_come_before_their_bindings_and_bind_twin_namespaces_only() -> None:
    objects = twin_admission_objects()
    kinds = [body["kind"] for _, body in objects]
    assert kinds == ["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"] * 2
    for _, body in objects[1::2]:
        assert body["spec"]["validationActions"] == ["Deny"]
        assert body["spec"]["matchResources"]["namespaceSelector"] == {
            "matchExpressions": [{"key": "gpuferry.io/origin-namespace", "operator": "Exists"}]}  # fmt: skip
