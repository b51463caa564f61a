"""Partitioning a grant over twin-namespace quotas: sums never exceed the grant."""

from __future__ import annotations

import itertools
from decimal import Decimal

from peering.provider.quotas import lowering_step, needs_lowering, partition, quota_totals

GPU = "requests.nvidia.com/gpu"


def test_totals_map_resources_to_quota_keys_and_fail_closed() -> None:
    zero = Decimal(0)
    assert quota_totals({"cpu": Decimal(4), "pods": Decimal(10)}) == {
        "requests.cpu": Decimal(4), "pods": Decimal(10), GPU: zero, "requests.memory": zero}
    assert quota_totals({"nvidia.com/gpu": Decimal(2), "nvidia.com/mig-1g.10gb": Decimal(7)}) == {
        GPU: Decimal(2), "requests.nvidia.com/mig-1g.10gb": Decimal(7), "requests.cpu": zero,
        "requests.memory": zero, "pods": zero}
    # what the provider's nodes offer is limited too, to 0 unless granted
    offered = ["nvidia.com/mig-1g.10gb", "nvidia.com/gpu.shared", "nvidia.com/gpumem"]
    assert quota_totals({"nvidia.com/mig-1g.10gb": Decimal(7)}, offered) == {
        "requests.nvidia.com/mig-1g.10gb": Decimal(7), "requests.nvidia.com/gpu.shared": zero,
        "requests.nvidia.com/gpumem": zero, GPU: zero, "requests.cpu": zero, "requests.memory": zero,
        "pods": zero}


def test_equal_split_with_remainder_first() -> None:
    plan = partition({GPU: Decimal(5), "requests.cpu": Decimal("1")}, ["b", "a"], {})
    assert plan["a"] == {GPU: Decimal(3), "requests.cpu": Decimal("0.500")}
    assert plan["b"] == {GPU: Decimal(2), "requests.cpu": Decimal("0.500")}


def test_usage_is_kept_and_taken_from_the_others() -> None:
    plan = partition({GPU: Decimal(4)}, ["a", "b", "c"], {"a": {GPU: Decimal(3)}})
    assert plan == {"a": {GPU: Decimal(3)}, "b": {GPU: Decimal(1)}, "c": {GPU: Decimal(0)}}


def test_shrunk_grant_freezes_namespaces_at_their_usage() -> None:
    plan = partition({GPU: Decimal(1)}, ["a", "b"], {"a": {GPU: Decimal(2)}, "b": {GPU: Decimal(1)}})
    assert plan == {"a": {GPU: Decimal(2)}, "b": {GPU: Decimal(1)}}


def test_sum_never_exceeds_max_of_grant_and_usage() -> None:
    usages = itertools.product(range(0, 4), repeat=2)
    for total, n, used in itertools.product(range(0, 9), range(1, 5), list(usages)):
        names = [f"ns{i}" for i in range(n)]
        usage = {names[i]: {GPU: Decimal(u)} for i, u in enumerate(used) if i < n}
        plan = partition({GPU: Decimal(total)}, names, usage)
        hard = [plan[ns][GPU] for ns in names]
        used_sum = sum((usage.get(ns, {}).get(GPU, Decimal(0)) for ns in names), Decimal(0))
        assert sum(hard) <= max(Decimal(total), used_sum)
        assert all(plan[ns][GPU] >= usage.get(ns, {}).get(GPU, Decimal(0)) for ns in names)
        if used_sum <= total:
            assert sum(hard) == total


def test_lowering_comes_first() -> None:
    assert needs_lowering(None, {GPU: Decimal(1)})
    assert needs_lowering({}, {GPU: Decimal(1)})  # no key: no limit
    assert needs_lowering({GPU: Decimal(2)}, {GPU: Decimal(1)})
    assert not needs_lowering({GPU: Decimal(1)}, {GPU: Decimal(2)})
    assert lowering_step({GPU: Decimal(1), "pods": Decimal(9)}, {GPU: Decimal(2), "pods": Decimal(3)}) == {
        GPU: Decimal(1), "pods": Decimal(3)}
    assert lowering_step(None, {GPU: Decimal(2), "pods": Decimal(4)}) == {GPU: Decimal(0), "pods": Decimal(0)}
    assert lowering_step({}, {GPU: Decimal(2)}) == {GPU: Decimal(2)}  # was unlimited


def test_moving_headroom_never_offers_it_twice() -> None:
    """Simulate the two steps: after lowering, the sum of limits never exceeds the grant."""
    grant = {GPU: Decimal(2)}
    current: dict[str, dict[str, Decimal] | None] = {"a": {GPU: Decimal(2)}}
    for names in (["a", "b"], ["a", "b", "c"], ["b", "c"]):
        for ns in names:
            current.setdefault(ns, None)
        plan = partition(grant, names, {})
        lowered = {ns: lowering_step(current[ns], plan[ns]) if needs_lowering(current[ns], plan[ns])
                   else current[ns] for ns in names}
        # until the quota controller syncs, a lowered quota may still enforce its old limit
        worst = [max((current[ns] or {}).get(GPU, Decimal(0)), (lowered[ns] or {}).get(GPU, Decimal(0)))
                 for ns in names]
        assert sum(worst) <= 2, (names, current, lowered)
        current = {ns: dict(plan[ns]) for ns in names}
        assert sum(q[GPU] for q in current.values() if q) == 2


def test_demand_is_served_from_the_headroom_before_equal_shares() -> None:
    # 4 GPUs over two twin namespaces: equal shares are 2 + 2, but a Job in "a" waits for 3
    plan = partition({GPU: Decimal(4)}, ["a", "b"], {}, {"a": {GPU: Decimal(3)}})
    assert plan == {"a": {GPU: Decimal(3)}, "b": {GPU: Decimal(1)}}
    # demand never takes what others use, nor more than the grant
    plan = partition({GPU: Decimal(4)}, ["a", "b"], {"b": {GPU: Decimal(2)}}, {"a": {GPU: Decimal(9)}})
    assert plan == {"a": {GPU: Decimal(2)}, "b": {GPU: Decimal(2)}}
    for total, wants in itertools.product(range(0, 6), itertools.product(range(0, 5), repeat=3)):
        demand = {ns: {GPU: Decimal(w)} for ns, w in zip("abc", wants, strict=True)}
        plan = partition({GPU: Decimal(total)}, ["a", "b", "c"], {}, demand)
        assert sum(plan[ns][GPU] for ns in "abc") == total
