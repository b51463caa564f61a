"""The pods bound to the virtual node as a scrape of its kubelet API reads them, and the names of
their twins, kept from scrape to scrape.

A scrape of 10,000 pods read each pod's identity from the consumer store and its twin's from the
provider's: about a fifth of a scrape where nothing changed, and as much again where one pod had
(issue 15). :class:`NodePodIndex` reads them all once, then only the keys the stores say changed
since (:meth:`kube.informers.Informer.changed_since`); everything again where a store cannot
tell (its journal overrun, a twin namespace come or gone).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection, Hashable, Sequence
from typing import Any, NamedTuple, Protocol

from kube.informers import Stored
from kube.objects import ObjectKey, RawObject

from ..forge.usage import PodRef


class FollowedStore(Protocol):
    """A store that tells whether, and where, it changed."""

    def changes(self) -> Hashable: ...
    def changed_since(self, token: Any) -> Collection[ObjectKey] | None: ...


class NodeStores(Protocol):
    """What the index reads: the consumer pods bound here (``local_*``), their twins by consumer
    key (``twin_identity``) and the stores that tell their changes (``followed``: none, every
    scrape reads everything)."""

    @property
    def local_keys(self) -> Callable[[], list[ObjectKey]]: ...
    @property
    def local_pod(self) -> Callable[[ObjectKey], RawObject | None]: ...
    @property
    def local_identity(self) -> Callable[[ObjectKey], Stored | None]: ...
    @property
    def twin_identity(self) -> Callable[[ObjectKey], Stored | None]: ...
    @property
    def followed(self) -> Sequence[FollowedStore]: ...


class NodePods(NamedTuple):
    """The pods bound here, and the twins of those that have one."""

    token: tuple[Hashable, ...] | None
    """What the followed stores told when they were read (None: nothing to tell by)."""
    refs: tuple[PodRef, ...]
    """A tuple, the same object while the stores do not change: a
    :class:`~vk.forge.usage.PodTexts` answers one it was given last time from that scrape."""
    twins: dict[str, dict[str, str]]
    """Twin namespace -> twin name -> consumer pod UID."""


def store_token(stores: Sequence[FollowedStore]) -> tuple[Hashable, ...] | None:
    """What ``stores`` tell now (None: there are none)."""
    return tuple(store.changes() for store in stores) if stores else None


def changed_since(
    stores: Sequence[FollowedStore], token: tuple[Hashable, ...] | None
) -> set[ObjectKey] | None:
    """The keys any of ``stores`` changed since it told ``token`` (None: one cannot tell)."""
    if token is None or not stores:
        return None
    found: set[ObjectKey] = set()
    for store, told in zip(stores, token, strict=True):
        changed = store.changed_since(told)
        if changed is None:
            return None
        found.update(changed)
    return found


class NodePodIndex:
    """The node's pods (:class:`PodRef` by key) and their twins' names, brought up to date at
    each read by the keys that changed since the last one."""

    def __init__(self) -> None:
        self._held: NodePods | None = None
        self._refs: dict[ObjectKey, PodRef] = {}
        self._twins: dict[str, dict[str, str]] = {}
        self._twin_of: dict[ObjectKey, tuple[str, str]] = {}
        """Consumer key -> its twin's namespace and name, as filed in :attr:`_twins`."""

    def read(self, stores: NodeStores) -> NodePods:
        """The pods bound here and their twins' names now: the last read's where no store
        changed, else the last read's with the changed keys read again."""
        token = store_token(stores.followed)
        held = self._held
        if held is not None and token is not None and held.token == token:
            return held
        changed = changed_since(stores.followed, held.token) if held is not None else None
        if changed is None:  # everything again
            self._refs, self._twins, self._twin_of = {}, {}, {}
        for key in stores.local_keys() if changed is None else changed:
            self._follow(stores, key)
        twins = {namespace: dict(names) for namespace, names in self._twins.items()}
        self._held = NodePods(token, tuple(self._refs.values()), twins)
        return self._held

    def _follow(self, stores: NodeStores, key: ObjectKey) -> None:
        """Read ``key`` again: its pod's identity and its twin's."""
        filed = self._twin_of.pop(key, None)
        if filed is not None and (names := self._twins.get(filed[0])) is not None:
            names.pop(filed[1], None)
            if not names:
                del self._twins[filed[0]]
        stored = stores.local_identity(key)
        if stored is None:
            self._refs.pop(key, None)
            return
        self._refs[key] = PodRef(str(key.namespace), key.name, stored.uid, stored.version,
                                 functools.partial(stores.local_pod, key))  # fmt: skip
        twin = stores.twin_identity(key)
        if twin is not None:
            namespace, name = str(twin.own.namespace), twin.own.name
            self._twins.setdefault(namespace, {})[name] = str(stored.uid)
            self._twin_of[key] = (namespace, name)
