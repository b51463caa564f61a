"""An async client for one API server: one aiohttp session, raw JSON, classified errors.

``async with KubeClient.from_kubeconfig(path) as client:`` opens one ``aiohttp.ClientSession``
(with the TLS context and credentials of the kubeconfig's context) and closes it on exit. Every
request passes the client-side rate limiter (:class:`kube.ratelimit.TokenBucket`), and every
non-2xx answer is raised as a :mod:`kube.errors` class. Objects are plain dicts decoded with
orjson; nothing is converted to kubernetes-asyncio models.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import ssl as ssl_module
from collections.abc import AsyncIterator, Mapping
from types import TracebackType
from typing import Any, Literal, Self

import aiohttp
import orjson

from .errors import KubeError, TooManyRequests, from_exception, from_response
from .kubeconfigs import SERVICE_ACCOUNT_DIR, Connection, in_cluster, load_kubeconfig, load_kubeconfig_data
from .metrics import counter
from .objects import ObjectKey, RawObject, Resource
from .ratelimit import TokenBucket
from .settings import ClientSettings
from .sockets import keepalive_factory

__all__ = ["KubeClient", "PatchType", "resource_of"]

PatchType = Literal["merge", "strategic", "json", "apply"]

_PATCH_CONTENT_TYPES: dict[str, str] = {
    "merge": "application/merge-patch+json",
    "strategic": "application/strategic-merge-patch+json",
    "json": "application/json-patch+json",
    "apply": "application/apply-patch+yaml",  # JSON is YAML
}

Params = Mapping[str, str | int | bool | None]

_REQUESTS = counter(
    "api_requests",
    "Requests sent to API servers, by verb, resource (pods, pods/status, ...) and server (host:port).",
    ["verb", "resource", "server"],
)
_ERRORS = counter("api_errors", "Failed API requests, by verb and error class.", ["verb", "error"])


def _verb(method: str, params: Params | None, streaming: bool) -> str:
    """The Kubernetes verb of a request, roughly as the API server's audit log names it."""
    if streaming:
        return "watch" if (params or {}).get("watch") else "stream"
    return {"GET": "get", "POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}.get(
        method.upper(), method.lower()
    )


def resource_of(path: str) -> str:
    """The resource a request path is about, with its subresource (``pods``, ``pods/status``,
    ``gpuslices``, ``namespaces``); ``""`` for a path that names none (``/version``). Pure."""
    parts = [p for p in path.split("?", 1)[0].split("/") if p]
    if parts[:1] == ["api"] and len(parts) >= 2:
        rest = parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 3:
        rest = parts[3:]
    else:
        return ""
    if len(rest) > 2 and rest[0] == "namespaces" and rest[2] not in ("status", "finalize"):
        rest = rest[2:]  # /namespaces/<ns>/<resource>...; /namespaces/<ns>[/status] is a namespace
    if not rest:
        return ""
    return rest[0] + (f"/{rest[2]}" if len(rest) >= 3 else "")


def served_of(path: str) -> str:
    """The resource a request path is for, as ``plural.group (group/version)`` (``pods (v1)``);
    ``""`` for a path that names none, or whose answer comes from elsewhere (a kubelet or a
    service through ``proxy``). Pure."""
    resource, _, subresource = resource_of(path).partition("/")
    if not resource or subresource == "proxy":
        return ""
    parts = [p for p in path.split("?", 1)[0].split("/") if p]
    if parts[0] == "api":
        return f"{resource} ({parts[1]})"
    return f"{resource}.{parts[1]} ({parts[1]}/{parts[2]})"


