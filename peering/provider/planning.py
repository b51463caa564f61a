"""Free capacity and grant decisions for GPUSlices. Pure: raw objects in, decisions out.

One pass decides every slice of the provider together (:func:`allocate`), in a fixed order
(slices that already hold a grant for their current spec first, then the oldest, then namespace
and name), so that two tenants competing for the same GPUs can never be granted more than
exists: each slice only sees what the slices before it left. Grants are sticky: a newcomer never
takes capacity from a slice granted before; only lost capacity (a node cordoned, drained,
deleted, or taken by the provider's own pods) shrinks a grant.

A grant is best effort, not a hard reservation against the provider's own workloads: when
capacity is lost, the grant *shrinks* to what is still free on its nodes (``PartiallyGranted``,
whatever ``allowPartial`` says: that flag is about the first answer), and it is withdrawn
(``Denied``) only when nothing of a requested resource is left. The consumer sees the grant in
force at once (its virtual node advertises ``status.granted``); running twins are never evicted
by a shrink, the provider's quota only stops new ones.

Changing a granted slice's spec is a transaction. The grants in force are placed first
(holders, then the grants in force of changed slices, kept on their nodes); then each changed
slice tries its new spec with its own grant handed back. Granted: the new grant replaces the old
one. Refused: the old grant stays in force, as it was, and the decision says why the change was
refused (``Decision.refused``). Newcomers come last.

A grant is a *reservation per node* (``shape.nodes``): a node's free capacity is its
allocatable minus the requests of its non-terminated pods that are not twin pods (twin pods are
charged to their tenant's grant, not a second time to the node) minus the reservations of the
slices decided before. GPUs are placed first, node by node; cpu, memory, pods and other
resources follow in proportion on the same nodes, so that each node's block in ``shape.nodes``
is usable on its own. The nodes are taken in this order: the nodes the slice already holds (the
most first: a grant does not wander off the nodes its twins run on), then the others by name.
When the consumer reports a pod that waits for a block larger than any node of its grant
(``SliceRequest.block``, from the virtual kubelet), the node that can hold that block with the
least to spare goes first, so that the grant is re-planned toward a block that fits.

A slice is granted in full, in part (only with ``allowPartial``, and only when every requested
resource gets something), or denied with a reason (``NoMatchingNodes``, ``InsufficientGPUs``,
``InsufficientResources``, ``ConsumerMismatch``, ``NotInTenantNamespace``).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal
from typing import Any, TypeVar

from kube.accelerators import closest, dra_class, gpu_equivalent, is_device, lead_resource, mig_profile
from kube.api import GPU_RESOURCE
from kube.quantities import (
    ResourceList,
    format_resource_list,
    is_byte_resource,
    parse_resource_list,
    pod_requests,
)
from kube.taints import blocking_taints, untolerated

from ..resources import TENANT_NAMESPACE_PREFIX

__all__ = [
    "GPU",
    "Decision",
    "NodeFree",
    "SliceRequest",
    "allocate",
    "free_capacity",
    "free_capacity_of_use",
    "node_is_usable",
    "pod_use",
    "pod_use_of",
    "reservations_of",
    "selector_matches",
    "slice_request",
    "slice_status",
]

GPU = GPU_RESOURCE
_K = TypeVar("_K")
_MILLI = Decimal("0.001")
_GFD_PREFIX = "nvidia.com/"
_TERMINAL = frozenset({"Succeeded", "Failed"})
_GRANTED_PHASES = frozenset({"Granted", "PartiallyGranted"})


@dataclass(frozen=True)
class NodeFree:
    """A usable provider node and what is free on it before any grant."""

    name: str
    labels: Mapping[str, str]
    free: ResourceList
    taints: tuple[Mapping[str, Any], ...] = ()
    """Its NoSchedule/NoExecute taints: only a slice that tolerates them all may be granted it."""


@dataclass(frozen=True)
class SliceRequest:
    """What one GPUSlice asks for."""

    namespace: str
    name: str
    consumer_id: str | None
    resources: ResourceList
    node_selector: Mapping[str, str]
    allow_partial: bool
    tolerations: tuple[Mapping[str, Any], ...] = ()
    """The provider taints its twins may tolerate (e.g. ``nvidia.com/gpu:NoSchedule``)."""
    created: str = ""
    holds_grant: bool = False
    """Granted (in full or in part) for its current spec in an earlier pass."""
    in_force: Mapping[str, ResourceList] | None = None
    """A changed slice's grant in force per node (``shape.nodes`` decided for its earlier spec)."""
    in_force_labels: Mapping[str, str] = field(default_factory=dict)
    in_force_selector: Mapping[str, str] = field(default_factory=dict)
    held: Mapping[str, Decimal] = field(default_factory=dict)
    """Of the device that leads its placement (:func:`kube.accelerators.lead_resource`: GPUs,
    else e.g. MIG instances), how much per node its grant in force holds (``shape.nodes``):
    taken first again."""
    block: Decimal = Decimal(0)
    """GPUs of the largest consumer pod waiting for a block no node of the grant has."""

    @property
    def order(self) -> tuple[bool, str, str, str]:
        """Slices holding a grant first (a newcomer never takes capacity from them), then the
        oldest (creationTimestamp has second precision: namespace and name break ties)."""
        return (not self.holds_grant, self.created, self.namespace, self.name)


