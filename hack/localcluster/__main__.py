"""python -m hack.localcluster {up,down,status,env,values,restart} — local clusters for the demo and tests."""

from __future__ import annotations

import argparse
import json
import sys
import time

from kube import goyaml

from ..images import BuildError
from .binaries import Binaries, BinariesMissing, ensure_built
from .cluster import COMPONENTS, KubectlFailed, LocalCluster, build_node_images
from .network import NetworkFailed, api_advertise_address
from .processes import ComponentFailed, PortBusy
from .realnode import NODE_COMPONENTS, NodeFailed
from .spec import PROFILE_PORT_BASES, cluster_specs


def _clusters(args: argparse.Namespace, *, build: bool) -> list[LocalCluster]:
    # only 'up' needs every binary; stopping or inspecting works with whatever is there
    binaries = ensure_built() if build else Binaries.locate()
    specs = cluster_specs(args.profile)
    names = list(specs) if args.cluster == "all" else [args.cluster]
    return [LocalCluster(specs[n], binaries) for n in names]


def _progress(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def cmd_up(args: argparse.Namespace) -> int:
    start = time.monotonic()
    clusters = _clusters(args, build=True)
    # the real nodes' images once for every cluster (cached by the hash of their inputs)
    images = (
        build_node_images(clusters[0].bin, progress=_progress)
        if any(c.has_real_node for c in clusters)
        else {}
    )
    for cluster in clusters:
        cluster.up(progress=_progress, images=images)
    _progress(f"clusters up in {time.monotonic() - start:.1f}s")
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    for cluster in _clusters(args, build=False):
        stopped = cluster.down(keep_state=args.keep_state)
        what = ", ".join(stopped) if stopped else "nothing was running"
        _progress(f"{cluster.spec.name}: stopped {what}" + ("" if args.keep_state else "; state removed"))
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    rows = []
    unhealthy = False
    for cluster in _clusters(args, build=False):
        for st in cluster.status():
            rows.append(
                {
                    "cluster": cluster.spec.name,
                    "component": st.name,
                    "running": st.running,
                    "pid": st.pid,
                    "log": str(st.log),
                }
            )
        for failure in cluster.crashed():
            unhealthy = True
            print(f"{cluster.spec.name}: {failure}", file=sys.stderr)
    if args.output == "json":
        print(json.dumps(rows, indent=2))
    else:
        from rich.console import Console
        from rich.table import Table

        table = Table("cluster", "component", "state", "pid", "log")
        for r in rows:
            state = "[green]running[/]" if r["running"] else "[red]stopped[/]"
            table.add_row(str(r["cluster"]), str(r["component"]), state, str(r["pid"] or "-"), str(r["log"]))
        Console().print(table)
    return 1 if unhealthy else 0


def cmd_env(args: argparse.Namespace) -> int:
    for cluster in _clusters(args, build=False):
        prefix = f"GPUFERRY_{cluster.spec.name.upper()}"
        print(f"export {prefix}_KUBECONFIG={cluster.spec.kubeconfig}")
        # where pods (gpuferry installed in the other cluster) reach this cluster's API server
        print(f"export {prefix}_SERVER=https://{api_advertise_address(cluster.spec)}:{cluster.spec.ports.apiserver}")
    return 0


def cmd_values(args: argparse.Namespace) -> int:
    """Helm values for gpuferry's chart on the cluster's real node (``gpuferry install -f``)."""
    (cluster,) = _clusters(args, build=False)
    values = cluster.chart_values()
    if not values:
        print(f"error: {cluster.spec.name} has no real node with the gpuferry image: run up as root",
              file=sys.stderr)  # fmt: skip
        return 1
    print(goyaml.dump(values, sort_keys=False), end="")
    return 0


def cmd_restart(args: argparse.Namespace) -> int:
    for cluster in _clusters(args, build=True):
        cluster.restart(args.component)
        _progress(f"{cluster.spec.name}: {args.component} restarted")
    return 0


# what a user can act on: one ``error:`` line (with a log tail where one helps), never a traceback
FAILURES = (ComponentFailed, PortBusy, BinariesMissing, NodeFailed, BuildError, NetworkFailed, KubectlFailed)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m hack.localcluster",
        description="Real local Kubernetes clusters (etcd, kube-apiserver, kube-controller-manager, "
        "kube-scheduler, kwok for simulated nodes) built from source by hack/build-k8s.sh, each with one "
        "real node (containerd, kubelet, kube-proxy; CoreDNS and metrics-server on it) when run as root.",
    )
    parser.add_argument(
        "--profile",
        default="demo",
        choices=sorted(PROFILE_PORT_BASES),
        help="port range and run folder: 'demo' for people, 'test' for the test suite (default: demo)",
    )
    parser.add_argument(
        "--cluster",
        default="all",
        choices=["all", "consumer", "provider"],
        help="which cluster to act on (default: both)",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("up", help="build what is missing, start what is not running, create the nodes")
    down = sub.add_parser("down", help="stop every process and remove the clusters' state")
    down.add_argument("--keep-state", action="store_true", help="keep etcd data, certificates and logs")
    status = sub.add_parser("status", help="which components run; exits 1 when one has crashed")
    status.add_argument("-o", "--output", choices=["table", "json"], default="table")
    sub.add_parser("env", help="print export lines with each cluster's admin kubeconfig and API server")
    sub.add_parser("values", help="helm values for gpuferry's chart on one cluster's real node (--cluster)")
    restart = sub.add_parser("restart", help="restart one component")
    restart.add_argument("component", choices=COMPONENTS + NODE_COMPONENTS)
    args = parser.parse_args(argv)
    handlers = {"up": cmd_up, "down": cmd_down, "status": cmd_status, "env": cmd_env, "restart": cmd_restart,
                "values": cmd_values}  # fmt: skip
    try:
        return handlers[args.command](args)
    except FAILURES as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted; run 'down' to stop what was started", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
