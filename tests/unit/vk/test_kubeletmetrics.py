"""The kubelet's own gauges that dashboards count kubelets and their pods by, told of the virtual
node's pods."""

from __future__ import annotations

import itertools

from prometheus_client.parser import text_string_to_metric_families

from kube.objects import RawObject
from vk.forge.kubeletmetrics import container_states, kubelet_metrics, pod_states
from vk.forge.usage import PodTexts

_names = itertools.count()


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
    return {"metadata": {"name": f"p{next(_names)}", "namespace": "ml"}, "status": found}


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


def test_kept_counts_are_those_of_each_pod_as_it_is_now() -> None:
    """The virtual kubelet keeps each pod's counts between scrapes of ``/metrics``: a pod that
    changed (a new resourceVersion) is counted as it is now, one gone no more."""

    def counted(text: str) -> dict[str, float]:
        families = text_string_to_metric_families(text)
        return {f"{s.name}{sorted(s.labels.items())}": s.value for family in families
                for s in family.samples if s.name != "kubelet_node_name"}  # fmt: skip

    kept = PodTexts(pod_states)
    a, b = pod("Running", ("running", True)), pod("Pending", ("waiting", True))
    for i, p in enumerate((a, b)):
        p["metadata"].update(uid=f"u{i}", resourceVersion="1")
    assert counted(kubelet_metrics("n", [a, b], kept)) == counted(kubelet_metrics("n", [a, b]))
    b = pod("Running", ("running", True))
    b["metadata"].update(uid="u1", resourceVersion="2")
    assert counted(kubelet_metrics("n", [a, b], kept)) == {
        "kubelet_running_containers[('container_state', 'running')]": 2,
        "kubelet_running_pods[]": 2,
    }
    assert counted(kubelet_metrics("n", [b], kept))["kubelet_running_pods[]"] == 1
    assert len(kept) == 1
