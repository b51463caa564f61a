"""The network fabric's part of ``peer`` and ``unpeer``, and ``gpuferry network status``.

``peer`` reads both clusters' network declarations first (so that a missing or wrong one stops it
before anything is changed), and once the virtual node is Ready:

1. starts the gateway of each side (embedded mode: ``python -m netfabric gateway`` as a local
   agent in the network namespace the declaration names);
2. waits for each gateway's key Secret to carry its public key;
3. applies the two PeerNetworks, each describing the other cluster (CIDRs, the other gateway's
   public key; the consumer's also names the provider's endpoint: the consumer dials);
4. waits until both report ``NetworkReady`` (a WireGuard handshake) and shows the remaps.

Later key rotations are carried across by the consumer agent (:mod:`peering.consumer.keys`).
``unpeer`` deletes the PeerNetworks: each gateway removes its interface, routes and nft table,
deletes its key and exits; an embedded gateway that does not is stopped, and its leftovers
removed with ``python -m netfabric down``, which fails when anything is left.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kube.clients import KubeClient
from kube.errors import NotFound
from kube.objects import CONFIGMAPS, PEERNETWORKS, SECRETS, RawObject
from kube.objects import annotations as annotations_of

from .. import flow
from ..localagents import Agent, all_agents, ensure_agent, exited, find_agent, stop_agent
from ..network import (
    DECLARATION_NAME,
    DECLARATION_NAMESPACE,
    FAILED_REASONS,
    PUBLIC_KEY_ANNOTATION,
    Declaration,
    DeclarationError,
    GatewayPlacement,
    declaration_from_configmap,
    free_slot,
    gateway_args,
    key_secret_name,
    netns_of,
    network_ready,
    peer_network,
    slot_of,
)
from ..resources import tenant_namespace
from ..waits import PeeringError, wait_gone, wait_until
from .common import Progress, UserError, emit

__all__ = ["add_parser", "network_down", "network_rows", "network_up", "read_declarations"]


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


def _placement(
    cluster_id: str, peer_id: str, namespace: str, d: Declaration, *, listens: bool
) -> GatewayPlacement:
    """Where the embedded gateway goes: its recorded slot, or the lowest free one in its netns."""
    name = f"{cluster_id}-{peer_id}"
    recorded = find_agent("gateway", name)
    slot = slot_of(recorded.args) if recorded is not None else None
    if slot is None:
        used = {
            s
            for a in all_agents()
            if a.role == "gateway" and a.cluster_id != name and a.pid() is not None
            and netns_of(a.args) == d.gateway_netns and (s := slot_of(a.args)) is not None
        }  # fmt: skip
        try:
            slot = free_slot(used)
        except DeclarationError as e:
            raise UserError(str(e)) from None
    return GatewayPlacement(cluster_id, peer_id, slot, namespace, d, listens)


async def _public_key(
    client: KubeClient, namespace: str, peer_id: str, timeout: float, side: str, agent: Agent | None
) -> str:
    """The gateway's public key once it published it; fails at once if its local process died."""

    def published(secret: RawObject) -> str | None:
        return "" if annotations_of(secret).get(PUBLIC_KEY_ANNOTATION) else None

    what = f"the {side} gateway's key (Secret {namespace}/{key_secret_name(peer_id)})"
    waiting = asyncio.ensure_future(
        wait_until(client, SECRETS, key_secret_name(peer_id), namespace, published, timeout, what)
    )
    died = asyncio.ensure_future(exited(agent) if agent else asyncio.sleep(timeout + 1))
    try:
        await asyncio.wait({waiting, died}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (waiting, died):
            task.cancel()
    if waiting.done() and not waiting.cancelled():
        try:
            secret = waiting.result()
        except PeeringError as e:
            raise PeeringError(f"{e} (is the {side}'s gateway running? see `gpuferry agents`)") from None
        return annotations_of(secret)[PUBLIC_KEY_ANNOTATION]
    assert agent is not None
    raise PeeringError(f"the {side}'s gateway exited; the end of its log ({agent.log}):\n{_tail(agent.log)}")


def _tail(path: Path, lines: int = 8) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as e:
        return f"(unreadable: {e})"


async def network_up(
    consumer: KubeClient,
    provider: KubeClient,
    *,
    consumer_id: str,
    provider_id: str,
    declarations: tuple[Declaration, Declaration],
    args: argparse.Namespace,
    progress: Progress,
) -> dict[str, Any]:
    """Bring the fabric up for this peering (idempotent); returns what ``peer`` reports of it."""
    mine, theirs = declarations
    c_ns, p_ns = flow.CONSUMER_NAMESPACE, tenant_namespace(consumer_id)
    port = theirs.endpoint_port  # the gateways run in the clusters (--agents none): as declared
    agents: dict[str, Agent | None] = {"consumer": None, "provider": None}
    if args.agents == "local":  # embedded gateways: a slot each in their namespace
        c_gw = _placement(consumer_id, provider_id, c_ns, mine, listens=False)
        p_gw = _placement(provider_id, consumer_id, p_ns, theirs, listens=True)
        port = p_gw.port
        sides = (("consumer", c_gw, args.kubeconfig), ("provider", p_gw, args.remote_kubeconfig))
        for side, placement, path in sides:
            name = f"{placement.cluster_id}-{placement.peer_id}"
            agent, started = ensure_agent("gateway", name, path, args=tuple(gateway_args(placement)))
            agents[side] = agent
            progress.note(
                f"{placement.cluster_id}: gateway towards {placement.peer_id} "
                f"{'started' if started else 'running'} in netns {placement.declaration.gateway_netns} "
                f"(log: {agent.log})"
            )
    c_key = await _public_key(consumer, c_ns, provider_id, args.timeout, "consumer", agents["consumer"])
    p_key = await _public_key(provider, p_ns, consumer_id, args.timeout, "provider", agents["provider"])
    endpoint = (str(theirs.endpoint_address), port)
    objects = (
        (consumer, peer_network(name=provider_id, namespace=c_ns, peer_id=provider_id, peer=theirs,
                                public_key=p_key, endpoint=endpoint, mtu=mine.mtu)),
        (provider, peer_network(name=consumer_id, namespace=p_ns, peer_id=consumer_id, peer=mine,
                                public_key=c_key, endpoint=None, mtu=theirs.mtu)),
    )  # fmt: skip
    failed: list[str] = []

    def applied(obj: RawObject) -> str | None:
        """The gateway has taken this spec (whatever it made of it)."""
        generation = obj["metadata"].get("generation")
        return "" if (obj.get("status") or {}).get("observedGeneration") == generation else None

    # the server side first: a client's first handshake that finds no server configured for it
    # is only retried after WireGuard's rekey timeout (5 s)
    for client, body in reversed(objects):
        name, namespace = body["metadata"]["name"], body["metadata"]["namespace"]
        obj = await client.patch(PEERNETWORKS, name, body, namespace, patch_type="apply",
                                 field_manager="gpuferry-cli", force=True)  # fmt: skip
        if client is provider and applied(obj) is None:
            await wait_until(client, PEERNETWORKS, name, namespace, applied, args.timeout,
                             f"the provider's gateway to take PeerNetwork {namespace}/{name}")  # fmt: skip
    progress.step(f"PeerNetworks applied; the consumer's gateway dials {endpoint[0]}:{endpoint[1]}")

    def ready(obj: RawObject) -> str | None:
        ok, reason, message = network_ready(obj)
        generation = obj["metadata"].get("generation")
        if (obj.get("status") or {}).get("observedGeneration", generation) != generation:
            return None  # about an older spec
        if ok:
            return ""
        if reason in FAILED_REASONS:  # waiting does not help: say so now
            where = f"{obj['metadata']['namespace']}/{obj['metadata']['name']}"
            failed.append(f"the gateway for {where} reports {reason}: {message} "
                          "(the peering itself stays; fix it and run peer again, or unpeer)")  # fmt: skip
            return failed[-1]
        return None

    out: dict[str, Any] = {"endpoint": f"{endpoint[0]}:{endpoint[1]}"}
    for side, client, body in (("consumer", consumer, objects[0][1]), ("provider", provider, objects[1][1])):
        name, namespace = body["metadata"]["name"], body["metadata"]["namespace"]
        try:
            obj = await wait_until(client, PEERNETWORKS, name, namespace, ready, args.timeout,
                                   f"the {side}'s PeerNetwork {namespace}/{name}")  # fmt: skip
        except PeeringError:
            if failed:
                raise
            with contextlib.suppress(NotFound):
                obj = await client.get(PEERNETWORKS, name, namespace)
                raise PeeringError(
                    f"the network is not up on the {side}'s side after {args.timeout:.0f}s: "
                    f"{': '.join(network_ready(obj)[1:])} (the peering itself stays; "
                    "see `gpuferry network status`)"
                ) from None
            raise
        status = obj.get("status") or {}
        out[side] = {
            "peer": body["spec"]["clusterID"],
            "remappedPodCIDRs": status.get("remappedPodCIDRs"),
            "remappedServiceCIDRs": status.get("remappedServiceCIDRs"),
            "backend": status.get("backend"),
        }
        views = ", ".join(status.get("remappedPodCIDRs") or [])
        progress.step(
            f"{side}: tunnel to {body['spec']['clusterID']} up ({status.get('backend')} WireGuard); its pods "
            f"{', '.join(body['spec']['podCIDRs'])} are {views} here"
        )
    return out


async def network_down(
    consumer: KubeClient,
    provider: KubeClient,
    *,
    consumer_id: str,
    provider_id: str,
    timeout: float,
    progress: Progress,
) -> tuple[list[str], list[str]]:
    """Remove the fabric of this peering: what was removed (for ``unpeer``'s report) and what
    could not be (``unpeer`` goes on with the rest, then fails naming it)."""
    removed: list[str] = []
    problems: list[str] = []
    sides = (
        ("consumer", consumer, flow.CONSUMER_NAMESPACE, provider_id, consumer_id),
        ("provider", provider, tenant_namespace(consumer_id), consumer_id, provider_id),
    )
    deleted: set[str] = set()
    for side, client, namespace, name, _ in sides:
        with contextlib.suppress(NotFound):
            await client.delete(PEERNETWORKS, name, namespace)
            removed.append(f"{side}: PeerNetwork {namespace}/{name}")
            deleted.add(side)
    for side, client, namespace, name, cluster_id in sides:
        agent = find_agent("gateway", f"{cluster_id}-{name}")
        if agent is not None:
            # a gateway tears down and exits once its PeerNetwork goes; one that never had one
            # (peer stopped before) has nothing to tear down and waits forever: stop it at once
            if left := await _end_gateway(agent, timeout if side in deleted else 0):
                problems.append(f"{side}: the gateway towards {name} left things behind: {left}")
            else:
                removed.append(f"{side}: gateway towards {name}")
        with contextlib.suppress(NotFound):  # a gateway removes its key; one that never ran cannot
            await client.delete(SECRETS, key_secret_name(name), namespace)
        with contextlib.suppress(NotFound, PeeringError):
            await wait_gone(client, SECRETS, key_secret_name(name), namespace, timeout=timeout)
            removed.append(f"{side}: key Secret {namespace}/{key_secret_name(name)}")
    if removed and not problems:
        progress.step("network fabric removed (tunnels, routes, nft tables, keys)")
    return removed, problems


async def _end_gateway(agent: Agent, timeout: float) -> str:
    """Let the gateway finish its teardown (it exits once its PeerNetwork is gone), stop it if it
    does not, then check with ``python -m netfabric down`` that nothing of it is left; returns
    what is ("" when nothing)."""
    if timeout > 0:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(exited(agent), timeout)
    await asyncio.to_thread(stop_agent, agent)
    sweep = [a for a in agent.args if a != "gateway"]
    keep = {"--netns", "--iface", "--fwmark", "--route-table", "--peer-network"}
    argv = [sys.executable, "-m", "netfabric", "down"]
    for flag, value in itertools.pairwise(sweep):
        if flag in keep:
            argv += [flag, value]
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    out, _ = await proc.communicate()
    return out.decode().strip() if proc.returncode else ""


def _age(timestamp: str | None) -> str | None:
    if not timestamp:
        return None
    seen = datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
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
    from rich.table import Table

    if not rows:
        console.print("network: no peer networks (peered with --no-network, or not peered)")
        return
    t = Table(title="network fabric (WireGuard tunnels)")
    for col in ("peer", "ready", "endpoint", "handshake", "bytes in/out"):
        t.add_column(col, overflow="fold")
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
    )
    status.add_argument("-o", "--output", choices=["table", "json", "yaml"], default="table")
    status.set_defaults(handler=cmd_network_status)
