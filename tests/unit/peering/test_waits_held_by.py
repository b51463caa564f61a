"""What holds an object being deleted, said when a wait for it gives up."""

from __future__ import annotations

from peering.waits import held_by

DISCOVERY = (
    "Discovery failed for some groups, 1 failing: unable to retrieve the complete list of server APIs: "
    "metrics.k8s.io/v1beta1: stale GroupVersion discovery: metrics.k8s.io/v1beta1"
)
# a namespace as the test clusters' API server showed it while its metrics-server was down
# (2026-11-28): every namespace deletion waited on discovery, and the wait said only "still there"
STUCK_NAMESPACE = {
    "metadata": {"name": "gpuferry-system", "deletionTimestamp": "2026-11-28T04:05:19Z"},
    "spec": {"finalizers": ["kubernetes"]},
    "status": {
        "phase": "Terminating",
        "conditions": [
            {"type": "NamespaceDeletionDiscoveryFailure", "status": "True", "reason": "DiscoveryFailed",
             "message": DISCOVERY},
            {"type": "NamespaceDeletionGroupVersionParsingFailure", "status": "False",
             "reason": "ParsedGroupVersions", "message": "All legacy kube types successfully parsed"},
            {"type": "NamespaceContentRemaining", "status": "False", "reason": "ContentRemoved",
             "message": "All content successfully removed"},
        ],
    },
}  # fmt: skip


def test_a_stuck_namespace_says_which_api_holds_it() -> None:
    assert (
        held_by(STUCK_NAMESPACE)
        == f"; held by: finalizers kubernetes; NamespaceDeletionDiscoveryFailure: {DISCOVERY}"
    )


def test_an_object_held_by_its_finalizers_names_them() -> None:
    obj = {
        "metadata": {"deletionTimestamp": "2026-11-28T04:05:19Z", "finalizers": ["gpuferry.io/offloading"]}
    }
    assert held_by(obj) == "; held by: finalizers gpuferry.io/offloading"


def test_nothing_is_said_of_an_object_not_being_deleted_or_not_seen() -> None:
    assert held_by({"metadata": {"finalizers": ["gpuferry.io/offloading"]}}) == ""
    assert held_by(None) == ""
    assert held_by({"metadata": {"deletionTimestamp": "2026-11-28T04:05:19Z"}}) == ""
