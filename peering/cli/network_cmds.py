"""The network fabric's part of ``peer`` (its declarations, checked before any change) and
``gpuferry network status``.

The fabric itself is brought up by controllers: the consumer agent writes this cluster's network
into the Tenant and the provider's into the PeerNetwork here (:mod:`peering.consumer.foreignclusters`),
the provider controller the consumer's into the PeerNetwork there (:mod:`peering.provider.networks`),
and each cluster's gateways (``python -m netfabric gateways``) reconcile their PeerNetworks.
"""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from typing import Any

from kube.clients import KubeClient
from kube.errors import NotFound
from kube.objects import CONFIGMAPS, PEERNETWORKS, RawObject
from kube.times import parse_time

from ..network import (
    DECLARATION_NAME,
    DECLARATION_NAMESPACE,
    Declaration,
    DeclarationError,
    declaration_from_configmap,
    network_ready,
)
from .common import UserError, add_output_argument, described, emit, fold_table

__all__ = ["add_parser", "network_rows", "read_declarations"]


async def _declaration(client: KubeClient, side: str) -> Declaration:
    try:
        cm: RawObject | None = await client.get(CONFIGMAPS, DECLARATION_NAME, DECLARATION_NAMESPACE)
    except NotFound:
        cm = None
    try:
        return declaration_from_configmap(cm, side=side)
    except DeclarationError as e:
        raise UserError(str(e)) from None


async def read_declarations(
    consumer: KubeClient, provider: KubeClient, *, embedded: bool
) -> tuple[Declaration, Declaration]:
    """Both clusters' declarations, checked for what this peering needs (before any change)."""
    mine, theirs = await _declaration(consumer, "consumer"), await _declaration(provider, "provider")
    if embedded:
        for side, d in (("consumer", mine), ("provider", theirs)):
            if not d.embedded:
                raise UserError(
                    f"the {side}'s network declaration names no gatewayNetns/gatewayIP, so no gateway "
                    "can run here for it: run gpuferry's gateway in the cluster (--agents none) or peer "
                    "with --no-network"
                )
    if theirs.endpoint_address is None:
        raise UserError(
            "the provider's network declaration has no endpointAddress: its gateway cannot be reached "
            "(declare the NodePort or LoadBalancer address), or peer with --no-network"
        )
    return mine, theirs


def _age(timestamp: str | None) -> str | None:
    if not timestamp:
        return None
    seen = parse_time(timestamp)
    return f"{max(0, int((datetime.now(UTC) - seen).total_seconds()))}s"


async def network_rows(client: KubeClient) -> list[dict[str, Any]]:
    """One row per PeerNetwork on this cluster: the tunnel to that peer as its gateway reports it."""
    try:
        items = (await client.list(PEERNETWORKS))["items"]
    except NotFound:  # CRDs not installed
        return []
    rows = []
    for obj in items:
        spec, status = obj.get("spec") or {}, obj.get("status") or {}
        ok, reason, message = network_ready(obj)
        endpoint = spec.get("endpoint") or {}
        rows.append({
            "peer": spec.get("clusterID"),
            "namespace": obj["metadata"]["namespace"],
            "ready": ok,
            "reason": reason,
            "message": message,
            "endpoint": f"{endpoint['address']}:{endpoint['port']}" if endpoint else None,
            "peerSeenFrom": status.get("peerEndpoint"),
            "latestHandshake": status.get("latestHandshake"),
            "handshakeAge": _age(status.get("latestHandshake")),
            "bytes": status.get("bytes") or {},
            "backend": status.get("backend"),
            "gatewayAddress": status.get("gatewayAddress"),
            "remaps": [
                {"peer": o, "here": v}
                for o, v in zip(
                    (spec.get("podCIDRs") or []) + (spec.get("serviceCIDRs") or []),
                    (status.get("remappedPodCIDRs") or []) + (status.get("remappedServiceCIDRs") or []),
                    strict=False,
                )
            ],
        })  # fmt: skip
    return rows


def render_rows(rows: list[dict[str, Any]], console: Any) -> None:

    if not rows:
        console.print("network: no peer networks (peered with --no-network, or not peered)")
        return
    t = fold_table(["peer", "ready", "endpoint", "handshake", "bytes in/out"],
                   title="network fabric (WireGuard tunnels)")  # fmt: skip
    for r in rows:
        t.add_row(
            str(r["peer"]),
            "yes" if r["ready"] else f"no ({r['reason']}: {r['message']})",
            r["endpoint"] or f"from {r['peerSeenFrom'] or '-'}",
            f"{r['handshakeAge']} ago" if r["handshakeAge"] else "never",
            f"{r['bytes'].get('received', '-')}/{r['bytes'].get('sent', '-')}",
        )
    console.print(t)
    for r in rows:  # one line each: the CIDRs are what people copy
        remaps = ", ".join(f"{m['peer']} → {m['here']}" for m in r["remaps"]) or "none yet"
        console.print(f"{r['peer']}'s CIDRs as seen here: {remaps}")


async def cmd_network_status(args: argparse.Namespace) -> int:
    async with KubeClient.from_config(args.kubeconfig, context=args.context) as client:
        rows = await network_rows(client)
    emit({"networks": rows}, args.output, lambda console: render_rows(rows, console))
    return 0


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    network = sub.add_parser("network", help="the network fabric: tunnels to peers, handshakes, remaps")
    network_sub = network.add_subparsers(dest="what", required=True, metavar="WHAT")
    status = network_sub.add_parser(
        "status",
        parents=[common],
        help="one line per peer: endpoint, handshake age, bytes, remapped CIDRs",
        **described(
            """One line per peer of this cluster's network fabric, from its PeerNetworks: whether
            the tunnel is ready (and why not), the peer's gateway endpoint, the age of the last
            WireGuard handshake and the bytes received and sent; then, per peer, the CIDRs its pod
            and service networks are seen as here (remapped where they overlap this cluster's).""",
            "gpuferry network status --kubeconfig consumer.yaml",
        ),
    )
    add_output_argument(status)
    status.set_defaults(handler=cmd_network_status)
