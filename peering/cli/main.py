"""``gpuferry``: the command line. Every error a user can cause is one line and a non-zero exit.

Commands: ``install``/``uninstall``, ``peer``/``unpeer``, ``offload``/``unoffload namespace``,
``info``, ``agents``, ``version`` and ``install crds``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as dist_version
from typing import Any, NoReturn

from kube import goyaml
from kube.clients import KubeClient
from kube.errors import KubeError, NetworkError, ResourceNotServed
from kube.kubeconfigs import ConfigError
from peering.crds import ensure_crds, installed, load_crds
from peering.flow import PeeringError

from . import agents_cmd, info_cmd, install_cmds, network_cmds, offload_cmds, peering_cmds, tenant_cmds
from .common import Progress, UserError, add_output_argument, console, described, fold_table

EXIT_USER_ERROR = 1
EXIT_INTERRUPTED = 130


def client_version() -> str:
    try:
        return dist_version("gpuferry")
    except PackageNotFoundError:
        return "unknown (not installed)"


def _emit(data: dict[str, Any], output: str, table: list[tuple[str, str]]) -> None:
    if output == "json":
        print(json.dumps(data, indent=2, sort_keys=True))
    elif output == "yaml":
        print(goyaml.dump(data), end="")
    else:
        t = fold_table(["", ""], show_header=False, box=None)
        for key, value in table:
            t.add_row(f"[bold]{key}[/]", value)
        console().print(t)


async def cmd_version(args: argparse.Namespace) -> int:
    data: dict[str, Any] = {"clientVersion": client_version()}
    rows = [("client", data["clientVersion"])]
    if args.kubeconfig or args.context:
        async with KubeClient.from_config(args.kubeconfig, context=args.context) as client:
            server = await client.server_version()
            state = await installed(client, load_crds())
        data["server"] = client.base_url
        data["serverVersion"] = server.get("gitVersion")
        data["crds"] = {
            "installed": sorted(n for n, ok in state.items() if ok),
            "missing": sorted(n for n, ok in state.items() if not ok),
        }
        rows += [
            ("server", f"{client.base_url} (Kubernetes {data['serverVersion']})"),
            (
                "CRDs",
                f"{len(data['crds']['installed'])}/{len(state)} installed"
                + (f"; missing: {', '.join(data['crds']['missing'])}" if data["crds"]["missing"] else ""),
            ),
        ]
    _emit(data, args.output, rows)
    return 0


async def cmd_install_crds(args: argparse.Namespace) -> int:
    progress = Progress(args.quiet)  # each CRD on stderr; the summary on stdout
    async with KubeClient.from_config(args.kubeconfig, context=args.context) as client:
        ensured = await ensure_crds(client, timeout=args.timeout, progress=progress.note, warn=progress.warn)
    print(f"{ensured.summary('gpuferry CRDs installed')} in {time.monotonic() - progress.start:.1f}s")
    return 0


async def cmd_install(args: argparse.Namespace) -> int:
    if not args.role:
        raise UserError("gpuferry install needs --role provider, consumer or both")
    return await install_cmds.cmd_install(args)


class OneLineParser(argparse.ArgumentParser):
    """Bad flags are one ``error:`` line naming the command (the usage is for ``--help``); the
    subcommands' parsers are of this class too (``add_subparsers`` makes them like their parent)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {self.prog}: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="gpuferry",
        **described(
            """Lend GPUs across Kubernetes clusters: a provider grants a consumer a slice of its
            GPUs, which the consumer sees as a virtual node. Pods of an offloaded namespace that
            the consumer's scheduler places there run as twins on the provider; their status, logs
            and exec come back. `gpuferry COMMAND --help` says more of each command.""",
            "gpuferry install --kubeconfig provider.yaml --role provider",
            "gpuferry install --kubeconfig consumer.yaml --role consumer",
            "gpuferry peer --kubeconfig consumer.yaml --remote-kubeconfig provider.yaml --gpus 4",
            "gpuferry offload namespace ml-team --kubeconfig consumer.yaml",
            "gpuferry info --kubeconfig consumer.yaml",
            "gpuferry unoffload namespace ml-team --kubeconfig consumer.yaml",
            "gpuferry unpeer --kubeconfig consumer.yaml --remote-kubeconfig provider.yaml",
        ),
    )
    common = OneLineParser(add_help=False)
    common.add_argument(
        "--kubeconfig",
        help="kubeconfig of the cluster to act on (default: $KUBECONFIG, in-cluster, ~/.kube/config)",
    )
    common.add_argument("--context", help="kubeconfig context (default: its current context)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    ver = sub.add_parser(
        "version",
        parents=[common],
        help="client version; with a cluster, its version and whether gpuferry's CRDs are installed",
        **described(
            """gpuferry's own version. Given a cluster (--kubeconfig or --context), also its API
            server, its Kubernetes version, and which of gpuferry's CRDs it serves.""",
            "gpuferry version",
            "gpuferry version --kubeconfig consumer.yaml -o json",
        ),
    )
    add_output_argument(ver)
    ver.set_defaults(handler=cmd_version)

    install = sub.add_parser(
        "install",
        parents=[common],
        help="install gpuferry in a cluster with its Helm chart (`install crds`: only the CRDs)",
        **described(
            """Install gpuferry's controllers in the cluster with its Helm chart (helm upgrade
            --install), then wait until they are available. A provider lends GPUs, a consumer
            borrows them through virtual nodes; a cluster may be both. Running it again upgrades
            the release: what the flags, -f and --set give now, over what the last install set
            (its values are kept; --reset-values starts from the chart's defaults instead).
            `gpuferry install crds` applies only the CRDs.""",
            "gpuferry install --kubeconfig provider.yaml --role provider",
            "gpuferry install --kubeconfig consumer.yaml --role consumer",
            "gpuferry install --kubeconfig consumer.yaml crds",
        ),
    )
    install_cmds.add_install_arguments(install)
    install.set_defaults(handler=cmd_install)
    install_sub = install.add_subparsers(dest="what", required=False, metavar="[crds]")
    # the same flags after `crds` as before it (gpuferry install --kubeconfig X crds): the
    # subcommand's own defaults must not overwrite what `install` already read
    sub_common = OneLineParser(add_help=False)
    sub_common.add_argument("--kubeconfig", default=argparse.SUPPRESS, help="as for install")
    sub_common.add_argument("--context", default=argparse.SUPPRESS, help="as for install")
    crds = install_sub.add_parser(
        "crds",
        parents=[sub_common],
        help="apply the CRDs (idempotent), wait until they are served",
        **described(
            """Apply gpuferry's CRDs (created, or updated to this version's) and wait until the API
            server serves them; nothing else is installed. For clusters whose controllers are run
            elsewhere (`gpuferry peer --agents local`), or to update the CRDs before the chart. A
            CRD the cluster has at a newer schema revision (annotation gpuferry.io/schema-revision)
            stays as it is, with a warning: an older gpuferry never puts its older schema back.""",
            "gpuferry install --kubeconfig consumer.yaml crds",
        ),
    )
    crds.add_argument("--timeout", type=float, default=60.0, help="seconds to wait (default: 60)")
    crds.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    crds.set_defaults(handler=cmd_install_crds)
    install_cmds.add_uninstall_parser(sub, common)
    peering_cmds.add_parsers(sub, common)
    offload_cmds.add_parsers(sub, common)
    info_cmd.add_parser(sub, common)
    network_cmds.add_parser(sub, common)
    tenant_cmds.add_parser(sub, common)
    agents_cmd.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(asyncio.run(args.handler(args)))
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.code
    except PeeringError as exc:
        print(f"error: {exc}", file=sys.stderr)
    except ConfigError as exc:
        print(f"error: kubeconfig: {exc}", file=sys.stderr)
    except NetworkError as exc:
        print(f"error: cannot reach the API server: {exc}", file=sys.stderr)
    except ResourceNotServed as exc:
        # a cluster without gpuferry's CRDs (never installed, or uninstalled with --crds)
        said = str(exc.args[0]) if exc.args else str(exc)  # no "404 NotFound:" before what it means
        ours = ".gpuferry.io" in said
        hint = " (`gpuferry install crds --kubeconfig KUBECONFIG` installs gpuferry's)" if ours else ""
        print(f"error: {said}{hint}", file=sys.stderr)
    except KubeError as exc:
        print(f"error: {exc}", file=sys.stderr)
    except (TimeoutError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    return EXIT_USER_ERROR


if __name__ == "__main__":
    sys.exit(main())
