"""``/healthz``, ``/readyz`` and ``/metrics`` of a component, on one port, without credentials.

The kubelet's HTTP probes carry no credentials, and a Prometheus scrape of a component's own
port should not need a token either (the metrics say how busy a component is, nothing about the
objects it manages). Every component serves the three on one port, chosen by its settings:

* ``/healthz`` (liveness): 200 while the event loop answers and no liveness check fails; a
  failing one (a root task that died) is named in the 500 answer, so a restart follows;
* ``/readyz`` (readiness): 200 once every readiness check passes (its informers have listed,
  its queues run); 503 with the names of those that do not yet;
* ``/metrics``: the Prometheus text of :data:`kube.metrics.REGISTRY`.

``?verbose`` on either probe lists every check, as the API server's own ``/readyz?verbose`` does.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from aiohttp import web

from .metrics import render

__all__ = ["Check", "Probes", "serve_probes"]

logger = logging.getLogger(__name__)

Check = Callable[[], bool]
"""A probe check: True when it passes."""


@dataclass
class Probes:
    """The checks of one component."""

    liveness: dict[str, Check] = field(default_factory=dict)
    readiness: dict[str, Check] = field(default_factory=dict)
    before_metrics: list[Callable[[], None]] = field(default_factory=list)
    """Called before each scrape (gauges computed on demand)."""

    def add_liveness(self, name: str, check: Check) -> None:
        self.liveness[name] = check

    def add_readiness(self, name: str, check: Check) -> None:
        self.readiness[name] = check

    @staticmethod
    def _run(checks: dict[str, Check]) -> dict[str, bool]:
        results = {}
        for name, check in checks.items():
            try:
                results[name] = bool(check())
            except Exception:  # a check that raises fails; the probe itself answers
                logger.exception("probe check %s raised", name)
                results[name] = False
        return results

    def healthy(self) -> dict[str, bool]:
        return self._run(self.liveness)

    def ready(self) -> dict[str, bool]:
        return self._run(self.readiness)

    def metrics_text(self) -> bytes:
        """The text exposition of :data:`kube.metrics.REGISTRY`, its on-demand gauges refreshed
        first."""
        for refresh in self.before_metrics:
            refresh()
        return render()


def _answer(request: web.Request, results: dict[str, bool], failing_status: int) -> web.Response:
    failed = sorted(name for name, ok in results.items() if not ok)
    if "verbose" in request.query:
        lines = [
            f"[{'+' if ok else '-'}]{name} {'ok' if ok else 'failed'}" for name, ok in sorted(results.items())
        ]
        text = "\n".join([*lines, "ok" if not failed else f"failed: {', '.join(failed)}"]) + "\n"
    else:
        text = "ok\n" if not failed else f"failed: {', '.join(failed)}\n"
    return web.Response(text=text, status=200 if not failed else failing_status)


def make_app(probes: Probes) -> web.Application:
    async def healthz(request: web.Request) -> web.Response:
        return _answer(request, probes.healthy(), 500)

    async def readyz(request: web.Request) -> web.Response:
        return _answer(request, probes.ready(), 503)

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=probes.metrics_text(), content_type="text/plain", charset="utf-8")

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/livez", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    return app


async def serve_probes(
    probes: Probes,
    *,
    host: str,
    port: int,
    on_listening: Callable[[int], Awaitable[None] | None] | None = None,
) -> None:
    """Serve until cancelled; ``port`` 0 picks a free one, reported to ``on_listening``."""
    runner = web.AppRunner(make_app(probes), access_log=None)
    await runner.setup()
    try:
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))  # port 0: the kernel picks one, reported below
        bound = sock.getsockname()[1]
        await web.SockSite(runner, sock).start()
        logger.info("probes and metrics on http://%s:%s/{healthz,readyz,metrics}", host, bound)
        if on_listening is not None:
            result = on_listening(int(bound))
            if asyncio.iscoroutine(result):
                await result
        await asyncio.Event().wait()
    finally:
        await asyncio.shield(runner.cleanup())
