"""List-then-watch as one endless async generator of typed markers.

:func:`watch_objects` lists a resource (following ``continue`` pages), yields every object as
an ``ADDED`` :class:`WatchEvent`, then a :class:`Listed` marker with the keys that exist, then
watches from the list's ``resourceVersion`` and yields every change. It keeps the last
``resourceVersion`` it saw, bookmarks included, and:

* when a watch ends normally (``timeoutSeconds``), watches again from there: no relist;
* on 410 Gone (an ``ERROR`` event or an HTTP status), lists again and yields a new ``Listed``;
  consumers drop the keys that the new marker lacks;
* on 429, 5xx and network errors (dropped connection, silent stream, refused), waits with
  exponential backoff (``Retry-After`` honoured) and resumes from the last ``resourceVersion``;
* on 401, 403, 404 and other permanent errors, raises the classified error.

The stream is newline-delimited JSON, split into lines here (a line may span many chunks and be
larger than aiohttp's readline limit: ConfigMaps reach 1 MiB) and decoded with orjson.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Literal

import aiohttp
import orjson

from . import backoff
from .clients import KubeClient
from .errors import (
    Gone,
    KubeError,
    NotFound,
    ResourceNotServed,
    TooManyRequests,
    Unreachable,
    from_exception,
    from_response,
    is_temporary,
    not_served_message,
)
from .metrics import counter
from .objects import ObjectKey, RawObject, Resource
from .settings import WatchSettings

__all__ = ["Listed", "WatchEvent", "backoff_delay", "iter_lines", "watch_objects"]

logger = logging.getLogger(__name__)

EventType = Literal["ADDED", "MODIFIED", "DELETED"]
_EVENT_TYPES: frozenset[str] = frozenset({"ADDED", "MODIFIED", "DELETED"})
_WATCH_EVENTS = counter(
    "watch_events",
    "Objects received by list+watch loops, by resource, type (ADDED, MODIFIED, DELETED, BOOKMARK; "
    "LISTED for each item of a list) and server (host:port): with api_requests, the work a "
    "component does for each object that changes.",
    ["resource", "type", "server"],
)


@dataclass(frozen=True)
class WatchEvent:
    """An object that was added, modified or deleted (its last state, for a deletion)."""

    type: EventType
    object: RawObject

    @property
    def key(self) -> ObjectKey:
        return ObjectKey.of(self.object)


@dataclass(frozen=True)
class Listed:
    """A (re)list finished: ``keys`` is everything that exists as of ``resource_version``.

    Everything a consumer knows of that is not in ``keys`` was deleted while it was not watching.
    """

    resource_version: str
    keys: frozenset[ObjectKey]


def present_after(present: frozenset[ObjectKey], item: WatchEvent | Listed) -> frozenset[ObjectKey]:
    """The objects a watch has shown to be there, after ``item``: a (re)list says which are, an
    event adds or removes one. Pure.

    None present means none exists only after a (re)list or a deletion: before its list ends, a
    watch has not yet shown what there is."""
    if isinstance(item, Listed):
        return item.keys
    return present - {item.key} if item.type == "DELETED" else present | {item.key}


async def iter_lines(content: aiohttp.StreamReader) -> AsyncIterator[bytes]:
    """Non-empty lines of a stream, however they are split into chunks (no length limit)."""
    buffer = bytearray()
    async for chunk in content.iter_any():
        buffer += chunk
        start = 0
        while (end := buffer.find(b"\n", start)) >= 0:
            line = bytes(buffer[start:end]).strip()
            start = end + 1
            if line:
                yield line
        del buffer[:start]
    if buffer.strip():
        # a stream cut mid-line: that event is incomplete and is not yielded
        raise aiohttp.ClientPayloadError(f"watch stream ended inside an event ({len(buffer)} bytes)")


def backoff_delay(failures: int, settings: WatchSettings, retry_after: float | None = None) -> float:
    """The wait before reconnect number ``failures`` (1-based); ``retry_after`` wins if given."""
    return backoff.backoff_delay(failures, base=settings.backoff_base, cap=settings.backoff_max,
                                 jitter=settings.backoff_jitter, retry_after=retry_after)  # fmt: skip


async def _list(
    client: KubeClient,
    resource: Resource,
    namespace: str | None,
    label_selector: str | None,
    field_selector: str | None,
    settings: WatchSettings,
) -> tuple[str, list[RawObject]]:
    try:
        listing = await client.list(
            resource,
            namespace,
            label_selector=label_selector,
            field_selector=field_selector,
            limit=settings.page_size,
        )
    except NotFound as exc:  # a list is never "not found" for lack of objects: the type is missing
        if isinstance(exc, ResourceNotServed):
            raise
        served = f"{resource.plural}.{resource.group}" if resource.group else resource.plural
        raise ResourceNotServed(
            not_served_message(f"{served} ({resource.api_version})"),
            status=exc.status, reason=exc.reason, body=exc.body,
        ) from exc  # fmt: skip
    return str(listing["metadata"]["resourceVersion"]), listing["items"]


async def _watch(
    client: KubeClient,
    resource: Resource,
    namespace: str | None,
    label_selector: str | None,
    field_selector: str | None,
    settings: WatchSettings,
    resource_version: str,
) -> AsyncIterator[tuple[str, RawObject]]:
    """(type, object) of one watch connection, BOOKMARK included; ERROR events are raised."""
    params: dict[str, str | int | bool | None] = {
        "watch": True,
        "allowWatchBookmarks": True,
        "resourceVersion": resource_version,
        "timeoutSeconds": settings.timeout_seconds,
        "labelSelector": label_selector,
        "fieldSelector": field_selector,
    }
    path = resource.path(namespace)
    async with client.stream("GET", path, params, read_timeout=settings.read_timeout) as resp:
        async for line in iter_lines(resp.content):
            event = orjson.loads(line)
            kind, obj = event.get("type"), event.get("object") or {}
            if kind == "ERROR":
                raise from_response(int(obj.get("code") or 500), obj)
            yield kind, obj


async def watch_objects(
    client: KubeClient,
    resource: Resource,
    *,
    namespace: str | None = None,
    label_selector: str | None = None,
    field_selector: str | None = None,
    settings: WatchSettings | None = None,
    retry_permanent: bool = False,
    _iterations: int | None = None,
) -> AsyncIterator[WatchEvent | Listed]:
    """Endless list+watch of ``resource``; see the module docstring for the behaviour.

    ``retry_permanent`` is for long-lived loops that must outlive a 403 or 404 (RBAC not bound
    yet, a CRD not installed yet, a namespace being made): such an error is logged and the
    resource listed again after the same backoff, instead of being raised.

    ``_iterations`` (tests only) ends the generator after that many connection attempts (each
    LIST or WATCH request, failed or not, counts as one).
    """
    settings = settings or WatchSettings()
    rv: str | None = None  # None: a (re)list is due
    failures = 0
    attempts = 0
    what = f"{resource} in {namespace}" if namespace else str(resource)
    received = {
        kind: _WATCH_EVENTS.labels(resource.plural, kind, client.server)
        for kind in ("LISTED", "ADDED", "MODIFIED", "DELETED", "BOOKMARK")
    }
    while _iterations is None or attempts < _iterations:
        attempts += 1
        try:
            if rv is None:
                listed_rv, items = await _list(
                    client, resource, namespace, label_selector, field_selector, settings
                )
                failures = 0
                received["LISTED"].inc(len(items))
                keys = []
                # handed out one by one and let go of: the list stays in this frame while the
                # watch runs, and a kept list of ten thousand full pods is ~180 MB (issue 15)
                items.reverse()
                while items:
                    listed_obj = items.pop()
                    keys.append(ObjectKey.of(listed_obj))
                    yield WatchEvent("ADDED", listed_obj)
                    del listed_obj
                rv = listed_rv
                listed = Listed(listed_rv, frozenset(keys))
                del keys
                yield listed
                del listed
                continue
            async for kind, obj in _watch(
                client, resource, namespace, label_selector, field_selector, settings, rv
            ):
                failures = 0
                new_rv = (obj.get("metadata") or {}).get("resourceVersion")
                if new_rv:
                    rv = str(new_rv)
                if (count := received.get(kind)) is not None:
                    count.inc()
                if kind in _EVENT_TYPES:
                    obj.setdefault("apiVersion", resource.api_version)
                    obj.setdefault("kind", resource.kind)
                    yield WatchEvent(kind, obj)  # type: ignore[arg-type]
                elif kind != "BOOKMARK":
                    logger.warning("watch of %s: ignoring an event of type %r", what, kind)
            failures = 0  # ended normally (timeoutSeconds): resume from rv
        except Gone as exc:
            logger.info("watch of %s: resourceVersion %s is gone (%s); listing again", what, rv, exc.message)
            rv = None
            if settings.relist_delay > 0:
                await asyncio.sleep(settings.relist_delay)
        except (KubeError, aiohttp.ClientError, TimeoutError, orjson.JSONDecodeError) as raw:
            if isinstance(raw, orjson.JSONDecodeError):
                error: KubeError = Unreachable(f"undecodable watch event: {raw}", reason="BadEvent")
            else:
                error = from_exception(raw)
            if not is_temporary(error):
                if not retry_permanent:
                    if error is raw:
                        raise
                    raise error from raw
                rv = None  # whatever was denied or missing, start again from a list
            failures += 1
            retry_after = error.retry_after if isinstance(error, TooManyRequests) else None
            delay = backoff_delay(failures, settings, retry_after)
            logger.warning(
                "watch of %s failed (%s); retrying from resourceVersion %s in %.2fs",
                what,
                error,
                rv or "(list)",
                delay,
            )
            await asyncio.sleep(delay)
