"""``gpuferry tenant``: its input, checked before anything is written, and what it prints."""

from __future__ import annotations

import pytest

from peering.cli.common import UserError
from peering.cli.tenant_cmds import parse_cidrs, parse_limits, policy_of


def test_limits_become_the_annotation_the_slice_policy_reads() -> None:
    assert parse_limits("nvidia.com/gpu=8, cpu=64") == "cpu=64,nvidia.com/gpu=8"
    assert parse_limits("memory=512Gi") == "memory=512Gi"


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("", "--max expects RESOURCE=QUANTITY"),
        ("nvidia.com/gpu", "--max expects KEY=VALUE"),
        ("nvidia.com/gpu=eight", "'eight' is not a Kubernetes quantity"),
        ("nvidia.com/gpu=-1", "'-1' is negative"),
        ("NVIDIA GPU=1", "'NVIDIA GPU' is not a resource name"),
    ],
)
def test_bad_limits_are_one_clear_error(text: str, words: str) -> None:
    with pytest.raises(UserError, match=words):
        parse_limits(text)


def test_cidrs_are_ipv4_network_addresses_that_do_not_overlap() -> None:
    assert parse_cidrs("10.244.0.0/16, 10.245.0.0/16", "--pod-cidrs") == ["10.244.0.0/16", "10.245.0.0/16"]
    for text, words in (
        ("10.244.0.1/16", "host bits set"),
        ("fd00::/64", "IPv6"),
        ("10.244.0.0/16,10.244.1.0/24", "overlaps 10.244.0.0/16"),
        ("", "expects at least one CIDR"),
    ):
        with pytest.raises(UserError, match=words):
            parse_cidrs(text, "--pod-cidrs")


def test_the_policy_shows_what_the_provider_decided_and_defaults_for_the_rest() -> None:
    tenant = {
        "spec": {"consumerClusterID": "ml-eu"},
        "status": {"acceptedNetwork": {"podCIDRs": ["10.244.0.0/16"], "serviceCIDRs": ["10.96.0.0/16"]}},
    }
    namespace = {
        "metadata": {
            "name": "gpuferry-tenant-ml-eu",
            "annotations": {"sharing.gpuferry.io/max-resources": "nvidia.com/gpu=4"},
        }
    }
    assert policy_of(tenant, namespace) == {
        "consumer": "ml-eu",
        "tenantNamespace": "gpuferry-tenant-ml-eu",
        "maxResources": "nvidia.com/gpu=4",
        "approvedNodeSelector": None,
        "podSecurity": "baseline",
        "maxTwinNamespaces": 64,
        "acceptedNetwork": {"podCIDRs": ["10.244.0.0/16"], "serviceCIDRs": ["10.96.0.0/16"]},
    }
