"""The kubelet's own gauges that dashboards count kubelets and their pods by, told of the virtual
node's pods."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from kube.objects import RawObject
from vk.forge.kubeletmetrics import container_states, kubelet_metrics


def pod(phase: str, *states: tuple[str, bool], init: tuple[str, bool] | None = None) -> RawObject:
    """A consumer pod in ``phase`` whose containers are in ``states`` ((state, has an ID))."""

    def status(i: int, state: str, made: bool) -> RawObject:
        return {
            "name": f"c{i}",
            "state": {state: {}},
            **({"containerID": f"containerd://{i}"} if made else {}),
        }

    found: RawObject = {
        "phase": phase,
        "containerStatuses": [status(i, s, m) for i, (s, m) in enumerate(states)],
    }
    if init is not None:
        found["initContainerStatuses"] = [status(9, *init)]
    return {"metadata": {"name": "p", "namespace": "ml"}, "status": found}


def test_containers_are_counted_by_the_runtimes_state_names() -> None:
    pods = [
        pod("Running", ("running", True), ("running", True), init=("terminated", True)),
        pod("Pending", ("waiting", True), ("waiting", False)),  # one made, one still pulling
        pod("Succeeded", ("terminated", True)),
    ]
    assert container_states(pods) == {"running": 2, "exited": 2, "created": 1}


def test_kubelet_metrics_name_the_node_and_count_its_running_pods() -> None:
    pods = [pod("Running", ("running", False)), pod("Running", ("running", True)), pod("Pending")]
    text = kubelet_metrics("gpuferry-gpu-farm", pods)
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert samples == {
        ("kubelet_node_name", (("node", "gpuferry-gpu-farm"),)): 1,
        ("kubelet_running_containers", (("container_state", "running"),)): 2,
        ("kubelet_running_pods", ()): 2,
    }
    assert "kubelet_running_pods 0" in kubelet_metrics("gpuferry-gpu-farm", []).splitlines()
