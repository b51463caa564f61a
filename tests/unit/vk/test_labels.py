from __future__ import annotations

import pytest

from vk.forge.labels import (
    MANAGED_BY,
    ORIGIN_CLUSTER_ID,
    ORIGIN_NAME,
    ORIGIN_NAMESPACE,
    ORIGIN_UID,
    Origin,
    is_owned_by,
    origin_annotations,
    origin_of,
    owner_selector,
    ownership_labels,
    virtual_node_identity,
)

from .builders import CONSUMER_ID, consumer_pod


def test_keys_live_under_gpuferry_io() -> None:
    for key in (MANAGED_BY, ORIGIN_CLUSTER_ID, ORIGIN_NAMESPACE, ORIGIN_NAME, ORIGIN_UID):
        assert key.startswith("gpuferry.io/")


def test_ownership_labels() -> None:
    assert ownership_labels(CONSUMER_ID) == {
        "gpuferry.io/managed-by": "gpuferry",
        "gpuferry.io/origin-cluster-id": CONSUMER_ID,
    }
    pod = consumer_pod()
    assert ownership_labels(CONSUMER_ID, pod) == {
        "gpuferry.io/managed-by": "gpuferry",
        "gpuferry.io/origin-cluster-id": CONSUMER_ID,
        "gpuferry.io/origin-namespace": "ml-team",
        "gpuferry.io/origin-uid": "5b0e1f2c-3d4a-4b5c-8d6e-7f8091a2b3c4",
    }
    with pytest.raises(ValueError, match="label value"):
        ownership_labels("c" * 64)


def test_is_owned_by() -> None:
    owned = {"metadata": {"labels": ownership_labels(CONSUMER_ID)}}
    assert is_owned_by(owned, CONSUMER_ID)
    assert not is_owned_by(owned, "someone-else")
    assert not is_owned_by({"metadata": {"labels": {ORIGIN_CLUSTER_ID: CONSUMER_ID}}}, CONSUMER_ID)
    assert not is_owned_by({"metadata": {}}, CONSUMER_ID)
    assert not is_owned_by({}, CONSUMER_ID)


def test_owner_selector() -> None:
    assert owner_selector(CONSUMER_ID) == (
        f"gpuferry.io/managed-by=gpuferry,gpuferry.io/origin-cluster-id={CONSUMER_ID}"
    )


def test_origin_round_trip() -> None:
    pod = consumer_pod()
    pod["metadata"]["name"] = "n" * 200  # longer than any label value: an annotation holds it
    twin = {
        "metadata": {
            "labels": ownership_labels(CONSUMER_ID, pod),
            "annotations": origin_annotations(CONSUMER_ID, pod),
        }
    }
    uid = "5b0e1f2c-3d4a-4b5c-8d6e-7f8091a2b3c4"
    assert origin_of(twin) == Origin(CONSUMER_ID, "ml-team", "n" * 200, uid)


def test_origin_of_foreign_or_incomplete_objects() -> None:
    assert origin_of({"metadata": {"labels": {"app": "x"}}}) is None
    assert origin_of({"metadata": {"labels": ownership_labels(CONSUMER_ID)}}) is None  # a twin namespace


def test_virtual_node_identity() -> None:
    assert virtual_node_identity("p1", "gpuferry-p1") == {
        "type": "virtual-kubelet",
        "kubernetes.io/role": "agent",
        "gpuferry.io/provider": "p1",
        "kubernetes.io/hostname": "gpuferry-p1",
    }
