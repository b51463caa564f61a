"""Grant decisions: capacity, full/partial/denied, competition, cordoned nodes, shape, labels."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from peering.provider.planning import allocate, free_capacity, node_is_usable, slice_request, slice_status

L4 = {"nvidia.com/gpu.product": "NVIDIA-L4", "nvidia.com/gpu.memory": "23034"}
H100 = {"nvidia.com/gpu.product": "NVIDIA-H100", "nvidia.com/gpu.memory": "81559"}


def node(name: str, gpus: int, labels: dict[str, str], *, ready: bool = True, unschedulable: bool = False,
         taints: list[dict[str, str]] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {**labels, "nvidia.com/gpu.count": str(gpus)}},
        "spec": {"unschedulable": unschedulable, "taints": taints or []},
        "status": {"allocatable": {"cpu": "32", "memory": "128Gi", "pods": "110",
                                   "nvidia.com/gpu": str(gpus)},
                   "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


def pod(ns: str, node_name: str, gpus: int, phase: str = "Running") -> dict[str, Any]:
    return {"metadata": {"name": f"p-{node_name}-{gpus}", "namespace": ns},
            "spec": {"nodeName": node_name, "containers": [
                {"resources": {"limits": {"nvidia.com/gpu": str(gpus)}, "requests": {"cpu": "1"}}}]},
            "status": {"phase": phase}}


def gslice(consumer: str, name: str, resources: dict[str, Any], *, partial: bool = False,
           selector: dict[str, str] | None = None, created: str = "2026-01-01T00:00:00Z") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": f"gpuferry-tenant-{consumer}",
                         "creationTimestamp": created},
            "spec": {"consumerClusterID": consumer, "resources": resources, "allowPartial": partial,
                     "nodeSelector": selector or {}}}


NODES = [node("l4-0", 2, L4), node("l4-1", 2, L4), node("h100-0", 8, H100)]


def decide(nodes: list[dict[str, Any]], slices: list[dict[str, Any]], pods: list[dict[str, Any]] = (),  # type: ignore[assignment]
           twins: frozenset[str] = frozenset()) -> dict[tuple[str, str], Any]:
    return allocate(free_capacity(nodes, pods, twins), [slice_request(s) for s in slices])


def test_full_grant_with_shape_and_uniform_labels() -> None:
    sel = {"nvidia.com/gpu.product": "NVIDIA-L4"}
    d = decide(NODES, [gslice("a", "s", {"nvidia.com/gpu": 3}, selector=sel)])
    got = d[("gpuferry-tenant-a", "s")]
    assert got.phase == "Granted"
    assert got.granted == {"nvidia.com/gpu": Decimal(3)}
    assert got.nodes == {"l4-0": {"nvidia.com/gpu": Decimal(2)}, "l4-1": {"nvidia.com/gpu": Decimal(1)}}
    assert got.largest == {"nvidia.com/gpu": Decimal(2)}
    assert got.labels["nvidia.com/gpu.product"] == "NVIDIA-L4"
    assert "nvidia.com/gpu.count" in got.labels  # both L4 nodes have 2
    status = slice_status(got)
    assert status["granted"] == {"nvidia.com/gpu": "3"}
    assert status["shape"]["nodes"] == [{"name": "l4-0", "free": {"nvidia.com/gpu": "2"}},
                                        {"name": "l4-1", "free": {"nvidia.com/gpu": "1"}}]


def test_labels_that_differ_are_not_copied() -> None:
    d = decide(NODES, [gslice("a", "s", {"nvidia.com/gpu": 12})])
    got = d[("gpuferry-tenant-a", "s")]
    assert got.phase == "Granted"
    assert "nvidia.com/gpu.product" not in got.labels


def test_partial_grant_only_when_allowed() -> None:
    sel = {"nvidia.com/gpu.product": "NVIDIA-L4"}
    d = decide(NODES, [gslice("a", "s", {"nvidia.com/gpu": 10}, partial=True, selector=sel),
                       gslice("b", "s", {"nvidia.com/gpu": 10}, selector=sel,
                              created="2026-01-02T00:00:00Z")])
    a, b = d[("gpuferry-tenant-a", "s")], d[("gpuferry-tenant-b", "s")]
    assert a.phase == "PartiallyGranted" and a.granted == {"nvidia.com/gpu": Decimal(4)}
    assert b.phase == "Denied" and b.reason == "InsufficientGPUs" and b.granted == {}
    assert "requested 10, free 0" in b.message


def test_denied_without_partial_reserves_nothing() -> None:
    sel = {"nvidia.com/gpu.product": "NVIDIA-L4"}
    d = decide(NODES, [gslice("a", "big", {"nvidia.com/gpu": 5}, selector=sel),
                       gslice("b", "s", {"nvidia.com/gpu": 4}, selector=sel, created="2026-01-02T00:00:00Z")])
    assert d[("gpuferry-tenant-a", "big")].phase == "Denied"
    assert "requested 5, free 4" in d[("gpuferry-tenant-a", "big")].message
    assert d[("gpuferry-tenant-b", "s")].phase == "Granted"


def test_competing_tenants_never_exceed_capacity() -> None:
    slices = [gslice(c, "s", {"nvidia.com/gpu": 3}, partial=True, created=f"2026-01-0{i + 1}T00:00:00Z")
              for i, c in enumerate(["a", "b", "c", "d", "e"])]
    d = decide(NODES, slices)
    total = sum((x.granted.get("nvidia.com/gpu", Decimal(0)) for x in d.values()), Decimal(0))
    assert total == 12
    assert [d[(f"gpuferry-tenant-{c}", "s")].phase for c in "abcde"] == [
        "Granted", "Granted", "Granted", "Granted", "Denied"]
    per_node: dict[str, Decimal] = {}
    for x in d.values():
        for n, r in x.nodes.items():
            per_node[n] = per_node.get(n, Decimal(0)) + r["nvidia.com/gpu"]
    assert per_node == {"l4-0": 2, "l4-1": 2, "h100-0": 8}


def test_running_pods_count_but_twin_and_finished_pods_do_not() -> None:
    pods = [pod("team", "l4-0", 1), pod("team", "l4-1", 2, phase="Succeeded"), pod("twin-a", "l4-1", 2)]
    reserved = {"a": {"l4-1": {"nvidia.com/gpu": Decimal(2)}}}
    free = {n.name: n.free["nvidia.com/gpu"] for n in free_capacity(NODES, pods, {"twin-a": "a"}, reserved)}
    assert free == {"h100-0": 8, "l4-0": 1, "l4-1": 2}


def test_cordoned_tainted_and_unready_nodes_are_not_used() -> None:
    nodes = [node("l4-0", 2, L4, unschedulable=True), node("l4-1", 2, L4, ready=False),
             node("l4-2", 2, L4, taints=[{"key": "x", "effect": "NoSchedule"}]),
             node("l4-3", 2, L4, taints=[{"key": "y", "effect": "PreferNoSchedule"}])]
    # taints are each slice's to tolerate: the node is usable, but not for a slice without tolerations
    assert [node_is_usable(n) for n in nodes] == [False, False, True, True]
    d = decide(nodes, [gslice("a", "s", {"nvidia.com/gpu": 4}, partial=True)])
    assert d[("gpuferry-tenant-a", "s")].granted == {"nvidia.com/gpu": Decimal(2)}
    assert set(d[("gpuferry-tenant-a", "s")].nodes) == {"l4-3"}



def test_a_slice_that_tolerates_a_taint_is_granted_the_tainted_nodes() -> None:
    """Real GPU nodes are often tainted (nvidia.com/gpu:NoSchedule): a slice may tolerate that."""
    gpu_taint = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
    nodes = [node("l4-0", 2, L4, taints=[gpu_taint]), node("l4-1", 2, L4, taints=[gpu_taint])]
    plain = gslice("a", "s", {"nvidia.com/gpu": 4})
    denied = decide(nodes, [plain])[("gpuferry-tenant-a", "s")]
    assert denied.reason == "NoMatchingNodes"
    assert "taints the slice does not tolerate: nvidia.com/gpu=present:NoSchedule" in denied.message
    tolerant = gslice("a", "s", {"nvidia.com/gpu": 4})
    tolerant["spec"]["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists"}]
    granted = decide(nodes, [tolerant])[("gpuferry-tenant-a", "s")]
    assert granted.phase == "Granted" and set(granted.nodes) == {"l4-0", "l4-1"}
    wrong = gslice("a", "s", {"nvidia.com/gpu": 4})
    wrong["spec"]["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Equal", "value": "absent"}]
    assert decide(nodes, [wrong])[("gpuferry-tenant-a", "s")].reason == "NoMatchingNodes"

def test_no_matching_nodes_and_wrong_tenant() -> None:
    d = decide(NODES, [gslice("a", "s", {"nvidia.com/gpu": 1}, selector={"nvidia.com/gpu.product": "B200"})])
    assert d[("gpuferry-tenant-a", "s")].reason == "NoMatchingNodes"
    other = gslice("a", "t", {"nvidia.com/gpu": 1})
    other["spec"]["consumerClusterID"] = "b"
    outside = gslice("a", "u", {"nvidia.com/gpu": 1})
    outside["metadata"]["namespace"] = "default"
    d = decide(NODES, [other, outside])
    assert d[("gpuferry-tenant-a", "t")].reason == "ConsumerMismatch"
    assert d[("default", "u")].reason == "NotInTenantNamespace"


def test_partial_needs_something_of_every_resource() -> None:
    fpga = node("fpga-0", 0, {})
    fpga["status"]["allocatable"]["example.com/fpga"] = "0"  # advertised, none healthy
    d = decide([*NODES, fpga], [gslice("a", "s", {"nvidia.com/gpu": 2, "example.com/fpga": 1}, partial=True)])
    got = d[("gpuferry-tenant-a", "s")]
    assert got.phase == "Denied" and got.reason == "InsufficientResources"


def test_cpu_memory_and_pods_are_granted_exactly() -> None:
    d = decide([node("l4-0", 2, L4)], [gslice("a", "s", {"cpu": "1500m", "memory": "1Gi", "pods": 10})])
    got = d[("gpuferry-tenant-a", "s")]
    assert slice_status(got)["granted"] == {"cpu": "1500m", "memory": "1Gi", "pods": "10"}


def test_cpu_memory_and_pods_follow_the_gpus_node_by_node() -> None:
    sel = {"nvidia.com/gpu.product": "NVIDIA-L4"}
    want = {"nvidia.com/gpu": 4, "cpu": "16", "memory": "64Gi", "pods": 20}
    got = decide(NODES, [gslice("a", "s", want, selector=sel)])[("gpuferry-tenant-a", "s")]
    assert got.phase == "Granted"
    blocks = {n: {k: str(v) for k, v in r.items()} for n, r in got.nodes.items()}
    assert slice_status(got)["shape"]["nodes"] == [
        {"name": "l4-0", "free": {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "2", "pods": "10"}},
        {"name": "l4-1", "free": {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "2", "pods": "10"}},
    ], blocks


def test_partial_gpus_scale_the_rest_down() -> None:
    sel = {"nvidia.com/gpu.product": "NVIDIA-L4"}
    want = {"nvidia.com/gpu": 8, "cpu": "64", "pods": 3}
    got = decide(NODES, [gslice("a", "s", want, selector=sel, partial=True)])[("gpuferry-tenant-a", "s")]
    assert got.phase == "PartiallyGranted"
    assert slice_status(got)["granted"] == {"cpu": "32", "nvidia.com/gpu": "4", "pods": "2"}


def test_what_does_not_fit_beside_the_gpus_comes_from_other_nodes() -> None:
    nodes = [node("l4-0", 2, L4), node("l4-1", 2, L4)]
    want = {"nvidia.com/gpu": 2, "cpu": "40"}  # 32 cpu per node
    got = decide(nodes, [gslice("a", "s", want)])[("gpuferry-tenant-a", "s")]
    assert got.phase == "Granted"
    assert slice_status(got)["shape"]["nodes"] == [
        {"name": "l4-0", "free": {"cpu": "32", "nvidia.com/gpu": "2"}},
        {"name": "l4-1", "free": {"cpu": "8"}},
    ]


def test_grants_are_sticky_against_newcomers() -> None:
    sel = {"nvidia.com/gpu.product": "NVIDIA-L4"}
    holder = gslice("b", "s", {"nvidia.com/gpu": 4}, selector=sel, partial=True,
                    created="2026-01-02T00:00:00Z")
    holder["metadata"]["generation"] = 3
    holder["status"] = {"phase": "PartiallyGranted", "observedGeneration": 3}
    newcomer = gslice("a", "s", {"nvidia.com/gpu": 1}, selector=sel, created="2026-01-02T00:00:00Z")
    d = decide(NODES, [newcomer, holder])
    assert d[("gpuferry-tenant-b", "s")].granted == {"nvidia.com/gpu": Decimal(4)}
    assert d[("gpuferry-tenant-a", "s")].phase == "Denied"
    # a holder whose spec changed since its grant queues again behind the others
    holder["metadata"]["generation"] = 4
    d = decide(NODES, [newcomer, holder])
    assert d[("gpuferry-tenant-a", "s")].phase == "Granted"
    assert d[("gpuferry-tenant-b", "s")].granted == {"nvidia.com/gpu": Decimal(3)}


def test_twin_pods_beyond_their_reservation_occupy_the_node() -> None:
    from peering.provider.planning import reservations_of

    held = gslice("a", "s", {"nvidia.com/gpu": 2})
    held["status"] = {"phase": "Granted",
                      "shape": {"nodes": [{"name": "l4-0", "free": {"nvidia.com/gpu": "2"}}]}}
    denied = gslice("b", "s", {"nvidia.com/gpu": 2})
    denied["status"] = {"phase": "Denied",
                        "shape": {"nodes": [{"name": "l4-1", "free": {"nvidia.com/gpu": "2"}}]}}
    reservations = reservations_of([held, denied])
    assert reservations == {"a": {"l4-0": {"nvidia.com/gpu": Decimal(2)}}}
    pods = [pod("ml-a", "l4-0", 1), pod("ml-a", "l4-1", 2), pod("serve-a", "l4-0", 1)]
    free = {n.name: n.free["nvidia.com/gpu"]
            for n in free_capacity(NODES, pods, {"ml-a": "a", "serve-a": "a"}, reservations)}
    # within the reservation on l4-0 (1 + 1 of 2): not charged; on l4-1 it is all beyond
    assert free == {"h100-0": 8, "l4-0": 2, "l4-1": 0}


def test_the_slices_tolerations_travel_from_the_foreign_cluster_to_the_virtual_node() -> None:
    from peering.consumer.builders import desired_slice_spec, same_slice_spec, virtual_node

    gpu = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    plain = desired_slice_spec("ml-eu", {"resources": {"nvidia.com/gpu": "2"}})
    assert "tolerations" not in plain
    tolerant = desired_slice_spec("ml-eu", {"resources": {"nvidia.com/gpu": "2"}, "tolerations": [gpu]})
    assert tolerant["tolerations"] == [gpu]
    assert not same_slice_spec(plain, tolerant), "a new toleration is a new request"
    grant = {"resources": {"nvidia.com/gpu": "2"}, "shape": {}, "labels": {}}
    vn = virtual_node(provider_id="farm", consumer_id="ml-eu", grant=grant, selector={}, secret="s",
                      tolerations=[gpu])  # fmt: skip
    assert vn["spec"]["providerTolerations"] == [gpu]
    bare = virtual_node(provider_id="farm", consumer_id="ml-eu", grant=grant, selector={}, secret="s")
    assert "providerTolerations" not in bare["spec"]


def granted_slice(consumer: str, gpus: int, nodes: dict[str, int], *, selector: dict[str, str] | None = None,
                  partial: bool = False, generation: int = 1) -> dict[str, Any]:
    """A slice granted ``nodes`` (node → GPUs) for generation 1, its spec now at ``generation``."""
    obj = gslice(consumer, "s", {"nvidia.com/gpu": gpus}, selector=selector, partial=partial)
    obj["metadata"]["generation"] = generation
    obj["status"] = {"phase": "Granted", "observedGeneration": 1,
                     "granted": {"nvidia.com/gpu": str(sum(nodes.values()))},
                     "shape": {"nodes": [{"name": n, "free": {"nvidia.com/gpu": str(g)}}
                                         for n, g in nodes.items()]},
                     "labels": {"nvidia.com/gpu.product": "NVIDIA-L4"}}
    return obj


L4_ONLY = {"nvidia.com/gpu.product": "NVIDIA-L4"}
A = ("gpuferry-tenant-a", "s")


def test_a_refused_change_keeps_the_grant_in_force() -> None:
    # held: the 4 L4 GPUs; asked now: 8 L4 (only 4 exist), or a product the provider lacks
    asks: list[tuple[int, dict[str, str]]] = [(8, L4_ONLY), (4, {"nvidia.com/gpu.product": "B200"})]
    for gpus, selector in asks:
        changed = granted_slice("a", gpus, {"l4-0": 2, "l4-1": 2}, selector=selector, generation=2)
        newcomer = gslice("b", "s", {"nvidia.com/gpu": 1}, selector=L4_ONLY, created="2025-01-01T00:00:00Z")
        d = decide(NODES, [changed, newcomer])
        kept = d[A]
        assert kept.phase == "Granted" and kept.granted == {"nvidia.com/gpu": Decimal(4)}
        assert kept.nodes == {"l4-0": {"nvidia.com/gpu": 2}, "l4-1": {"nvidia.com/gpu": 2}}
        assert kept.labels == {"nvidia.com/gpu.product": "NVIDIA-L4"}
        assert kept.refused is not None and kept.refused[0] in {"InsufficientGPUs", "NoMatchingNodes"}
        assert kept.reason == "ChangeRefused" and kept.refused[1] in kept.message
        # the grant in force is still held: an older newcomer does not get it
        assert d[("gpuferry-tenant-b", "s")].phase == "Denied"


def test_a_change_that_fits_replaces_the_grant_and_may_use_its_own_capacity() -> None:
    smaller = granted_slice("a", 2, {"l4-0": 2, "l4-1": 2}, selector=L4_ONLY, generation=2)
    d = decide(NODES, [smaller])
    assert d[A].phase == "Granted" and d[A].granted["nvidia.com/gpu"] == 2 and d[A].refused is None
    # growing from 2 to 4 L4 while an older newcomer waits for 2: the change goes first, with
    # its own 2 GPUs handed back to it
    bigger = granted_slice("a", 4, {"l4-0": 2}, selector=L4_ONLY, generation=2)
    waiting = gslice("b", "s", {"nvidia.com/gpu": 2}, selector=L4_ONLY, created="2025-01-01T00:00:00Z")
    d = decide(NODES, [bigger, waiting])
    assert d[A].phase == "Granted" and d[A].granted["nvidia.com/gpu"] == 4
    assert d[("gpuferry-tenant-b", "s")].phase == "Denied"


def test_a_kept_grant_shrinks_with_lost_capacity_and_goes_when_nothing_is_left() -> None:
    changed = granted_slice("a", 8, {"l4-0": 2, "l4-1": 2}, selector=L4_ONLY, generation=2)
    cordoned = [node("l4-0", 2, L4), node("l4-1", 2, L4, unschedulable=True), node("h100-0", 8, H100)]
    d = decide(cordoned, [changed])
    assert d[A].phase == "PartiallyGranted" and d[A].granted == {"nvidia.com/gpu": Decimal(2)}
    assert d[A].refused is not None
    gone = [node("l4-0", 2, L4, ready=False), node("l4-1", 2, L4, unschedulable=True)]
    d = decide(gone, [changed])
    assert d[A].phase == "Denied" and d[A].refused is None and d[A].granted == {}


def test_a_holder_shrinks_to_what_is_left_instead_of_being_revoked() -> None:
    holder = granted_slice("a", 4, {"l4-0": 2, "l4-1": 2}, selector=L4_ONLY)  # allowPartial false
    provider_pod = pod("team", "l4-1", 1)
    d = decide(NODES, [holder], [provider_pod])
    assert d[A].phase == "PartiallyGranted" and d[A].granted["nvidia.com/gpu"] == 3
    # a newcomer with allowPartial false is still all or nothing
    fresh = gslice("c", "s", {"nvidia.com/gpu": 4}, selector=L4_ONLY)
    d = decide(NODES, [fresh], [provider_pod])
    assert d[("gpuferry-tenant-c", "s")].phase == "Denied"


def test_a_written_refusal_is_read_back_as_a_change_not_a_holder() -> None:
    changed = granted_slice("a", 8, {"l4-0": 2, "l4-1": 2}, selector=L4_ONLY, generation=2)
    (decision,) = decide(NODES, [changed]).values()
    changed["status"] = {**changed["status"], **slice_status(decision), "observedGeneration": 2,
                         "refusedChange": {"generation": 2, "reason": "InsufficientGPUs", "message": "..."}}
    again = slice_request(changed)
    assert not again.holds_grant
    assert again.in_force == {"l4-0": {"nvidia.com/gpu": 2}, "l4-1": {"nvidia.com/gpu": 2}}
    (second,) = decide(NODES, [changed]).values()
    assert second.granted == decision.granted and second.refused == decision.refused
    # the same spec once granted (refusal of an older generation): a holder again
    changed["metadata"]["generation"] = 3
    changed["status"]["observedGeneration"] = 3
    assert slice_request(changed).holds_grant


def test_the_virtual_node_advertises_the_grant_in_force_and_zero_once_withdrawn() -> None:
    from peering.consumer.builders import virtual_node_spec_from_grant

    kept = granted_slice("a", 8, {"l4-0": 2, "l4-1": 2}, selector=L4_ONLY, generation=2)
    kept["status"]["refusedChange"] = {"generation": 2, "reason": "InsufficientGPUs", "message": "..."}
    grant = virtual_node_spec_from_grant(kept)
    assert grant is not None and grant["resources"] == {"nvidia.com/gpu": "4"}
    advertised = {"resources": {"nvidia.com/gpu": "4", "pods": "110"},
                  "labels": {"nvidia.com/gpu.product": "L4"}}
    withdrawn = {"status": {"phase": "Denied", "granted": {}}}
    assert virtual_node_spec_from_grant(withdrawn, advertised) == {
        "resources": {"nvidia.com/gpu": "0", "pods": "0"}, "shape": {"nvidia.com/gpu": "0", "pods": "0"},
        "labels": {"nvidia.com/gpu.product": "L4"},
    }  # fmt: skip
    assert virtual_node_spec_from_grant(withdrawn, None) is None  # denied at once: no node at all


def test_a_waiting_block_re_plans_the_grant_toward_a_node_that_holds_it() -> None:
    """Issue 14 §3: 8 GPUs granted as 2 on each of four nodes (the provider's pods hold 6 on
    each); one node is emptied; an 8-GPU pod waits. Without its report the grant stays where it
    is; with it, the grant moves to the emptied node as one block of 8, and stays there."""
    h100 = {"nvidia.com/gpu.product": "NVIDIA-H100"}
    nodes = [node(f"h-{i}", 8, H100) for i in range(4)]
    busy = [pod("team", f"h-{i}", 6) for i in range(4)]
    fresh = gslice("a", "s", {"nvidia.com/gpu": 8}, selector=h100)
    first = decide(nodes, [fresh], busy)[A]
    assert first.nodes == {f"h-{i}": {"nvidia.com/gpu": 2} for i in range(4)}

    held = granted_slice("a", 8, {f"h-{i}": 2 for i in range(4)}, selector=h100)
    emptied = busy[:2] + busy[3:]  # h-2 is free now
    (stays,) = allocate(free_capacity(nodes, emptied), [slice_request(held)]).values()
    assert stays.nodes == first.nodes, "no pod waits for a block: the grant does not wander"
    (moved,) = allocate(free_capacity(nodes, emptied), [slice_request(held, block=Decimal(8))]).values()
    assert moved.granted == {"nvidia.com/gpu": 8} and moved.nodes == {"h-2": {"nvidia.com/gpu": 8}}
    assert moved.largest == {"nvidia.com/gpu": 8}

    placed = granted_slice("a", 8, {"h-2": 8}, selector=h100)  # the pod runs there; no more waiting
    (kept,) = allocate(free_capacity(nodes, emptied), [slice_request(placed)]).values()
    assert kept.nodes == {"h-2": {"nvidia.com/gpu": 8}}
    # a block larger than the whole grant, or than any node has, changes nothing
    (same,) = allocate(free_capacity(nodes, busy), [slice_request(held, block=Decimal(8))]).values()
    assert same.nodes == first.nodes
