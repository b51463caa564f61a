"""Authentication and authorisation of kubelet API requests, as a real kubelet does them.

Authentication: a client certificate that the TLS layer verified against the consumer's client
CA (user = CN, groups = O), else a bearer token checked with a ``TokenReview``. Nothing else:
anonymous requests get 401.

Authorisation: a ``SubjectAccessReview`` on ``nodes/<subresource>`` of this node, with the verb
from the HTTP method, and the subresources the kubelet maps paths to (pkg/kubelet/server/auth.go,
fine-grained authorisation on, as in 1.36): ``/stats`` → stats, ``/metrics`` → metrics,
``/logs`` → log, ``/pods`` and ``/runningpods`` → pods then proxy, ``/healthz`` → healthz then
proxy, everything else (containerLogs, exec, attach, portForward) → proxy. Any allowed
subresource allows the request; otherwise 403.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from kube.clients import KubeClient
from kube.errors import KubeError

logger = logging.getLogger(__name__)

VERBS = {"POST": "create", "GET": "get", "HEAD": "get", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}
CACHE_ALLOWED_SECONDS = 300.0
CACHE_DENIED_SECONDS = 30.0
"""How long decisions are kept (the kubelet's webhook authoriser defaults: 5 min and 30 s)."""
TOKEN_CACHE_SECONDS = 120.0
"""How long an authenticated token is trusted without a new TokenReview (the kubelet's default)."""


@dataclass(frozen=True)
class UserInfo:
    name: str
    groups: tuple[str, ...] = ()
    uid: str = ""
    extra: tuple[tuple[str, tuple[str, ...]], ...] = ()


def _is_subpath(path: str, prefix: str) -> bool:
    prefix = prefix.rstrip("/")
    return path == prefix or path.startswith(prefix + "/")


def request_attributes(method: str, path: str) -> tuple[str, tuple[str, ...]]:
    """The verb and the ``nodes`` subresources (in order) a kubelet checks for a request. Pure."""
    verb = VERBS.get(method.upper(), method.lower())
    subresources: list[str] = []
    if _is_subpath(path, "/pods") or _is_subpath(path, "/runningpods"):
        subresources.append("pods")
    elif _is_subpath(path, "/healthz"):
        subresources.append("healthz")
    if _is_subpath(path, "/stats"):
        subresources.append("stats")
    elif _is_subpath(path, "/metrics"):
        subresources.append("metrics")
    elif _is_subpath(path, "/logs"):
        subresources.append("log")
    else:
        subresources.append("proxy")
    return verb, tuple(subresources)


def user_from_peercert(peercert: dict[str, Any] | None) -> UserInfo | None:
    """The user a verified client certificate names (``getpeercert()`` form): CN and O."""
    if not peercert:
        return None
    cn = ""
    groups: list[str] = []
    for rdn in peercert.get("subject") or ():
        for key, value in rdn:
            if key == "commonName":
                cn = value
            elif key == "organizationName":
                groups.append(value)
    return UserInfo(name=cn, groups=tuple(groups)) if cn else None


@dataclass
class Authenticator:
    """Token reviews and access reviews against the consumer API server, with short caches."""

    consumer: KubeClient
    node_name: str
    _tokens: dict[str, tuple[float, UserInfo | None]] = field(default_factory=dict)
    _decisions: dict[tuple[UserInfo, str, str], tuple[float, bool]] = field(default_factory=dict)

    async def review_token(self, token: str) -> UserInfo | None:
        now = time.monotonic()
        cached = self._tokens.get(token)
        if cached and cached[0] > now:
            return cached[1]
        review = await self.consumer.request(
            "POST",
            "/apis/authentication.k8s.io/v1/tokenreviews",
            json={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}},
        )
        status = review.get("status") or {}
        user: UserInfo | None = None
        if status.get("authenticated"):
            info = status.get("user") or {}
            extra = tuple(sorted((str(k), tuple(v)) for k, v in (info.get("extra") or {}).items()))
            user = UserInfo(
                str(info.get("username", "")),
                tuple(info.get("groups") or ()),
                str(info.get("uid", "")),
                extra,
            )
        if len(self._tokens) > 1000:
            self._tokens.clear()
        self._tokens[token] = (now + (TOKEN_CACHE_SECONDS if user else CACHE_DENIED_SECONDS), user)
        return user

    async def allowed(self, user: UserInfo, verb: str, subresource: str) -> bool:
        now = time.monotonic()
        key = (user, verb, subresource)
        cached = self._decisions.get(key)
        if cached and cached[0] > now:
            return cached[1]
        spec: dict[str, Any] = {
            "user": user.name,
            "groups": list(user.groups),
            "resourceAttributes": {
                "verb": verb,
                "version": "v1",
                "resource": "nodes",
                "subresource": subresource,
                "name": self.node_name,
            },
        }
        if user.uid:
            spec["uid"] = user.uid
        if user.extra:
            spec["extra"] = {k: list(v) for k, v in user.extra}
        review = await self.consumer.request(
            "POST",
            "/apis/authorization.k8s.io/v1/subjectaccessreviews",
            json={"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec},
        )
        allowed = bool((review.get("status") or {}).get("allowed"))
        if len(self._decisions) > 1000:
            self._decisions.clear()
        self._decisions[key] = (now + (CACHE_ALLOWED_SECONDS if allowed else CACHE_DENIED_SECONDS), allowed)
        return allowed


def _status(code: int, reason: str, message: str) -> web.Response:
    body = {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    return web.json_response(body, status=code)


def auth_middleware(authn: Authenticator) -> Callable[..., Awaitable[web.StreamResponse]]:
    @web.middleware
    async def middleware(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        user = user_from_peercert(request.transport.get_extra_info("peercert") if request.transport else None)
        try:
            if user is None:
                header = request.headers.get("Authorization", "")
                scheme, _, token = header.partition(" ")
                if scheme.lower() == "bearer" and token.strip():
                    user = await authn.review_token(token.strip())
            if user is None:
                return _status(401, "Unauthorized", "Unauthorized")
            verb, subresources = request_attributes(request.method, request.path)
            for subresource in subresources:
                if await authn.allowed(user, verb, subresource):
                    break
            else:
                message = (
                    f"Forbidden (user={user.name}, verb={verb}, resource=nodes, "
                    f"subresource(s)={list(subresources)})"
                )
                return _status(403, "Forbidden", message)
        except KubeError as exc:
            logger.warning("cannot authenticate/authorise %s %s: %s", request.method, request.path, exc)
            return _status(503, "ServiceUnavailable", f"authentication/authorisation unavailable: {exc}")
        return await handler(request)

    return middleware
