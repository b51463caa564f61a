"""The provider's pods' use of its nodes, kept as the pods change.

The GPU pool's pass needs, per node, what the pods bound there request
(:func:`peering.provider.planning.free_capacity_of_use`). Summing every pod in every pass made a
pass cost the provider's pods, and a burst of ten thousand pods on the provider asked for one
pass after another (issue 15: 2 to 4 ms of the provider controller's CPU per pod created, any pod,
paced). :class:`PodUse` keeps the sums per (namespace, node) instead, each pod's share added
when it is bound and taken back when it finishes or goes: a pass reads the sums.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from decimal import Decimal

from kube.informers import Change
from kube.logs import object_logger
from kube.objects import ObjectKey, RawObject
from kube.quantities import ResourceList, SharedLists, add, sub

from .planning import pod_use_of

__all__ = ["PodUse"]

logger = logging.getLogger(__name__)

_SHARED_REQUESTS = 256
"""Distinct pod requests kept as one shared dict each (a burst's pods all ask alike)."""

Where = tuple[str, str]


class PodUse:
    """(namespace, node) → the summed requests of that namespace's pods holding room on that
    node (:func:`peering.provider.planning.pod_use` of every pod, kept as they change)."""

    def __init__(self) -> None:
        self._of: dict[ObjectKey, tuple[Where, ResourceList]] = {}
        self._sums: dict[Where, ResourceList] = {}
        self._counts: dict[Where, int] = {}
        self._share = SharedLists(_SHARED_REQUESTS)

    @property
    def sums(self) -> Mapping[Where, Mapping[str, Decimal]]:
        """The sums now (read, not kept: they change with the next pod event)."""
        return self._sums

    def changed(self, change: Change) -> None:
        """A handler for the pods informer: ``change``'s pod counted anew."""
        if change.type == "MODIFIED" and change.old == change.new:
            return  # its projection is the same: requests, node and phase too
        self.set(change.key, change.new)

    def set(self, key: ObjectKey, pod: RawObject | None) -> None:
        """``key``'s pod is now ``pod`` (``None``: gone). A pod whose requests cannot be read
        (the API server validates them, so not from it) is logged and not counted: this runs in
        the pods informer's handler, where an exception would end the watch."""
        try:
            entry = pod_use_of(pod) if pod is not None else None
        except ValueError as exc:
            log = object_logger(logger, "Pod", key)
            log.warning("unreadable requests (%s): not counted in the GPU pool", exc)
            entry = None
        old = self._of.get(key)
        if old == entry:
            return
        if old is not None:
            del self._of[key]
            self._take(*old)
        if entry is not None:
            where, amounts = entry[0], self._share(entry[1])
            self._of[key] = (where, amounts)
            self._sums[where] = add(self._sums.get(where, {}), amounts)
            self._counts[where] = self._counts.get(where, 0) + 1

    def _take(self, where: Where, amounts: ResourceList) -> None:
        left = self._counts[where] - 1
        if left == 0:  # the last pod there: nothing is left, exactly
            del self._counts[where], self._sums[where]
        else:
            self._counts[where] = left
            self._sums[where] = sub(self._sums[where], amounts)

    def __len__(self) -> int:
        """The pods counted."""
        return len(self._of)
