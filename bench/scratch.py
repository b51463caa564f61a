"""What the request benchmarks (``bench.client_requests``, ``bench.request_costs``) share: the
cluster's kubeconfig, a namespace of their own removed after the run whatever happens, requests
a few at a time, and one clear line instead of a traceback when the run stops."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

import aiohttp

from bench.offload import TimedOut, wait_gone
from bench.offload import namespace as bench_namespace
from hack.localcluster import profile_clusters
from hack.localcluster.spec import PROFILE_PORT_BASES
from kube.clients import KubeClient
from kube.errors import KubeError
from kube.kubeconfigs import ConfigError
from kube.objects import NAMESPACES

__all__ = ["PROFILES", "gather_limited", "kubeconfig_of", "run_bench", "scratch_namespace"]

PROFILES = sorted(PROFILE_PORT_BASES)
"""The local clusters' profiles a benchmark may run on (``--profile``)."""


def kubeconfig_of(profile: str, cluster: str) -> Path | None:
    """The admin kubeconfig of ``cluster`` in the local clusters ``profile``; None, said on
    stderr, when those clusters are not up."""
    kubeconfig = Path(profile_clusters(profile)[cluster].spec.kubeconfig)
    if not kubeconfig.exists():
        print(f"no kubeconfig at {kubeconfig}: start the clusters first (make demo)", file=sys.stderr)
        return None
    return kubeconfig


@contextlib.asynccontextmanager
async def scratch_namespace(client: KubeClient, prefix: str) -> AsyncIterator[str]:
    """A namespace ``<prefix>-<random>`` (labelled as the bench's), deleted and waited for on the
    way out, also when the run fails or is interrupted; a namespace that would not go is said."""
    ns = f"{prefix}-{uuid.uuid4().hex[:6]}"
    await client.create(NAMESPACES, bench_namespace(ns))
    try:
        yield ns
    finally:
        try:
            await client.delete(NAMESPACES, ns)
            await wait_gone(client, [ns], timeout=120)
        except (KubeError, TimedOut) as exc:
            print(f"cleanup: namespace {ns} may be left: {exc}", file=sys.stderr)


async def gather_limited(count: int, concurrency: int, one: Callable[[int], Awaitable[object]]) -> None:
    """``one(0)`` … ``one(count - 1)``, at most ``concurrency`` at a time."""
    sem = asyncio.Semaphore(concurrency)

    async def limited(i: int) -> None:
        async with sem:
            await one(i)

    await asyncio.gather(*(limited(i) for i in range(count)))


def run_bench(run: Coroutine[Any, Any, None], *errors: type[BaseException]) -> int:
    """Run a benchmark to its end: 0; 130 on Ctrl-C (its namespaces go first); 1 with one line
    naming the error when it stops on the API, a kubeconfig or the network (or on ``errors``)."""
    try:
        asyncio.run(run)
    except KeyboardInterrupt:
        print("stopped", file=sys.stderr)
        return 130
    except (KubeError, ConfigError, TimedOut, aiohttp.ClientError, OSError, *errors) as exc:
        print(f"benchmark stopped: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0
