"""Resource paths and object helpers."""

import pytest

from kube.objects import (
    CONFIGMAPS,
    CRDS,
    CSRS,
    LEASES,
    NAMESPACES,
    ObjectKey,
    annotations,
    copy_json,
    labels,
    meta,
    resource_version,
    uid,
)


def test_paths() -> None:
    assert CONFIGMAPS.path() == "/api/v1/configmaps"
    assert CONFIGMAPS.path("ns") == "/api/v1/namespaces/ns/configmaps"
    assert CONFIGMAPS.path("ns", "a") == "/api/v1/namespaces/ns/configmaps/a"
    assert (
        LEASES.path("kube-node-lease", "n1")
        == "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/n1"
    )
    assert CSRS.path(name="c", subresource="approval") == (
        "/apis/certificates.k8s.io/v1/certificatesigningrequests/c/approval"
    )
    assert NAMESPACES.path(name="ns", subresource="finalize") == "/api/v1/namespaces/ns/finalize"
    assert CRDS.api_version == "apiextensions.k8s.io/v1" and CONFIGMAPS.api_version == "v1"
    with pytest.raises(ValueError):
        CSRS.path("ns")
    with pytest.raises(ValueError):
        CONFIGMAPS.path("ns", subresource="status")


def test_keys() -> None:
    obj = {
        "metadata": {
            "name": "a",
            "namespace": "ns",
            "uid": "u",
            "resourceVersion": "5",
            "labels": {"l": "1"},
            "annotations": {"a": "2"},
        }
    }
    key = ObjectKey.of(obj)
    assert key == ObjectKey("ns", "a") and str(key) == "ns/a"
    assert str(ObjectKey.of({"metadata": {"name": "node"}})) == "node"
    assert ObjectKey.parse("ns/a") == key and ObjectKey.parse("node") == ObjectKey(None, "node")
    assert (uid(obj), resource_version(obj), labels(obj), annotations(obj)) == (
        "u",
        "5",
        {"l": "1"},
        {"a": "2"},
    )
    assert meta({}) == {} and uid({}) is None and labels({"metadata": {}}) == {}


def test_copy_json_is_a_deep_copy_equal_to_the_original() -> None:
    spec = {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
            "nodeSelector": {"a": "b"}, "priority": 7, "hostNetwork": False, "x": None}  # fmt: skip
    copied = copy_json(spec)
    assert copied == spec
    copied["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "2"
    copied["nodeSelector"]["a"] = "c"
    assert spec["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert spec["nodeSelector"] == {"a": "b"}
    assert copy_json({"t": ("a", "b")}) == {"t": ["a", "b"]}  # JSON has lists only