def _query(params: Params | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in (params or {}).items():
        if value is None:
            continue
        out[key] = ("true" if value else "false") if isinstance(value, bool) else str(value)
    return out


class KubeClient:
    """A connection to one API server. Use it as an async context manager."""

    def __init__(self, connection: Connection, settings: ClientSettings | None = None) -> None:
        self.connection = connection
        self.settings = settings or ClientSettings()
        self.limiter = TokenBucket(self.settings.qps, self.settings.burst)
        self._session: aiohttp.ClientSession | None = None
        self._streams: aiohttp.ClientSession | None = None
        self._server = self.base_url.split("://", 1)[-1]

    @classmethod
    def from_kubeconfig(
        cls, path: str | os.PathLike[str], context: str | None = None, settings: ClientSettings | None = None
    ) -> KubeClient:
        """A client for ``context`` (default: the current one) of the kubeconfig at ``path``."""
        return cls(load_kubeconfig(path, context), settings)

    @classmethod
    def from_kubeconfig_data(
        cls,
        data: str | bytes,
        context: str | None = None,
        settings: ClientSettings | None = None,
        *,
        source: str = "<data>",
    ) -> KubeClient:
        """A client for a kubeconfig held in memory (a Secret's value), never written to disk."""
        return cls(load_kubeconfig_data(data, context, source=source), settings)

    @classmethod
    def in_cluster(
        cls, settings: ClientSettings | None = None, account_dir: os.PathLike[str] | str = SERVICE_ACCOUNT_DIR
    ) -> KubeClient:
        """A client for the pod's own cluster, authenticated as its service account."""
        from pathlib import Path

        return cls(in_cluster(account_dir=Path(account_dir)), settings)

    @classmethod
    def from_config(
        cls,
        kubeconfig: str | os.PathLike[str] | None = None,
        context: str | None = None,
        settings: ClientSettings | None = None,
    ) -> KubeClient:
        """From ``kubeconfig`` if given, else ``$KUBECONFIG``, else in-cluster, else ``~/.kube/config``."""
        path = kubeconfig or os.environ.get("KUBECONFIG", "").split(os.pathsep)[0]
        if path:
            return cls.from_kubeconfig(path, context, settings)
        if os.environ.get("KUBERNETES_SERVICE_HOST"):
            return cls.in_cluster(settings)
        return cls.from_kubeconfig(os.path.expanduser("~/.kube/config"), context, settings)

    @property
    def base_url(self) -> str:
        """The API server's URL, without a trailing slash."""
        return self.connection.server

    @property
    def server(self) -> str:
        """The API server as the metrics' ``server`` label names it (host:port)."""
        return self._server

    async def __aenter__(self) -> Self:
        await self.open()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def open(self) -> None:
        """Open the session (``async with`` does this)."""
        if self._session is not None:
            return
        await self.connection.prepare()
        ssl_ctx = self.connection.ssl_context()
        ssl: ssl_module.SSLContext | bool = ssl_ctx if ssl_ctx is not None else True
        headers = {"User-Agent": self.settings.user_agent, "Accept": "application/json"}
        sockets = keepalive_factory(self.settings.tcp_keepalive_seconds, self.settings.tcp_keepalive_probes)
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(
                ssl=ssl, limit=self.settings.max_connections, socket_factory=sockets
            ),
            headers=headers,
            timeout=aiohttp.ClientTimeout(
                total=self.settings.request_timeout, connect=self.settings.connect_timeout
            ),
        )
        # streams (watches, logs) hold their connection while they run: a pool of their own, so
        # that a hundred watches never leave a GET waiting for a connection
        self._streams = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=ssl, limit=0, socket_factory=sockets), headers=headers
        )

    async def close(self) -> None:
        """Close the session and its connections."""
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()
        if self._streams is not None:
            streams, self._streams = self._streams, None
            await streams.close()

    @property
    def stream_session(self) -> aiohttp.ClientSession:
        """The session for long-lived connections (watches, logs, exec), with no connection limit."""
        if self._streams is None:
            raise RuntimeError("KubeClient is not open: use `async with client:`")
        return self._streams

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("KubeClient is not open: use `async with client:`")
        return self._session

    async def _headers(self, extra: Mapping[str, str] | None) -> dict[str, str]:
        headers = dict(extra or {})
        auth = await self.connection.authorization()
        if auth:
            headers["Authorization"] = auth
        return headers

    def _error(
        self, resp: aiohttp.ClientResponse, body: bytes, path: str, key: ObjectKey | None
    ) -> KubeError:
        """The classified error of a non-2xx answer to a request for ``path``."""
        retry_after = resp.headers.get("Retry-After")
        return from_response(
            resp.status, body, key, retry_after=retry_after, served=served_of(path), server=self.base_url
        )

    async def request(
        self,
        method: str,
        path: str,
        params: Params | None = None,
        json: Any = None,
        data: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        *,
        key: ObjectKey | None = None,
    ) -> RawObject:
        """Send one request and return the decoded JSON answer (``{}`` for an empty body).

        ``json`` is encoded with orjson; ``data`` is sent as is. ``key`` names the object in
        the error raised for a non-2xx answer. A 429 is retried ``throttle_retries`` times
        after its ``Retry-After`` before it is raised.
        """
        for attempt in range(self.settings.throttle_retries + 1):
            try:
                return await self._request_once(method, path, params, json, data, headers, key=key)
            except TooManyRequests as exc:
                if attempt >= self.settings.throttle_retries:
                    raise
                wait = exc.retry_after if exc.retry_after is not None else 0.5 * 2**attempt
                await asyncio.sleep(min(wait, self.settings.throttle_max_wait))
        raise AssertionError("unreachable")

    async def _request_once(
        self,
        method: str,
        path: str,
        params: Params | None,
        json: Any,
        data: bytes | None,
        headers: Mapping[str, str] | None,
        *,
        key: ObjectKey | None,
    ) -> RawObject:
        hdrs = await self._headers(headers)
        if json is not None:
            data = orjson.dumps(json)
            hdrs.setdefault("Content-Type", "application/json")
        await self.limiter.acquire()
        verb = _verb(method, params, streaming=False)
        _REQUESTS.labels(verb, resource_of(path), self._server).inc()
        try:
            async with self.session.request(
                method,
                self.base_url + path,
                params=_query(params),
                data=data,
                headers=hdrs,
                server_hostname=self.connection.tls_server_name,
            ) as resp:
                body = await resp.read()
                if resp.status >= 400:
                    raise self._error(resp, body, path, key)
        except KubeError as exc:
            _ERRORS.labels(verb, type(exc).__name__).inc()
            raise
        except (aiohttp.ClientError, TimeoutError, ConnectionError) as exc:
            classified = from_exception(exc, key)
            _ERRORS.labels(verb, type(classified).__name__).inc()
            raise classified from exc
        if not body:
            return {}
        result = orjson.loads(body)
        return result if isinstance(result, dict) else {"value": result}

    @contextlib.asynccontextmanager
    async def stream(
        self,
        method: str,
        path: str,
        params: Params | None = None,
        *,
        read_timeout: float | None = None,
        headers: Mapping[str, str] | None = None,
        key: ObjectKey | None = None,
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        """A streaming request (watches, logs): yields the open response once its status is 2xx.

        There is no total timeout; ``read_timeout`` bounds the silence between two reads.
        Connection errors, including those while reading the body, are raised classified.
        """
        hdrs = await self._headers(headers)
        timeout = aiohttp.ClientTimeout(
            total=None, connect=self.settings.connect_timeout, sock_read=read_timeout
        )
        await self.limiter.acquire()
        verb = _verb(method, params, streaming=True)
        _REQUESTS.labels(verb, resource_of(path), self._server).inc()
        try:
            async with self.stream_session.request(
                method,
                self.base_url + path,
                params=_query(params),
                headers=hdrs,
                timeout=timeout,
                server_hostname=self.connection.tls_server_name,
            ) as resp:
                if resp.status >= 400:
                    body = await resp.read()
                    raise self._error(resp, body, path, key)
                yield resp
        except KubeError as exc:
            _ERRORS.labels(verb, type(exc).__name__).inc()
            raise
        except (aiohttp.ClientError, TimeoutError, ConnectionError) as exc:
            classified = from_exception(exc, key)
            _ERRORS.labels(verb, type(classified).__name__).inc()
            raise classified from exc

    # -- typed verbs ---------------------------------------------------------------------------

    @staticmethod
    def _namespace(
        resource: Resource, namespace: str | None, body: Mapping[str, Any] | None = None
    ) -> str | None:
        if not resource.namespaced:
            return None
        if namespace is None and body is not None:
            found = (body.get("metadata") or {}).get("namespace")
            return str(found) if found else None
        return namespace

    async def get(
        self, resource: Resource, name: str, namespace: str | None = None, *, subresource: str | None = None
    ) -> RawObject:
        """One object (or a subresource of it, such as ``status`` or ``scale``)."""
        return await self.request(
            "GET", resource.path(namespace, name, subresource), key=ObjectKey(namespace, name)
        )

    async def list(
        self,
        resource: Resource,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        limit: int | None = None,
        resource_version: str | None = None,
    ) -> RawObject:
        """All objects, following ``continue`` tokens; ``limit`` is the size of each page.

        Returns ``{"apiVersion", "kind", "metadata": {"resourceVersion"}, "items"}``; items get
        ``apiVersion`` and ``kind`` filled in, as the API server leaves them out of lists.
        """
        items: list[RawObject] = []
        params: dict[str, str | int | None] = {
            "labelSelector": label_selector,
            "fieldSelector": field_selector,
            "limit": limit,
            "resourceVersion": resource_version,
        }
        path = resource.path(namespace)
        while True:
            page = await self.request("GET", path, params)
            for item in page.get("items") or []:
                item.setdefault("apiVersion", resource.api_version)
                item.setdefault("kind", resource.kind)
                items.append(item)
            md = page.get("metadata") or {}
            token = md.get("continue")
            if not token:
                break
            params = {
                "labelSelector": label_selector,
                "fieldSelector": field_selector,
                "limit": limit,
                "continue": token,
            }
        return {
            "apiVersion": resource.api_version,
            "kind": f"{resource.kind}List",
            "metadata": {"resourceVersion": md.get("resourceVersion", "")},
            "items": items,
        }

    async def create(
        self,
        resource: Resource,
        body: RawObject,
        namespace: str | None = None,
        *,
        name: str | None = None,
        subresource: str | None = None,
        field_manager: str | None = None,
        dry_run: bool = False,
    ) -> RawObject:
        """Create an object (POST to the collection), or POST to a subresource of ``name``."""
        ns = self._namespace(resource, namespace, body)
        key = ObjectKey(ns, name or (body.get("metadata") or {}).get("name") or "")
        params = {"fieldManager": field_manager, "dryRun": "All" if dry_run else None}
        return await self.request("POST", resource.path(ns, name, subresource), params, json=body, key=key)

    async def replace(
        self,
        resource: Resource,
        name: str,
        body: RawObject,
        namespace: str | None = None,
        *,
        subresource: str | None = None,
        field_manager: str | None = None,
    ) -> RawObject:
        """PUT the whole object (``metadata.resourceVersion`` in ``body`` guards against races)."""
        ns = self._namespace(resource, namespace, body)
        return await self.request(
            "PUT",
            resource.path(ns, name, subresource),
            {"fieldManager": field_manager},
            json=body,
            key=ObjectKey(ns, name),
        )

    async def patch(
        self,
        resource: Resource,
        name: str,
        body: Any,
        namespace: str | None = None,
        patch_type: PatchType = "merge",
        subresource: str | None = None,
        field_manager: str | None = None,
        force: bool | None = None,
    ) -> RawObject:
        """PATCH an object; ``apply`` (server-side apply) needs a ``field_manager``."""
        if patch_type == "apply" and not field_manager:
            raise ValueError("server-side apply needs a field_manager")
        params = {"fieldManager": field_manager, "force": force}
        return await self.request(
            "PATCH",
            resource.path(namespace if resource.namespaced else None, name, subresource),
            params,
            data=orjson.dumps(body),
            headers={"Content-Type": _PATCH_CONTENT_TYPES[patch_type]},
            key=ObjectKey(namespace, name),
        )

    async def delete(
        self,
        resource: Resource,
        name: str,
        namespace: str | None = None,
        grace_period_seconds: int | None = None,
        preconditions_uid: str | None = None,
        propagation_policy: Literal["Orphan", "Background", "Foreground"] | None = None,
        preconditions_resource_version: str | None = None,
    ) -> RawObject:
        """Delete an object; returns it (still there, being finalized) or a ``Status``.

        ``preconditions_uid`` makes the delete fail with Conflict if the name now belongs to
        another object, so a stale delete never removes a newer object of the same name.
        """
        options: RawObject = {"apiVersion": "v1", "kind": "DeleteOptions"}
        if grace_period_seconds is not None:
            options["gracePeriodSeconds"] = grace_period_seconds
        if propagation_policy is not None:
            options["propagationPolicy"] = propagation_policy
        preconditions = {"uid": preconditions_uid, "resourceVersion": preconditions_resource_version}
        if any(preconditions.values()):
            options["preconditions"] = {k: v for k, v in preconditions.items() if v}
        return await self.request(
            "DELETE",
            resource.path(namespace if resource.namespaced else None, name),
            json=options,
            key=ObjectKey(namespace, name),
        )

    async def server_version(self) -> RawObject:
        """``/version``: ``gitVersion``, ``major``, ``minor``…"""
        return await self.request("GET", "/version")
