"""SPDY/3.1 streams (legacy clients) passed through to the provider API server.

A client that still speaks SPDY for exec, attach or port-forward (kubectl with
``KUBECTL_REMOTE_COMMAND_WEBSOCKETS=false`` or ``KUBECTL_PORT_FORWARD_WEBSOCKETS=false``, older
client-go) reaches the kubelet with ``Upgrade: SPDY/3.1``: the API server proxies that upgrade to
the kubelet as it is, whatever the node declares. The virtual kubelet makes the same upgrade
request to the twin's ``pods/exec|attach|portforward`` on the provider API server, answers the
client with the provider's ``101 Switching Protocols`` (and its chosen
``X-Stream-Protocol-Version``), then copies bytes both ways, as the API server's own
upgrade-aware proxy does: the SPDY session (framing, header compression, streams) is end to end
between the client and the provider's kubelet. A refused upgrade is answered with the
provider's status and message.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from urllib.parse import urlencode, urlsplit

from aiohttp import web
from aiohttp.abc import AbstractStreamWriter
from multidict import MultiDict

from kube.clients import KubeClient
from kube.sockets import set_keepalive

logger = logging.getLogger(__name__)

HEAD_LIMIT = 64 * 1024
CHUNK = 64 * 1024


def is_spdy(request: web.Request) -> bool:
    return request.headers.get("Upgrade", "").lower().startswith("spdy/")


class _RawReader:
    """Takes the place of aiohttp's HTTP parser once the connection is upgraded: raw bytes from
    the client go to a queue (``None`` at the end)."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[bytes | None] = asyncio.Queue()

    def feed_data(self, data: bytes) -> tuple[bool, bytes]:
        self.queue.put_nowait(bytes(data))
        return False, b""

    def feed_eof(self) -> None:
        self.queue.put_nowait(None)


def _parse_head(head: bytes) -> tuple[int, str, MultiDict[str]]:
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    status = int(parts[1])
    reason = parts[2] if len(parts) > 2 else ""
    headers: MultiDict[str] = MultiDict()
    for line in lines[1:]:
        if ":" in line:
            name, _, value = line.partition(":")
            headers.add(name.strip().lower(), value.strip())
    return status, reason, headers


async def passthrough(
    request: web.Request, provider: KubeClient, *, path: str, query: MultiDict[str]
) -> web.StreamResponse:
    """Upgrade ``path`` on the provider to SPDY and join the two connections."""
    url = urlsplit(provider.base_url)
    host, port = url.hostname or "127.0.0.1", url.port or (443 if url.scheme == "https" else 80)
    ssl_ctx = provider.connection.ssl_context()
    try:
        async with asyncio.timeout(30):
            reader, writer = await asyncio.open_connection(
                host,
                port,
                ssl=ssl_ctx,
                server_hostname=(provider.connection.tls_server_name or host) if ssl_ctx else None,
            )
    except (OSError, TimeoutError) as exc:
        return web.Response(status=502, text=f"cannot reach the provider API server: {exc}")
    if (sock := writer.get_extra_info("socket")) is not None:
        # a provider gone without a word ends the stream, as the client's other connections do
        set_keepalive(sock, provider.settings.tcp_keepalive_seconds, provider.settings.tcp_keepalive_probes)
    try:
        target = f"{url.path.rstrip('/')}{path}?{urlencode(list(query.items()))}"
        lines = [
            f"{request.method} {target} HTTP/1.1",
            f"Host: {url.netloc}",
            "Connection: Upgrade",
            f"Upgrade: {request.headers.get('Upgrade', 'SPDY/3.1')}",
            "Content-Length: 0",
            "User-Agent: gpuferry-virtual-kubelet",
        ]
        for version in request.headers.getall("X-Stream-Protocol-Version", []):
            lines.append(f"X-Stream-Protocol-Version: {version}")
        auth = await provider.connection.authorization()
        if auth:
            lines.append(f"Authorization: {auth}")
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        await writer.drain()
        async with asyncio.timeout(30):
            head = await reader.readuntil(b"\r\n\r\n")
        if len(head) > HEAD_LIMIT:
            return web.Response(status=502, text="provider API server: response head too large")
        status, reason, headers = _parse_head(head[:-4])
        if status != 101:
            length = int(headers.get("content-length", "0") or 0)
            body = b""
            if length:
                async with asyncio.timeout(10):
                    body = await reader.readexactly(min(length, HEAD_LIMIT))
            logger.info("provider refused the SPDY upgrade of %s: %s %s", path, status, reason)
            return web.Response(
                status=status,
                body=body,
                content_type=(headers.get("content-type") or "text/plain").split(";")[0],
            )
        response = web.StreamResponse(status=101)
        response.headers["Connection"] = "Upgrade"
        response.headers["Upgrade"] = headers.get("upgrade", "SPDY/3.1")
        if chosen := headers.get("x-stream-protocol-version"):
            response.headers["X-Stream-Protocol-Version"] = chosen
        response.force_close()
        client = await response.prepare(request)
        assert client is not None
        raw = _RawReader()
        assert request.protocol is not None
        request.protocol.set_parser(raw)  # type: ignore[arg-type]
        request.protocol.keep_alive(False)
        try:
            await _join(raw, client, reader, writer)
        finally:
            if request.transport is not None:
                request.transport.close()
        return response
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


async def _join(
    raw: _RawReader, client: AbstractStreamWriter, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    """Copy both ways until either side ends (aiohttp feeds EOF to ``raw`` when the client's
    connection is lost)."""

    async def client_to_provider() -> None:
        while (data := await raw.queue.get()) is not None:
            writer.write(data)
            await writer.drain()

    async def provider_to_client() -> None:
        while data := await reader.read(CHUNK):
            await client.write(data)  # the raw transport: no body framing after a 101

    tasks = [asyncio.create_task(client_to_provider()), asyncio.create_task(provider_to_client())]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
