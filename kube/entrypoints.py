"""What every component's ``__main__`` shares: the runtime flags (probes, leader election) and
their settings, read once at the entry point (environment first, flags over it)."""

from __future__ import annotations

import argparse

from .settings import LeaderElectionSettings, ProbeSettings

__all__ = ["add_runtime_arguments", "leader_election_settings", "probe_settings"]


def add_runtime_arguments(parser: argparse.ArgumentParser, *, lease_name: str | None = None) -> None:
    """``--probe-bind-address``, ``--probe-port`` and, with ``lease_name``, the leader-election
    flags (``--leader-elect``/``--no-leader-elect``, ``--lease-namespace``, ``--lease-seconds``)."""
    probes = ProbeSettings.from_env()
    group = parser.add_argument_group("probes and metrics")
    group.add_argument("--probe-bind-address", default=probes.bind_address,
                       help=f"address of /healthz, /readyz and /metrics (default: {probes.bind_address}; "
                            "0.0.0.0 in a pod)")  # fmt: skip
    group.add_argument("--probe-port", type=int, default=probes.port,
                       help="their port (default: a free one, logged at start; -1: none)")  # fmt: skip
    if lease_name is None:
        return
    leader = LeaderElectionSettings.from_env(name=lease_name)
    group = parser.add_argument_group("leader election (one replica acts, the others stand by)")
    group.add_argument("--leader-elect", action=argparse.BooleanOptionalAction, default=leader.enabled,
                       help="act only while holding the Lease (default: on)")  # fmt: skip
    group.add_argument("--lease-namespace", default=leader.namespace,
                       help=f"namespace of the Lease (default: {leader.namespace})")  # fmt: skip
    group.add_argument("--lease-name", default=leader.name, help=f"the Lease (default: {leader.name})")
    group.add_argument("--lease-seconds", type=int, default=leader.lease_seconds,
                       help="a standby takes over this long after the leader stopped renewing "
                            f"(default: {leader.lease_seconds})")  # fmt: skip
    group.add_argument("--renew-seconds", type=float, default=leader.renew_seconds,
                       help=f"how often the leader renews (default: {leader.renew_seconds:g})")  # fmt: skip


def probe_settings(args: argparse.Namespace) -> ProbeSettings:
    return ProbeSettings(bind_address=args.probe_bind_address, port=args.probe_port)


def leader_election_settings(args: argparse.Namespace) -> LeaderElectionSettings:
    return LeaderElectionSettings(
        enabled=args.leader_elect,
        namespace=args.lease_namespace,
        name=args.lease_name,
        lease_seconds=args.lease_seconds,
        renew_seconds=args.renew_seconds,
    )
