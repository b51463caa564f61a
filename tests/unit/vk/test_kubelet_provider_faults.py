"""The kubelet API when the provider fails it: logs out of reach or cut short, an exec whose
connection to the provider drops, a metrics API that hangs or refuses the tenant. The routes are
served as they are (aiohttp's test server, our handlers); the provider is a port nothing listens
on, or a server that drops the connection mid-stream or hangs, faults a real API server does not
make on demand."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from aiohttp import ClientPayloadError, WSMsgType, web
from aiohttp.test_utils import TestClient, TestServer

from kube.clients import KubeClient
from kube.informers import Stored
from kube.kubeconfigs import Connection
from kube.objects import ObjectKey, RawObject
from kube.ports import free_port
from vk.kubelet.server import (
    CONTEXT,
    USAGE,
    KubeletContext,
    Usage,
    container_logs,
    exec_,
    metrics_cadvisor,
    metrics_resource,
)

POD: RawObject = {"metadata": {"name": "trainer", "namespace": "ml"}, "status": {"phase": "Running"}}
TWIN: RawObject = {"metadata": {"name": "trainer", "namespace": "ml-cons"}}


def _context(provider: KubeClient, twin: RawObject | None, *, resume: float = 30.0) -> KubeletContext:
    here = ObjectKey("ml", "trainer")
    return KubeletContext(
        node_name="gpuferry-prov",
        provider=provider,
        local_pod=lambda key: POD if key == ObjectKey("ml", "trainer") else None,
        twin_pod=lambda key: twin if key == ObjectKey("ml", "trainer") else None,
        local_keys=lambda: [ObjectKey("ml", "trainer")],
        local_identity=lambda key: Stored(None, None, key) if key == here else None,
        twin_identity=lambda key: Stored(None, None, ObjectKey.of(twin)) if twin and key == here else None,
        started=datetime.datetime.now(datetime.UTC),
        log_resume_seconds=resume,
    )


async def _served(ctx: KubeletContext) -> TestClient[web.Request, web.Application]:
    app = web.Application()
    app[CONTEXT] = ctx
    app[USAGE] = Usage(timeout=0.5)
    app.router.add_get("/containerLogs/{namespace}/{pod}/{container}", container_logs)
    app.router.add_get("/exec/{namespace}/{pod}/{container}", exec_)
    app.router.add_get("/metrics/resource", metrics_resource)
    app.router.add_get("/metrics/cadvisor", metrics_cadvisor)
    return TestClient(TestServer(app))


Opener = Callable[[str], Awaitable[KubeClient]]


@contextlib.asynccontextmanager
async def _kubelet_before(
    provider_at: Opener,
    sub: str,
    handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
    *,
    resume: float = 30.0,
) -> AsyncIterator[TestClient[web.Request, web.Application]]:
    """Our kubelet routes, in front of a provider that answers the twin's ``sub`` (or the path
    ``sub``, when it starts with ``/``) with ``handler``."""
    upstream = web.Application()
    path = sub if sub.startswith("/") else f"/api/v1/namespaces/ml-cons/pods/trainer/{sub}"
    upstream.router.add_get(path, handler)
    async with TestServer(upstream) as server:
        provider = await provider_at(f"http://127.0.0.1:{server.port}")
        async with await _served(_context(provider, TWIN, resume=resume)) as client:
            yield client


@pytest.fixture
async def provider_at() -> AsyncIterator[Opener]:
    """Opens a client of the provider at a URL; each is closed after the test."""
    async with contextlib.AsyncExitStack() as stack:

        async def open_(server: str) -> KubeClient:
            return await stack.enter_async_context(KubeClient(Connection(server=server)))

        yield open_


async def test_a_provider_out_of_reach_is_an_internal_error_in_words(
    provider_at: Opener,
) -> None:
    provider = await provider_at(f"http://127.0.0.1:{free_port()}")  # nothing listens there
    async with await _served(_context(provider, TWIN)) as client:
        answer = await client.get("/containerLogs/ml/trainer/main")
        text = await answer.text()
    # the API server passes a kubelet's 500 on with its text: "Internal error occurred: provider: …"
    assert answer.status == 500, text
    assert answer.content_type == "text/plain"
    assert text.startswith("provider: ") and "127.0.0.1" in text, text


async def test_a_pod_with_no_twin_yet_is_a_bad_request_saying_so(
    provider_at: Opener,
) -> None:
    provider = await provider_at(f"http://127.0.0.1:{free_port()}")  # not asked
    async with await _served(_context(provider, None)) as client:
        answer = await client.get("/containerLogs/ml/trainer/main")
        text = await answer.text()
    assert answer.status == 400
    said = (
        'container "main" in pod "trainer" is waiting to start: '
        + "its twin on the provider is not created yet"
    )
    assert text == said


async def test_a_log_stream_cut_short_by_the_provider_is_not_ended_as_if_complete(
    provider_at: Opener,
) -> None:
    """A provider that drops the connection mid-stream: the client has what came, and its read
    fails (a log cut short is not a log that ended), rather than a clean end of the body."""
    sent = asyncio.Event()

    async def cut(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/plain"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        await response.write(b"epoch 1: loss 0.93\n")
        sent.set()
        await asyncio.sleep(0.2)
        assert request.transport is not None
        request.transport.abort()  # no last chunk: the body is cut, not ended
        return response

    async with _kubelet_before(provider_at, "log", cut) as client:
        answer = await client.get("/containerLogs/ml/trainer/main")
        assert answer.status == 200
        got = b""
        # a second answer after the first left the client waiting for the rest: timed out here
        with pytest.raises(ClientPayloadError, match="not completed"):
            async with asyncio.timeout(10):
                async for chunk in answer.content.iter_any():
                    got += chunk
        assert sent.is_set()
    assert got == b"epoch 1: loss 0.93\n"


LINES = [
    b"2026-12-07T06:30:00.100000000Z epoch 1: loss 0.93\n",
    b"2026-12-07T06:30:00.500000000Z epoch 2: loss 0.41\n",
    b"2026-12-07T06:30:00.500000000Z epoch 2: eval 0.52\n",  # the same time as the line before
    b"2026-12-07T06:30:00.700000000Z epoch 3: loss 0.12\n",
    b"2026-12-07T06:30:01.000000000Z done\n",
]


async def _stream(request: web.Request, chunks: list[bytes], *, end: bool) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/plain"})
    response.enable_chunked_encoding()
    await response.prepare(request)
    for chunk in chunks:
        await response.write(chunk)
        await asyncio.sleep(0.05)
    if end:
        await response.write_eof()
    else:
        assert request.transport is not None
        request.transport.abort()  # no last chunk: the body is cut, not ended
    return response


async def test_a_followed_log_cut_short_goes_on_where_it_was_each_line_once(provider_at: Opener) -> None:
    """A provider restarted while ``kubectl logs -f`` follows: the stream is opened again from the
    second of the last whole line, and what was passed on already is not passed on again (two
    lines of the same time, and a line cut in the middle, included)."""
    asked: list[dict[str, str]] = []

    async def log(request: web.Request) -> web.StreamResponse:
        asked.append(dict(request.query))
        if len(asked) == 1:  # cut in the middle of epoch 3's line
            return await _stream(request, [*LINES[:3], LINES[3][:40]], end=False)
        if len(asked) == 2:
            return web.Response(status=503, text="restarting")  # not back yet: tried again
        return await _stream(request, LINES[1:], end=True)  # from 06:30:00, as asked

    async with _kubelet_before(provider_at, "log", log) as client:
        answer = await client.get("/containerLogs/ml/trainer/main?follow=true&tailLines=10")
        assert answer.status == 200
        async with asyncio.timeout(10):
            got = await answer.read()
    assert got == b"epoch 1: loss 0.93\nepoch 2: loss 0.41\nepoch 2: eval 0.52\nepoch 3: loss 0.12\ndone\n"
    assert asked[0] == {"container": "main", "follow": "true", "tailLines": "10", "timestamps": "true"}
    again = {"container": "main", "follow": "true", "sinceTime": "2026-12-07T06:30:00Z", "timestamps": "true"}
    assert asked[1:] == [again, again]


async def test_a_followed_log_keeps_its_timestamps_when_asked_for_them(provider_at: Opener) -> None:
    calls = 0

    async def log(request: web.Request) -> web.StreamResponse:
        nonlocal calls
        calls += 1
        return await _stream(request, LINES[:2] if calls == 1 else LINES[1:3], end=calls > 1)

    async with _kubelet_before(provider_at, "log", log) as client:
        answer = await client.get("/containerLogs/ml/trainer/main?follow=true&timestamps=true")
        async with asyncio.timeout(10):
            got = await answer.read()
    assert got == b"".join(LINES[:3])


@pytest.mark.parametrize("again", [503, 404, "held"])
async def test_a_followed_log_whose_provider_stays_away_or_loses_the_twin_ends_cut(
    provider_at: Opener, again: int | str, caplog: pytest.LogCaptureFixture
) -> None:
    """Cut, then the provider busy past ``log_resume_seconds`` (503: tried again until then), the
    twin gone (404: at once), or a provider that takes the connection again and never answers it
    (held: an API server stuck starting, a relay cut halfway): the body ends cut, not complete.
    Waiting for that answer had no bound (a stream has no total timeout): ``kubectl logs -f``
    hung until the provider answered, if it ever did."""
    calls = 0
    never = asyncio.Event()

    async def log(request: web.Request) -> web.StreamResponse:
        nonlocal calls
        calls += 1
        if calls == 1:
            return await _stream(request, LINES[:1], end=False)
        if again == "held":
            await never.wait()  # no status line, no headers
        return web.Response(status=int(again), text="no")

    caplog.set_level(logging.INFO, logger="vk.kubelet.server")
    async with _kubelet_before(provider_at, "log", log, resume=1.0) as client:
        answer = await client.get("/containerLogs/ml/trainer/main?follow=true")
        got = b""
        with pytest.raises(ClientPayloadError, match="not completed"):
            async with asyncio.timeout(10):
                async for chunk in answer.content.iter_any():
                    got += chunk
    assert got == b"epoch 1: loss 0.93\n"
    assert calls > 2 if again == 503 else calls == 2
    if again == "held":
        assert "no answer in the 1s it is tried again" in caplog.text


SUCCESS = b'\x03{"metadata":{},"status":"Success"}'
STEP = b"\x01step 1 of 3\n"
OPENED = b"\x03"
"""What a provider sends first on a stream without stdout or stderr: an empty error-channel message."""
CUT = "the connection to the provider ended before the command's exit status"


@pytest.mark.parametrize(
    ("sent", "code", "reason"),
    [
        # as a provider API server ends a command: its status, then the connection, no close frame
        ([STEP, SUCCESS], 1000, ""),
        ([OPENED, SUCCESS], 1000, ""),
        # the connection lost before the status: a normal close made kubectl exit 0
        ([STEP], 1011, CUT),
        ([OPENED], 1011, CUT),
    ],
)
async def test_an_exec_cut_short_by_the_provider_is_not_closed_as_a_success(
    provider_at: Opener, sent: list[bytes], code: int, reason: str
) -> None:
    async def execute(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(protocols=("v5.channel.k8s.io",))
        await ws.prepare(request)
        for message in sent:
            await ws.send_bytes(message)
        await asyncio.sleep(0.1)
        assert request.transport is not None
        request.transport.abort()
        return ws

    async with _kubelet_before(provider_at, "exec", execute) as client:
        ws = await client.ws_connect(
            "/exec/ml/trainer/main?command=train&output=1", protocols=("v5.channel.k8s.io",)
        )
        got: list[bytes] = []
        async with asyncio.timeout(10):
            while (msg := await ws.receive()).type == WSMsgType.BINARY:
                got.append(msg.data)
        await ws.close()
    assert msg.type == WSMsgType.CLOSE, msg
    assert (msg.data, msg.extra) == (code, reason)
    assert got == sent


async def _hang(_: web.Request) -> web.StreamResponse:
    await asyncio.sleep(60)
    return web.Response()


async def _forbidden(_: web.Request) -> web.StreamResponse:
    said = 'pods.metrics.k8s.io is forbidden: User "tenant" cannot list resource "pods"'
    status = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Forbidden", "code": 403,
              "message": said}  # fmt: skip
    return web.json_response(status, status=403)


async def _garbled(_: web.Request) -> web.StreamResponse:
    item = {"metadata": {"name": "trainer", "namespace": "ml-cons"}, "window": "15s",
            "containers": [{"name": "main", "usage": {"cpu": "lots", "memory": "1Gi"}}]}  # fmt: skip
    listed = {"kind": "PodMetricsList", "apiVersion": "metrics.k8s.io/v1beta1", "items": [item]}
    return web.json_response(listed)


@pytest.mark.parametrize(
    "provider_metrics", [_hang, _forbidden, _garbled], ids=["hangs", "forbidden", "garbled"]
)
@pytest.mark.parametrize(
    ("path", "error"),
    [("/metrics/resource", "resource_scrape_error"), ("/metrics/cadvisor", "container_scrape_error")],
)
async def test_usage_the_provider_does_not_give_costs_the_figures_not_the_scrape(
    provider_at: Opener,
    provider_metrics: Callable[[web.Request], Awaitable[web.StreamResponse]],
    path: str,
    error: str,
) -> None:
    """metrics-server gives a kubelet 10 s: a provider whose metrics API hangs, refuses the
    tenant, or gives a PodMetrics that cannot be read (no timestamp, a CPU that is no quantity)
    still lets the scrape answer, in time, without usage and with the scrape error set; so does
    Prometheus' scrape of the cAdvisor endpoint."""
    metrics_path = "/apis/metrics.k8s.io/v1beta1/namespaces/ml-cons/pods"
    async with _kubelet_before(provider_at, metrics_path, provider_metrics) as client:
        async with asyncio.timeout(5):
            answer = await client.get(path)
        text = await answer.text()
    assert answer.status == 200, text
    assert f"{error} 1" in text.splitlines()
    samples = [line for line in text.splitlines() if not line.startswith("#")]
    assert not [s for s in samples if "usage" in s or "working_set" in s], text
