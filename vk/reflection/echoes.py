"""Our own writes, as the watch brings them back: an echo wakes no reconciler.

When a reconciler writes an object (a consumer pod's status, a new twin), the API server answers
with the object as written, and a moment later the watch delivers the same version again. The
pass that wrote it already did what that state needs: waking the same reconciler for its echo
only decodes both pods to find nothing to do (issue 15: a status pass and a twin pass per pod,
of 8.8 passes on its way to Running). :class:`Echoes` keeps, per key, the resource version that
our last write of it returned, and :meth:`Echoes.is_echo` says whether a change brings exactly
that version back.

A change that brings any other version is not an echo: someone else wrote, or our write was
overtaken, and the reconciler looks at it as before. Entries go with their echo, or when the
key's object goes (:meth:`Echoes.forget`): at most one per pod on the node.
"""

from __future__ import annotations

from kube.objects import ObjectKey, RawObject

__all__ = ["Echoes"]


class Echoes:
    """The resource version of our last write of each key, until its watch event comes."""

    __slots__ = ("_written",)

    def __init__(self) -> None:
        self._written: dict[ObjectKey, str] = {}

    def wrote(self, key: ObjectKey, answer: RawObject, seen: str | None = None) -> str | None:
        """Record the API server's ``answer`` to a write of ``key``; its resource version.

        ``seen``: the version the informer holds now. Where it is the answer's, the echo came in
        while the answer was on its way (the watch is read first as often as not) and nothing is
        awaited: kept, the entry would stay until the object goes."""
        version = (answer.get("metadata") or {}).get("resourceVersion")
        if version and str(version) != seen:
            self._written[key] = str(version)
            return str(version)
        self._written.pop(key, None)
        return str(version) if version else None

    def is_echo(self, key: ObjectKey, version: str | None) -> bool:
        """Whether a change of ``key`` to ``version`` is our last write coming back (then it is
        forgotten: a later change with the same version cannot come)."""
        if version is None or self._written.get(key) != version:
            return False
        del self._written[key]
        return True

    def awaiting(self, key: ObjectKey) -> str | None:
        """The resource version of our last write of ``key`` while its watch event has not come:
        until then the informer's copy is older than the object."""
        return self._written.get(key)

    def forget(self, key: ObjectKey) -> None:
        self._written.pop(key, None)

    def __len__(self) -> int:
        return len(self._written)
