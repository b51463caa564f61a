"""Errors from the API server, classified once, by what a caller should do about them.

Every failed request becomes one :class:`KubeError` subclass, built either from the HTTP status
and the ``Status`` object the API server sends (:func:`from_response`) or from a client-side
exception (:func:`from_exception`: kubernetes-asyncio's ``ApiException``, aiohttp errors,
timeouts). :func:`is_temporary` says whether retrying the same request later can succeed.

Reconcilers do not raise these to say what they want; they raise :class:`TemporaryError` (try
again after ``delay``) or :class:`PermanentError` (do not retry until the object changes).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import aiohttp
import orjson

from .objects import ObjectKey

__all__ = [
    "AlreadyExists",
    "BadRequest",
    "Conflict",
    "Forbidden",
    "Gone",
    "Invalid",
    "KubeError",
    "NetworkError",
    "NotFound",
    "PermanentError",
    "ResourceNotServed",
    "ServerError",
    "TemporaryError",
    "Timeout",
    "TooManyRequests",
    "Unauthorized",
    "Unreachable",
    "admission_refusal",
    "from_exception",
    "from_response",
    "is_temporary",
    "namespace_terminating",
    "not_served_message",
]

#: the message of the API server's 404 for a path it serves nothing at (a resource type it does
#: not know: a CRD not installed, an API group turned off), as against an object that is missing
NOT_SERVED = "the server could not find the requested resource"
#: its answer, in plain text and no Status, under an API group it does not know at all
PAGE_NOT_FOUND = "404 page not found"


class KubeError(Exception):
    """A request to the API server failed. ``status`` is ``None`` when no response came back."""

    temporary: bool = False
    """Whether the same request may succeed later without anything else changing."""

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        reason: str = "",
        object_key: ObjectKey | None = None,
        body: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.reason = reason
        self.object_key = object_key
        self.body: Mapping[str, Any] = body or {}

    def __str__(self) -> str:
        where = f" ({self.object_key})" if self.object_key else ""
        code = f"{self.status} {self.reason}".strip() if self.status is not None else self.reason
        return f"{code}: {self.message}{where}" if code else f"{self.message}{where}"


class BadRequest(KubeError):
    """400: the request is malformed; retrying it unchanged cannot help."""


class Unauthorized(KubeError):
    """401: the credentials are missing, expired or not accepted."""


class Forbidden(KubeError):
    """403: authenticated, but RBAC, admission or a quota refuses the request."""


def admission_refusal(error: KubeError) -> str:
    """What an admission policy said, without the API server's preamble ("... is forbidden:
    ValidatingAdmissionPolicy 'x' with binding 'x' denied request: <what it said>")."""
    _, found, said = error.message.partition("denied request: ")
    return said.strip() if found else error.message


def namespace_terminating(error: KubeError) -> bool:
    """Whether the API server refused to create something because its namespace is being
    deleted (the NamespaceLifecycle admission's ``NamespaceTerminating`` cause): nothing new
    goes there again, so a writer has nothing to retry or report."""
    details = error.body.get("details") or {}
    return any(cause.get("reason") == "NamespaceTerminating" for cause in details.get("causes") or ())


class NotFound(KubeError):
    """404: the object (or its namespace, or the resource type) does not exist."""


class ResourceNotServed(NotFound):
    """404 because the API server does not serve the resource type at all (a CRD not installed,
    an API group turned off): any 404 on a list (a list in a namespace that does not exist is
    empty), and the API server's own answer for a path it serves nothing at."""


def not_served_message(served: str, server: str = "") -> str:
    """What a :class:`ResourceNotServed` says, for ``served`` as ``plural.group (group/version)``
    and the API server at ``server``."""
    at = f" at {server}" if server else ""
    return f"the API server{at} does not serve {served}: is its CustomResourceDefinition installed?"


class Conflict(KubeError):
    """409: the object changed since it was read (stale ``resourceVersion`` or UID precondition)."""


class AlreadyExists(Conflict):
    """409 with reason ``AlreadyExists``: a create for a name that is taken."""


class Gone(KubeError):
    """410: the requested ``resourceVersion`` is too old (compacted); list again."""


class Invalid(KubeError):
    """422: the object fails validation; ``causes`` lists the offending fields."""

    @property
    def causes(self) -> list[dict[str, Any]]:
        return list((self.body.get("details") or {}).get("causes") or [])


