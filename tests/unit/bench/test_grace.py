"""The bench's ``--grace S``: its pods' terminationGracePeriodSeconds, so that "Running to gone"
can be measured as most pods go (terminating first), not only at once (a negative S is refused:
test_services.py's test of the bench's counts)."""

from __future__ import annotations

from bench.offload import pod


def test_pods_go_at_once_by_default_and_take_the_grace_asked_for() -> None:
    for node in (None, "gpuferry-bench-p1"):
        assert pod("p-00001", "ab12c", node)["spec"]["terminationGracePeriodSeconds"] == 0
        assert pod("p-00001", "ab12c", node, grace=30)["spec"]["terminationGracePeriodSeconds"] == 30
