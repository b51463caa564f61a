from __future__ import annotations

from netfabric.app import remaps_from_status


def test_remaps_from_status_needs_a_status_for_the_current_spec() -> None:
    spec = {"podCIDRs": ["10.244.0.0/16"], "serviceCIDRs": ["10.96.0.0/16"]}
    status = {"remappedPodCIDRs": ["10.70.0.0/16"], "remappedServiceCIDRs": ["10.71.0.0/16"]}
    assert [str(r.local_view) for r in remaps_from_status({"spec": spec, "status": status})] == [
        "10.70.0.0/16",
        "10.71.0.0/16",
    ]
    assert remaps_from_status({"spec": spec}) == []
    assert remaps_from_status({"spec": spec, "status": {**status, "remappedPodCIDRs": ["bad"]}}) == []
