"""``gpuferry peer`` and ``gpuferry unpeer``: every step of a peering, in order, and back.

``peer`` holds both admin kubeconfigs (the platform engineer's) but hands neither to the other
side: the consumer's runtime identity on the provider is the certificate the provider issues
(see :mod:`peering.flow`), stored in a consumer Secret that the VirtualNode names.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from typing import Any

from kube.clients import KubeClient
from kube.errors import NotFound
from kube.objects import (
    FOREIGNCLUSTERS,
    MUTATINGADMISSIONPOLICIES,
    MUTATINGADMISSIONPOLICYBINDINGS,
    NAMESPACES,
    NODES,
    PODS,
    RawObject,
    Resource,
)
from kube.quantities import parse_quantity

from .. import flow
from ..clusterid import ClusterIDError, ensure_cluster_id, read_cluster_id
from ..crds import ensure_crds
from ..localagents import Agent, ensure_agent, stop_agent
from ..resources import TENANTS, tenant_namespace
from ..virtualnodes import VIRTUALNODES
from ..waits import wait_gone, wait_none
from .common import Progress, UserError, emit, kubeconfig_context_name, parse_pairs
from .network_cmds import network_down, network_up, read_declarations

__all__ = ["FOREIGNCLUSTERS", "add_parsers", "virtual_node_for"]

GPU = "nvidia.com/gpu"
EXIT_DENIED = 3


def node_name(provider_id: str) -> str:
    return f"gpuferry-{provider_id}"


def requested_resources(args: argparse.Namespace) -> dict[str, str]:
    """The slice to ask for: GPUs, and CPU, memory and pods to go with them (defaults scale with
    the GPUs: 8 CPUs and 64 GiB per GPU, 110 pods, as a typical GPU node has)."""
    if args.gpus is None or args.gpus < 1:
        raise UserError("say how many GPUs to ask for: --gpus N (N >= 1)")
    out = {GPU: str(args.gpus)}
    out["cpu"] = args.cpu or str(8 * args.gpus)
    out["memory"] = args.memory or f"{64 * args.gpus}Gi"
    out["pods"] = str(args.pods)
    for key, value in parse_pairs(args.resource, "--resource").items():
        out[key] = value
    for key, value in out.items():
        try:
            parse_quantity(value)
        except ValueError:
            raise UserError(f"{key}: {value!r} is not a Kubernetes quantity (e.g. 8, 500m, 64Gi)") from None
    return out


def virtual_node_for(
    *, provider_id: str, consumer_id: str, slice_obj: RawObject, selector: dict[str, str], secret: str
) -> RawObject:
    """The VirtualNode standing for a decided GPUSlice. Pure."""
    status = slice_obj.get("status") or {}
    return {
        "apiVersion": VIRTUALNODES.api_version,
        "kind": VIRTUALNODES.kind,
        "metadata": {"name": provider_id, "labels": {"gpuferry.io/provider": provider_id}},
        "spec": {
            "providerClusterID": provider_id,
            "consumerClusterID": consumer_id,
            "nodeName": node_name(provider_id),
            "tenantNamespace": tenant_namespace(consumer_id),
            "sliceName": slice_obj["metadata"]["name"],
            "providerNodeSelector": dict(selector),
            "labels": dict(status.get("labels") or {}),
            "resources": dict(status.get("granted") or {}),
            "shape": dict((status.get("shape") or {}).get("largest") or {}),
            "kubeconfigSecretRef": {"name": secret, "key": "kubeconfig"},
        },
    }


def foreign_cluster(cluster_id: str, role: str, server: str | None = None) -> RawObject:
    spec: dict[str, Any] = {"clusterID": cluster_id, "role": role}
    if server:
        spec["apiServerURL"] = server
    return {
        "apiVersion": FOREIGNCLUSTERS.api_version,
        "kind": FOREIGNCLUSTERS.kind,
        "metadata": {"name": cluster_id, "labels": {"app.kubernetes.io/managed-by": "gpuferry"}},
        "spec": spec,
    }


async def _apply(
    client: KubeClient, resource: Resource, body: RawObject, namespace: str | None = None
) -> None:
    await client.patch(
        resource,
        body["metadata"]["name"],
        body,
        namespace,
        patch_type="apply",
        field_manager="gpuferry-cli",
        force=True,
    )


async def _wait_node_ready(client: KubeClient, name: str, timeout: float) -> RawObject:
    from kube.watching import Listed, watch_objects

    async def watch() -> RawObject:
        async for item in watch_objects(client, NODES, field_selector=f"metadata.name={name}"):
            if isinstance(item, Listed) or item.type == "DELETED":
                continue
            ready = [
                c for c in item.object.get("status", {}).get("conditions", []) if c.get("type") == "Ready"
            ]
            if ready and ready[0].get("status") == "True":
                return item.object
        raise UserError("watching the virtual node ended")

    try:
        return await asyncio.wait_for(watch(), timeout)
    except TimeoutError:
        raise UserError(
            f"the virtual node {name} is not Ready after {timeout:.0f}s; see `gpuferry info` and the "
            "consumer agent's log (gpuferry agents)"
        ) from None


async def _ids(consumer: KubeClient, provider: KubeClient, args: argparse.Namespace) -> tuple[str, str]:
    try:
        consumer_id = await ensure_cluster_id(
            consumer,
            requested=args.cluster_id,
            fallback=kubeconfig_context_name(args.kubeconfig, args.context),
        )
        provider_id = await ensure_cluster_id(
            provider,
            requested=args.remote_cluster_id,
            fallback=kubeconfig_context_name(args.remote_kubeconfig, args.remote_context),
        )
    except ClusterIDError as exc:
        raise UserError(str(exc)) from None
    if consumer_id == provider_id:
        raise UserError(
            f"both kubeconfigs lead to clusters called {consumer_id!r}: a cluster cannot peer with "
            "itself (or give them distinct IDs with --cluster-id/--remote-cluster-id)"
        )
    return consumer_id, provider_id


async def cmd_peer(args: argparse.Namespace) -> int:
    resources = requested_resources(args)
    selector = parse_pairs(args.selector, "--selector")
    if not args.remote_kubeconfig:
        raise UserError("give the provider's kubeconfig: --remote-kubeconfig PATH")
    progress = Progress(args.quiet)
    async with (
        KubeClient.from_config(args.kubeconfig, context=args.context) as consumer,
        KubeClient.from_config(args.remote_kubeconfig, context=args.remote_context) as provider,
    ):
        if consumer.base_url == provider.base_url:
            raise UserError("--kubeconfig and --remote-kubeconfig lead to the same API server")
        declarations = None
        if not args.no_network:  # a missing or wrong declaration stops us before any change
            declarations = await read_declarations(consumer, provider, embedded=args.agents == "local")
        for side, client in (("consumer", consumer), ("provider", provider)):
            await ensure_crds(client)
            progress.step(f"{side}: gpuferry CRDs installed ({client.base_url})")
        consumer_id, provider_id = await _ids(consumer, provider, args)
        progress.step(f"cluster IDs: consumer {consumer_id}, provider {provider_id}")
        if args.agents == "local":
            for role, cid, path in (
                ("provider", provider_id, args.remote_kubeconfig),
                ("consumer", consumer_id, args.kubeconfig),
            ):
                if not path:
                    raise UserError(f"--agents local needs a kubeconfig file for the {role}")
                agent, started = ensure_agent(role, cid, path)
                progress.step(f"{role} agent {'started' if started else 'running'} (log: {agent.log})")
        identity = await flow.establish_tenant(
            consumer,
            provider,
            consumer_id=consumer_id,
            provider_id=provider_id,
            timeout=args.timeout,
            progress=progress.note,
        )
        progress.step(
            ("already authenticated as " if identity.already else "authenticated as ")
            + f"{identity.username} (certificate until {identity.not_after})"
        )
        async with await flow.issued_client(consumer, provider_id) as tenant:
            decided = await flow.request_slice(
                tenant,
                consumer_id=consumer_id,
                resources=resources,
                node_selector=selector,
                allow_partial=args.allow_partial,
                timeout=args.timeout,
            )
        status = decided.get("status") or {}
        if status.get("phase") == "Denied":
            raise UserError(
                f"the provider denied the GPU slice: {status.get('reason')}: {status.get('message')} "
                f"(the peering itself stays; ask for less, or run `gpuferry unpeer`)",
                EXIT_DENIED,
            )
        progress.step(f"slice {status.get('phase')}: {status.get('granted')}")
        await _apply(consumer, FOREIGNCLUSTERS, foreign_cluster(provider_id, "Provider", provider.base_url))
        await _apply(provider, FOREIGNCLUSTERS, foreign_cluster(consumer_id, "Consumer"))
        vn = virtual_node_for(
            provider_id=provider_id,
            consumer_id=consumer_id,
            slice_obj=decided,
            selector=selector,
            secret=identity.secret_name,
        )
        await _apply(consumer, VIRTUALNODES, vn, flow.CONSUMER_NAMESPACE)
        progress.step(f"VirtualNode {flow.CONSUMER_NAMESPACE}/{provider_id} applied")
        node = await _wait_node_ready(consumer, node_name(provider_id), args.timeout)
        progress.step(f"virtual node {node_name(provider_id)} Ready")
        network: dict[str, Any] | str = "disabled (--no-network)"
        if declarations is not None:
            network = await network_up(
                consumer, provider, consumer_id=consumer_id, provider_id=provider_id,
                declarations=declarations, args=args, progress=progress,
            )  # fmt: skip
    labels = node["metadata"].get("labels") or {}
    result = {
        "consumer": consumer_id,
        "provider": provider_id,
        "alreadyPeered": identity.already,
        "identity": {"username": identity.username, "notAfter": identity.not_after},
        "slice": {
            "phase": status.get("phase"),
            "requested": resources,
            "granted": status.get("granted"),
            "largestBlock": (status.get("shape") or {}).get("largest"),
            "reason": status.get("reason"),
        },
        "virtualNode": {
            "name": node_name(provider_id),
            "capacity": node["status"].get("capacity"),
            "gpuProduct": labels.get("nvidia.com/gpu.product"),
        },
        "network": network,
    }

    def table(console: Any) -> None:
        from rich.table import Table

        t = Table(title=f"{consumer_id} ⟶ {provider_id}", show_header=False, box=None)
        t.add_row("[bold]identity[/]", f"{identity.username} until {identity.not_after}")
        t.add_row("[bold]slice[/]", f"{status.get('phase')}: {status.get('granted')}")
        t.add_row("[bold]largest block[/]", str((status.get("shape") or {}).get("largest")))
        t.add_row(
            "[bold]virtual node[/]",
            f"{node_name(provider_id)} (GPU {labels.get('nvidia.com/gpu.product', '-')})",
        )
        if isinstance(network, dict):
            remaps = ", ".join(network["consumer"].get("remappedPodCIDRs") or [])
            t.add_row("[bold]network[/]", f"tunnel up to {network['endpoint']}; provider pods are {remaps}")
        else:
            t.add_row("[bold]network[/]", network)
        console.print(t)
        console.print(f"next: gpuferry offload namespace NAMESPACE --kubeconfig {args.kubeconfig or '…'}")

    emit(result, args.output, table)
    return 0


async def _evict_pods_on(consumer: KubeClient, node: str, progress: Progress, timeout: float) -> None:
    pods = (await consumer.list(PODS, field_selector=f"spec.nodeName={node}"))["items"]
    for pod in pods:
        with contextlib.suppress(NotFound):
            await consumer.delete(PODS, pod["metadata"]["name"], pod["metadata"]["namespace"])
    if pods:
        progress.note(f"deleting {len(pods)} pods on {node} (their twins go first)")
    await wait_none(
        consumer, PODS, None, field_selector=f"spec.nodeName={node}", timeout=timeout, what=f"pods on {node}"
    )


async def cmd_unpeer(args: argparse.Namespace) -> int:
    if not args.remote_kubeconfig:
        raise UserError("give the provider's kubeconfig: --remote-kubeconfig PATH")
    progress = Progress(args.quiet)
    async with (
        KubeClient.from_config(args.kubeconfig, context=args.context) as consumer,
        KubeClient.from_config(args.remote_kubeconfig, context=args.remote_context) as provider,
    ):
        consumer_id, provider_id = await read_cluster_id(consumer), await read_cluster_id(provider)
        if consumer_id is None or provider_id is None:
            raise UserError("these clusters were never peered by gpuferry (no cluster ID recorded)")
        node = node_name(provider_id)
        with contextlib.suppress(NotFound):
            await consumer.get(NODES, node)
            await _evict_pods_on(consumer, node, progress, args.timeout)
            progress.step(f"pods on {node} removed")
        try:
            await consumer.delete(VIRTUALNODES, provider_id, flow.CONSUMER_NAMESPACE)
            progress.step(f"VirtualNode {provider_id} deleted")
        except NotFound:
            pass
        # the virtual kubelet removes its node; without a running agent nobody would: do it here
        try:
            await wait_gone(consumer, NODES, node, None, timeout=30)
        except flow.PeeringError:
            with contextlib.suppress(NotFound):
                await consumer.delete(NODES, node)
            await wait_gone(consumer, NODES, node, None, timeout=args.timeout)
        progress.step(f"virtual node {node} gone")
        fabric, left = await network_down(
            consumer, provider, consumer_id=consumer_id, provider_id=provider_id,
            timeout=args.timeout, progress=progress,
        )  # fmt: skip
        removed = fabric + await flow.teardown(
            consumer,
            provider,
            consumer_id=consumer_id,
            provider_id=provider_id,
            timeout=args.timeout,
            progress=progress.note,
        )
        progress.step(f"tenant {consumer_id} revoked on {provider_id} ({len(removed)} objects removed)")
        for client, name in ((consumer, provider_id), (provider, consumer_id)):
            with contextlib.suppress(NotFound):
                await client.delete(FOREIGNCLUSTERS, name)
        no_nodes = not (await consumer.list(VIRTUALNODES))["items"]
        no_tenants = not (await provider.list(TENANTS))["items"]
        if args.agents == "local":
            if no_nodes and stop_agent(Agent("consumer", consumer_id, "")):
                progress.step("consumer agent stopped (no virtual node left)")
            if no_tenants and stop_agent(Agent("provider", provider_id, "")):
                progress.step("provider agent stopped (no tenant left)")
        # the last peering gone: the cluster is as it was before the first one (CRDs aside)
        if no_nodes and not await _peered_anywhere(consumer):
            removed += await _forget_cluster(consumer, "consumer", admission=True)
        if no_tenants and not await _peered_anywhere(provider):
            removed += await _forget_cluster(provider, "provider", admission=False)
    if left:
        raise UserError("unpeered, but the network fabric left things behind: " + "; ".join(left))
    emit(
        {"consumer": consumer_id, "provider": provider_id, "removed": removed},
        args.output,
        lambda console: console.print(f"unpeered {consumer_id} from {provider_id}"),
    )
    return 0


async def _peered_anywhere(client: KubeClient) -> bool:
    """Whether the cluster still has a peering in either role (virtual nodes, tenants)."""
    return bool((await client.list(VIRTUALNODES))["items"] or (await client.list(TENANTS))["items"])


async def _forget_cluster(client: KubeClient, side: str, *, admission: bool) -> list[str]:
    """Remove what only existed for peerings: the admission policy (consumer) and the
    ``gpuferry-system`` namespace with the cluster ID (both sides)."""
    from ..admission import BINDING_NAME, POLICY_NAME

    removed = []
    if admission:
        for resource, name in (
            (MUTATINGADMISSIONPOLICYBINDINGS, BINDING_NAME),
            (MUTATINGADMISSIONPOLICIES, POLICY_NAME),
        ):
            with contextlib.suppress(NotFound):
                await client.delete(resource, name)
                removed.append(f"{side}: {resource.kind}/{name}")
    with contextlib.suppress(NotFound):
        await client.delete(NAMESPACES, flow.CONSUMER_NAMESPACE)
        removed.append(f"{side}: namespace/{flow.CONSUMER_NAMESPACE}")
        # gone, not just terminating: a peer right after needs it gone
        await wait_gone(client, NAMESPACES, flow.CONSUMER_NAMESPACE, None, timeout=120)
    return removed


def add_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    remote = argparse.ArgumentParser(add_help=False)
    remote.add_argument("--remote-kubeconfig", help="admin kubeconfig of the provider cluster")
    remote.add_argument("--remote-context", help="context in --remote-kubeconfig")
    remote.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for each step (120)")
    remote.add_argument(
        "--agents",
        choices=["local", "none"],
        default="local",
        help="run gpuferry's controllers as local background processes (default), or "
        "rely on controllers already running in the clusters",
    )
    remote.add_argument("-o", "--output", choices=["table", "json", "yaml"], default="table")
    remote.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")

    peer = sub.add_parser(
        "peer",
        parents=[common, remote],
        help="peer this (consumer) cluster with a provider: authenticate, negotiate a GPU slice, "
        "start a virtual node",
        description="Peer the consumer cluster (--kubeconfig) with a provider (--remote-kubeconfig): the "
        "provider issues the consumer an identity limited to its tenant, grants a slice of its GPUs, and "
        "the consumer gets a virtual node advertising them. Idempotent: running it again shows the state.",
    )
    peer.add_argument("--gpus", type=int, help="nvidia.com/gpu to ask for (required)")
    peer.add_argument("--cpu", help="CPU to ask for (default: 8 per GPU)")
    peer.add_argument("--memory", help="memory to ask for (default: 64Gi per GPU)")
    peer.add_argument("--pods", type=int, default=110, help="pods the virtual node accepts (110)")
    peer.add_argument(
        "--resource",
        action="append",
        metavar="NAME=QUANTITY",
        help="any other resource, verbatim (nvidia.com/mig-1g.10gb=7), repeatable",
    )
    peer.add_argument(
        "--selector",
        action="append",
        metavar="LABEL=VALUE",
        help="only provider nodes with this label (a GPU product), repeatable",
    )
    peer.add_argument(
        "--allow-partial", action="store_true", help="accept less than asked if that is all there is"
    )
    peer.add_argument(
        "--no-network",
        action="store_true",
        help="do not set up the network fabric (by default each cluster's declared network, the "
        "ConfigMap kube-system/gpuferry-network with podCIDRs and serviceCIDRs, is joined by WireGuard)",
    )
    peer.add_argument(
        "--cluster-id", help="this cluster's ID, the first time (default: from the context name)"
    )
    peer.add_argument(
        "--remote-cluster-id", help="the provider's ID, the first time (default: its context name)"
    )
    peer.set_defaults(handler=cmd_peer)

    unpeer = sub.add_parser(
        "unpeer",
        parents=[common, remote],
        help="undo a peering: virtual node, grant, identity, tenant; nothing is left behind",
    )
    unpeer.set_defaults(handler=cmd_unpeer)