@dataclass(frozen=True)
class Decision:
    """The provider's answer to one slice."""

    phase: str  # Granted | PartiallyGranted | Denied
    reason: str
    message: str
    granted: ResourceList = field(default_factory=dict)
    nodes: Mapping[str, ResourceList] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)
    refused: tuple[str, str] | None = None
    """The current spec was refused (reason, message); the grant above is the one in force."""
    node_selector: Mapping[str, str] = field(default_factory=dict)
    """The node selector the grant in force was decided for (its twins are pinned to it)."""

    @property
    def largest(self) -> ResourceList:
        """Per resource, the most granted on one node (the largest block a pod can use)."""
        out: ResourceList = {}
        for free in self.nodes.values():
            for res, amount in free.items():
                if amount > out.get(res, Decimal(0)):
                    out[res] = amount
        return out


def node_is_usable(node: Mapping[str, Any]) -> bool:
    """Ready, not cordoned, not being deleted (taints are for each slice to tolerate)."""
    md = node.get("metadata") or {}
    spec = node.get("spec") or {}
    if md.get("deletionTimestamp") or spec.get("unschedulable"):
        return False
    ready = [c for c in (node.get("status") or {}).get("conditions") or () if c.get("type") == "Ready"]
    return bool(ready) and ready[0].get("status") == "True"


