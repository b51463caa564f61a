"""Which namespaces still have pods on the node: when the last goes, its watches go (issue 15)."""

from __future__ import annotations

from kube.objects import ObjectKey
from vk.reflection.namespaced import NamespacePods


def test_a_namespace_is_empty_when_its_last_pod_goes_and_only_then() -> None:
    pods = NamespacePods()
    assert not pods.update(ObjectKey("ml", "a"), True)
    assert not pods.update(ObjectKey("ml", "b"), True)
    assert not pods.update(ObjectKey("ml", "a"), True)  # an update of a pod already known
    assert not pods.update(ObjectKey("ml", "a"), False)
    assert "ml" in pods
    assert pods.update(ObjectKey("ml", "b"), False)  # the last one
    assert "ml" not in pods
    assert not pods.update(ObjectKey("ml", "b"), False)  # told twice: nothing more to release
    assert not pods.update(ObjectKey("other", "x"), False)  # never seen
