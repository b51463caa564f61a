"""What the provider can place now: its nodes and the requests of the pods bound to them.

:class:`ProviderView` list+watches the provider's Nodes and its bound, unfinished Pods (every
namespace: the free room of a node depends on every pod on it, not only our twins) and keeps
small projections: per node, its labels, taints, readiness and allocatable; per pod, its node
and effective request (:func:`vk.forge.fit.placement_request`), summed per node as it changes.
Where the virtual kubelet watches its twins anyway, that watch feeds them in
(:meth:`ProviderView.add_pod_source`) and the view's own pod watch leaves them out.
Answers are computed from those, never by walking every pod again. The free room of each node is
kept as pods come and go (a pod changes one node's entry, not every node's), and the nodes a pod's
selector and tolerations may land on are kept per selector and tolerations, a node's change
updating them for that node alone: the fit of one pod is a scan of those nodes' free room that
stops at the first that fits, which keeps the gate cheap in a burst of ten thousand pods (issue
15: recomputing every node's free room and selector match for every pod made a burst quadratic,
57 ms of CPU per pod at 10,000).

The view is advisory: a twin created a moment ago is counted once the provider's watch reports
it bound, so two pods fitted in the same instant may both be told that the last free block is
theirs; the provider's scheduler then keeps one Pending, as it would for any pod.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from kube.clients import KubeClient
from kube.objects import NODES, PODS, ObjectKey, RawObject, Resource
from kube.quantities import ResourceList, SharedLists, add, covers, parse_resource_list, sub
from kube.settings import WatchSettings
from kube.watching import Listed, WatchEvent, watch_objects

from ..forge.fit import FitResult, fits_somewhere, placement_request, unschedulable_reason
from ..forge.labels import PREFIX, virtual_node_identity

__all__ = ["ProviderView"]

logger = logging.getLogger(__name__)

# Bound, unfinished pods only: a pod that completes or is deleted leaves the watch (DELETED).
POD_FIELD_SELECTOR = "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"
_ELIGIBLE_CACHE = 64
"""Distinct (selector, tolerations) pairs whose eligible nodes are kept at once."""
_SHARED_REQUESTS = 256
"""Distinct pod requests kept as one shared dict each."""


def _project_node(node: Mapping[str, Any]) -> RawObject:
    """The fields of a Node that fit and labels read (heartbeat timestamps left out)."""
    metadata = node.get("metadata") or {}
    spec = node.get("spec") or {}
    status = node.get("status") or {}
    ready = [
        {"type": "Ready", "status": c.get("status")}
        for c in status.get("conditions") or ()
        if c.get("type") == "Ready"
    ]
    return {
        "metadata": {"name": metadata.get("name"), "labels": dict(metadata.get("labels") or {})},
        "spec": {"unschedulable": bool(spec.get("unschedulable")), "taints": list(spec.get("taints") or ())},
        "status": {
            "allocatable": dict(status.get("allocatable") or status.get("capacity") or {}),
            "conditions": ready,
        },
    }


def _eligible_key(
    selector: Mapping[str, str], tolerations: Sequence[Mapping[str, Any]]
) -> tuple[object, ...]:
    """How the nodes for ``selector`` and ``tolerations`` are filed in ``ProviderView._eligible``."""
    return (
        tuple(sorted(selector.items())),
        tuple(tuple(sorted((str(k), str(v)) for k, v in t.items())) for t in tolerations),
    )


@dataclass
class _Eligible:
    """The nodes a pod with ``selector`` and ``tolerations`` may land on, sorted by name."""

    selector: dict[str, str]
    tolerations: list[dict[str, Any]]
    names: list[str]


class ProviderView:
    """Provider nodes and the room left on each (see the module docstring)."""

    def __init__(
        self,
        *,
        provider: KubeClient,
        selector: Mapping[str, str],
        settings: WatchSettings,
        on_change: Callable[[], None] = lambda: None,
        ignored_selector_keys: frozenset[str] = frozenset(),
        tolerations: Sequence[Mapping[str, Any]] = (),
    ) -> None:
        self.provider = provider
        self.tolerations = [dict(t) for t in tolerations]
        """The grant's tolerations (a slice may cover tainted GPU nodes): every twin carries them."""
        self.selector = dict(selector)
        self.settings = settings
        self.on_change = on_change
        self.ignored_selector_keys = ignored_selector_keys
        self.nodes: dict[str, RawObject] = {}
        self.nodes_version = 0
        """Counts the changes of the nodes' labels and allocatable (nodes coming and going too):
        what is derived from those alone (the GPU labels of the virtual node) is kept until it
        moves. Readiness, taints and cordons do not move it: on a provider of a thousand nodes
        they change every few seconds somewhere (issue 15: the GPU labels, recomputed over every
        node at each Node update of a 10,000-pod burst, were 6 % of the virtual kubelet's py-spy
        samples)."""
        self._allocatable: dict[str, ResourceList] = {}
        self._pods: dict[ObjectKey, tuple[str, ResourceList, str]] = {}
        """Counted pod → its node, its request and the watch that feeds it (``""``: the view's own)."""
        self.pod_label_selector: str | None = None
        """The view's own pod watch leaves out what another watch feeds (:meth:`add_pod_source`)."""
        self._unlisted: set[str] = {""}
        """The pod watches not listed yet: what fits where is known once each was."""
        self._used: dict[str, ResourceList] = {}
        self._free: dict[str, ResourceList] = {}
        """Node name → allocatable less the requests of its pods, kept per node as they change."""
        self._shared = SharedLists(_SHARED_REQUESTS)
        self._eligible: dict[tuple[object, ...], _Eligible] = {}
        """(selector, tolerations) → the sorted names of the nodes a pod with them may land on,
        kept as nodes change (each change looks at that node only)."""
        self._grant_key = _eligible_key(self.selector, self.tolerations)
        """The grant's own selector and tolerations as kept in ``_eligible`` (read per pod change)."""
        self._largest: ResourceList | None = None
        """What :meth:`largest` answered, kept as pods come and go; None: to be computed again."""
        self._at_largest: dict[str, int] = {}
        """Per resource, how many of the grant's nodes have exactly the largest amount free."""
        self.nodes_synced = asyncio.Event()
        self.not_granted: str | None = None
        """Why the grant has no node now (fed from a GPUSlice that is not granted), for the
        message of a pod that waits; None: granted, or not fed from a grant."""
        self.pods_synced = asyncio.Event()

    @property
    def synced(self) -> bool:
        """Whether both the nodes and the pods were listed at least once."""
        return self.nodes_synced.is_set() and self.pods_synced.is_set()

    # ---- answers -------------------------------------------------------------------------------

    def _eligible_names(
        self, selector: Mapping[str, str], tolerations: Sequence[Mapping[str, Any]]
    ) -> list[str]:
        """The sorted names of the Ready, uncordoned nodes ``selector`` picks and whose taints
        ``tolerations`` tolerate, kept as nodes change."""
        key = _eligible_key(selector, tolerations)
        eligible = self._eligible.get(key)
        if eligible is None:
            if len(self._eligible) >= _ELIGIBLE_CACHE:
                self._eligible.clear()  # many distinct selectors: start over rather than grow
            names = sorted(
                name
                for name, node in self.nodes.items()
                if unschedulable_reason(node, selector=selector, tolerations=tolerations) is None
            )
            eligible = self._eligible[key] = _Eligible(dict(selector), [dict(t) for t in tolerations], names)
        return eligible.names

    def _node_eligibility_changed(self, name: str) -> None:
        """Keep every kept list of eligible nodes right for the node ``name``, which changed or
        went: one node looked at per kept list, where recomputing a list looked at every node."""
        node = self.nodes.get(name)
        for eligible in self._eligible.values():
            names = eligible.names
            at = bisect.bisect_left(names, name)
            listed = at < len(names) and names[at] == name
            fits = node is not None and unschedulable_reason(
                node, selector=eligible.selector, tolerations=eligible.tolerations
            ) is None
            if listed and not fits:
                del names[at]
            elif fits and not listed:
                names.insert(at, name)

    def per_node_free(
        self, *, selector: Mapping[str, str] | None = None, tolerations: list[Mapping[str, Any]] | None = None
    ) -> dict[str, ResourceList]:
        """Node name → free resources, for the Ready, uncordoned provider nodes that the grant's
        selector (and ``selector``) picks and whose taints ``tolerations`` tolerate."""
        wanted = {**self.selector, **(selector or {})}
        tolerated = [*self.tolerations, *(tolerations or ())]
        return {name: dict(self._free.get(name, {})) for name in self._eligible_names(wanted, tolerated)}

    def largest(self) -> ResourceList:
        """Per resource, the largest amount free on one schedulable picked node (the grant's
        tolerations only).

        Kept between calls: a pod that takes room from a node changes the answer only where that
        node was the last one with the largest amount, and one that gives room back only where it
        now has more (issue 15: a scan of every node at each Node status sync was 1.5 % of the
        virtual kubelet's CPU through a burst of 10,000 pods on 1252 nodes). A node's own change
        (labels, taints, readiness, allocatable) starts the answer over."""
        if self._largest is None:
            largest: ResourceList = {}
            zero = Decimal(0)
            names = self._eligible_names(self.selector, self.tolerations)
            for node in names:  # no copies: read only
                for name, amount in self._free.get(node, {}).items():
                    current = largest.get(name, zero)
                    largest[name] = amount if amount > current else current
            self._at_largest = {name: 0 for name in largest}
            for node in names:
                for name, amount in self._free.get(node, {}).items():
                    if amount == largest[name]:
                        self._at_largest[name] += 1
            self._largest = largest
        return dict(self._largest)

    def _largest_moved(self, node: str, old: ResourceList, new: ResourceList) -> None:
        """Keep :meth:`largest`'s answer right after the free room of ``node`` went from ``old``
        to ``new`` (its eligibility unchanged); where it cannot tell, the answer is dropped."""
        largest = self._largest
        if largest is None:
            return
        kept = self._eligible.get(self._grant_key)
        names = kept.names if kept is not None else self._eligible_names(self.selector, self.tolerations)
        at = bisect.bisect_left(names, node)
        if at == len(names) or names[at] != node:
            return  # not one of the grant's nodes: no part of the answer
        if old.keys() != new.keys():
            self._largest = None  # a resource appears or goes: rare, start over
            return
        counts = self._at_largest
        for name, after in new.items():
            before, top = old[name], largest[name]
            if after > top:
                largest[name], counts[name] = after, 1
            elif after == top:
                if before != top:
                    counts[name] += 1
            elif before == top:
                counts[name] -= 1
                if counts[name] <= 0:  # it was the last node with that much: start over
                    self._largest = None
                    return

    def fit(self, pod: Mapping[str, Any]) -> FitResult:
        """Whether ``pod`` (a consumer pod) fits on one provider node its twin could land on.

        The twin keeps the pod's tolerations and node selector (less the virtual node's
        identity labels and gpuferry's own labels, which mean nothing on the provider), so both
        narrow the nodes considered. Node affinity is not considered.
        """
        spec = pod.get("spec") or {}
        selector = {
            key: value
            for key, value in (spec.get("nodeSelector") or {}).items()
            if key not in self.ignored_selector_keys and not key.startswith(PREFIX)
        }
        tolerations = list(spec.get("tolerations") or ())
        request = placement_request(pod)
        names = self._eligible_names({**self.selector, **selector}, [*self.tolerations, *tolerations])
        for name in names:  # the first that fits, in name order, as fits_somewhere picks it
            if covers(self._free.get(name, {}), request):
                return FitResult(True, "Fits", f"fits on provider node {name}", name)
        if not names and self.not_granted is not None:
            return FitResult(False, "NothingGranted", self.not_granted)
        # none fits: the full answer says why (this walk happens only for a pod that waits)
        return fits_somewhere(request, {name: self._free.get(name, {}) for name in names})

    # ---- watches -------------------------------------------------------------------------------

    def _changed(self) -> None:
        self.on_change()

    def _node_changed(self, name: str | None = None, *, labels_moved: bool = True) -> None:
        """A node changed (``name``; None: any may have, after a relist)."""
        self._largest = None
        if labels_moved:
            self.nodes_version += 1
        if name is None:
            self._eligible.clear()
        else:
            self._node_eligibility_changed(name)
        self._changed()

    def _refresh_free(self, node: str) -> None:
        old = self._free.get(node)
        new = self._free[node] = sub(self._allocatable.get(node, {}), self._used.get(node, {}))
        if old is None:
            self._largest = None
        else:
            self._largest_moved(node, old, new)

    def handle_node(self, item: WatchEvent | Listed) -> None:
        if isinstance(item, Listed):
            names = {key.name for key in item.keys}
            gone = [name for name in self.nodes if name not in names]
            for name in gone:
                del self.nodes[name]
                self._allocatable.pop(name, None)
                self._free.pop(name, None)
            self.nodes_synced.set()
            self._node_changed()  # the first listing is a change too
            return
        name = item.key.name
        if item.type == "DELETED":
            if self.nodes.pop(name, None) is not None:
                self._allocatable.pop(name, None)
                self._free.pop(name, None)
                self._node_changed(name)
            return
        projected = _project_node(item.object)
        old = self.nodes.get(name)
        if old != projected:
            self.nodes[name] = projected
            try:
                self._allocatable[name] = parse_resource_list(projected["status"]["allocatable"])
            except ValueError as exc:
                logger.warning("provider Node %s: unreadable allocatable (%s); counted as empty", name, exc)
                self._allocatable[name] = {}
            self._refresh_free(name)
            moved = old is None or any(
                old[part][field] != projected[part][field]
                for part, field in (("metadata", "labels"), ("status", "allocatable"))
            )
            self._node_changed(name, labels_moved=moved)

    def _forget_pod(self, key: ObjectKey) -> bool:
        old = self._pods.pop(key, None)
        if old is None:
            return False
        node, request, _ = old
        self._used[node] = sub(self._used.get(node, {}), request)
        self._refresh_free(node)
        return True

    def add_pod_source(self, source: str, *, leave_out: str) -> None:
        """Another watch feeds the view some pods (:meth:`handle_pod` with ``source``), and the
        view's own pod watch leaves them out by the label selector ``leave_out``: the virtual
        kubelet's twin informer, which receives every event of its twins anyway, feeds them, so
        that the provider does not send each twin's events twice (issue 15: 2 of the 5.8 provider
        watch events per pod). Call before the view's own watch starts."""
        self.pod_label_selector = leave_out
        self._unlisted.add(source)

    def handle_pod(self, item: WatchEvent | Listed, source: str = "") -> None:
        """A pod event or a relist from the watch ``source`` (``""``: the view's own).

        A relist forgets only the pods that watch fed. A pod whose labels move it from one watch
        to the other is counted once: the watch it enters takes it over, and the deletion the
        one it leaves sends is ignored, whichever comes first."""
        if isinstance(item, Listed):
            gone = [key for key, (_, _, by) in self._pods.items() if by == source and key not in item.keys]
            for key in gone:
                self._forget_pod(key)
            self._unlisted.discard(source)
            if not self._unlisted:
                self.pods_synced.set()
            self._changed()
            return
        key = item.key
        pod = item.object
        old = self._pods.get(key)
        if item.type == "DELETED" and old is not None and old[2] != source:
            return  # it moved to the other watch, which counts it now
        node = (pod.get("spec") or {}).get("nodeName")
        phase = (pod.get("status") or {}).get("phase")
        if item.type == "DELETED" or not node or phase in ("Succeeded", "Failed"):
            if self._forget_pod(key):
                self._changed()
            return
        try:
            request = self._shared(placement_request(pod))
        except ValueError as exc:
            logger.warning("provider Pod %s: unreadable requests (%s); not counted", key, exc)
            return
        if old == (node, request, source):
            return
        self._forget_pod(key)
        self._pods[key] = (node, request, source)
        self._used[node] = add(self._used.get(node, {}), request)
        self._refresh_free(node)
        if old is None or old[:2] != (node, request):
            self._changed()

    # ---- fed from a grant (scoped identity) ------------------------------------------------------

    def set_granted_nodes(self, slice_obj: RawObject | None) -> None:
        """Use the per-node grant of a GPUSlice as the nodes (what is *ours* on each) instead of
        watching the provider's Nodes, which a scoped identity may not list."""
        status = (slice_obj or {}).get("status") or {}
        labels = {str(k): str(v) for k, v in (status.get("labels") or {}).items()}
        selector = ((slice_obj or {}).get("spec") or {}).get("nodeSelector") or {}
        nodes: dict[str, RawObject] = {}
        phase = status.get("phase")
        self.not_granted = None if phase in ("Granted", "PartiallyGranted") else (
            f"the provider grants nothing now (GPUSlice {phase or 'Pending'}"
            + (f": {status.get('reason')}: {status.get('message')})" if status.get("reason") else ")")
        )  # fmt: skip
        if phase in ("Granted", "PartiallyGranted"):
            for entry in (status.get("shape") or {}).get("nodes") or ():
                nodes[str(entry["name"])] = {
                    "metadata": {"name": entry["name"], "labels": {**labels, **selector}},
                    "spec": {"unschedulable": False, "taints": []},
                    "status": {"allocatable": dict(entry.get("free") or {}),
                               "conditions": [{"type": "Ready", "status": "True"}]},
                }  # fmt: skip
        self.handle_node(Listed("", frozenset(ObjectKey(None, name) for name in nodes)))
        for node in nodes.values():
            self.handle_node(WatchEvent("MODIFIED", node))

    def mark_pods_synced(self) -> None:
        """The pods fed through :meth:`handle_pod_in` (every namespace we have pods in) were
        all listed: what fits where is known."""
        self.pods_synced.set()
        self._changed()

    def handle_pod_in(self, namespace: str, item: WatchEvent | Listed) -> None:
        """:meth:`handle_pod` for a watch of one namespace (a relist there forgets only its pods)."""
        if isinstance(item, Listed):
            gone = [key for key in self._pods if key.namespace == namespace and key not in item.keys]
            for key in gone:
                self._forget_pod(key)
            self._changed()
            return
        self.handle_pod(item)

    async def _watch(
        self,
        resource: Resource,
        handle: Callable[[WatchEvent | Listed], None],
        field_selector: str | None = None,
        label_selector: str | None = None,
    ) -> None:
        """Watch forever; a permanent error (403 on a scoped identity, say) is logged and the
        watch retried with backoff, never raised."""
        async for item in watch_objects(
            self.provider,
            resource,
            field_selector=field_selector,
            label_selector=label_selector,
            settings=self.settings,
            retry_permanent=True,
        ):
            handle(item)

    @property
    def node_label_selector(self) -> str | None:
        """The grant's node selector as a label selector: nodes it does not pick are never
        counted, so the API server need not send them (a provider of a thousand nodes heartbeats
        them all; issue 15)."""
        return ",".join(f"{key}={value}" for key, value in sorted(self.selector.items())) or None

    async def watch_nodes(self) -> None:
        await self._watch(NODES, self.handle_node, label_selector=self.node_label_selector)

    async def watch_pods(self) -> None:
        await self._watch(PODS, self.handle_pod, POD_FIELD_SELECTOR, self.pod_label_selector)


def identity_keys(provider_id: str, node_name: str) -> frozenset[str]:
    """Label keys of the virtual node's identity (ignored in pods' node selectors)."""
    return frozenset(virtual_node_identity(provider_id, node_name))
