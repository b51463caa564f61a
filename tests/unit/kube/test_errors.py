"""Classification of API errors from real-shaped Status bodies and client exceptions."""

from __future__ import annotations

import aiohttp
import orjson
import pytest

from kube.errors import (
    AlreadyExists,
    BadRequest,
    Conflict,
    Forbidden,
    Gone,
    Invalid,
    KubeError,
    NotFound,
    PermanentError,
    ServerError,
    TemporaryError,
    Timeout,
    TooManyRequests,
    Unauthorized,
    Unreachable,
    from_exception,
    from_response,
    is_temporary,
    namespace_terminating,
)
from kube.objects import ObjectKey

# bodies as kube-apiserver v1.34 sends them
NOT_FOUND = b'{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"pods \\"web\\" not found","reason":"NotFound","details":{"name":"web","kind":"pods"},"code":404}'  # noqa: E501
EXISTS = b'{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"configmaps \\"a\\" already exists","reason":"AlreadyExists","details":{"name":"a","kind":"configmaps"},"code":409}'  # noqa: E501
CONFLICT = b'{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"Operation cannot be fulfilled on configmaps \\"a\\": the object has been modified; please apply your changes to the latest version and try again","reason":"Conflict","details":{"name":"a","kind":"configmaps"},"code":409}'  # noqa: E501
INVALID = b'{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"Pod \\"x\\" is invalid: spec.containers: Required value","reason":"Invalid","details":{"name":"x","kind":"Pod","causes":[{"reason":"FieldValueRequired","message":"Required value","field":"spec.containers"}]},"code":422}'  # noqa: E501
EXPIRED = b'{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"too old resource version: 100 (2000)","reason":"Expired","code":410}'  # noqa: E501
FORBIDDEN = b'{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"pods \\"over\\" is forbidden: exceeded quota: gpus, requested: requests.nvidia.com/gpu=2, used: requests.nvidia.com/gpu=2, limited: requests.nvidia.com/gpu=3","reason":"Forbidden","details":{"name":"over","kind":"pods"},"code":403}'  # noqa: E501
THROTTLED = b'{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"Too many requests, please try again later.","reason":"TooManyRequests","details":{"causes":[{"message":"Too many requests, please try again later."}],"retryAfterSeconds":1},"code":429}'  # noqa: E501


@pytest.mark.parametrize(
    ("status", "body", "cls", "temporary"),
    [
        (404, NOT_FOUND, NotFound, False),
        (409, EXISTS, AlreadyExists, False),
        (409, CONFLICT, Conflict, False),
        (422, INVALID, Invalid, False),
        (410, EXPIRED, Gone, False),
        (403, FORBIDDEN, Forbidden, False),
        (429, THROTTLED, TooManyRequests, True),
        (
            401,
            b'{"kind":"Status","code":401,"reason":"Unauthorized","message":"Unauthorized"}',
            Unauthorized,
            False,
        ),
        (400, b"{}", BadRequest, False),
        (500, b"etcdserver: request timed out", ServerError, True),
        (503, b"", ServerError, True),
        (504, b'{"reason":"Timeout"}', ServerError, True),
    ],
)
def test_from_response_classifies(status: int, body: bytes, cls: type[KubeError], temporary: bool) -> None:
    error = from_response(status, body)
    assert type(error) is cls
    assert error.status == status
    assert is_temporary(error) is temporary


def test_details_are_kept() -> None:
    error = from_response(404, NOT_FOUND)
    assert error.message == 'pods "web" not found'
    assert error.reason == "NotFound"
    assert error.object_key == ObjectKey(None, "web")
    assert "404 NotFound" in str(error)
    keyed = from_response(404, orjson.loads(NOT_FOUND), ObjectKey("ns", "web"))
    assert str(keyed).endswith("(ns/web)")
    invalid = from_response(422, INVALID)
    assert isinstance(invalid, Invalid)
    assert invalid.causes[0]["field"] == "spec.containers"
    assert isinstance(from_response(409, EXISTS), Conflict), "AlreadyExists is a Conflict"
    plain = from_response(502, b"<html>bad gateway</html>")
    assert plain.message == "<html>bad gateway</html>"


def test_retry_after_from_header_or_body() -> None:
    from_body = from_response(429, THROTTLED)
    assert isinstance(from_body, TooManyRequests) and from_body.retry_after == 1.0
    from_header = from_response(429, THROTTLED, retry_after="4")
    assert isinstance(from_header, TooManyRequests) and from_header.retry_after == 4.0
    neither = from_response(429, b"")
    assert isinstance(neither, TooManyRequests) and neither.retry_after is None


def test_from_exception_maps_client_errors() -> None:
    assert isinstance(from_exception(TimeoutError()), Timeout)
    assert isinstance(from_exception(aiohttp.ServerTimeoutError("read")), Timeout)
    assert isinstance(from_exception(aiohttp.ServerDisconnectedError()), Unreachable)
    assert isinstance(from_exception(aiohttp.ClientPayloadError("cut")), Unreachable)
    assert isinstance(from_exception(ConnectionRefusedError()), Unreachable)
    assert is_temporary(from_exception(ConnectionResetError()))
    same = NotFound("x", status=404)
    assert from_exception(same) is same
    other = from_exception(RuntimeError("boom"))
    assert type(other) is KubeError and not is_temporary(other)


class _Response:
    """The shape of kubernetes-asyncio's RESTResponse that ApiException reads."""

    def __init__(self, status: int, reason: str, data: bytes, headers: dict[str, str]) -> None:
        self.status, self.reason, self.data, self._headers = status, reason, data, headers

    def getheaders(self) -> dict[str, str]:
        return self._headers


def test_from_exception_maps_kubernetes_asyncio_api_exception() -> None:
    from kubernetes_asyncio.client.exceptions import ApiException

    exc = ApiException(http_resp=_Response(409, "Conflict", CONFLICT, {}))  # type: ignore[arg-type]
    error = from_exception(exc, ObjectKey("ns", "a"))
    assert type(error) is Conflict
    assert error.object_key == ObjectKey("ns", "a")
    assert error.message.startswith("Operation cannot be fulfilled")
    mapped = from_exception(
        ApiException(http_resp=_Response(429, "Too Many Requests", b"", {"Retry-After": "2"}))  # type: ignore[arg-type]
    )
    assert isinstance(mapped, TooManyRequests) and mapped.retry_after == 2.0
    assert isinstance(from_exception(ApiException(status=404, reason="Not Found")), NotFound)


def test_reconciler_errors() -> None:
    assert TemporaryError("later", delay=3).delay == 3
    assert is_temporary(TemporaryError("later"))
    assert not is_temporary(PermanentError("never"))


def test_a_terminating_namespace_is_told_by_its_cause_not_its_words() -> None:
    terminating = from_response(403, {
        "kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Forbidden", "code": 403,
        "message": 'events "p.gpuferry-1" is forbidden: unable to create new content in namespace w '
                   "because it is being terminated",
        "details": {"name": "p.gpuferry-1", "kind": "events", "causes": [
            {"reason": "NamespaceTerminating", "message": "namespace w is being terminated",
             "field": "metadata.namespace"}]},
    })  # fmt: skip
    assert isinstance(terminating, Forbidden) and namespace_terminating(terminating)
    quota = from_response(403, {
        "kind": "Status", "status": "Failure", "reason": "Forbidden", "code": 403,
        "message": 'pods "p" is forbidden: exceeded quota: gpus', "details": {"name": "p", "kind": "pods"},
    })  # fmt: skip
    assert not namespace_terminating(quota)
    assert not namespace_terminating(from_response(503, b"upstream connect error"))
