"""Waiting for an object to reach a state, through a real watch (kube.watching), never a poll."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from kube.clients import KubeClient
from kube.objects import ObjectKey, RawObject, Resource
from kube.watching import Listed, WatchEvent, present_after, watch_objects


async def wait_for(
    client: KubeClient,
    resource: Resource,
    name: str,
    predicate: Callable[[RawObject], bool],
    *,
    namespace: str | None = None,
    timeout: float = 30.0,
) -> RawObject:
    """The first version of ``name`` for which ``predicate`` holds; TimeoutError names the last seen."""
    last: RawObject | None = None

    async def watch() -> RawObject:
        nonlocal last
        async for item in watch_objects(
            client, resource, namespace=namespace, field_selector=f"metadata.name={name}"
        ):
            if isinstance(item, Listed):
                continue
            assert isinstance(item, WatchEvent)
            if item.type != "DELETED":
                last = item.object
                if predicate(item.object):
                    return item.object
        raise AssertionError("watch_objects ended")

    try:
        return await asyncio.wait_for(watch(), timeout)
    except TimeoutError:
        shown = last.get("status") if last else "never seen"
        raise TimeoutError(
            f"{resource.plural} {namespace}/{name} not as expected after {timeout}s: {shown}"
        ) from None


def condition(obj: RawObject, type_: str) -> RawObject | None:
    for cond in obj.get("status", {}).get("conditions") or []:
        if cond.get("type") == type_:
            return dict(cond)
    return None


async def wait_for_items(
    client: KubeClient,
    resource: Resource,
    predicate: Callable[[list[RawObject]], bool],
    *,
    namespace: str | None = None,
    timeout: float = 30.0,
) -> list[RawObject]:
    """The first list of ``resource`` objects for which ``predicate`` holds (watched, not polled);
    TimeoutError shows the names last seen."""
    present: dict[ObjectKey, RawObject] = {}

    async def watch() -> list[RawObject]:
        listed = False
        async for item in watch_objects(client, resource, namespace=namespace):
            if isinstance(item, Listed):
                listed = True
                for key in [k for k in present if k not in item.keys]:
                    del present[key]
            elif item.type == "DELETED":
                present.pop(item.key, None)
            else:
                present[item.key] = item.object
            if listed and predicate(list(present.values())):
                return list(present.values())
        raise AssertionError("watch_objects ended")

    try:
        return await asyncio.wait_for(watch(), timeout)
    except TimeoutError:
        names = sorted(str(k.name) for k in present)
        raise TimeoutError(f"{resource.plural} not as expected after {timeout}s: {names}") from None


async def wait_for_empty(client: KubeClient, resource: Resource, namespace: str, timeout: float = 60) -> None:
    """Until ``namespace`` holds no ``resource`` object (watched, not polled)."""

    async def watch() -> None:
        present: frozenset[ObjectKey] = frozenset()
        async for item in watch_objects(client, resource, namespace=namespace):
            present = present_after(present, item)
            if not present and (isinstance(item, Listed) or item.type == "DELETED"):
                return

    await asyncio.wait_for(watch(), timeout)


async def wait_for_deletion(
    client: KubeClient, resource: Resource, name: str, namespace: str | None, timeout: float = 60
) -> None:
    """Until ``name`` no longer exists (watched, not polled)."""

    async def watch() -> None:
        async for item in watch_objects(
            client, resource, namespace=namespace, field_selector=f"metadata.name={name}"
        ):
            if isinstance(item, Listed) and not item.keys:
                return
            if isinstance(item, WatchEvent) and item.type == "DELETED":
                return

    await asyncio.wait_for(watch(), timeout)
