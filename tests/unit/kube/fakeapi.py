"""A fake API server (aiohttp) for faults a real kube-apiserver will not produce on demand.

It serves one namespaced collection of ConfigMaps (``/api/v1/namespaces/ns/configmaps``):
LIST with ``limit``/``continue`` pagination, and WATCH streams played from scripts the test
writes (events, raw byte chunks, pauses, a dropped connection). Any request can be answered
with a queued HTTP fault instead (500, 410, 429 with Retry-After…). Every request is recorded
with its query and headers so tests can assert what the client asked for (e.g. the rv it
resumed from). Other paths echo the request back as JSON.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

NS = "ns"
LIST_PATH = f"/api/v1/namespaces/{NS}/configmaps"


def configmap(name: str, rv: int | str, **data: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": NS, "resourceVersion": str(rv), "uid": f"uid-{name}"},
        "data": dict(data),
    }


def event(type_: str, obj: dict[str, Any]) -> bytes:
    """One NDJSON watch event line."""
    return orjson.dumps({"type": type_, "object": obj}) + b"\n"


def bookmark(rv: int | str) -> bytes:
    return event(
        "BOOKMARK", {"kind": "ConfigMap", "apiVersion": "v1", "metadata": {"resourceVersion": str(rv)}}
    )


def status(code: int, reason: str, message: str = "", **details: Any) -> dict[str, Any]:
    """A ``Status`` object shaped like the API server's."""
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message or reason,
        "reason": reason,
        "code": code,
    }
    if details:
        body["details"] = details
    return body


def error_event(code: int, reason: str, message: str = "") -> bytes:
    return event("ERROR", status(code, reason, message))


@dataclass(frozen=True)
class Fault:
    """Answer the next request with this status (and Status body) instead of serving it."""

    code: int
    reason: str = "InternalError"
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0
    message: str = ""

    text: str = ""  # a plain-text body instead of a Status (as Go's http.NotFound writes)

    def response(self) -> web.Response:
        if self.text:
            return web.Response(status=self.code, text=self.text, headers=self.headers)
        return web.Response(
            status=self.code,
            body=orjson.dumps(status(self.code, self.reason, self.message)),
            content_type="application/json",
            headers=self.headers,
        )


@dataclass(frozen=True)
class Pause:
    seconds: float


@dataclass(frozen=True)
class Drop:
    """Cut the connection in the middle of the stream."""


Step = bytes | Pause | Drop


@dataclass
class Recorded:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes

    @property
    def is_watch(self) -> bool:
        return self.query.get("watch") == "true"


class FakeApi:
    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.resource_version = 100
        self.requests: list[Recorded] = []
        self.faults: list[Fault] = []
        self.watch_scripts: list[list[Step]] = []
        self.app = web.Application()
        self.app.router.add_route("*", "/{tail:.*}", self.handle)

    def put(self, *names: str) -> None:
        for name in names:
            self.resource_version += 1
            self.objects[name] = configmap(name, self.resource_version)

    @property
    def lists(self) -> list[Recorded]:
        return [r for r in self.requests if r.path == LIST_PATH and not r.is_watch and r.method == "GET"]

    @property
    def watches(self) -> list[Recorded]:
        return [r for r in self.requests if r.is_watch]

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.requests.append(
            Recorded(request.method, request.path, dict(request.query), dict(request.headers), body)
        )
        if self.faults:
            fault = self.faults.pop(0)
            if fault.delay:
                await asyncio.sleep(fault.delay)
            return fault.response()
        if request.method == "GET" and request.query.get("watch") == "true":
            return await self._watch(request)
        if request.method == "GET" and request.path == LIST_PATH:
            return self._list(request)
        if request.path == "/version":
            return web.json_response({"major": "1", "minor": "34", "gitVersion": "v1.34.1"})
        echo = {
            "method": request.method,
            "path": request.path,
            "query": dict(request.query),
            "contentType": request.headers.get("Content-Type", ""),
            "body": orjson.loads(body) if body else None,
        }
        return web.Response(body=orjson.dumps(echo), content_type="application/json")

    def _list(self, request: web.Request) -> web.Response:
        names = sorted(self.objects)
        start = int(request.query.get("continue") or 0)
        limit = int(request.query.get("limit") or 0) or len(names)
        page = names[start : start + limit]
        metadata: dict[str, Any] = {"resourceVersion": str(self.resource_version)}
        if start + limit < len(names):
            metadata["continue"] = str(start + limit)
        listing = {
            "kind": "ConfigMapList",
            "apiVersion": "v1",
            "metadata": metadata,
            "items": [self.objects[n] for n in page],
        }
        return web.Response(body=orjson.dumps(listing), content_type="application/json")

    async def _watch(self, request: web.Request) -> web.StreamResponse:
        script = self.watch_scripts.pop(0) if self.watch_scripts else []
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        for step in script:
            if isinstance(step, Pause):
                await asyncio.sleep(step.seconds)
            elif isinstance(step, Drop):
                assert request.transport is not None
                request.transport.abort()
                return resp
            else:
                await resp.write(step)
        await resp.write_eof()
        return resp