def selector_matches(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def _add_to(acc: ResourceList, amounts: Mapping[str, Decimal]) -> None:
    for res, amount in amounts.items():
        acc[res] = acc.get(res, Decimal(0)) + amount


def _plus(acc: dict[_K, Mapping[str, Decimal]], key: _K, amounts: Mapping[str, Decimal]) -> None:
    """``acc[key] += amounts`` without changing a dict held elsewhere: the first amounts are
    kept as given (and only read), a second sum is a new dict (a pass over kept sums copies
    none of the many a node holds once)."""
    current = acc.get(key)
    if current is None:
        acc[key] = amounts
        return
    total = dict(current)
    _add_to(total, amounts)
    acc[key] = total


@functools.lru_cache(maxsize=4096)
def _parsed_allocatable(items: tuple[tuple[str, Any], ...]) -> ResourceList:
    """A node's allocatable, parsed once per distinct value (a pass reads every node's; a
    provider's nodes mostly share a few). Shared: read only."""
    return parse_resource_list(dict(items))


PodUse = dict[tuple[str, str], ResourceList]
"""(namespace, node) → the requests of that namespace's pods holding room on that node, with
``pods`` counting them: all :func:`free_capacity_of_use` needs to know of the pods."""


def pod_use_of(pod: Mapping[str, Any]) -> tuple[tuple[str, str], ResourceList] | None:
    """((namespace, node), requests with ``pods: 1``) of a pod that holds room on its node;
    ``None`` for one that does not (not bound, or finished). Pure."""
    node_name = (pod.get("spec") or {}).get("nodeName")
    if not node_name or (pod.get("status") or {}).get("phase") in _TERMINAL:
        return None
    namespace = str((pod.get("metadata") or {}).get("namespace") or "")
    return (namespace, node_name), {**pod_requests(pod), "pods": Decimal(1)}


def pod_use(pods: Iterable[Mapping[str, Any]]) -> PodUse:
    """The :data:`PodUse` of ``pods``, summed. Pure."""
    use: PodUse = {}
    for pod in pods:
        if (entry := pod_use_of(pod)) is not None:
            _add_to(use.setdefault(entry[0], {}), entry[1])
    return use


def free_capacity(
    nodes: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
    twin_namespaces: Mapping[str, str] | frozenset[str] = frozenset(),
    reservations: Mapping[str, Mapping[str, ResourceList]] | None = None,
    devices: Mapping[str, ResourceList] | None = None,
    device_use: Mapping[tuple[str, str], ResourceList] | None = None,
) -> list[NodeFree]:
    """Usable nodes with allocatable minus the requests of their non-terminated pods:
    :func:`free_capacity_of_use` of :func:`pod_use` of ``pods``."""
    return free_capacity_of_use(nodes, pod_use(pods), twin_namespaces, reservations, devices, device_use)


def free_capacity_of_use(
    nodes: Iterable[Mapping[str, Any]],
    use: Mapping[tuple[str, str], Mapping[str, Decimal]],
    twin_namespaces: Mapping[str, str] | frozenset[str] = frozenset(),
    reservations: Mapping[str, Mapping[str, ResourceList]] | None = None,
    devices: Mapping[str, ResourceList] | None = None,
    device_use: Mapping[tuple[str, str], ResourceList] | None = None,
) -> list[NodeFree]:
    """Usable nodes with allocatable minus what the pods of ``use`` (:data:`PodUse`) request.

    ``devices`` adds what a node has beyond its allocatable: its DRA devices per DeviceClass
    (:func:`peering.provider.devices.node_devices`); ``device_use``, (namespace, node) → the
    devices ResourceClaims hold there (:func:`peering.provider.devices.allocated`), is charged
    like the pods of that namespace.

    Pods of twin namespaces (``twin_namespaces``: namespace → consumer ID) are charged to their
    tenant's grant: on a node, only what they use beyond the tenant's reservation there
    (``reservations``: consumer ID → node → resources, from the grants in force) counts against
    the node. A consumer that places twin pods outside its grant's nodes thus makes those nodes
    less free for everyone else, and the pool never hands out what is really occupied.
    Pure; a pass costs the (namespace, node) pairs and the nodes, not the pods (issue 15).
    """
    tenants = twin_namespaces if isinstance(twin_namespaces, Mapping) else dict.fromkeys(twin_namespaces, "")
    used: dict[str, Mapping[str, Decimal]] = {}
    twin_use: dict[tuple[str, str], Mapping[str, Decimal]] = {}
    for (namespace, node_name), amounts in use.items():
        if namespace in tenants:
            _plus(twin_use, (tenants[namespace], node_name), amounts)
        else:
            _plus(used, node_name, amounts)
    for (namespace, node_name), amounts in (device_use or {}).items():
        if namespace in tenants:
            _plus(twin_use, (tenants[namespace], node_name), amounts)
        else:
            _plus(used, node_name, amounts)
    for (tenant, node_name), amounts in twin_use.items():
        reserved = ((reservations or {}).get(tenant) or {}).get(node_name) or {}
        beyond = {res: amount - reserved.get(res, Decimal(0)) for res, amount in amounts.items()}
        _plus(used, node_name, {res: v for res, v in beyond.items() if v > 0})
    out: list[NodeFree] = []
    for node in nodes:
        if not node_is_usable(node):
            continue
        md = node.get("metadata") or {}
        alloc = {
            **_parsed_allocatable(tuple(((node.get("status") or {}).get("allocatable") or {}).items())),
            **((devices or {}).get(md["name"]) or {}),
        }
        taken = used.get(md["name"], {})
        free = {res: max(amount - taken.get(res, Decimal(0)), Decimal(0)) for res, amount in alloc.items()}
        out.append(NodeFree(md["name"], dict(md.get("labels") or {}), free, tuple(blocking_taints(node))))
    return sorted(out, key=lambda n: n.name)


def reservations_of(slices: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, ResourceList]]:
    """Consumer ID → node → resources reserved there by the grants in force (``shape.nodes``)."""
    out: dict[str, dict[str, ResourceList]] = {}
    for obj in slices:
        ns = str((obj.get("metadata") or {}).get("namespace") or "")
        status = obj.get("status") or {}
        if not ns.startswith(TENANT_NAMESPACE_PREFIX) or status.get("phase") not in _GRANTED_PHASES:
            continue
        tenant = out.setdefault(ns.removeprefix(TENANT_NAMESPACE_PREFIX), {})
        for entry in (status.get("shape") or {}).get("nodes") or ():
            _add_to(tenant.setdefault(str(entry["name"]), {}), parse_resource_list(entry.get("free")))
    return out


