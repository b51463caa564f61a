"""``python -m peering.consumer --kubeconfig PATH``: run the consumer agent."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
from pathlib import Path

from kube.clients import KubeClient
from kube.logs import setup_logging
from kube.settings import ClientSettings, LoggingSettings

from .app import run_consumer


async def _main(args: argparse.Namespace, kubeconfig: Path | None) -> None:
    # SIGTERM (gpuferry agents stop, a pod's termination) ends the agent cleanly: its virtual
    # kubelets are stopped by the supervisor instead of being orphaned
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    async with KubeClient.from_config(kubeconfig, args.context, settings=ClientSettings.from_env()) as client:
        await run_consumer(
            client,
            kubeconfig=kubeconfig,
            namespace=args.namespace,
            log_dir=args.log_dir,
            kubelet_self_approve=args.kubelet_csr_self_approve,
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m peering.consumer",
        description="gpuferry's consumer agent: one virtual kubelet per VirtualNode, "
        "kept in step with its grant",
    )
    parser.add_argument("--kubeconfig", help="admin kubeconfig of the consumer (default: in-cluster)")
    parser.add_argument("--context", help="kubeconfig context")
    parser.add_argument("--namespace", default="gpuferry-system", help="where VirtualNodes live")
    parser.add_argument(
        "--log-dir", type=Path, help="one log file per virtual kubelet here (default: inherit)"
    )
    parser.add_argument(
        "--kubelet-csr-self-approve",
        action="store_true",
        help="virtual kubelets approve their own serving certificates (local clusters only)",
    )
    args = parser.parse_args(argv)
    setup_logging(LoggingSettings.from_env())
    with contextlib.suppress(KeyboardInterrupt, asyncio.CancelledError):
        asyncio.run(_main(args, Path(args.kubeconfig).resolve() if args.kubeconfig else None))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
