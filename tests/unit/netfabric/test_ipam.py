from __future__ import annotations

from ipaddress import IPv4Network

import pytest

from netfabric.ipam import DEFAULT_POOL, overlaps, parse_cidrs, plan_remaps
from netfabric.model import ClusterNetwork, NetworkConfigError, PoolExhausted, Remap

N = IPv4Network
#: The pool these tests were written against (two /16s); the default is larger.
POOL = N("10.70.0.0/15")
KIND = ClusterNetwork(pod_cidrs=(N("10.244.0.0/16"),), service_cidrs=(N("10.96.0.0/16"),))


def test_parse_cidrs_parses_a_list() -> None:
    assert parse_cidrs(["10.244.0.0/16", "10.96.0.0/12"], "podCIDRs") == [
        N("10.244.0.0/16"),
        N("10.96.0.0/12"),
    ]
    assert parse_cidrs([], "podCIDRs") == []


@pytest.mark.parametrize(
    ("values", "field", "fragment"),
    [
        (["10.244.0.0/33"], "podCIDRs[0]", "/0 to /32"),
        (["10.244.0.0/16", "10.244.1.0/16"], "podCIDRs[1]", "host bits"),
        (["abc"], "podCIDRs[0]", "not a valid CIDR"),
        (["10.244.0.0/16", "10.244.7.0/24"], "podCIDRs[1]", "overlaps 10.244.0.0/16 (podCIDRs[0])"),
        ("10.244.0.0/16", "podCIDRs", "single string"),
    ],
)
def test_parse_cidrs_errors_name_the_field(values: list[str], field: str, fragment: str) -> None:
    with pytest.raises(NetworkConfigError) as info:
        parse_cidrs(values, "podCIDRs")
    assert info.value.field == field
    assert fragment in info.value.message


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ("10.244.0.0/16", "10.244.0.0/16", True),
        ("10.244.0.0/16", "10.244.3.0/24", True),
        ("10.244.3.0/24", "10.244.0.0/16", True),
        ("10.244.0.0/16", "10.245.0.0/16", False),
        ("10.70.0.0/15", "10.71.255.0/24", True),
    ],
)
def test_overlaps(a: str, b: str, expected: bool) -> None:
    assert overlaps(N(a), N(b)) is expected


def test_overlapping_pod_cidrs_are_remapped_into_the_pool() -> None:
    remaps = plan_remaps(KIND, [N("10.244.0.0/16")], pool=DEFAULT_POOL)
    assert remaps == [Remap(original=N("10.244.0.0/16"), local_view=N("10.64.0.0/16"))]


def test_the_default_pool_holds_kubeadm_service_cidrs_of_two_peers() -> None:
    # kubeadm's defaults on every side: pods 10.244.0.0/16, services 10.96.0.0/12
    kubeadm = ClusterNetwork(pod_cidrs=(N("10.244.0.0/16"),), service_cidrs=(N("10.96.0.0/12"),))
    first = plan_remaps(kubeadm, [N("10.244.0.0/16"), N("10.96.0.0/12")])
    assert [str(r.local_view) for r in first] == ["10.64.0.0/16", "10.80.0.0/12"]
    taken = [r.local_view for r in first]
    second = plan_remaps(kubeadm, [N("10.244.0.0/16"), N("10.96.0.0/12")], taken=taken)
    # 10.96.0.0/12 inside the pool is skipped: it is the local service CIDR
    assert [str(r.local_view) for r in second] == ["10.65.0.0/16", "10.112.0.0/12"]


def test_non_overlapping_cidrs_map_to_themselves() -> None:
    remaps = plan_remaps(KIND, [N("10.245.0.0/16"), N("10.97.0.0/16")])
    assert all(remap.is_identity for remap in remaps)
    assert [remap.original for remap in remaps] == [N("10.245.0.0/16"), N("10.97.0.0/16")]


def test_pods_and_services_both_remapped_in_input_order() -> None:
    remaps = plan_remaps(KIND, [N("10.244.0.0/16"), N("10.96.0.0/16"), N("10.1.0.0/24")])
    assert [(str(r.original), str(r.local_view)) for r in remaps] == [
        ("10.244.0.0/16", "10.64.0.0/16"),
        ("10.96.0.0/16", "10.65.0.0/16"),
        ("10.1.0.0/24", "10.1.0.0/24"),
    ]


def test_a_remap_colliding_with_a_local_service_cidr_is_avoided() -> None:
    local = ClusterNetwork(pod_cidrs=(N("10.244.0.0/16"),), service_cidrs=(N("10.70.0.0/16"),))
    remaps = plan_remaps(local, [N("10.244.0.0/16")], pool=N("10.70.0.0/15"))
    assert remaps[0].local_view == N("10.71.0.0/16")


