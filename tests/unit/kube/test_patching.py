"""JSON merge patch: diff and apply, and the status patch sent."""

from __future__ import annotations

from typing import Any

import pytest

from kube.clients import KubeClient
from kube.objects import CONFIGMAPS, PODS, ObjectKey
from kube.patching import apply_merge_patch, diff_merge_patch, patch_changes, patch_status

from .fakeapi import NS, FakeApi


def test_equal_objects_give_an_empty_patch() -> None:
    obj = {"metadata": {"name": "a", "labels": {"x": "1"}}, "spec": {"list": [1, 2]}}
    assert diff_merge_patch(obj, obj) == {}


def test_changes_additions_and_removals() -> None:
    old = {"metadata": {"name": "a", "labels": {"x": "1", "gone": "y"}}, "spec": {"n": 1, "keep": True}}
    new = {
        "metadata": {"name": "a", "labels": {"x": "2"}, "annotations": {"a": "b"}},
        "spec": {"n": 1, "keep": True},
    }
    assert diff_merge_patch(old, new) == {
        "metadata": {"labels": {"x": "2", "gone": None}, "annotations": {"a": "b"}}
    }


def test_null_for_a_key_that_is_not_there_is_no_change() -> None:
    # a NamespaceOffloading without a clusterSelector has no allowedProviders, and its
    # reconciler asks for None: that was a status PATCH on every pass, changing nothing
    old = {"status": {"phase": "Ready"}}
    assert diff_merge_patch(old, {"status": {"phase": "Ready", "allowedProviders": None}}) == {}
    had, gone = {"status": {"allowedProviders": ["a"]}}, {"status": {"allowedProviders": None}}
    assert diff_merge_patch(had, gone) == gone


def test_lists_and_type_changes_are_replaced_whole() -> None:
    assert diff_merge_patch({"l": [1, 2, 3]}, {"l": [1, 2]}) == {"l": [1, 2]}
    assert diff_merge_patch({"v": {"a": 1}}, {"v": "flat"}) == {"v": "flat"}
    assert diff_merge_patch({"v": 1}, {"v": 1.0}) == {"v": 1.0}
    assert diff_merge_patch({"v": 1}, {"v": True}) == {"v": True}
    assert diff_merge_patch({"gone": {"deep": 1}}, {}) == {"gone": None}


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ({}, {"a": {"b": {"c": [1]}}}),
        ({"a": {"b": 1, "c": 2}}, {"a": {"c": 3}}),
        ({"a": [1, {"x": 1}]}, {"a": [{"x": 2}]}),
        ({"a": "s", "b": {"c": {"d": "e"}}}, {"b": {"c": {}}}),
    ],
)
def test_apply_of_diff_round_trips(old: dict[str, Any], new: dict[str, Any]) -> None:
    assert apply_merge_patch(old, diff_merge_patch(old, new)) == new


def test_diff_does_not_alias_its_inputs() -> None:
    new = {"spec": {"list": [1]}}
    patch = diff_merge_patch({}, new)
    patch["spec"]["list"].append(2)
    assert new == {"spec": {"list": [1]}}


async def test_patch_status_and_changes_send_merge_patches(fake: FakeApi, client: KubeClient) -> None:
    sent = await patch_status(client, PODS, ObjectKey(NS, "p"), {"phase": "Running"}, resource_version="7")
    assert sent["path"] == f"/api/v1/namespaces/{NS}/pods/p/status"
    assert sent["body"] == {"status": {"phase": "Running"}, "metadata": {"resourceVersion": "7"}}

    old = {"metadata": {"name": "c", "namespace": NS, "resourceVersion": "9"}, "data": {"a": "1"}}
    same = await patch_changes(client, CONFIGMAPS, old, old)
    assert same is old and len(fake.requests) == 1
    new = {"metadata": {"name": "c", "namespace": NS, "resourceVersion": "9"}, "data": {"a": "2"}}
    changed = await patch_changes(client, CONFIGMAPS, old, new, guard=True)
    assert changed["body"] == {"data": {"a": "2"}, "metadata": {"resourceVersion": "9"}}
    assert changed["contentType"] == "application/merge-patch+json"
