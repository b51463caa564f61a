"""RBAC and namespace builders: namespaced only, bound to the consumer's user, PSA enforced."""

from __future__ import annotations

from decimal import Decimal

import pytest

from peering.provider.builders import (
    consumer_rolebinding,
    grant_quota,
    limit_range,
    tenant_role,
    twin_namespace,
    twin_role,
)
from peering.resources import is_reserved_namespace, tenant_namespace, twin_namespace_name


def test_roles_are_namespaced_and_never_grant_namespaces_or_status() -> None:
    for role in (tenant_role("gpuferry-tenant-c", "c"), twin_role("t-c", "c")):
        assert role["kind"] == "Role"
        resources = {r for rule in role["rules"] for r in rule["resources"]}
        assert not resources & {"namespaces", "nodes", "gpuslices/status", "namespaceoffloadings/status",
                                "tenants/status", "resourcequotas/status", "rolebindings", "roles"}
        for rule in role["rules"]:
            assert "*" not in rule["verbs"] and "*" not in rule["resources"]
    tenant_resources = {r for rule in tenant_role("n", "c")["rules"] for r in rule["resources"]}
    assert "secrets" not in tenant_resources  # the peering token lives there
    quota_rule = next(r for r in twin_role("t", "c")["rules"] if "resourcequotas" in r["resources"])
    assert quota_rule["verbs"] == ["get", "list", "watch"]


def test_binding_names_the_user_not_the_shared_group() -> None:
    rb = consumer_rolebinding("t-c", "c", "gpuferry:consumer:c")
    assert rb["subjects"] == [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                               "name": "gpuferry:consumer:c"}]
    assert rb["roleRef"]["kind"] == "Role"


def test_twin_namespace_labels() -> None:
    ns = twin_namespace("ml-c", "c", "ml", "restricted")
    labels = ns["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    assert labels["gpuferry.io/tenant"] == "c" and labels["gpuferry.io/origin-namespace"] == "ml"


def test_quota_and_limit_range() -> None:
    q = grant_quota("t", "c", {"requests.nvidia.com/gpu": Decimal(2), "requests.memory": Decimal(2**30)})
    assert q["spec"]["hard"] == {"requests.memory": "1Gi", "requests.nvidia.com/gpu": "2",
                                 "services.loadbalancers": "0", "services.nodeports": "0"}
    assert limit_range("t", "c", {"requests.nvidia.com/gpu": Decimal(1)}) is None
    lr = limit_range("t", "c", {"requests.cpu": Decimal(1)})
    assert lr is not None and lr["spec"]["limits"][0]["defaultRequest"] == {"cpu": "100m"}


def test_names() -> None:
    assert tenant_namespace("c1") == "gpuferry-tenant-c1"
    with pytest.raises(ValueError):
        tenant_namespace("Not_Valid")
    assert twin_namespace_name("ml", "c1") == "ml-c1"
    assert twin_namespace_name("ml", "c1", "SameName") == "ml"
    long = twin_namespace_name("a" * 60, "consumer")
    assert len(long) <= 63 and long != twin_namespace_name("a" * 59, "consumer")
    assert is_reserved_namespace("kube-system") and is_reserved_namespace("default")
    assert not is_reserved_namespace("ml")
