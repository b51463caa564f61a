"""``python -m peering.provider --kubeconfig PATH``: run the provider controller."""

from __future__ import annotations

import argparse
import asyncio
import logging

from kube.clients import KubeClient
from kube.entrypoints import add_runtime_arguments, leader_election_settings, probe_settings
from kube.errors import KubeError
from kube.leaderelection import LostLeadership
from kube.logs import setup_logging
from kube.settings import ClientSettings, LoggingSettings, QueueSettings, WatchSettings

from ..crds import ensure_crds
from .app import run_provider
from .settings import ProviderSettings


async def _main(args: argparse.Namespace) -> None:
    async with KubeClient.from_config(
        args.kubeconfig, args.context, settings=ClientSettings.from_env()
    ) as client:
        if args.install_crds:
            await ensure_crds(client)
        leader = leader_election_settings(args)
        settings = ProviderSettings(
            certificate_seconds=args.certificate_seconds,
            leader_elect=leader.enabled, lease_namespace=leader.namespace, lease_name=leader.name,
            lease_seconds=leader.lease_seconds, renew_seconds=leader.renew_seconds,
            queue=QueueSettings.from_env(workers=args.workers), watch=WatchSettings.from_env(),
            probes=probe_settings(args), pool_pace=args.pool_pace, pool_pod_batch=args.pool_pod_batch,
        )  # fmt: skip
        await run_provider(client, settings=settings, handle_signals=True)


def _not_negative(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {value!r}") from None
    if number < 0 or number != number:
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {value}")
    return number


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m peering.provider",
        description="gpuferry's provider controller (tenants, grants, twins)",
    )
    parser.add_argument(
        "--kubeconfig", help="admin kubeconfig of the provider (default: $KUBECONFIG, in-cluster)"
    )
    parser.add_argument("--context", help="kubeconfig context")
    parser.add_argument("--install-crds", action="store_true", help="apply gpuferry's CRDs first")
    defaults = ProviderSettings()
    parser.add_argument(
        "--certificate-seconds",
        type=int,
        default=defaults.certificate_seconds,
        help="lifetime asked for issued client certificates (default: 30 days)",
    )
    parser.add_argument("--workers", type=int, default=defaults.queue.workers, help="workers per work queue")
    parser.add_argument(
        "--pool-pace",
        type=_not_negative,
        default=defaults.pool_pace,
        help="after a pass over the GPU pool, wait this many times as long as it took before the next "
        f"(at most 2 s; default {defaults.pool_pace:g}: passes take at most a fifth of a core in a "
        "burst of pods; 0: no wait)",
    )
    parser.add_argument(
        "--pool-pod-batch",
        type=_not_negative,
        default=defaults.pool_pod_batch,
        help="seconds from a pod's or ResourceClaim's change to the GPU pool's pass that counts it, "
        f"with the changes meanwhile (default {defaults.pool_pod_batch:g}; nodes, GPUSlices: 0.1)",
    )
    add_runtime_arguments(parser, lease_name=defaults.lease_name)
    args = parser.parse_args(argv)
    setup_logging(LoggingSettings.from_env())
    try:
        asyncio.run(_main(args))
    except LostLeadership as exc:  # a standby leads now; exit so that this one starts over as one
        logging.getLogger("peering.provider").error("%s; exiting", exc)
        return 1
    except KubeError as exc:  # a CRD not installed, RBAC not bound: one line, the pod's termination message
        logging.getLogger("peering.provider").error("%s; exiting", exc)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