def slice_request(obj: Mapping[str, Any], *, block: Decimal = Decimal(0)) -> SliceRequest:
    """The request of a raw GPUSlice (ValueError for quantities the schema should have refused);
    ``block``: GPUs of the largest pod its consumer has waiting for a block."""
    md = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    granted_now = status.get("phase") in _GRANTED_PHASES
    refused_now = (status.get("refusedChange") or {}).get("generation") == md.get("generation")
    holds = granted_now and status.get("observedGeneration") == md.get("generation") and not refused_now
    resources = {k: v for k, v in parse_resource_list(spec.get("resources")).items() if v > 0}
    lead = lead_resource(resources) or GPU
    in_force = None
    if granted_now and not holds:  # what its earlier spec was granted, node by node
        in_force = {
            str(e["name"]): parse_resource_list(e.get("free"))
            for e in (status.get("shape") or {}).get("nodes") or ()
        } or None
    return SliceRequest(
        namespace=str(md.get("namespace") or ""),
        name=str(md["name"]),
        consumer_id=spec.get("consumerClusterID"),
        resources=resources,
        node_selector=dict(spec.get("nodeSelector") or {}),
        allow_partial=bool(spec.get("allowPartial")),
        tolerations=tuple(dict(t) for t in spec.get("tolerations") or ()),
        created=str(md.get("creationTimestamp") or ""),
        holds_grant=bool(holds),
        in_force=in_force,
        in_force_labels=dict(status.get("labels") or {}) if in_force is not None else {},
        in_force_selector=dict(status.get("nodeSelector") or {}) if in_force is not None else {},
        held={
            str(e["name"]): parse_resource_list(e.get("free")).get(lead, Decimal(0))
            for e in (status.get("shape") or {}).get("nodes") or ()
        }
        if granted_now
        else {},
        block=block,
    )


def _uniform_labels(nodes: Sequence[NodeFree]) -> dict[str, str]:
    if not nodes:
        return {}
    first = {k: v for k, v in nodes[0].labels.items() if k.startswith(_GFD_PREFIX)}
    return {k: v for k, v in first.items() if all(n.labels.get(k) == v for n in nodes[1:])}


def _shortfall_reason(short: Sequence[str]) -> str:
    return "InsufficientGPUs" if any(is_device(r) for r in short) else "InsufficientResources"


def _unit(resource: str, amount: Decimal) -> Decimal:
    if resource == "cpu":
        return _MILLI
    if resource == "pods" or is_byte_resource(resource) or amount == amount.to_integral_value():
        return Decimal(1)
    return _MILLI


def _round(value: Decimal, unit: Decimal, rounding: str) -> Decimal:
    return (value / unit).to_integral_value(rounding=rounding) * unit


def _take(
    res: str,
    need: Decimal,
    order: Sequence[NodeFree],
    remaining: dict[str, ResourceList],
    taken: dict[str, ResourceList],
    caps: Mapping[str, Decimal] | None = None,
) -> Decimal:
    """Take up to ``need`` of ``res`` from the nodes in ``order`` (at most ``caps[node]`` from
    each when given); returns what was taken."""
    got = Decimal(0)
    for node in order:
        if got >= need:
            break
        have = taken.setdefault(node.name, {}).get(res, Decimal(0))
        avail = remaining[node.name].get(res, Decimal(0)) - have
        if caps is not None:
            avail = min(avail, caps.get(node.name, Decimal(0)) - have)
        take = min(need - got, avail)
        if take > 0:
            taken[node.name][res] = have + take
            got += take
    return got


def _gpus_of(amounts: Mapping[str, Decimal], devices: Iterable[str]) -> Decimal:
    """How many GPUs ``amounts`` of ``devices`` are worth (a MIG 3g instance is 3/7 of one)."""
    return sum((gpu_equivalent(r, amounts.get(r, Decimal(0))) for r in devices), Decimal(0))


