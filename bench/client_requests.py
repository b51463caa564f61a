"""CPU per API request of gpuferry's client (:class:`kube.clients.KubeClient`: aiohttp, raw
dicts decoded with orjson) against kubernetes-asyncio's (its generated API and models), side by
side on one API server of the local clusters.

Each pass creates, reads and deletes ``--objects`` ConfigMaps, ``--concurrency`` at a time, in a
namespace of its own, and counts this process's CPU (user and system) over it. The passes
alternate, ours first, ``--rounds`` times; the figures are the medians and their ratio. Our
client's rate limiter is off for the run (kubernetes-asyncio has none), so both send as fast
as the server answers. The virtual kubelet spends most of its CPU per offloaded pod in requests
like these (``bench.offload`` prints how many per pod).

    make demo
    .venv/bin/python -m bench.client_requests --profile demo
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio import config as k8s_config
from kubernetes_asyncio.client.exceptions import ApiException

from bench.offload import TimedOut, wait_gone
from bench.offload import namespace as bench_namespace
from hack.localcluster import profile_clusters
from kube.clients import KubeClient
from kube.errors import KubeError
from kube.kubeconfigs import ConfigError
from kube.objects import CONFIGMAPS, NAMESPACES
from kube.settings import ClientSettings

Pass = Callable[[str, int, int], Awaitable[None]]
"""One pass: (namespace, objects, concurrency)."""


def cpu_per_request(cpu_seconds: float, objects: int) -> float:
    """Milliseconds of CPU per request of a pass over ``objects`` (three requests each). Pure."""
    return cpu_seconds / (3 * objects) * 1000


def summary(ours: list[float], theirs: list[float]) -> str:
    """The medians of both clients' ms per request, and the ratio theirs/ours. Pure."""
    a, b = statistics.median(ours), statistics.median(theirs)
    rounds = " ".join(f"{x:.3f}/{y:.3f}" for x, y in zip(ours, theirs, strict=True))
    return (f"CPU per request: gpuferry's client {a:.3f} ms, kubernetes-asyncio {b:.3f} ms: "
            f"{b / a:.2f}x (medians; each round ours/theirs: {rounds})")  # fmt: skip


def _configmap(name: str) -> dict[str, object]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"a": "b"}}


async def _gather(objects: int, concurrency: int, one: Callable[[int], Awaitable[None]]) -> None:
    sem = asyncio.Semaphore(concurrency)

    async def limited(i: int) -> None:
        async with sem:
            await one(i)

    await asyncio.gather(*(limited(i) for i in range(objects)))


def ours(c: KubeClient, tag: str) -> Pass:
    async def run(ns: str, objects: int, concurrency: int) -> None:
        async def one(i: int) -> None:
            name = f"{tag}-{i}"
            await c.create(CONFIGMAPS, _configmap(name), ns)
            await c.get(CONFIGMAPS, name, ns)
            await c.delete(CONFIGMAPS, name, ns)

        await _gather(objects, concurrency, one)

    return run


def theirs(api: k8s.CoreV1Api, tag: str) -> Pass:
    async def run(ns: str, objects: int, concurrency: int) -> None:
        async def one(i: int) -> None:
            name = f"{tag}-{i}"
            await api.create_namespaced_config_map(ns, _configmap(name))
            await api.read_namespaced_config_map(name, ns)
            await api.delete_namespaced_config_map(name, ns)

        await _gather(objects, concurrency, one)

    return run


async def timed(run: Pass, ns: str, objects: int, concurrency: int) -> float:
    """This process's CPU seconds over one pass."""
    start = time.process_time()
    await run(ns, objects, concurrency)
    return time.process_time() - start


async def main(kubeconfig: Path, objects: int, concurrency: int, rounds: int) -> None:
    ns = f"bench-client-{uuid.uuid4().hex[:6]}"
    config = k8s.Configuration()
    await k8s_config.load_kube_config(config_file=str(kubeconfig), client_configuration=config)
    async with KubeClient.from_kubeconfig(kubeconfig, settings=ClientSettings(qps=0)) as c:
        await c.create(NAMESPACES, bench_namespace(ns))
        try:
            async with k8s.ApiClient(configuration=config) as api_client:
                api = k8s.CoreV1Api(api_client)
                for warm in (ours(c, "warm-o"), theirs(api, "warm-t")):  # connections, imports
                    await warm(ns, 2 * concurrency, concurrency)
                got: dict[str, list[float]] = {"ours": [], "theirs": []}
                for r in range(rounds):
                    for side, run in (("ours", ours(c, f"o{r}")), ("theirs", theirs(api, f"t{r}"))):
                        cpu = await timed(run, ns, objects, concurrency)
                        got[side].append(cpu_per_request(cpu, objects))
                        print(f"  round {r + 1} {side}: {got[side][-1]:.3f} ms CPU per request", flush=True)
                print(summary(got["ours"], got["theirs"]), flush=True)
        finally:
            try:
                await c.delete(NAMESPACES, ns)
                await wait_gone(c, [ns], timeout=120)
            except (KubeError, TimedOut) as exc:
                print(f"cleanup: namespace {ns} may be left: {exc}", file=sys.stderr)


def cli(argv: list[str] | None = None) -> int:
    about = (__doc__ or "").split("\n\n")[0]
    p = argparse.ArgumentParser(prog="python -m bench.client_requests", description=about)
    p.add_argument("--profile", default="demo", help="local clusters to use (default: demo; make demo first)")
    p.add_argument("--cluster", default="consumer", choices=["consumer", "provider"])
    p.add_argument("--objects", type=int, default=2000, help="ConfigMaps per pass (3 requests each)")
    p.add_argument("--concurrency", type=int, default=16, help="objects in flight (the vk: 16 pod workers)")
    p.add_argument("--rounds", type=int, default=2, help="passes of each client, alternating")
    args = p.parse_args(argv)
    if args.objects < 1 or args.concurrency < 1 or args.rounds < 1:
        p.error("--objects, --concurrency and --rounds must be at least 1")
    cluster = profile_clusters(args.profile)[args.cluster]
    kubeconfig = cluster.spec.kubeconfig
    if not Path(kubeconfig).exists():
        print(f"no kubeconfig at {kubeconfig}: start the clusters first (make demo)", file=sys.stderr)
        return 1
    try:
        asyncio.run(main(Path(kubeconfig), args.objects, args.concurrency, args.rounds))
    except KeyboardInterrupt:
        print("stopped", file=sys.stderr)
        return 130
    except (KubeError, ConfigError, ApiException, aiohttp.ClientError, OSError) as exc:
        reason = getattr(exc, "reason", None) or exc
        print(f"benchmark stopped: {type(exc).__name__}: {reason}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(cli())
