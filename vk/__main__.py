"""python -m vk: run one virtual kubelet. Settings come from flags (and GPUFERRY_* variables for
client, queue, watch and probe tuning), read once here.

Exit status: 0 the VirtualNode was deleted (its node removed), 2 the VirtualNode cannot be run,
75 it changed (start again), 1 an error, 128+N stopped by signal N (143: SIGTERM, 130: SIGINT)
after a graceful stop.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path

from kube.api import VirtualKubeletExit
from kube.entrypoints import add_runtime_arguments, probe_settings
from kube.errors import KubeError
from kube.kubeconfigs import ConfigError
from kube.logs import setup_logging
from kube.memory import tune_gc, tune_memory
from kube.settings import ClientSettings, LoggingSettings, QueueSettings, WatchSettings

from .app import VirtualNodeChanged, VirtualNodeGone, run, run_virtual_node
from .forge.events import PROVIDER_EVENTS
from .settings import VirtualKubeletSettings, VirtualNodeError


def _pairs(values: list[str], flag: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for value in values:
        key, sep, val = value.partition("=")
        if not sep or not key:
            raise SystemExit(f"error: {flag} expects NAME=VALUE, got {value!r}")
        out[key] = val
    return out


def parse_settings(argv: list[str] | None = None) -> VirtualKubeletSettings:
    p = argparse.ArgumentParser(
        prog="python -m vk",
        description="gpuferry virtual kubelet: one virtual node on the consumer standing for GPUs "
        "granted by a provider; pods bound to it run as twin pods on the provider.",
    )
    p.add_argument("--consumer-kubeconfig", type=Path, help="consumer kubeconfig (default: in-cluster)")
    p.add_argument(
        "--virtual-node",
        metavar="NAMESPACE/NAME",
        help="run for this VirtualNode: node, grant and provider identity come from it and its "
        "kubeconfig Secret (then the provider flags below are not used); the process exits 0 "
        "when the VirtualNode is deleted (after removing the node) and 75 when it changes",
    )
    p.add_argument("--provider-kubeconfig", type=Path, help="provider kubeconfig (without --virtual-node)")
    p.add_argument("--consumer-id", help="consumer cluster ID, twin namespace suffix (no --virtual-node)")
    p.add_argument("--provider-id", help="provider cluster ID (without --virtual-node)")
    p.add_argument("--node-name", default="", help="Node name (default: gpuferry-<provider-id>)")
    p.add_argument(
        "--resource",
        action="append",
        default=[],
        metavar="NAME=QUANTITY",
        help="granted capacity, repeatable: nvidia.com/gpu=8, cpu=64, memory=512Gi, pods=110",
    )
    p.add_argument(
        "--provider-node-selector",
        action="append",
        default=[],
        metavar="LABEL=VALUE",
        help="provider nodes the grant covers, repeatable (e.g. nvidia.com/gpu.product=...)",
    )
    p.add_argument(
        "--namespace-strategy",
        choices=["default", "same"],
        default="default",
        help="twin namespace: <ns>-<consumer-id> (default) or the same name",
    )
    p.add_argument("--node-address", default="127.0.0.1", help="InternalIP of the node (kubelet API)")
    p.add_argument(
        "--kubelet-api",
        action="store_true",
        help="serve the kubelet API (kubectl logs/exec/attach/port-forward) on --node-address:--kubelet-port",
    )
    p.add_argument("--kubelet-port", type=int, default=10250, help="port of the kubelet API (10250)")
    p.add_argument(
        "--kubelet-csr-self-approve",
        action="store_true",
        help="approve the kubelet API's serving-certificate CSR with our own identity (local clusters only)",
    )
    p.add_argument(
        "--provider-events",
        choices=PROVIDER_EVENTS,
        default="all",
        help="which provider Events about twins are copied onto their pods (default all: the "
        "provider's scheduler and kubelet, what kubectl describe shows on a node of its own; "
        "warnings: only what went wrong, one consumer write per pod fewer or about five with a "
        "real provider node; none)",
    )
    p.add_argument("--log-resume-seconds", type=float, default=30.0,
                   help="how long `kubectl logs -f` of a pod whose stream from the provider is cut "
                        "tries to go on where it was before it ends (30): a restart of the "
                        "provider's API server passes unnoticed; 0: it ends at once")  # fmt: skip
    p.add_argument("--workers", type=int, default=16, help="pods reconciled concurrently")
    p.add_argument("--resync-seconds", type=float, default=300.0,
                   help="every pod, twin and copy is reconciled again this often (300): collects "
                        "orphans and heals what a lost event hid; each pass costs CPU per pod")  # fmt: skip
    p.add_argument("--metrics-port", type=int, default=0,
                   help="the probe port's older name: serve /metrics (with /healthz and /readyz) on "
                        "this port; wins over --probe-port when set")  # fmt: skip
    add_runtime_arguments(p)
    args = p.parse_args(argv)
    if args.log_resume_seconds < 0:
        p.error(f"--log-resume-seconds must not be negative, got {args.log_resume_seconds:g}")
    if args.resync_seconds < 1:
        p.error(f"--resync-seconds must be at least 1, got {args.resync_seconds:g}")
    if args.virtual_node:
        namespace, sep, name = args.virtual_node.partition("/")
        if not sep or not namespace or not name:
            p.error(f"--virtual-node expects NAMESPACE/NAME, got {args.virtual_node!r}")
    else:
        missing = [f for f in ("provider_kubeconfig", "consumer_id", "provider_id") if not getattr(args, f)]
        if missing:
            flags = ", ".join("--" + f.replace("_", "-") for f in missing)
            p.error(f"without --virtual-node these are required: {flags}")
    return VirtualKubeletSettings(
        consumer_kubeconfig=args.consumer_kubeconfig,
        provider_kubeconfig=args.provider_kubeconfig,
        consumer_cluster_id=args.consumer_id or "",
        provider_cluster_id=args.provider_id or "",
        virtual_node=args.virtual_node or "",
        node_name=args.node_name,
        resources=_pairs(args.resource, "--resource"),
        provider_node_selector=_pairs(args.provider_node_selector, "--provider-node-selector"),
        namespace_strategy=args.namespace_strategy,
        provider_events=args.provider_events,
        node_address=args.node_address,
        kubelet_api=args.kubelet_api,
        kubelet_port=args.kubelet_port,
        kubelet_csr_self_approve=args.kubelet_csr_self_approve,
        log_resume_seconds=args.log_resume_seconds,
        probes=probe_settings(args),
        metrics_port=args.metrics_port,
        workers=args.workers,
        resync_seconds=args.resync_seconds,
        consumer_client=ClientSettings.from_env(),
        provider_client=ClientSettings.from_env(),
        watch=WatchSettings.from_env(),
        queue=QueueSettings.from_env(workers=args.workers),
    )


def main(argv: list[str] | None = None) -> int:
    settings = parse_settings(argv)
    setup_logging(LoggingSettings.from_env())
    tune_memory()
    tune_gc()
    log = logging.getLogger("vk")
    try:
        if settings.virtual_node:
            namespace, _, name = settings.virtual_node.partition("/")
            stopped_by = asyncio.run(run_virtual_node(namespace, name, settings, handle_signals=True))
        else:
            stopped_by = asyncio.run(run(settings, handle_signals=True))
    except VirtualNodeGone as exc:
        log.info("%s", exc)
        return VirtualKubeletExit.GONE
    except VirtualNodeChanged as exc:
        log.info("%s", exc)
        return VirtualKubeletExit.CHANGED
    except VirtualNodeError as exc:
        log.error("cannot run: %s", exc)
        return VirtualKubeletExit.INVALID
    except (ConfigError, KubeError) as exc:
        log.error("stopped: %s", exc)
        return 1
    except KeyboardInterrupt:
        return 130
    if stopped_by is None:
        log.error("stopped: a root task ended")
        return 1
    log.info("stopped")
    return 128 + stopped_by


if __name__ == "__main__":
    sys.exit(main())