def _spread(
    want: Mapping[str, Decimal],
    matching: Sequence[NodeFree],
    remaining: dict[str, ResourceList],
    taken: dict[str, ResourceList],
    held: Mapping[str, Decimal] | None = None,
    block_node: NodeFree | None = None,
) -> ResourceList:
    """Place the request on nodes; returns the amounts placed (``taken`` gets them per node).

    Devices lead (GPUs, MIG instances, shared replicas, MetaGPU units): each is taken node by
    node, then every other resource follows in proportion to the part of a GPU placed on each
    node (:func:`kube.accelerators.gpu_equivalent`; scaled down with the devices when they are
    short), so that a node's block is usable — devices with the CPU, memory and pod slots to run
    them, HAMi's GPU memory and cores beside its GPUs. What cannot be placed beside the devices is
    taken from the other matching nodes.

    The leading device (:func:`kube.accelerators.lead_resource`) comes from ``block_node`` first
    (as much as it has), then from each node up to what it ``held`` before, then from the nodes
    in order; the other devices from the nodes in order."""
    granted: ResourceList = {}
    lead = lead_resource(want)
    if lead is None:
        for res, need in sorted(want.items()):
            granted[res] = _take(res, need, matching, remaining, taken)
    else:
        placed = Decimal(0)
        if block_node is not None:
            placed += _take(lead, want[lead], [block_node], remaining, taken)
        if held:
            placed += _take(lead, want[lead] - placed, matching, remaining, taken, dict(held))
        placed += _take(lead, want[lead] - placed, matching, remaining, taken)
        granted[lead] = placed
        devices = sorted(r for r in want if is_device(r) and r != lead)
        for res in devices:
            granted[res] = _take(res, want[res], matching, remaining, taken)
        weight = {n.name: _gpus_of(taken.get(n.name, {}), (lead, *devices)) for n in matching}
        with_devices = [n for n in matching if weight[n.name] > 0]
        others = [n for n in matching if n not in with_devices]
        total = sum(weight.values(), Decimal(0))
        wanted = _gpus_of(want, (lead, *devices))
        scale = total / wanted
        for res, need in sorted(want.items()):
            if res == lead or res in devices:
                continue
            unit = _unit(res, need)
            target = min(need, _round(need * scale, unit, ROUND_CEILING))
            caps = {n.name: _round(target * weight[n.name] / total, unit, ROUND_FLOOR) for n in with_devices}
            got = _take(res, target, with_devices, remaining, taken, caps) if total else Decimal(0)
            got += _take(res, target - got, [*with_devices, *others], remaining, taken)
            granted[res] = got
    for node_name in [n for n, amounts in taken.items() if not any(amounts.values())]:
        del taken[node_name]
    for amounts in taken.values():
        for res in [r for r, v in amounts.items() if not v]:
            del amounts[res]
    return granted


def _block_node(
    req: SliceRequest, order: Sequence[NodeFree], remaining: Mapping[str, ResourceList]
) -> NodeFree | None:
    """The node to take the waiting block of GPUs from first: one already held that large, else
    the one that holds it with the least to spare; None when no block waits or none can hold it
    (blocks are whole GPUs: a slice led by another device has none)."""
    want = req.resources.get(GPU, Decimal(0))
    if req.block <= 0 or req.block > want:
        return None
    fitting = [n for n in order if remaining[n.name].get(GPU, Decimal(0)) >= req.block]
    held = [n for n in fitting if req.held.get(n.name, Decimal(0)) >= req.block]
    if held:
        return held[0]
    if not fitting:
        return None
    return min(fitting, key=lambda n: (remaining[n.name].get(GPU, Decimal(0)), order.index(n)))


def _offered(nodes: Sequence[NodeFree]) -> set[str]:
    """The resources at least one of ``nodes`` advertises (free now or not)."""
    return {res for n in nodes for res in n.free}


