"""A watch-fed cache of one resource, calling back on every change. I/O (watches)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from kube.clients import KubeClient
from kube.objects import ObjectKey, RawObject, Resource
from kube.settings import WatchSettings
from kube.watching import Listed, watch_objects

__all__ = ["Cache"]

Projection = Callable[[RawObject], RawObject]


class Cache:
    """Objects of ``resource`` (projected with ``project``) by key, kept current by a watch."""

    def __init__(self, resource: Resource, *, label_selector: str | None = None,
                 project: Projection | None = None) -> None:
        self.resource = resource
        self.label_selector = label_selector
        self.project = project or (lambda obj: obj)
        self.objects: dict[ObjectKey, RawObject] = {}
        self.synced = asyncio.Event()

    def values(self) -> list[RawObject]:
        return list(self.objects.values())

    async def run(self, client: KubeClient, on_change: Callable[[RawObject], None], *,
                  settings: WatchSettings | None = None) -> None:
        """Watch forever; ``on_change(obj)`` after each change is applied (deletions included)."""
        async for item in watch_objects(client, self.resource, label_selector=self.label_selector,
                                        settings=settings):
            if isinstance(item, Listed):
                for key in set(self.objects) - set(item.keys):
                    on_change(self.objects.pop(key))
                self.synced.set()
                continue
            if item.type == "DELETED":
                self.objects.pop(item.key, None)
            else:
                self.objects[item.key] = self.project(item.object)
            on_change(item.object)
