"""The bench's ``--grace S``: its pods' terminationGracePeriodSeconds, so that "Running to gone"
can be measured as most pods go (terminating first), not only at once (a negative S is refused:
test_services.py's test of the bench's counts)."""

from __future__ import annotations

from types import SimpleNamespace

from bench.offload import pod, vk_command


def test_pods_go_at_once_by_default_and_take_the_grace_asked_for() -> None:
    for node in (None, "gpuferry-bench-p1"):
        assert pod("p-00001", "ab12c", node)["spec"]["terminationGracePeriodSeconds"] == 0
        assert pod("p-00001", "ab12c", node, grace=30)["spec"]["terminationGracePeriodSeconds"] == 30


def test_the_bench_runs_its_virtual_kubelet_with_the_provider_events_asked_for() -> None:
    cluster = SimpleNamespace(spec=SimpleNamespace(kubeconfig="/k"))
    args = (cluster, cluster, "c", "p", "10", 9100, 300.0, "ab12c")
    default = vk_command(*args)
    assert default[default.index("--provider-events") + 1] == "all"
    warnings = vk_command(*args, provider_events="warnings")
    assert warnings[warnings.index("--provider-events") + 1] == "warnings"
