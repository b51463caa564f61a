"""/healthz, /readyz and /metrics without credentials (kube.probes), through aiohttp's client."""

from __future__ import annotations

from typing import Any

from kube.metrics import counter
from kube.probes import Probes, make_app


async def test_probes_answer_by_their_checks(aiohttp_client: Any) -> None:
    probes = Probes()
    state = {"synced": False, "alive": True}
    probes.add_readiness("informer-pods", lambda: state["synced"])
    probes.add_liveness("watch-pods", lambda: state["alive"])
    client = await aiohttp_client(make_app(probes))

    ready = await client.get("/readyz")
    assert (ready.status, await ready.text()) == (503, "failed: informer-pods\n")
    assert (await client.get("/healthz")).status == 200
    state["synced"] = True
    assert (await client.get("/readyz")).status == 200

    state["alive"] = False
    health = await client.get("/healthz?verbose")
    assert health.status == 500
    assert await health.text() == "[-]watch-pods failed\nfailed: watch-pods\n"
    assert (await client.get("/livez")).status == 500


async def test_a_check_that_raises_fails_and_the_probe_still_answers(aiohttp_client: Any) -> None:
    probes = Probes()

    def broken() -> bool:
        raise RuntimeError("boom")

    probes.add_readiness("broken", broken)
    probes.add_readiness("fine", lambda: True)
    client = await aiohttp_client(make_app(probes))
    resp = await client.get("/readyz?verbose")
    assert resp.status == 503
    assert await resp.text() == "[-]broken failed\n[+]fine ok\nfailed: broken\n"


async def test_metrics_are_the_registry_refreshed_on_demand(aiohttp_client: Any) -> None:
    probes = Probes()
    scrapes = counter("test_probe_scrapes", "Scrapes seen by the test.")
    probes.before_metrics.append(scrapes.inc)
    client = await aiohttp_client(make_app(probes))
    first = await (await client.get("/metrics")).text()
    second = await (await client.get("/metrics")).text()
    assert "gpuferry_test_probe_scrapes_total 1.0" in first
    assert "gpuferry_test_probe_scrapes_total 2.0" in second
