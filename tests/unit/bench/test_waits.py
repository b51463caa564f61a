"""The bench waits for its namespaces by watching them go."""

from __future__ import annotations

from bench.offload import BENCH_NAMESPACES, namespace, namespaces_left
from kube.objects import ObjectKey
from kube.watching import Listed, WatchEvent


def _deleted(name: str) -> WatchEvent:
    return WatchEvent("DELETED", namespace(name))


def test_namespaces_left_follows_a_relist_and_deletions() -> None:
    left = frozenset({"a", "b", "c"})
    left = namespaces_left(left, Listed("1", frozenset({ObjectKey(None, "a"), ObjectKey(None, "b")})))
    assert left == {"a", "b"}, "one already gone before the watch began"
    left = namespaces_left(left, WatchEvent("MODIFIED", namespace("a")))  # Terminating
    assert left == {"a", "b"}
    assert namespaces_left(left, _deleted("a")) == {"b"}
    assert namespaces_left(frozenset({"b"}), _deleted("b")) == frozenset()
    assert namespaces_left(frozenset({"b"}), _deleted("other")) == {"b"}


def test_the_bench_namespaces_carry_the_label_its_waits_and_clean_up_select() -> None:
    key, value = BENCH_NAMESPACES.split("=")
    assert namespace("x")["metadata"]["labels"] == {key: value}
