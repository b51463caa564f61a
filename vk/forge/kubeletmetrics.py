"""What a kubelet says of itself on ``/metrics`` that Prometheus' usual kubelet dashboards read,
told of the virtual node's pods. Pure.

kube-prometheus' "Kubernetes / Kubelet" dashboard counts the kubelets by ``kubelet_node_name``
and shows each one's ``kubelet_running_pods`` and ``kubelet_running_containers``; a virtual
node without them is scraped (its own ``gpuferry_*`` and ``process_*`` families) but shows as no
kubelet at all. Here a pod runs when its consumer pod is Running (its twin is, on the provider),
and its containers' states are those the twins' kubelet reported back.

Left out: ``kubelet_certificate_manager_server_ttl_seconds``. The virtual kubelet's serving
certificate lives a day by default and is renewed at 80 % of that, where kube-prometheus'
``KubeletServerCertificateExpiration`` fires below seven days (critical below one): it would
fire for good on a certificate that is renewed on time.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import NamedTuple

from kube.objects import RawObject

from .usage import PodLike, PodTexts, series_line

STATE_NAMES = {"running": "running", "terminated": "exited", "waiting": "created"}
"""A container status's state, by the name the kubelet's runtime gives it."""


def container_states(pods: Iterable[RawObject]) -> Counter[str]:
    """The containers of ``pods`` by runtime state, as a kubelet counts those its runtime has:
    running, exited, and created (waiting, with a container already made: one whose image is
    still pulling has none and is not counted). Init and ephemeral containers too. Pure."""
    counted: Counter[str] = Counter()
    for pod in pods:
        status = pod.get("status") or {}
        for key in ("initContainerStatuses", "containerStatuses", "ephemeralContainerStatuses"):
            for cs in status.get(key) or ():
                state = next(iter(cs.get("state") or {}), None)
                if state == "waiting" and not cs.get("containerID"):
                    continue
                if state in STATE_NAMES:
                    counted[STATE_NAMES[state]] += 1
    return counted


class PodStates(NamedTuple):
    """What ``/metrics`` counts of one pod: whether it runs, its containers by state."""

    running: bool
    containers: Counter[str]


def pod_states(pod: RawObject) -> PodStates:
    """Pure."""
    return PodStates((pod.get("status") or {}).get("phase") == "Running", container_states([pod]))


def kubelet_metrics(node_name: str, pods: Iterable[PodLike], kept: PodTexts[PodStates] | None = None) -> str:
    """``kubelet_node_name``, ``kubelet_running_pods`` and ``kubelet_running_containers`` of the
    virtual node ``node_name`` with the consumer ``pods`` bound to it. Pure but for ``kept``, each
    pod's counts from the last scrape (a pod is loaded again only once it changed)."""
    states = [
        found for _, found in (kept if kept is not None else PodTexts(pod_states)).scrape(pods).values()
    ]
    containers: Counter[str] = Counter()
    for found in states:
        containers.update(found.containers)
    lines = [
        "# HELP kubelet_node_name [ALPHA] The node's name. The count is always 1.",
        "# TYPE kubelet_node_name gauge",
        series_line("kubelet_node_name", {"node": node_name}, 1),
        "# HELP kubelet_running_containers [ALPHA] Number of containers currently running",
        "# TYPE kubelet_running_containers gauge",
        *(series_line("kubelet_running_containers", {"container_state": state}, count)
          for state, count in sorted(containers.items())),
        "# HELP kubelet_running_pods [ALPHA] Number of pods that have a running pod sandbox",
        "# TYPE kubelet_running_pods gauge",
        series_line("kubelet_running_pods", {}, sum(found.running for found in states)),
    ]  # fmt: skip
    return "\n".join(lines) + "\n"
