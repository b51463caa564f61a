"""``gpuferry agents``: the controllers ``gpuferry peer`` started as local background processes."""

from __future__ import annotations

import argparse
from typing import Any

from ..localagents import agents_dir, all_agents, stop_agent
from .common import add_output_argument, described, emit, fold_table

__all__ = ["add_parser"]


async def cmd_agents(args: argparse.Namespace) -> int:
    agents = all_agents()
    if args.action == "stop":
        stopped = [f"{a.role}-{a.cluster_id}" for a in agents if stop_agent(a)]
        emit(
            {"stopped": stopped},
            args.output,
            lambda console: console.print(f"stopped {len(stopped)} agents: {', '.join(stopped) or 'none'}"),
        )
        return 0
    rows = [
        {
            "role": a.role,
            "cluster": a.cluster_id,
            "pid": a.pid(),
            "log": str(a.log),
            "kubeconfig": a.kubeconfig,
        }
        for a in agents
    ]

    def table(console: Any) -> None:
        t = fold_table(["role", "cluster", "running", "log"], title=f"local agents ({agents_dir()})")
        for r in rows:
            running = f"pid {r['pid']}" if r["pid"] else "no"
            t.add_row(str(r["role"]), str(r["cluster"]), running, str(r["log"]))
        console.print(t)

    emit({"agents": rows}, args.output, table)
    return 0


def add_parser(sub: Any) -> None:
    agents = sub.add_parser(
        "agents",
        help="list or stop the local controllers that `gpuferry peer` started (embedded mode)",
        **described(
            """In development mode (`gpuferry peer --agents local`, for clusters without gpuferry
            installed) peer runs the controllers as background processes on this machine, one per
            cluster and role, with their pid files and logs under $GPUFERRY_CACHE/agents
            (~/.cache/gpuferry/agents). `agents` lists them, running or not; `agents stop` stops
            them all (`gpuferry unpeer` stops a peering's own).""",
            "gpuferry agents",
            "gpuferry agents stop",
        ),
    )
    agents.add_argument(
        "action", nargs="?", choices=["list", "stop"], default="list", help="list (default) or stop"
    )
    add_output_argument(agents)
    agents.set_defaults(handler=cmd_agents)
