"""exec, attach and port-forward: WebSocket streams relayed to the provider API server.

What a 1.36 kube-apiserver sends a kubelet (pkg/registry/core/pod/rest/subresources.go): when the
Node declares ``ExtendWebSocketsToKubelet`` in ``status.declaredFeatures`` (gate beta, on by
default), a WebSocket request from the client is proxied to the kubelet as it is: exec/attach with
``v5.channel.k8s.io`` (or v4…v1), port-forward as the ``SPDY/3.1+portforward.k8s.io`` tunnel
(SPDY frames inside WebSocket binary messages). Without that declaration the API server
translates WebSocket to SPDY/3.1 towards the kubelet; clients that still speak SPDY (kubectl with
``KUBECTL_REMOTE_COMMAND_WEBSOCKETS=false``, old client-go) reach the kubelet with SPDY either way.

The virtual node declares the feature, and this module bridges the WebSocket: it opens the same
request on the provider API server (``pods/exec``, ``pods/attach``, ``pods/portforward`` of the
twin) offering the client's subprotocols, answers the client with the one the provider chose, and
relays messages verbatim both ways. Channel bytes (stdin 0, stdout 1, stderr 2, error 3, resize
4, close 255 in v5) and the port-forward SPDY tunnel are end to end between the client and the
provider. SPDY upgrades are passed through by :mod:`.spdy`; a stream request that upgrades to
neither is answered with a clear 400 and never hangs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import aiohttp
from aiohttp import web
from multidict import MultiDict, MultiMapping

from kube.clients import KubeClient

logger = logging.getLogger(__name__)

EXEC_PROTOCOLS = (
    "v5.channel.k8s.io",
    "v4.channel.k8s.io",
    "v3.channel.k8s.io",
    "v2.channel.k8s.io",
    "channel.k8s.io",
)
PORTFORWARD_PROTOCOLS = ("SPDY/3.1+portforward.k8s.io", "v4.channel.k8s.io", "portforward.k8s.io")

# kubelet query (from the API server's streamParams) -> provider pods/exec|attach query
_KUBELET_TO_API = {"input": "stdin", "output": "stdout", "error": "stderr", "tty": "tty"}


def provider_stream_query(kind: str, query: MultiMapping[str], container: str | None) -> MultiDict[str]:
    """The provider API query for a kubelet ``/exec``, ``/attach`` or ``/portForward`` query. Pure."""
    out: MultiDict[str] = MultiDict()
    if kind in ("exec", "attach"):
        if container:
            out.add("container", container)
        for kubelet_name, api_name in _KUBELET_TO_API.items():
            value = query.get(kubelet_name)
            if value is not None and value.lower() in ("1", "true"):
                out.add(api_name, "true")
        if kind == "exec":
            for arg in query.getall("command", []):
                out.add("command", arg)
    elif kind == "portforward":
        for port in query.getall("port", []):
            out.add("ports", port)
    return out


def offered_protocols(request: web.Request) -> list[str]:
    header = request.headers.get("Sec-WebSocket-Protocol", "")
    return [p.strip() for p in header.split(",") if p.strip()]


def is_websocket(request: web.Request) -> bool:
    return request.headers.get("Upgrade", "").lower() == "websocket"


def _status(code: int, reason: str, message: str) -> web.Response:
    return web.json_response(
        {
            "kind": "Status",
            "apiVersion": "v1",
            "status": "Failure",
            "message": message,
            "reason": reason,
            "code": code,
        },
        status=code,
    )


async def relay(
    request: web.Request,
    provider: KubeClient,
    *,
    path: str,
    query: MultiDict[str],
    supported: tuple[str, ...],
    ends_with_status: bool = False,
) -> web.StreamResponse:
    """Open ``path`` on the provider as a WebSocket and relay it to ``request``'s WebSocket.

    ``ends_with_status``: an exec or attach, whose stream ends with its status on the error
    channel in ``v4``/``v5`` (see :func:`_pump_both`)."""
    if not is_websocket(request):
        upgrade = request.headers.get("Upgrade") or "none"
        return _status(
            400,
            "BadRequest",
            f"streams need an upgrade to WebSocket ({', '.join(supported)}) or SPDY/3.1; "
            f"got upgrade {upgrade!r}",
        )
    offered = [p for p in offered_protocols(request) if p in supported]
    if not offered:
        return _status(
            400, "BadRequest", f"no supported WebSocket subprotocol offered; supported: {list(supported)}"
        )
    # not the client session's "Accept: application/json": kubelets behind the provider's
    # stream tunnel (go-restful) answer 406 to a port-forward that only accepts JSON
    headers: dict[str, str] = {"Accept": "*/*"}
    auth = await provider.connection.authorization()
    if auth:
        headers["Authorization"] = auth
    try:
        upstream = await provider.stream_session.ws_connect(
            provider.base_url + path,
            params=query,
            protocols=offered,
            headers=headers,
            max_msg_size=0,
            autoping=True,
            timeout=aiohttp.ClientWSTimeout(ws_receive=None, ws_close=10.0),
            server_hostname=provider.connection.tls_server_name,
        )
    except aiohttp.WSServerHandshakeError as exc:
        logger.info("provider refused %s: %s %s", path, exc.status, exc.message)
        code = exc.status if 400 <= exc.status < 600 else 502
        return _status(code, "ProviderError", f"provider API server: {exc.status} {exc.message}")
    except (aiohttp.ClientError, OSError) as exc:
        return _status(502, "BadGateway", f"cannot reach the provider API server: {exc}")
    async with upstream:
        chosen = upstream.protocol
        if chosen is None or chosen not in offered:
            return _status(502, "BadGateway", f"provider chose subprotocol {chosen!r}, not one of {offered}")
        downstream = web.WebSocketResponse(protocols=(chosen,), max_msg_size=0, compress=False, autoping=True)
        await downstream.prepare(request)
        expected = ends_with_status and chosen in STATUS_PROTOCOLS
        await _pump_both(downstream, upstream, status_expected=expected, what=path)
        return downstream


def _sendable(code: int | None) -> int:
    """A close code that may be sent on: 1005/1006/1015 only describe a peer's missing or broken
    close (the provider API server often just ends the connection): pass those on as 1000."""
    if code is None or code in (1005, 1006, 1015) or not (1000 <= code < 5000):
        return aiohttp.WSCloseCode.OK
    return code


STATUS_PROTOCOLS = ("v5.channel.k8s.io", "v4.channel.k8s.io")
"""The exec/attach subprotocols whose stream always ends with a Status (Success, or the exit code)
on the error channel, 3."""
CUT_SHORT = "the connection to the provider ended before the command's exit status"


def downstream_close(up_code: int | None, *, status_expected: bool, status_seen: bool) -> tuple[int, str]:
    """The close code and reason to send the client once the provider's side of a stream ended
    with ``up_code``. A provider API server often ends a stream without a close frame (1006), so
    that alone is no failure; but an exec or attach in v4/v5 that ended so before its status is
    a connection lost: 1011, saying so (client-go then fails the command; a normal close made
    kubectl exit 0 as if the command had succeeded). Pure."""
    if status_expected and not status_seen and up_code in (None, 1005, 1006):
        return aiohttp.WSCloseCode.INTERNAL_ERROR, CUT_SHORT
    return _sendable(up_code), ""


async def _pump_both(
    down: web.WebSocketResponse,
    up: aiohttp.ClientWebSocketResponse,
    *,
    status_expected: bool = False,
    what: str = "stream",
) -> None:
    async def down_to_up() -> None:
        async for msg in down:
            if msg.type == aiohttp.WSMsgType.BINARY:
                await up.send_bytes(msg.data)
            elif msg.type == aiohttp.WSMsgType.TEXT:
                await up.send_str(msg.data)
        await up.close(code=_sendable(down.close_code))

    async def up_to_down() -> None:
        status_seen = False
        async for msg in up:
            if msg.type == aiohttp.WSMsgType.BINARY:
                # not the empty message on channel 3 that opens a stream without stdout or stderr
                status_seen = status_seen or (msg.data[:1] == b"\x03" and len(msg.data) > 1)
                await down.send_bytes(msg.data)
            elif msg.type == aiohttp.WSMsgType.TEXT:
                await down.send_str(msg.data)
        code, reason = downstream_close(
            up.close_code, status_expected=status_expected, status_seen=status_seen
        )
        if reason:
            logger.warning("%s: %s (closed %s)", what, reason, up.close_code)
        await down.close(code=code, message=reason.encode())

    tasks = [
        asyncio.create_task(down_to_up(), name="ws-down-to-up"),
        asyncio.create_task(up_to_down(), name="ws-up-to-down"),
    ]
    try:
        # the provider ending the stream (exit status on the error channel, then close) ends it
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            if not task.cancelled() and task.exception() is not None:
                logger.debug("stream relay ended: %r", task.exception())
    finally:
        for task in tasks:
            task.cancel()
        with contextlib.suppress(Exception):
            await asyncio.gather(*tasks, return_exceptions=True)
        if not down.closed:
            await down.close()
        if not up.closed:
            await up.close()
