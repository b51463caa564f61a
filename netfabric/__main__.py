"""python -m netfabric gateways|agent|down: the fabric's processes. Flags are read once here.

    python -m netfabric gateways [--gateway-ip $POD_IP] [--netns NAME]   # every PeerNetwork's gateway
    python -m netfabric agent --next-hop 10.244.2.5 [--dev veth123] [--namespace NS]
    python -m netfabric agent --gateway-selector app.kubernetes.io/component=gateway \
        --gateway-namespace gpuferry-system --node-name $NODE_NAME       # the chart's DaemonSet
    python -m netfabric down --peer-network NS/NAME --iface gf... --fwmark ... --route-table ...

The gateways read the cluster's network (pod and service CIDRs, where they run and listen, the
tunnel MTU) from its declaration, the ConfigMap kube-system/gpuferry-network, and each peer from
its PeerNetwork.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import logging
import os
import sys
from ipaddress import IPv4Address, IPv4Network
from pathlib import Path

from kube.clients import KubeClient
from kube.declaration import (
    DECLARATION_NAME,
    DECLARATION_NAMESPACE,
    Declaration,
    DeclarationError,
    declaration_from_configmap,
)
from kube.entrypoints import add_runtime_arguments, probe_settings
from kube.errors import KubeError, NotFound
from kube.logs import setup_logging
from kube.manager import Manager
from kube.objects import CONFIGMAPS, ObjectKey
from kube.settings import ClientSettings, LoggingSettings
from netfabric.gateway import GatewaySettings, gateway_down, leftovers
from netfabric.gateways import Gateways, GatewaysSettings, LeftBehind
from netfabric.ipam import DEFAULT_POOL
from netfabric.model import NetworkConfigError
from netfabric.nat import DEFAULT_FWMARK, table_name_for
from netfabric.nsexec import SysctlReadOnly
from netfabric.routeagent import GatewayPods, RouteAgent, RouteAgentSettings
from netfabric.wireguard import BackendKind


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m netfabric", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--kubeconfig", type=Path, help="kubeconfig (default: $KUBECONFIG or in-cluster)")
    sub = p.add_subparsers(dest="command", required=True)
    g = sub.add_parser("gateways", help="one WireGuard gateway per PeerNetwork of this cluster")
    g.add_argument(
        "--gateway-ip",
        type=IPv4Address,
        help="the gateways' pod IP, the SNAT source (default: the declaration's gatewayIP)",
    )
    g.add_argument("--netns", help="network namespace to work in (default: the declaration's gatewayNetns, "
                                   "else this process's own, as in a gateway pod)")  # fmt: skip
    g.add_argument("--own-netns", action="store_true",
                   help="this process's own network namespace, whatever the declaration says "
                        "(a gateway pod)")  # fmt: skip
    g.add_argument("--namespace", help="only PeerNetworks of this namespace (default: all)")
    g.add_argument(
        "--peer-network",
        metavar="NAMESPACE/NAME",
        help="only the gateway of this PeerNetwork (one process per peer)",
    )
    g.add_argument("--pool", type=IPv4Network, default=DEFAULT_POOL, help="remap pool")
    g.add_argument("--backend", choices=[k.value for k in BackendKind], help="default: detect")
    g.add_argument("--status-interval", type=float, default=10.0)
    add_runtime_arguments(g)
    d = sub.add_parser(
        "down", help="remove a gateway's interface, rule, routes and nft table; exit 1 if any is left"
    )
    d.add_argument(
        "--peer-network",
        required=True,
        metavar="NAMESPACE/NAME",
        help="its PeerNetwork (NAME is the peer's cluster ID)",
    )
    d.add_argument("--iface", required=True)
    d.add_argument("--netns")
    d.add_argument("--fwmark", type=lambda v: int(v, 0), default=DEFAULT_FWMARK)
    d.add_argument("--route-table", type=int, default=4700)
    a = sub.add_parser("agent", help="route peers' remapped CIDRs to the gateway on this node")
    hop = a.add_mutually_exclusive_group(required=True)
    hop.add_argument(
        "--next-hop",
        type=IPv4Address,
        help="a fixed next hop: the gateway's pod IP (its node) or its node's IP (other nodes)",
    )
    hop.add_argument(
        "--gateway-selector",
        metavar="LABELS",
        help="follow the gateway pod with these labels: its IP on its node, its node's IP elsewhere",
    )
    a.add_argument("--gateway-namespace", default="gpuferry-system", help="the gateway pod's namespace")
    a.add_argument(
        "--node-name",
        default=os.environ.get("NODE_NAME"),
        help="this node (default: $NODE_NAME), to know whether the gateway pod runs here",
    )
    a.add_argument("--dev", help="interface towards the next hop")
    a.add_argument("--namespace", help="only PeerNetworks of this namespace")
    add_runtime_arguments(a)
    return p


async def _down(args: argparse.Namespace) -> int:
    """Remove what a gateway set up (it may have died before its PeerNetwork went); 1 if left."""
    settings = GatewaySettings(
        iface=args.iface, gateway_ip=IPv4Address("0.0.0.0"), netns=args.netns, fwmark=args.fwmark,
        route_table=args.route_table, rule_priority=args.route_table,
    )  # fmt: skip
    table = table_name_for(ObjectKey.parse(args.peer_network).name)
    with contextlib.suppress(ExceptionGroup):  # what it could not remove is listed below
        await gateway_down(settings, table_name=table)
    left = await leftovers(settings, table_name=table)
    for thing in left:
        print(f"left behind: {thing}")
    return 1 if left else 0


async def _declaration(client: KubeClient) -> Declaration:
    try:
        cm = await client.get(CONFIGMAPS, DECLARATION_NAME, DECLARATION_NAMESPACE)
    except NotFound:
        cm = None
    return declaration_from_configmap(cm, side="this cluster")


async def _main(args: argparse.Namespace) -> None:
    async with KubeClient.from_config(args.kubeconfig, settings=ClientSettings.from_env()) as client:
        if args.command == "gateways":
            declaration = await _declaration(client)
            if args.own_netns:  # where gateway processes on a machine run is not this pod's business
                declaration = dataclasses.replace(declaration, gateway_netns=None, gateway_ip=None)
            netns = args.netns or declaration.gateway_netns
            if netns and not os.path.exists(os.path.join("/run/netns", netns)):  # noqa: ASYNC240 (one stat at start)
                # pyroute2 would make it: gateways in an empty namespace of their own, reaching nothing
                raise NetworkConfigError(f"network namespace {netns} does not exist", "gatewayNetns")
            settings = GatewaysSettings(
                netns=args.netns, gateway_ip=args.gateway_ip, namespace=args.namespace, pool=args.pool,
                only=ObjectKey.parse(args.peer_network) if args.peer_network else None,
                backend=BackendKind(args.backend) if args.backend else None,
                status_interval=args.status_interval,
            )  # fmt: skip
            manager = Manager("gateways", probes_settings=probe_settings(args))
            gateways = Gateways(client, declaration, settings)
            manager.add_informer(gateways.informer)  # ready once it listed the PeerNetworks
            manager.add_task("gateways", lambda: gateways.serve(watch=False))
            with contextlib.suppress(asyncio.CancelledError):
                await manager.run()
        else:
            if args.gateway_selector and not args.node_name:
                raise NetworkConfigError("--gateway-selector needs --node-name (or $NODE_NAME)", "node-name")
            selector = args.gateway_selector
            pods = GatewayPods(args.gateway_namespace, selector) if selector else None
            agent = RouteAgent(client, RouteAgentSettings(
                node_name=args.node_name, next_hop=args.next_hop, dev=args.dev, namespace=args.namespace,
                gateway=pods,
            ))  # fmt: skip
            manager = Manager("route-agent", probes_settings=probe_settings(args))
            for informer in agent.informers:
                manager.add_informer(informer)
            manager.add_task("routes", agent.serve)
            with contextlib.suppress(asyncio.CancelledError):
                await manager.run()


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    setup_logging(LoggingSettings.from_env())
    try:
        if args.command == "down":
            if args.netns and not Path("/run/netns", args.netns).exists():
                print(f"network namespace {args.netns} does not exist: nothing of the gateway can be left")
                return 0
            return asyncio.run(_down(args))
        asyncio.run(_main(args))
    except (NetworkConfigError, DeclarationError, KubeError, LeftBehind, SysctlReadOnly) as e:
        logging.getLogger("netfabric").error("%s", e)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