def _not_offered(req: SliceRequest, nodes: Sequence[NodeFree], matching: Sequence[NodeFree]) -> str | None:
    """Why the slice asks for a resource no node it could get offers (a typo, a MIG profile this
    provider does not partition its GPUs into, a device of another vendor); None when all are.
    Only usable nodes count (Ready, uncordoned): the messages say so, since a pool being drained
    offers nothing for a while."""
    everywhere = _offered(nodes)
    here = _offered(matching)
    problems = []
    for res in sorted(r for r in req.resources if r not in here):
        if res in everywhere:
            owners = sorted(n.name for n in nodes if res in n.free)
            problems.append(
                f"{res} is offered only by nodes the slice does not select or tolerate "
                f"({', '.join(owners[:5])}{', …' if len(owners) > 5 else ''})"
            )
            continue
        device_class = dra_class(res)
        if device_class is not None:
            classes = sorted(c for c in map(dra_class, everywhere) if c)
            offer = f"DeviceClasses with devices: {', '.join(classes)}" if classes else "no DRA devices here"
            problems.append(
                f"no usable node of this provider has devices of DeviceClass {device_class} ({offer})"
            )
            continue
        profile = mig_profile(res)
        profiles = sorted(p for p in map(mig_profile, everywhere) if p)
        if profile is not None:
            offer = f"its MIG profiles: {', '.join(profiles)}" if profiles else "none has MIG instances"
            problems.append(f"no usable node of this provider offers the MIG profile {profile} ({offer})")
            continue
        guess = closest(res, everywhere)
        hint = f" (did you mean {guess}?)" if guess else ""
        devices = sorted(r for r in everywhere if is_device(r))
        offer = f"; its devices: {', '.join(devices)}" if devices else ""
        problems.append(f"no usable node of this provider offers {res}{hint}{offer}")
    return "; ".join(problems) or None


def _decide(req: SliceRequest, remaining: dict[str, ResourceList], nodes: Sequence[NodeFree]) -> Decision:
    expected_prefix = TENANT_NAMESPACE_PREFIX
    if not req.namespace.startswith(expected_prefix):
        return Decision(
            "Denied",
            "NotInTenantNamespace",
            f"GPUSlices are decided only in tenant namespaces ({expected_prefix}<consumer-id>)",
        )
    tenant_id = req.namespace.removeprefix(expected_prefix)
    if req.consumer_id and req.consumer_id != tenant_id:
        return Decision(
            "Denied",
            "ConsumerMismatch",
            f"spec.consumerClusterID {req.consumer_id!r} is not this namespace's consumer {tenant_id!r}",
        )
    selected = [n for n in nodes if selector_matches(req.node_selector, n.labels)]
    matching = [n for n in selected if not untolerated(n.taints, req.tolerations)]
    if not matching:
        tainted = sorted({t for n in selected for t in untolerated(n.taints, req.tolerations)})
        why = (
            f"; the matching nodes have taints the slice does not tolerate: {', '.join(tainted)}"
            if tainted
            else ""
        )
        return Decision(
            "Denied",
            "NoMatchingNodes",
            f"no schedulable node matches nodeSelector {dict(req.node_selector)}{why}",
        )
    unknown = _not_offered(req, nodes, matching)
    if unknown is not None:
        return Decision("Denied", "ResourceNotOffered", unknown)
    taken: dict[str, ResourceList] = {}

    def order(n: NodeFree) -> tuple[Decimal, int, str]:
        # what it held first (a grant does not wander), then the nodes that offer the most of
        # the requested resources (HAMi's GPUs with their memory and cores), then by name
        return (-req.held.get(n.name, Decimal(0)), -len(req.resources.keys() & n.free.keys()), n.name)

    matching = sorted(matching, key=order)
    granted = _spread(
        req.resources, matching, remaining, taken, req.held, _block_node(req, matching, remaining)
    )
    short = sorted(r for r, need in req.resources.items() if granted[r] < need)
    if short:
        detail = ", ".join(
            f"{r}: requested {format_resource_list({r: req.resources[r]})[r]}, "
            f"free {format_resource_list({r: granted[r]})[r]}"
            for r in short
        )
        where = f"on nodes matching {dict(req.node_selector)}" if req.node_selector else "on this provider"
        reason = _shortfall_reason(short)
        if not (req.allow_partial or req.holds_grant) or any(granted[r] == 0 for r in req.resources):
            return Decision("Denied", reason, f"not enough free {where} ({detail})")
        phase, message = "PartiallyGranted", f"granted in part {where} ({detail})"
    else:
        phase, reason, message = "Granted", "Granted", "granted in full"
    for node_name, amounts in taken.items():
        for res, amount in amounts.items():
            remaining[node_name][res] -= amount
    used_nodes = [n for n in matching if n.name in taken]
    return Decision(
        phase,
        reason,
        message,
        granted,
        taken,
        _uniform_labels(used_nodes),
        node_selector=dict(req.node_selector),
    )


