"""python -m netfabric gateway|agent: the fabric's processes. Flags are read once here.

    python -m netfabric gateway --peer-network NS/NAME --pod-cidr 10.244.0.0/16 \\
        --service-cidr 10.96.0.0/16 --gateway-ip $POD_IP [--listen-port 51820] [--netns NAME]
    python -m netfabric agent --next-hop 10.244.2.5 [--dev veth123] [--namespace NS]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import sys
from ipaddress import IPv4Address, IPv4Network
from pathlib import Path

from kube.clients import KubeClient
from kube.errors import KubeError
from kube.logs import setup_logging
from kube.objects import ObjectKey
from kube.settings import ClientSettings, LoggingSettings
from netfabric.agent import AgentSettings
from netfabric.app import run_agent, run_gateway
from netfabric.gateway import GatewaySettings, gateway_down, leftovers
from netfabric.ipam import DEFAULT_POOL
from netfabric.model import ClusterNetwork, NetworkConfigError
from netfabric.nat import DEFAULT_FWMARK, table_name_for
from netfabric.wireguard import BackendKind


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m netfabric", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kubeconfig", type=Path, help="kubeconfig (default: $KUBECONFIG or in-cluster)")
    sub = p.add_subparsers(dest="command", required=True)
    g = sub.add_parser("gateway", help="the WireGuard gateway towards one peer")
    g.add_argument("--peer-network", required=True, metavar="NAMESPACE/NAME")
    g.add_argument("--pod-cidr", action="append", required=True, help="local pod CIDR (repeatable)")
    g.add_argument("--service-cidr", action="append", default=[], help="local service CIDR (repeatable)")
    g.add_argument("--gateway-ip", type=IPv4Address, required=True, help="this pod's IP (SNAT source)")
    g.add_argument("--iface", default="gpuferry0", help="tunnel interface name")
    g.add_argument("--listen-port", type=int, help="UDP port (server side: behind the NodePort/LB)")
    g.add_argument("--mtu", type=int, help="tunnel MTU (default: the PeerNetwork's spec.mtu)")
    g.add_argument("--pool", type=IPv4Network, default=DEFAULT_POOL, help="remap pool")
    g.add_argument("--backend", choices=[k.value for k in BackendKind], help="default: detect")
    g.add_argument("--key-secret", default="gpuferry-gateway-key",
                   help="Secret (in the PeerNetwork's namespace) holding the private key; made when absent")
    g.add_argument("--netns", help="network namespace to work in (default: this process's own)")
    g.add_argument("--fwmark", type=lambda v: int(v, 0), default=DEFAULT_FWMARK,
                   help="mark of tunnel connections, inside 0x00ff0000 (one per gateway sharing a namespace)")
    g.add_argument("--route-table", type=int, default=4700,
                   help="policy routing table and rule priority (one per gateway sharing a namespace)")
    g.add_argument("--status-interval", type=float, default=10.0)
    d = sub.add_parser(
        "down", help="remove a gateway's interface, rule, routes and nft table; exit 1 if any is left"
    )
    d.add_argument("--peer-network", required=True, metavar="NAMESPACE/NAME",
                   help="its PeerNetwork (NAME is the peer's cluster ID)")
    d.add_argument("--iface", required=True)
    d.add_argument("--netns")
    d.add_argument("--fwmark", type=lambda v: int(v, 0), default=DEFAULT_FWMARK)
    d.add_argument("--route-table", type=int, default=4700)
    a = sub.add_parser("agent", help="route peers' remapped CIDRs to the gateway on this node")
    a.add_argument("--next-hop", type=IPv4Address, required=True,
                   help="the gateway's pod IP (its node) or its node's IP (other nodes)")
    a.add_argument("--dev", help="interface towards the next hop")
    a.add_argument("--namespace", help="only PeerNetworks of this namespace")
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


async def _main(args: argparse.Namespace) -> None:
    async with KubeClient.from_config(args.kubeconfig, settings=ClientSettings.from_env()) as client:
        if args.command == "gateway":
            key = ObjectKey.parse(args.peer_network)
            local = ClusterNetwork.from_strings(args.pod_cidr, args.service_cidr)
            settings = GatewaySettings(
                iface=args.iface,
                gateway_ip=args.gateway_ip,
                listen_port=args.listen_port,
                mtu=args.mtu,
                pool=args.pool,
                backend=BackendKind(args.backend) if args.backend else None,
                netns=args.netns,
                fwmark=args.fwmark,
                route_table=args.route_table,
                rule_priority=args.route_table,
            )
            await run_gateway(client, key, local=local, settings=settings, key_secret=args.key_secret,
                              status_interval=args.status_interval)
        else:
            await run_agent(client, settings=AgentSettings(next_hop=args.next_hop, dev=args.dev),
                            namespace=args.namespace)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    setup_logging(LoggingSettings.from_env())
    try:
        if args.command == "gateway" and args.netns and not Path("/run/netns", args.netns).exists():
            # pyroute2 would make it: a gateway in an empty namespace of its own, reaching nothing
            raise NetworkConfigError(f"network namespace {args.netns} does not exist", "--netns")
        if args.command == "down":
            if args.netns and not Path("/run/netns", args.netns).exists():
                print(f"network namespace {args.netns} does not exist: nothing of the gateway can be left")
                return 0
            return asyncio.run(_down(args))
        asyncio.run(_main(args))
    except (NetworkConfigError, KubeError) as e:
        logging.getLogger("netfabric").error("%s", e)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
