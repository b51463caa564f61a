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
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from kubernetes_asyncio import client as k8s
from kubernetes_asyncio import config as k8s_config
from kubernetes_asyncio.client.exceptions import ApiException

from bench.scratch import PROFILES, gather_limited, kubeconfig_of, run_bench, scratch_namespace
from kube.clients import KubeClient
from kube.objects import CONFIGMAPS
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


def ours(c: KubeClient, tag: str) -> Pass:
    async def run(ns: str, objects: int, concurrency: int) -> None:
        async def one(i: int) -> None:
            name = f"{tag}-{i}"
            await c.create(CONFIGMAPS, _configmap(name), ns)
            await c.get(CONFIGMAPS, name, ns)
            await c.delete(CONFIGMAPS, name, ns)

        await gather_limited(objects, concurrency, one)

    return run


def theirs(api: k8s.CoreV1Api, tag: str) -> Pass:
    async def run(ns: str, objects: int, concurrency: int) -> None:
        async def one(i: int) -> None:
            name = f"{tag}-{i}"
            await api.create_namespaced_config_map(ns, _configmap(name))
            await api.read_namespaced_config_map(name, ns)
            await api.delete_namespaced_config_map(name, ns)

        await gather_limited(objects, concurrency, one)

    return run


async def timed(run: Pass, ns: str, objects: int, concurrency: int) -> float:
    """This process's CPU seconds over one pass."""
    start = time.process_time()
    await run(ns, objects, concurrency)
    return time.process_time() - start


async def main(kubeconfig: Path, objects: int, concurrency: int, rounds: int) -> None:
    config = k8s.Configuration()
    await k8s_config.load_kube_config(config_file=str(kubeconfig), client_configuration=config)
    async with (
        KubeClient.from_kubeconfig(kubeconfig, settings=ClientSettings(qps=0)) as c,
        scratch_namespace(c, "bench-client") as ns,
        k8s.ApiClient(configuration=config) as api_client,
    ):
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


def cli(argv: list[str] | None = None) -> int:
    about = (__doc__ or "").split("\n\n")[0]
    p = argparse.ArgumentParser(prog="python -m bench.client_requests", description=about)
    p.add_argument("--profile", default="demo", choices=PROFILES,
                   help="local clusters to use (default: demo; make demo first)")  # fmt: skip
    p.add_argument("--cluster", default="consumer", choices=["consumer", "provider"])
    p.add_argument("--objects", type=int, default=2000, help="ConfigMaps per pass (3 requests each)")
    p.add_argument("--concurrency", type=int, default=16, help="objects in flight (the vk: 16 pod workers)")
    p.add_argument("--rounds", type=int, default=2, help="passes of each client, alternating")
    args = p.parse_args(argv)
    if args.objects < 1 or args.concurrency < 1 or args.rounds < 1:
        p.error("--objects, --concurrency and --rounds must be at least 1")
    kubeconfig = kubeconfig_of(args.profile, args.cluster)
    if kubeconfig is None:
        return 1
    return run_bench(main(kubeconfig, args.objects, args.concurrency, args.rounds), ApiException)


if __name__ == "__main__":
    sys.exit(cli())