class TooManyRequests(KubeError):
    """429: throttled (API priority and fairness, or eviction budgets); retry after a while."""

    temporary = True

    def __init__(self, message: str, *, retry_after: float | None = None, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.retry_after = retry_after


class ServerError(KubeError):
    """5xx (and 408): the API server or something behind it failed; retry with backoff."""

    temporary = True


class NetworkError(KubeError):
    """No usable response: the connection failed, dropped or timed out."""

    temporary = True


class Unreachable(NetworkError):
    """Connection refused or reset, TLS handshake failure, DNS failure, a stream cut mid-way."""


class Timeout(NetworkError):
    """The request (or a read on a stream) took longer than allowed."""


class TemporaryError(Exception):
    """Raised by a reconciler: the work could not be done now; retry it after ``delay`` seconds."""

    def __init__(self, message: str, delay: float = 10.0) -> None:
        super().__init__(message)
        self.delay = delay


class PermanentError(Exception):
    """Raised by a reconciler: retrying cannot help until the object itself changes."""


_BY_STATUS: dict[int, type[KubeError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    408: ServerError,
    409: Conflict,
    410: Gone,
    422: Invalid,
    429: TooManyRequests,
}


def is_temporary(exc: BaseException) -> bool:
    """True for errors that a later retry of the same request can fix: 429, 5xx, network.

    Conflicts are not temporary in this sense: the caller must read the object again first.
    """
    if isinstance(exc, KubeError):
        return exc.temporary
    return isinstance(exc, TemporaryError)


def _parse_retry_after(value: object) -> float | None:
    if value is None or value == "":
        return None
    try:
        seconds = float(str(value))
    except ValueError:
        return None  # an HTTP-date: the API server never sends one
    return max(seconds, 0.0)


def _not_served(message: str, text: str, served: str) -> bool:
    """Whether a 404 without an object's name says the path serves nothing (not: an object is
    missing); the plain-text answer counts only where the path is the API server's own."""
    return message == NOT_SERVED or bool(served and text == PAGE_NOT_FOUND)


def from_response(
    status: int,
    body: bytes | str | Mapping[str, Any] | None,
    key: ObjectKey | None = None,
    *,
    retry_after: str | float | None = None,
    served: str = "",
    server: str = "",
) -> KubeError:
    """The error for an HTTP ``status`` and its body, normally a ``Status`` object.

    ``retry_after`` is the ``Retry-After`` header; ``details.retryAfterSeconds`` in the body is
    used when the header is missing. A body that is not JSON becomes the message. ``served`` names
    the resource the request was for (``plural.group (group/version)``; empty for a path that the
    API server hands to something else, such as a kubelet through ``nodes/proxy``) and ``server``
    the API server: a 404 saying the path serves nothing becomes :class:`ResourceNotServed`,
    naming both.
    """
    parsed: Mapping[str, Any] = {}
    text = ""
    if isinstance(body, Mapping):
        parsed = body
    elif body:
        raw = body.encode() if isinstance(body, str) else body
        try:
            decoded = orjson.loads(raw)
        except orjson.JSONDecodeError:
            text = raw.decode(errors="replace").strip()
        else:
            if isinstance(decoded, dict):
                parsed = decoded
            else:
                text = str(decoded)
    reason = str(parsed.get("reason") or "")
    message = str(parsed.get("message") or text or f"HTTP {status}")
    details = parsed.get("details") or {}
    if key is None and details.get("name"):
        key = ObjectKey(None, str(details["name"]))
    if status == 409 and reason == "AlreadyExists":
        cls: type[KubeError] = AlreadyExists
    elif status == 404 and not details.get("name") and _not_served(message, text, served):
        cls = ResourceNotServed
        message = not_served_message(served, server) if served else message
    elif status >= 500:
        cls = ServerError
    else:
        cls = _BY_STATUS.get(status, KubeError)
    if cls is TooManyRequests:
        after = _parse_retry_after(retry_after)
        if after is None:
            after = _parse_retry_after(details.get("retryAfterSeconds"))
        return TooManyRequests(
            message, retry_after=after, status=status, reason=reason, object_key=key, body=parsed
        )
    return cls(message, status=status, reason=reason, object_key=key, body=parsed)


def from_exception(exc: BaseException, key: ObjectKey | None = None) -> KubeError:
    """The classified error for a client-side exception; a :class:`KubeError` is returned as is.

    Understands kubernetes-asyncio's ``ApiException`` (by shape, without importing the
    generated client), aiohttp's errors and timeouts. Anything else becomes a plain
    :class:`KubeError` that is neither temporary nor specific.
    """
    if isinstance(exc, KubeError):
        return exc
    if isinstance(exc, aiohttp.ClientResponseError):
        retry = exc.headers.get("Retry-After") if exc.headers else None
        return from_response(exc.status, exc.message, key, retry_after=retry)
    if isinstance(exc, aiohttp.ServerTimeoutError | asyncio.TimeoutError):
        return Timeout(str(exc) or "timed out", reason="Timeout", object_key=key)
    if isinstance(exc, aiohttp.ClientError | ConnectionError):
        return Unreachable(str(exc) or type(exc).__name__, reason=type(exc).__name__, object_key=key)
    status = getattr(exc, "status", None)
    if type(exc).__module__.startswith("kubernetes_asyncio") and isinstance(status, int) and status:
        headers: Mapping[str, str] = getattr(exc, "headers", None) or {}
        body = getattr(exc, "body", None)
        return from_response(
            status, body or getattr(exc, "reason", ""), key, retry_after=headers.get("Retry-After")
        )
    return KubeError(str(exc) or type(exc).__name__, reason=type(exc).__name__, object_key=key)
