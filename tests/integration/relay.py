"""A TCP relay to an API server that a test can cut and restore, to make a provider "outage"
without stopping the shared cluster (TLS passes through untouched; the server's certificate
names 127.0.0.1)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from pathlib import Path

import yaml


class Relay:
    """A TCP relay to the provider API server that the test can cut and restore."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self.server: asyncio.Server | None = None
        self.writers: set[asyncio.StreamWriter] = set()
        self.serving = 0
        """Which start() serves now; 0: none (stopped)."""
        self._starts = 0

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        writer.close()

    async def _handle(self, start: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # a connection accepted just before stop() may only come here after it (even after a
        # start() again), and one that stop() found still connecting upstream was not cut with
        # the others: neither goes on
        if not self._open(start, writer):
            return
        self.writers.add(writer)
        try:
            try:
                up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
            except OSError:
                writer.close()
                return
            if not self._open(start, writer):
                up_writer.transport.abort()
                return
            self.writers.add(up_writer)
            try:
                await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
            finally:
                self.writers.discard(up_writer)
        finally:
            self.writers.discard(writer)

    def _open(self, start: int, writer: asyncio.StreamWriter) -> bool:
        """Whether the relay still serves as it did when it took ``writer``'s connection and did
        not cut that since; else cut it."""
        if start == self.serving and not writer.transport.is_closing():
            return True
        writer.transport.abort()
        return False

    async def start(self) -> None:
        self._starts += 1
        self.serving = self._starts
        self.server = await asyncio.start_server(
            functools.partial(self._handle, self._starts), "127.0.0.1", self.port
        )
        self.port = self.server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """Refuse new connections and cut the open ones (watches included)."""
        self.serving = 0
        if self.server is not None:
            self.server.close()
            for writer in list(self.writers):
                writer.transport.abort()
            await self.server.wait_closed()
            self.server = None


def kubeconfig_via(original: Path, server: str, directory: Path) -> Path:
    config = yaml.safe_load(original.read_text())
    for cluster in config["clusters"]:
        cluster["cluster"]["server"] = server
        for key in ("certificate-authority",):
            if key in cluster["cluster"]:
                cluster["cluster"][key] = str(original.parent / cluster["cluster"][key])
    for user in config.get("users") or []:
        for key in ("client-certificate", "client-key"):
            if key in user["user"]:
                user["user"][key] = str(original.parent / user["user"][key])
    path = directory / "provider.kubeconfig"
    path.write_text(yaml.safe_dump(config))
    return path