def _keep(req: SliceRequest, remaining: dict[str, ResourceList]) -> Decision | None:
    """A changed slice's grant in force, on its nodes, shrunk to what is left there; None when
    nothing of a resource it holds is left."""
    assert req.in_force is not None
    taken: dict[str, ResourceList] = {}
    held: ResourceList = {}
    for node_name, amounts in sorted(req.in_force.items()):
        _add_to(held, amounts)
        if node_name not in remaining:  # no longer usable
            continue
        for res, amount in amounts.items():
            take = min(amount, remaining[node_name].get(res, Decimal(0)))
            if take > 0:
                taken.setdefault(node_name, {})[res] = take
    granted: ResourceList = {}
    for amounts in taken.values():
        _add_to(granted, amounts)
    if not held or any(granted.get(res, Decimal(0)) == 0 for res, amount in held.items() if amount > 0):
        return None
    for node_name, amounts in taken.items():
        for res, amount in amounts.items():
            remaining[node_name][res] -= amount
    phase = "Granted" if granted == {r: v for r, v in held.items() if v > 0} else "PartiallyGranted"
    return Decision(
        phase,
        "GrantInForce",
        "the grant decided before the change",
        granted,
        taken,
        dict(req.in_force_labels),
        node_selector=dict(req.in_force_selector),
    )


def _give_back(remaining: dict[str, ResourceList], decision: Decision) -> dict[str, ResourceList]:
    out = {name: dict(free) for name, free in remaining.items()}
    for node_name, amounts in decision.nodes.items():
        _add_to(out[node_name], amounts)
    return out


def allocate(nodes: Sequence[NodeFree], requests: Iterable[SliceRequest]) -> dict[tuple[str, str], Decision]:
    """Decide every slice; the sum of all grants never exceeds what is free.

    The grants in force first (holders, oldest first, and the kept grants of changed slices),
    then each changed slice's new spec, with its own grant given back to it, then the newcomers,
    oldest first."""
    remaining = {n.name: dict(n.free) for n in nodes}
    ordered = sorted(requests, key=lambda r: r.order)
    out: dict[tuple[str, str], Decision] = {}
    kept: dict[tuple[str, str], Decision | None] = {}
    for req in ordered:
        if req.holds_grant:
            out[(req.namespace, req.name)] = _decide(req, remaining, nodes)
        elif req.in_force is not None:
            kept[(req.namespace, req.name)] = _keep(req, remaining)
    for req in ordered:
        key = (req.namespace, req.name)
        if key not in kept:
            continue
        in_force = kept[key]
        if in_force is None:  # nothing of its grant left: it queues again like a newcomer
            continue
        trial = _give_back(remaining, in_force)
        change = _decide(req, trial, nodes)
        if change.phase != "Denied":
            remaining = trial
            out[key] = change
        else:
            out[key] = replace(
                in_force,
                reason="ChangeRefused",
                message=f"the change was refused ({change.reason}: {change.message}); "
                "the grant decided before it stays in force",
                refused=(change.reason, change.message),
            )
    for req in ordered:
        key = (req.namespace, req.name)
        if key not in out:
            out[key] = _decide(req, remaining, nodes)
    return {(r.namespace, r.name): out[(r.namespace, r.name)] for r in ordered}


def slice_status(decision: Decision) -> dict[str, Any]:
    """The GPUSlice ``status`` fields for a decision (without conditions)."""
    return {
        "phase": decision.phase,
        "reason": decision.reason,
        "message": decision.message,
        "granted": format_resource_list(decision.granted),
        "shape": {
            "largest": format_resource_list(decision.largest),
            "nodes": [
                {"name": name, "free": format_resource_list(free)}
                for name, free in sorted(decision.nodes.items())
            ],
        },
        "labels": dict(decision.labels),
        "nodeSelector": dict(decision.node_selector),
    }
