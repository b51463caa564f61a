"""Waiting for peering objects through watches, and the one error the peering steps raise."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from kube.clients import KubeClient
from kube.objects import RawObject, Resource
from kube.watching import Listed, watch_objects

__all__ = [
    "PeeringError",
    "Progress",
    "StillThere",
    "held_by",
    "quiet",
    "wait_all_gone",
    "wait_gone",
    "wait_none",
    "wait_until",
]

Progress = Callable[[str], None]
"""Called with one line per step done (the CLI prints them)."""


class PeeringError(Exception):
    """A peering step cannot complete; the message is one line for the user."""


class StillThere(PeeringError):
    """An object waited for to go is still there; ``held`` says what holds it (:func:`held_by`)."""

    def __init__(self, message: str, held: str = "") -> None:
        super().__init__(message + held)
        self.held = held


def quiet(_: str) -> None:
    """A :data:`Progress` that says nothing."""
    pass


async def wait_until(
    client: KubeClient,
    resource: Resource,
    name: str,
    namespace: str | None,
    check: Callable[[RawObject], str | None],
    timeout: float,
    what: str,
) -> RawObject:
    """Watch ``name`` until ``check`` returns "" (done) or a non-empty failure message."""
    last: RawObject | None = None

    async def watch() -> RawObject:
        nonlocal last
        async for item in watch_objects(
            client, resource, namespace=namespace, field_selector=f"metadata.name={name}"
        ):
            if isinstance(item, Listed) or item.type == "DELETED":
                continue
            last = item.object
            verdict = check(item.object)
            if verdict == "":
                return item.object
            if verdict:
                raise PeeringError(verdict)
        raise PeeringError(f"watching {what} ended")

    try:
        async with asyncio.timeout(timeout):
            return await watch()
    except TimeoutError:
        if last is None:
            detail: object = "it was never seen"
        else:
            detail = last.get("status") or "it has no status yet: is the provider controller running?"
        raise PeeringError(f"{what} not ready after {timeout:.0f}s: {detail}") from None


def held_by(obj: RawObject | None) -> str:
    """What an object being deleted says holds it, as a suffix for a message ("" when nothing
    does, or it is not being deleted): its finalizers, and its conditions that report a failure
    or content remaining. A namespace whose deletion waits on an aggregated API that does not
    answer (a metrics-server that is down) says so only there. Pure."""
    if obj is None or not (obj.get("metadata") or {}).get("deletionTimestamp"):
        return ""
    parts = []
    finalizers = (obj.get("metadata") or {}).get("finalizers") or []
    finalizers += (obj.get("spec") or {}).get("finalizers") or []  # a namespace's own
    if finalizers:
        parts.append(f"finalizers {', '.join(str(f) for f in finalizers)}")
    for cond in (obj.get("status") or {}).get("conditions") or []:
        kind = str(cond.get("type") or "")
        if cond.get("status") == "True" and kind.endswith(("Failure", "Remaining")):
            parts.append(f"{kind}: {cond.get('message') or cond.get('reason') or ''}".rstrip(": "))
    return f"; held by: {'; '.join(parts)}" if parts else ""


async def wait_gone(
    client: KubeClient, resource: Resource, name: str, namespace: str | None, timeout: float
) -> None:
    """Until ``name`` no longer exists; PeeringError after ``timeout`` seconds, saying what holds
    it (:func:`held_by`)."""
    last: RawObject | None = None

    async def watch() -> None:
        nonlocal last
        async for item in watch_objects(
            client, resource, namespace=namespace, field_selector=f"metadata.name={name}"
        ):
            if isinstance(item, Listed):
                if not item.keys:
                    return
            elif item.type == "DELETED":
                return
            else:
                last = item.object

    try:
        async with asyncio.timeout(timeout):
            await watch()
    except TimeoutError:
        raise StillThere(
            f"{resource.kind} {namespace + '/' if namespace else ''}{name} still there after {timeout:.0f}s",
            held_by(last),
        ) from None


async def wait_all_gone(
    resource: Resource, targets: Sequence[tuple[KubeClient, str]], timeout: float
) -> None:
    """Until each ``(cluster, name)`` of ``resource`` (cluster-scoped) is gone, waiting for them all
    at once: a namespace's deletion takes at least the namespace controller's 5 s, a CRD's the API
    server's removal of its objects, so n of them one after the other take n times that.
    :class:`StillThere` for the first still there after ``timeout`` seconds."""
    waits = (wait_gone(client, resource, name, None, timeout) for client, name in targets)
    for outcome in await asyncio.gather(*waits, return_exceptions=True):  # each ends by its timeout
        if isinstance(outcome, BaseException):
            raise outcome


async def wait_none(
    client: KubeClient,
    resource: Resource,
    namespace: str | None,
    *,
    timeout: float,
    what: str,
    field_selector: str | None = None,
    matching: Callable[[RawObject], bool] = lambda _: True,
) -> None:
    """Until no ``resource`` object (selected, and ``matching``) is left; PeeringError after
    ``timeout`` seconds, naming how many are still there."""
    left: set[object] = set()

    async def watch() -> None:
        listed = False
        async for item in watch_objects(client, resource, namespace=namespace, field_selector=field_selector):
            if isinstance(item, Listed):
                left.intersection_update(item.keys)
                listed = True
            elif item.type == "DELETED" or not matching(item.object):
                left.discard(item.key)
            else:
                left.add(item.key)
            if listed and not left:
                return

    try:
        async with asyncio.timeout(timeout):
            await watch()
    except TimeoutError:
        raise PeeringError(f"{len(left)} {what} still there after {timeout:.0f}s") from None
