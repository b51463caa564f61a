"""``python -m peering.consumer --kubeconfig PATH``: run the consumer's controllers."""

from __future__ import annotations

import argparse
import asyncio
import logging
from pathlib import Path

from kube.api import SYSTEM_NAMESPACE
from kube.clients import KubeClient
from kube.entrypoints import add_runtime_arguments, leader_election_settings, probe_settings
from kube.leaderelection import LostLeadership
from kube.logs import setup_logging
from kube.settings import ClientSettings, LoggingSettings

from .app import LEASE_NAME, build_consumer


async def _main(args: argparse.Namespace, kubeconfig: Path | None) -> None:
    # SIGTERM (gpuferry agents stop, a pod's termination) ends the agent cleanly: its virtual
    # kubelets are stopped by the supervisor instead of being orphaned, its Lease released
    async with KubeClient.from_config(kubeconfig, args.context, settings=ClientSettings.from_env()) as client:
        manager = build_consumer(
            client,
            kubeconfig=kubeconfig,
            namespace=args.namespace,
            log_dir=args.log_dir,
            kubelet_self_approve=args.kubelet_csr_self_approve,
            node_address=args.virtual_kubelet_address,
            probes=probe_settings(args),
            leader_election=leader_election_settings(args),
        )
        await manager.run(handle_signals=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m peering.consumer",
        description="gpuferry's consumer controllers: ForeignClusters (enrolment, GPU slice, "
        "virtual node, network), NamespaceOffloadings, and one virtual kubelet per VirtualNode",
    )
    parser.add_argument("--kubeconfig", help="admin kubeconfig of the consumer (default: in-cluster)")
    parser.add_argument("--context", help="kubeconfig context")
    parser.add_argument("--namespace", default=SYSTEM_NAMESPACE, help="where VirtualNodes live")
    parser.add_argument(
        "--log-dir", type=Path, help="one log file per virtual kubelet here (default: inherit)"
    )
    parser.add_argument(
        "--kubelet-csr-self-approve",
        action="store_true",
        help="virtual kubelets approve their own serving certificates (local clusters only)",
    )
    parser.add_argument(
        "--virtual-kubelet-address",
        default="127.0.0.1",
        help="where the virtual kubelets' APIs listen, reported as their Nodes' InternalIP "
        "(default 127.0.0.1; in a pod its IP, for the API server to reach logs and exec)",
    )
    add_runtime_arguments(parser, lease_name=LEASE_NAME)
    args = parser.parse_args(argv)
    setup_logging(LoggingSettings.from_env())
    try:
        asyncio.run(_main(args, Path(args.kubeconfig).resolve() if args.kubeconfig else None))
    except LostLeadership as exc:  # a standby leads now; exit so that this one starts over as one
        logging.getLogger("peering.consumer").error("%s; exiting", exc)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