def test_taken_remaps_of_other_peers_are_avoided_and_force_remapping() -> None:
    taken = [N("10.70.0.0/16")]
    remaps = plan_remaps(KIND, [N("10.244.0.0/16")], taken=taken, pool=POOL)
    assert remaps[0].local_view == N("10.71.0.0/16")
    # A peer CIDR equal to another peer's local view must itself be remapped.
    remaps = plan_remaps(KIND, [N("10.70.0.0/16")], taken=taken, pool=POOL)
    assert remaps[0].local_view == N("10.71.0.0/16")


def test_identity_peer_cidrs_block_the_pool() -> None:
    # 10.70.0.0/16 is kept as is (no overlap locally), so 10.244.0.0/16 must not land on it.
    remaps = plan_remaps(KIND, [N("10.244.0.0/16"), N("10.70.0.0/16")], pool=POOL)
    assert remaps == [
        Remap(N("10.244.0.0/16"), N("10.71.0.0/16")),
        Remap(N("10.70.0.0/16"), N("10.70.0.0/16")),
    ]


def test_smaller_blocks_skip_past_obstacles_aligned() -> None:
    local = ClusterNetwork(pod_cidrs=(N("10.244.0.0/24"),), service_cidrs=(N("10.70.0.0/23"),))
    remaps = plan_remaps(local, [N("10.244.0.0/24")], pool=N("10.70.0.0/22"))
    assert remaps[0].local_view == N("10.70.2.0/24")


def test_same_inputs_same_answer() -> None:
    peer = [N("10.244.0.0/16"), N("10.96.0.0/16")]
    assert plan_remaps(KIND, peer) == plan_remaps(KIND, list(peer))


def test_existing_remaps_are_kept_for_stability() -> None:
    existing = {"10.244.0.0/16": N("10.71.0.0/16")}
    remaps = plan_remaps(KIND, [N("10.96.0.0/16"), N("10.244.0.0/16")], existing=existing, pool=POOL)
    # The kept remap claims its block first; the newcomer takes the lowest other one.
    assert remaps == [
        Remap(N("10.96.0.0/16"), N("10.70.0.0/16")),
        Remap(N("10.244.0.0/16"), N("10.71.0.0/16")),
    ]
    again = plan_remaps(
        KIND,
        [N("10.96.0.0/16"), N("10.244.0.0/16")],
        existing={str(r.original): r.local_view for r in remaps},
        pool=POOL,
    )
    assert again == remaps


@pytest.mark.parametrize(
    "previous",
    [
        N("10.72.0.0/16"),  # outside the pool
        N("10.70.0.0/17"),  # wrong size
        N("10.96.0.0/16"),  # collides with a local service CIDR
    ],
)
def test_invalid_existing_remaps_are_replaced(previous: IPv4Network) -> None:
    remaps = plan_remaps(KIND, [N("10.244.0.0/16")], existing={"10.244.0.0/16": previous}, pool=POOL)
    assert remaps[0].local_view == N("10.70.0.0/16")


def test_existing_remap_now_taken_by_another_peer_is_replaced() -> None:
    remaps = plan_remaps(
        KIND,
        [N("10.244.0.0/16")],
        taken=[N("10.70.0.0/16")],
        existing={"10.244.0.0/16": N("10.70.0.0/16")},
        pool=POOL,
    )
    assert remaps[0].local_view == N("10.71.0.0/16")


def test_pool_exhausted_says_what_was_needed_and_what_the_pool_holds() -> None:
    with pytest.raises(PoolExhausted) as info:
        plan_remaps(KIND, [N("10.244.0.0/16"), N("10.96.0.0/16")], pool=N("10.70.0.0/16"))
    message = str(info.value)
    assert info.value.field == "pool"
    assert "remap pool 10.70.0.0/16" in message
    assert "needed 2 block(s) of /16 (the pool holds 1, 1 free)" in message


def test_pool_too_small_for_the_prefix() -> None:
    local = ClusterNetwork(pod_cidrs=(N("10.244.0.0/16"),), service_cidrs=(N("10.96.0.0/12"),))
    with pytest.raises(PoolExhausted, match=r"1 block\(s\) of /12 \(the pool holds 0, 0 free\)"):
        plan_remaps(local, [N("10.96.0.0/12")], pool=POOL)


def test_pool_fully_blocked_by_taken_remaps() -> None:
    with pytest.raises(PoolExhausted, match=r"holds 2, 0 free.*2 taken remap"):
        plan_remaps(KIND, [N("10.244.0.0/16")], taken=[N("10.70.0.0/16"), N("10.71.0.0/16")], pool=POOL)


def test_overlapping_peer_cidrs_are_rejected() -> None:
    with pytest.raises(NetworkConfigError) as info:
        plan_remaps(KIND, [N("10.244.0.0/16"), N("10.244.1.0/24")])
    assert info.value.field == "peer_cidrs[1]"
