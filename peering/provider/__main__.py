"""``python -m peering.provider --kubeconfig PATH``: run the provider controller."""

from __future__ import annotations

import argparse
import asyncio
import contextlib

from kube.clients import KubeClient
from kube.logs import setup_logging
from kube.settings import ClientSettings, LoggingSettings, QueueSettings, WatchSettings

from ..crds import ensure_crds
from .app import run_provider
from .settings import ProviderSettings


async def _main(args: argparse.Namespace) -> None:
    async with KubeClient.from_config(args.kubeconfig, args.context,
                                      settings=ClientSettings.from_env()) as client:
        if args.install_crds:
            await ensure_crds(client)
        settings = ProviderSettings(
            certificate_seconds=args.certificate_seconds, lease_namespace=args.lease_namespace,
            queue=QueueSettings.from_env(workers=args.workers), watch=WatchSettings.from_env(),
        )
        await run_provider(client, settings=settings)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m peering.provider",
                                     description="gpuferry's provider controller (tenants, grants, twins)")
    parser.add_argument("--kubeconfig",
                        help="admin kubeconfig of the provider (default: $KUBECONFIG, in-cluster)")
    parser.add_argument("--context", help="kubeconfig context")
    parser.add_argument("--install-crds", action="store_true", help="apply gpuferry's CRDs first")
    defaults = ProviderSettings()
    parser.add_argument("--certificate-seconds", type=int, default=defaults.certificate_seconds,
                        help="lifetime asked for issued client certificates (default: 30 days)")
    parser.add_argument("--lease-namespace", default=defaults.lease_namespace,
                        help="namespace of the leader-election Lease (default: gpuferry-system)")
    parser.add_argument("--workers", type=int, default=defaults.queue.workers,
                        help="workers per work queue")
    args = parser.parse_args(argv)
    setup_logging(LoggingSettings.from_env())
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_main(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
