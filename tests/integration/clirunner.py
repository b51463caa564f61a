"""The ``gpuferry`` CLI as a real process, with its local agents kept in a temporary
``$GPUFERRY_CACHE`` so that they cannot meet the demo's; the ``cli`` fixture (conftest) unpeers and
stops whatever a test left running."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path

from hack.localcluster import LocalCluster

__all__ = ["Cli", "cache_of"]


class Cli:
    def __init__(
        self, consumer: LocalCluster, provider: LocalCluster, cache: Path, *, agents: str = "local"
    ) -> None:
        """``agents``: what peer and unpeer run with (``$GPUFERRY_AGENTS``): local processes
        (development mode) for the clusters gpuferry is not installed in, auto where it is."""
        self.c, self.p = str(consumer.spec.kubeconfig), str(provider.spec.kubeconfig)
        self.env = {**os.environ, "GPUFERRY_CACHE": str(cache), "GPUFERRY_AGENTS": agents}

    async def __call__(self, *args: str) -> tuple[int, str, str]:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "peering.cli.main",
            *args,
            env=self.env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(proc.communicate(), 300)
        assert proc.returncode is not None
        return proc.returncode, out.decode(), err.decode()

    def peer_args(self, *extra: str) -> list[str]:
        """``gpuferry peer`` ml-eu with gpu-farm, quiet and without the network fabric (for the
        tests about GPUs, not packets); what to ask for follows in ``extra``."""
        return ["peer", "--kubeconfig", self.c, "--remote-kubeconfig", self.p, "--cluster-id", "ml-eu",
                "--remote-cluster-id", "gpu-farm", "-q", "--no-network", *extra]  # fmt: skip

    async def ok(self, *args: str) -> str:
        code, out, err = await self(*args)
        assert code == 0, f"gpuferry {' '.join(args)} failed ({code}):\n{err}\n{out}"
        assert "Traceback" not in err
        return out


@contextlib.contextmanager
def cache_of(cli: Cli) -> Iterator[None]:
    """This process looks at the CLI's agents (their records live under $GPUFERRY_CACHE)."""
    previous = os.environ.get("GPUFERRY_CACHE")
    os.environ["GPUFERRY_CACHE"] = cli.env["GPUFERRY_CACHE"]
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("GPUFERRY_CACHE", None)
        else:
            os.environ["GPUFERRY_CACHE"] = previous
