"""``python -m peering.consumer --kubeconfig PATH``: run the consumer's controllers."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
from pathlib import Path
from typing import Any

from kube.api import SYSTEM_NAMESPACE
from kube.clients import KubeClient
from kube.entrypoints import add_runtime_arguments, leader_election_settings, probe_settings
from kube.errors import KubeError
from kube.leaderelection import LostLeadership
from kube.logs import setup_logging
from kube.settings import ClientSettings, LoggingSettings

from ..kubeletworkload import KubeletWorkloadSettings
from .app import LEASE_NAME, build_consumer


def kubelet_pod_settings(
    args: argparse.Namespace, parser: argparse.ArgumentParser
) -> KubeletWorkloadSettings | None:
    """The settings of virtual kubelets run as pods (``--virtual-kubelets pods``), else None."""
    if args.virtual_kubelets != "pods":
        return None
    if not args.virtual_kubelet_image:
        parser.error("--virtual-kubelets pods needs --virtual-kubelet-image (the image of this agent)")
    try:
        pod: dict[str, Any] = json.loads(args.virtual_kubelet_pod or "{}")
    except json.JSONDecodeError as exc:
        parser.error(f"--virtual-kubelet-pod is not JSON: {exc}")
    unknown = set(pod) - {"nodeSelector", "tolerations", "resources", "labels"}
    if not isinstance(pod, dict) or unknown:
        keys = "nodeSelector, tolerations, resources and labels"
        parser.error(f"--virtual-kubelet-pod takes {keys}; got {sorted(unknown)}")
    return KubeletWorkloadSettings(
        extra_args=tuple(args.virtual_kubelet_arg),
        image=args.virtual_kubelet_image,
        pull_policy=args.virtual_kubelet_pull_policy,
        namespace=args.namespace,
        cluster_role=args.virtual_kubelet_cluster_role,
        node_selector=pod.get("nodeSelector") or {},
        tolerations=pod.get("tolerations") or (),
        resources=pod.get("resources") or {},
        labels=pod.get("labels") or {},
    )


async def _main(
    args: argparse.Namespace, kubeconfig: Path | None, kubelet_pods: KubeletWorkloadSettings | None
) -> None:
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
            kubelet_pods=kubelet_pods,
            kubelet_args=args.virtual_kubelet_arg,
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
    parser.add_argument(
        "--virtual-kubelets",
        choices=("processes", "pods"),
        default="processes",
        help="run each VirtualNode's virtual kubelet as a process of this agent (development, "
        "the default) or as a Deployment in the cluster (what the chart sets)",
    )
    parser.add_argument("--virtual-kubelet-image", help="image of the virtual kubelets' pods (this agent's)")
    parser.add_argument(
        "--virtual-kubelet-pull-policy",
        default="IfNotPresent",
        choices=("Always", "IfNotPresent", "Never"),
        help="their imagePullPolicy",
    )
    parser.add_argument("--virtual-kubelet-cluster-role", default="gpuferry-virtual-kubelet",
                        help="the ClusterRole each kubelet's ServiceAccount is bound to")  # fmt: skip
    parser.add_argument(
        "--virtual-kubelet-pod",
        metavar="JSON",
        help='their pods\' {"nodeSelector", "tolerations", "resources", "labels"}',
    )
    parser.add_argument(
        "--virtual-kubelet-arg",
        action="append",
        default=[],
        metavar="FLAG",
        help="a flag every virtual kubelet gets, repeatable (see python -m vk --help), e.g. "
        "--virtual-kubelet-arg=--provider-events=warnings",
    )
    add_runtime_arguments(parser, lease_name=LEASE_NAME)
    args = parser.parse_args(argv)
    kubelet_pods = kubelet_pod_settings(args, parser)
    setup_logging(LoggingSettings.from_env())
    try:
        asyncio.run(_main(args, Path(args.kubeconfig).resolve() if args.kubeconfig else None, kubelet_pods))
    except LostLeadership as exc:  # a standby leads now; exit so that this one starts over as one
        logging.getLogger("peering.consumer").error("%s; exiting", exc)
        return 1
    except KubeError as exc:  # a CRD not installed, RBAC not bound: one line, the pod's termination message
        logging.getLogger("peering.consumer").error("%s; exiting", exc)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
