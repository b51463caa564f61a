"""``gpuferry peer`` and ``gpuferry unpeer``: every step of a peering, in order, and back.

``peer`` holds both admin kubeconfigs (the platform engineer's) but hands neither to the other
side: the consumer's runtime identity on the provider is the certificate the provider issues
(see :mod:`peering.flow`), stored in a consumer Secret that the VirtualNode names.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import functools
import ipaddress
import os
import re
import urllib.parse
from typing import Any

from kube.accelerators import dra_resource, is_device
from kube.api import GPU_RESOURCE, NETWORK_READY, PROVIDER_LABEL, SYSTEM_NAMESPACE, virtual_node_name
from kube.clients import KubeClient
from kube.declaration import (
    DECLARATION_NAME,
    DECLARATION_NAMESPACE,
    DeclarationError,
    declaration_from_configmap,
)
from kube.errors import NotFound
from kube.objects import (
    CONFIGMAPS,
    DEPLOYMENTS,
    FOREIGNCLUSTERS,
    NAMESPACES,
    NODES,
    PEERNETWORKS,
    SECRETS,
    RawObject,
    Resource,
)
from kube.quantities import parse_quantity

from .. import flow
from ..clusterid import ClusterIDError, ensure_cluster_id, read_cluster_id, validate_cluster_id
from ..conditions import CHANGE_REFUSED, find_condition
from ..consumer.builders import with_defaults
from ..crds import ensure_crds
from ..localagents import Agent, ensure_agent, exited, find_agent, stop_agent
from ..network import FAILED_REASONS, network_ready
from ..resources import TENANTS, tenant_namespace
from ..virtualnodes import VIRTUALNODES
from ..waits import wait_until
from .common import (
    Progress,
    UserError,
    add_output_argument,
    delete_and_wait,
    described,
    emit,
    ensure_namespace,
    fold_table,
    format_resources,
    kubeconfig_context_name,
    parse_pairs,
)
from .following import STEPS, Follower, StepFailed, tail
from .network_cmds import read_declarations

__all__ = ["FOREIGNCLUSTERS", "add_parsers", "foreign_cluster"]

GPU = GPU_RESOURCE
EXIT_DENIED = 3


def node_name(provider_id: str) -> str:
    return virtual_node_name(provider_id)


def requested_resources(args: argparse.Namespace) -> dict[str, str]:
    """The slice to ask for: GPUs (or slices and shares of them, with ``--resource``), and CPU,
    memory and pods to go with them (defaults scale with the GPUs: 8 CPUs and 64 GiB per GPU, a
    MIG instance or a shared replica counting for its part of one; 110 pods)."""
    extra = parse_pairs(args.resource, "--resource")
    for device_class, count in parse_pairs(getattr(args, "devices", None), "--devices").items():
        extra[dra_resource(device_class)] = count
    if args.gpus is not None and args.gpus < 1:
        raise UserError("--gpus N: N must be 1 or more (leave --gpus out to ask only for slices of "
                        "GPUs with --resource)")  # fmt: skip
    if args.gpus is None and not any(is_device(key) for key in extra):
        raise UserError(
            "say how many GPUs to ask for: --gpus N (N >= 1), slices of them with --resource "
            "(nvidia.com/mig-1g.10gb=7, nvidia.com/gpu.shared=4, cnvrg.io/metagpu=200), or DRA devices "
            "with --devices gpu.nvidia.com=N"
        )
    out = {"pods": str(args.pods)}
    if args.gpus is not None:
        out[GPU] = str(args.gpus)
    if args.cpu:
        out["cpu"] = args.cpu
    if args.memory:
        out["memory"] = args.memory
    out.update(extra)
    for key, value in out.items():
        check_quantity("--resource", key, value)
    return with_defaults(out)  # what the consumer's controller would fill in: shown before it asks


def check_quantity(flag: str, key: str, value: str) -> None:
    """A resource name and a quantity of it, as a GPUSlice takes them (``--resource``, ``--max``)."""
    if not LABEL_KEY.match(key):
        raise UserError(f"{flag}: {key!r} is not a resource name (e.g. nvidia.com/gpu, cpu, memory)")
    try:
        amount = parse_quantity(value)
    except ValueError:
        raise UserError(f"{key}: {value!r} is not a Kubernetes quantity (e.g. 8, 500m, 64Gi)") from None
    if amount < 0:
        raise UserError(f"{key}: {value!r} is negative: give a quantity of 0 or more")
    if "/" in key and "." in key.split("/")[0] and amount != int(amount):
        # extended resources (nvidia.com/gpu, ...) are whole units: Kubernetes refuses 0.5 of one
        raise UserError(f"{key}: {value!r} is not a whole number: {key} comes in whole units")


def check_selector(selector: dict[str, str]) -> dict[str, str]:
    """``--selector`` pairs as a nodeSelector: label keys and values Kubernetes accepts."""
    for key, value in selector.items():
        if not LABEL_KEY.match(key):
            raise UserError(f"--selector {key}={value}: {key!r} is not a valid label key")
        if value and not LABEL_VALUE.match(value):
            raise UserError(f"--selector {key}={value}: {value!r} is not a valid label value (letters, "
                            "digits, '-', '_', '.'; at most 63; alphanumeric at both ends)")  # fmt: skip
    return selector


def check_cluster_ids(args: argparse.Namespace) -> None:
    """``--cluster-id`` and ``--remote-cluster-id``, before anything is sent."""
    for flag, value in (("--cluster-id", args.cluster_id), ("--remote-cluster-id", args.remote_cluster_id)):
        if value is not None:
            try:
                validate_cluster_id(value)
            except ClusterIDError as exc:
                raise UserError(f"{flag}: {exc}") from None


def foreign_cluster(
    provider_id: str,
    *,
    server: str,
    ca_pem: bytes | None,
    token_secret: str,
    resources: dict[str, str],
    selector: dict[str, str],
    allow_partial: bool,
    networking: bool,
    tolerations: list[dict[str, str]] | None = None,
) -> RawObject:
    """The ForeignCluster of a provider on the consumer: all the consumer agent needs to peer. Pure."""
    spec: dict[str, Any] = {
        "clusterID": provider_id,
        "role": "Provider",
        "apiServerURL": server,
        "peeringTokenSecretRef": {"name": token_secret, "key": "token"},
        "slice": {
            "resources": dict(resources),
            "nodeSelector": dict(selector),
            "allowPartial": allow_partial,
            **({"tolerations": tolerations} if tolerations else {}),
        },
        "networkingEnabled": networking,
    }
    if ca_pem:
        spec["caBundle"] = base64.b64encode(ca_pem).decode()
    return {
        "apiVersion": FOREIGNCLUSTERS.api_version,
        "kind": FOREIGNCLUSTERS.kind,
        "metadata": {"name": provider_id, "labels": {"app.kubernetes.io/managed-by": "gpuferry"}},
        "spec": spec,
    }


def token_secret_name(provider_id: str) -> str:
    return f"gpuferry-peering-{provider_id}"


async def _apply(
    client: KubeClient, resource: Resource, body: RawObject, namespace: str | None = None
) -> RawObject:
    return await client.patch(
        resource,
        body["metadata"]["name"],
        body,
        namespace,
        patch_type="apply",
        field_manager="gpuferry-cli",
        force=True,
    )


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


def _warn_for(progress: Progress, side: str, why: str) -> None:
    progress.warn(f"{side}: {why}")


def _ensure_agents(
    args: argparse.Namespace, consumer_id: str, provider_id: str, progress: Progress
) -> dict[str, Agent]:
    """Embedded mode: the provider controller, the consumer agent and, with the network, a gateway
    per side for this peering, as local processes (none of them gets more than a kubeconfig and
    what it serves: everything else they read from objects)."""
    agents: dict[str, Agent] = {}
    for role, cid, path in (
        ("provider", provider_id, args.remote_kubeconfig),
        ("consumer", consumer_id, args.kubeconfig),
    ):
        if not path:
            raise UserError(f"--agents local needs a kubeconfig file for the {role}")
        agent, started = ensure_agent(role, cid, path)
        agents[role] = agent
        progress.step(f"{role} agent {'started' if started else 'running'} (log: {agent.log})")
    if not args.no_network:
        for side, cid, peer, namespace, path in (
            ("consumer", consumer_id, provider_id, flow.CONSUMER_NAMESPACE, args.kubeconfig),
            ("provider", provider_id, consumer_id, tenant_namespace(consumer_id), args.remote_kubeconfig),
        ):
            agent, started = ensure_agent(
                "gateway", f"{cid}-{peer}", path, args=("gateways", "--peer-network", f"{namespace}/{peer}")
            )
            agents[f"{side} gateway"] = agent
            progress.note(
                f"{cid}: gateway towards {peer} {'started' if started else 'running'} (log: {agent.log})"
            )
    return agents


async def died(agent: Agent, what: str) -> str:
    """Once ``agent``'s process has exited: what to tell the user (the end of its log)."""
    await exited(agent)
    return f"{what} exited; the end of its log ({agent.log}):\n{tail(agent.log)}"


def _progress_line(step: str, fc: RawObject, provider: dict[str, Any]) -> str:
    status = fc.get("status") or {}
    if step == "Authenticated":
        identity = status.get("identity") or {}
        return f"authenticated as {identity.get('username')} (certificate until {identity.get('notAfter')})"
    if step == "SliceGranted":
        sl = status.get("slice") or {}
        return f"slice {sl.get('phase')}: {sl.get('granted')}"
    if step == "VirtualNodeReady":
        return f"virtual node {status.get('virtualNode')} Ready"
    network = status.get("network") or {}
    cond = find_condition(status.get("conditions"), NETWORK_READY) or {}
    if cond.get("reason") == "NetworkDisabled":
        return "network: disabled (--no-network)"
    views = ", ".join(network.get("remappedPodCIDRs") or [])
    return (
        f"consumer: tunnel to {fc['metadata']['name']} up ({network.get('backend')} WireGuard) via "
        f"{network.get('endpoint')}; its pods {', '.join(provider.get('podCIDRs') or [])} are {views} here"
    )


async def _provider_tunnel(provider: KubeClient, consumer_id: str, timeout: float) -> dict[str, Any]:
    """The provider's gateway's view of the tunnel, once it reports a handshake."""
    ns = tenant_namespace(consumer_id)

    def ready(obj: RawObject) -> str | None:
        ok, reason, message = network_ready(obj)
        if ok:
            return ""
        if reason in FAILED_REASONS:
            return (
                f"the gateway for {ns}/{consumer_id} reports {reason}: {message} (the peering itself stays; "
                "fix it and run peer again, or unpeer)"
            )
        return None

    obj = await wait_until(
        provider,
        PEERNETWORKS,
        consumer_id,
        ns,
        ready,
        timeout,
        f"the provider's PeerNetwork {ns}/{consumer_id}",
    )
    return obj


LABEL_KEY = re.compile(r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
LABEL_VALUE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")

INSTALLED_DEPLOYMENTS = {"consumer": "gpuferry-consumer", "provider": "gpuferry-provider"}
"""The chart's controllers: a cluster that has its role's Deployment runs gpuferry itself."""
GATEWAY_DEPLOYMENT = "gpuferry-gateway"
"""The chart's gateway (installed with the network)."""


def choose_agents(requested: str, installed: dict[str, bool]) -> str:
    """``--agents auto``: none where both clusters run the installed controllers; anything else
    is an error that says what to do, not a guess (local processes are development mode, asked
    for by name). Pure."""
    if requested != "auto":
        return requested
    if all(installed.values()):
        return "none"
    if not any(installed.values()):
        raise UserError("gpuferry runs in neither cluster: install it in both (gpuferry install --role "
                        "provider, then --role consumer), or run its controllers on this machine in "
                        "development mode with --agents local")  # fmt: skip
    have = next(side for side, yes in installed.items() if yes)
    lack = next(side for side, yes in installed.items() if not yes)
    raise UserError(f"gpuferry is installed in the {have} cluster but not in the {lack}: install it there "
                    f"(gpuferry install --role {lack}), or pass --agents local or --agents none")  # fmt: skip


async def resolve_agents(
    args: argparse.Namespace, consumer: KubeClient, provider: KubeClient, progress: Progress
) -> bool:
    """Turn ``--agents auto`` into local or none, saying which and why; True when that is
    because both clusters run the chart's controllers."""
    if args.agents != "auto":
        return False
    installed: dict[str, bool] = {}
    for side, client in (("consumer", consumer), ("provider", provider)):
        try:
            await client.get(DEPLOYMENTS, INSTALLED_DEPLOYMENTS[side], SYSTEM_NAMESPACE)
            installed[side] = True
        except NotFound:
            installed[side] = False
    args.agents = choose_agents("auto", installed)
    progress.step("controllers: installed in both clusters (gpuferry install): none started here")
    return True


def is_loopback_url(url: str) -> bool:
    """Whether ``url``'s host is this machine's loopback (127.0.0.0/8, ::1, localhost). Pure."""
    host = (urllib.parse.urlsplit(url).hostname or "").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_reachable_from_pods(url: str, given: bool) -> None:
    """UserError, before anything is written, when the provider's API server ``url`` (``given``
    with --remote-server, else --remote-kubeconfig's) is a loopback address: a pod of the
    consumer cluster, where the installed agent runs, reaches its own loopback there (kind and
    minikube kubeconfigs name 127.0.0.1). Pure."""
    if not is_loopback_url(url):
        return
    where = "--remote-server" if given else "the server of --remote-kubeconfig"
    raise UserError(
        f"{where} is {url}, a loopback address: the consumer's agent runs in a pod of the consumer "
        "cluster, where that address is the pod itself; give --remote-server URL, the provider's API "
        "server as the consumer's pods reach it (nothing was changed)"
    )


async def require_gateways(consumer: KubeClient, provider: KubeClient) -> None:
    """Both installed clusters run the chart's gateway, or the tunnel would never come up."""
    missing = []
    for side, client in (("consumer", consumer), ("provider", provider)):
        try:
            await client.get(DEPLOYMENTS, GATEWAY_DEPLOYMENT, SYSTEM_NAMESPACE)
        except NotFound:
            missing.append(side)
    if missing:
        raise UserError(
            f"gpuferry on the {' and the '.join(missing)} runs no gateway (installed with --no-network): "
            "peer with --no-network, or install again with the network (gpuferry install)"
        )


def parse_tolerations(values: list[str] | None) -> list[dict[str, str]]:
    """``--tolerate KEY[=VALUE][:EFFECT]`` as pod tolerations (Exists without a value). Pure."""
    out: list[dict[str, str]] = []
    for text in values or ():
        rest, _, effect = text.rpartition(":") if ":" in text else (text, "", "")
        key, eq, value = rest.partition("=")
        if not key or (eq and not value):
            raise UserError(f"--tolerate expects KEY[=VALUE][:EFFECT], got {text!r}")
        if effect and effect not in ("NoSchedule", "PreferNoSchedule", "NoExecute"):
            raise UserError(f"--tolerate {text!r}: the effect is NoSchedule, PreferNoSchedule or NoExecute")
        if not LABEL_KEY.match(key) or (value and not LABEL_VALUE.match(value)):
            raise UserError(f"--tolerate {text!r}: {key!r}={value!r} is not a valid taint key and value")
        toleration = (
            {"key": key, "operator": "Equal", "value": value} if eq else {"key": key, "operator": "Exists"}
        )
        if effect:
            toleration["effect"] = effect
        out.append(toleration)
    return out


async def cmd_peer(args: argparse.Namespace) -> int:
    resources = requested_resources(args)
    selector = check_selector(parse_pairs(args.selector, "--selector"))
    tolerations = parse_tolerations(args.tolerate)
    check_cluster_ids(args)
    if not args.remote_kubeconfig:
        raise UserError("give the provider's kubeconfig: --remote-kubeconfig PATH")
    progress = Progress(args.quiet)
    async with (
        KubeClient.from_config(args.kubeconfig, context=args.context) as consumer,
        KubeClient.from_config(args.remote_kubeconfig, context=args.remote_context) as provider,
    ):
        if consumer.base_url == provider.base_url:
            raise UserError("--kubeconfig and --remote-kubeconfig lead to the same API server")
        installed = await resolve_agents(args, consumer, provider, progress)
        if installed and not args.no_network:  # nothing would ever bring the tunnel up
            await require_gateways(consumer, provider)
        if not args.no_network:  # a missing or wrong declaration stops us before any change
            await read_declarations(consumer, provider, embedded=args.agents == "local")
        if installed:  # the consumer's agent dials the provider from a pod of the consumer cluster
            check_reachable_from_pods(args.remote_server or provider.base_url, bool(args.remote_server))
        for side, client in (("consumer", consumer), ("provider", provider)):
            await ensure_crds(client, warn=functools.partial(_warn_for, progress, side))
            progress.step(f"{side}: gpuferry CRDs installed ({client.base_url})")
        consumer_id, provider_id = await _ids(consumer, provider, args)
        progress.step(f"cluster IDs: consumer {consumer_id}, provider {provider_id}")
        agents = _ensure_agents(args, consumer_id, provider_id, progress) if args.agents == "local" else {}
        # the provider's admin part: a tenant namespace and a peering token, nothing else
        token = await flow.issue_peering_token(provider, consumer_id, timeout=args.timeout)
        progress.step(f"peering token issued ({tenant_namespace(consumer_id)}/{flow.TOKEN_SECRET})")
        # the consumer's part: the token and a ForeignCluster; the consumer agent does the rest
        try:
            before: RawObject | None = await consumer.get(FOREIGNCLUSTERS, provider_id)
        except NotFound:
            before = None
        authenticated = find_condition(
            ((before or {}).get("status") or {}).get("conditions"), "Authenticated"
        )
        already = bool(authenticated and authenticated.get("status") == "True")
        await ensure_namespace(consumer, flow.CONSUMER_NAMESPACE)
        secret = {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "Opaque",
            "metadata": {
                "name": token_secret_name(provider_id),
                "namespace": flow.CONSUMER_NAMESPACE,
                "labels": {"app.kubernetes.io/managed-by": "gpuferry", PROVIDER_LABEL: provider_id},
            },
            "data": {"token": base64.b64encode(token.encode()).decode()},
        }
        await _apply(consumer, SECRETS, secret, flow.CONSUMER_NAMESPACE)
        body = foreign_cluster(
            provider_id,
            server=args.remote_server or provider.base_url,
            ca_pem=provider.connection.ca_pem,
            token_secret=token_secret_name(provider_id),
            resources=resources,
            selector=selector,
            allow_partial=args.allow_partial,
            networking=not args.no_network,
            tolerations=tolerations,
        )
        fc = await _apply(consumer, FOREIGNCLUSTERS, body)
        progress.step(
            f"ForeignCluster {provider_id} applied; the consumer agent peers"
            + (" (already authenticated)" if already else "")
        )
        published: dict[str, Any] = {}

        def on_step(step: str, current: RawObject) -> None:
            if step == NETWORK_READY:
                published.update((current.get("status") or {}).get("network") or {})
            progress.step(_progress_line(step, current, theirs))

        theirs: dict[str, Any] = {}
        if not args.no_network:
            with contextlib.suppress(DeclarationError, NotFound):
                cm = await provider.get(CONFIGMAPS, DECLARATION_NAME, DECLARATION_NAMESPACE)
                theirs = {"podCIDRs": list(declaration_from_configmap(cm, side="provider").pod_cidrs)}
        follower = Follower(consumer, provider_id, int(fc["metadata"].get("generation") or 0), STEPS)
        deaths = [died(agent, f"the {name.split()[0]}'s gateway") for name, agent in agents.items()
                  if name.endswith("gateway")]  # fmt: skip
        deaths += [
            died(agents[role], f"the {role} agent") for role in ("provider", "consumer") if role in agents
        ]
        try:
            done = await follower.until_done(on_step, timeout=args.timeout, also=deaths)
        except StepFailed as e:
            if e.step == "SliceGranted" and e.reason == CHANGE_REFUSED:
                raise UserError(
                    f"{e.message} (nothing changed; run peer again with what the provider can grant)",
                    EXIT_DENIED,
                ) from None
            if e.step == "SliceGranted":
                raise UserError(
                    f"the provider denied the GPU slice: {e.reason}: {e.message} "
                    "(the peering itself stays; ask for less, or run `gpuferry unpeer`)",
                    EXIT_DENIED,
                ) from None
            if e.step == NETWORK_READY:
                raise UserError(
                    f"the gateway for {flow.CONSUMER_NAMESPACE}/{provider_id} reports {e.reason}: "
                    f"{e.message} (the peering itself stays; fix it and run peer again, or unpeer)"
                ) from None
            raise UserError(f"peering with {provider_id} failed: {e.step}: {e.reason}: {e.message}") from None
        except TimeoutError as e:
            raise UserError(
                f"peering with {provider_id} is not done after {args.timeout:.0f}s: {e} (the peering "
                "stays and the consumer agent keeps trying: fix what is named and run peer again, or "
                "`gpuferry unpeer`; see `kubectl get fc` and the consumer agent's log)"
            ) from None
        status = done.get("status") or {}
        network: dict[str, Any] | str = "disabled (--no-network)"
        if not args.no_network:
            tunnel = await _provider_tunnel(provider, consumer_id, args.timeout)
            ours = status.get("network") or {}
            theirs_status = tunnel.get("status") or {}
            network = {
                "endpoint": ours.get("endpoint"),
                "consumer": {
                    "peer": provider_id,
                    "remappedPodCIDRs": ours.get("remappedPodCIDRs"),
                    "remappedServiceCIDRs": ours.get("remappedServiceCIDRs"),
                    "backend": ours.get("backend"),
                },
                "provider": {
                    "peer": consumer_id,
                    "remappedPodCIDRs": theirs_status.get("remappedPodCIDRs"),
                    "remappedServiceCIDRs": theirs_status.get("remappedServiceCIDRs"),
                    "backend": theirs_status.get("backend"),
                },
            }
            views = ", ".join(theirs_status.get("remappedPodCIDRs") or [])
            progress.step(
                f"provider: tunnel to {consumer_id} up ({theirs_status.get('backend')} WireGuard); "
                f"its pods {', '.join(tunnel['spec']['podCIDRs'])} are {views} here"
            )
        node = await consumer.get(NODES, node_name(provider_id))
    labels = node["metadata"].get("labels") or {}
    sl = status.get("slice") or {}
    identity = status.get("identity") or {}
    result = {
        "consumer": consumer_id,
        "provider": provider_id,
        "alreadyPeered": already,
        "identity": {"username": identity.get("username"), "notAfter": identity.get("notAfter")},
        "slice": {
            "phase": sl.get("phase"),
            "requested": resources,
            "granted": sl.get("granted"),
            "largestBlock": sl.get("largestBlock"),
            "reason": sl.get("reason"),
        },
        "virtualNode": {
            "name": node_name(provider_id),
            "capacity": node["status"].get("capacity"),
            "gpuProduct": labels.get("nvidia.com/gpu.product"),
        },
        "network": network,
    }

    def table(console: Any) -> None:
        t = fold_table(["", ""], title=f"{consumer_id} ⟶ {provider_id}", show_header=False, box=None)
        t.add_row("[bold]identity[/]", f"{identity.get('username')} until {identity.get('notAfter')}")
        t.add_row("[bold]slice[/]", f"{sl.get('phase')}: {format_resources(sl.get('granted'))}")
        t.add_row("[bold]largest block[/]", format_resources(sl.get("largestBlock")))
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


async def cmd_unpeer(args: argparse.Namespace) -> int:
    if not args.remote_kubeconfig:
        raise UserError("give the provider's kubeconfig: --remote-kubeconfig PATH")
    progress = Progress(args.quiet)
    left: list[str] = []
    async with (
        KubeClient.from_config(args.kubeconfig, context=args.context) as consumer,
        KubeClient.from_config(args.remote_kubeconfig, context=args.remote_context) as provider,
    ):
        if consumer.base_url == provider.base_url:
            raise UserError("--kubeconfig and --remote-kubeconfig lead to the same API server")
        consumer_id, provider_id = await read_cluster_id(consumer), await read_cluster_id(provider)
        if consumer_id is None or provider_id is None:
            raise UserError("these clusters were never peered by gpuferry (no cluster ID recorded)")
        if consumer_id == provider_id:
            raise UserError(f"both clusters have the cluster ID {consumer_id}: they are not a consumer and "
                            "its provider")  # fmt: skip
        # nothing is removed that this peering cannot be shown to own: the consumer's ForeignCluster
        # for the provider, or the provider's Tenant for the consumer, must be there
        if not (await _exists(consumer, FOREIGNCLUSTERS, provider_id, None)
                or await _exists(provider, TENANTS, consumer_id, tenant_namespace(consumer_id))):  # fmt: skip
            for cid, peer in ((consumer_id, provider_id), (provider_id, consumer_id)):  # this pair's, by name
                gateway = find_agent("gateway", f"{cid}-{peer}")
                if gateway is not None:
                    await asyncio.to_thread(stop_agent, gateway)
            said = f"{consumer_id} and {provider_id} are not peered: nothing to undo"
            progress.step(f"no ForeignCluster {provider_id} on the consumer, no Tenant {consumer_id} on the "
                          "provider: nothing removed")  # fmt: skip
            emit({"consumer": consumer_id, "provider": provider_id, "removed": []}, args.output,
                 lambda console: console.print(said))  # fmt: skip
            return 0
        await resolve_agents(args, consumer, provider, progress)
        if args.agents == "local":  # the consumer agent undoes the peering on this side: it must run
            ensure_agent("consumer", consumer_id, args.kubeconfig)
        # a gateway whose PeerNetwork never came (the peering failed before the network) has no
        # tunnel to take down: it is stopped at once instead of waited for
        had_network = {
            "consumer": await _exists(consumer, PEERNETWORKS, provider_id, flow.CONSUMER_NAMESPACE),
            "provider": await _exists(provider, PEERNETWORKS, consumer_id, tenant_namespace(consumer_id)),
        }
        removed: list[str] = []
        if await delete_and_wait(
            consumer, FOREIGNCLUSTERS, provider_id, None, timeout=args.timeout,
            deleted=lambda: progress.note(
                f"ForeignCluster {provider_id} deleted: the consumer agent removes the virtual node, "
                "its pods, the tunnel and the identity"
            ),
            stuck=f"the ForeignCluster {provider_id} is still there after {args.timeout:.0f}s: is the "
            "consumer agent running? (its finalizer undoes the peering)",
        ):  # fmt: skip
            removed.append(f"consumer: ForeignCluster {provider_id}")
            progress.step(f"virtual node {node_name(provider_id)} gone")
        with contextlib.suppress(NotFound):
            await consumer.delete(SECRETS, token_secret_name(provider_id), flow.CONSUMER_NAMESPACE)
            removed.append(f"consumer: secret/{flow.CONSUMER_NAMESPACE}/{token_secret_name(provider_id)}")
        revoked = await flow.start_teardown(
            consumer, provider, consumer_id=consumer_id, provider_id=provider_id, progress=progress.note
        )
        removed += revoked.removed
        progress.step(f"tenant {consumer_id} revoked on {provider_id} ({len(removed)} objects removed)")
        # the namespaces deleted, on both sides: each takes the namespace controller's 5 s or more
        # to go, so they are all waited for at once, at the end
        going = [(provider, name) for name in revoked.namespaces]
        for side, cid, peer in (
            ("consumer", consumer_id, provider_id),
            ("provider", provider_id, consumer_id),
        ):
            agent = find_agent("gateway", f"{cid}-{peer}")
            if agent is not None and agent.pid() is not None and had_network[side]:
                # its PeerNetwork is gone: the gateway removes its tunnel, checks nothing is left, exits
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(args.timeout):
                        await exited(agent)
                if agent.pid() is not None:
                    await asyncio.to_thread(stop_agent, agent)
                    left.append(
                        f"{side}: the gateway towards {peer} did not finish its teardown (log: {agent.log})"
                    )
                elif found := [line for line in tail(agent.log, 20).splitlines() if "left behind:" in line]:
                    left.append(f"{side}: the gateway towards {peer} left things behind: {'; '.join(found)}")
            if agent is not None:
                await asyncio.to_thread(stop_agent, agent)
        no_nodes = not (await consumer.list(VIRTUALNODES))["items"]
        no_tenants = not (await provider.list(TENANTS))["items"]
        if args.agents == "local":
            if no_nodes and stop_agent(Agent("consumer", consumer_id, "")):
                progress.step("consumer agent stopped (no virtual node left)")
            if no_tenants and stop_agent(Agent("provider", provider_id, "")):
                progress.step("provider agent stopped (no tenant left)")
        # the last peering gone: the cluster is as it was before the first one (CRDs aside). Not
        # with controllers installed in the clusters: gpuferry-system is their namespace then
        if args.agents == "local" and no_nodes and not await _peered_anywhere(consumer):
            removed += await _forget_cluster(consumer, "consumer", admission=True, going=going)
        if args.agents == "local" and no_tenants and not await _peered_anywhere(provider):
            removed += await _forget_cluster(provider, "provider", admission=False, going=going)
        # gone, not just terminating: a peer right after needs them gone
        await flow.wait_all_gone(NAMESPACES, going, args.timeout)
        progress.step(f"{len(going)} namespace{'s' * (len(going) != 1)} gone")
        removed += await flow.finish_teardown(provider, consumer_id=consumer_id, progress=progress.note)
    if left:
        raise UserError("unpeered, but the network fabric left things behind: " + "; ".join(left))
    emit(
        {"consumer": consumer_id, "provider": provider_id, "removed": removed},
        args.output,
        lambda console: console.print(f"unpeered {consumer_id} from {provider_id}"),
    )
    return 0


async def _exists(client: KubeClient, resource: Resource, name: str, namespace: str | None) -> bool:
    try:
        await client.get(resource, name, namespace)
    except NotFound:
        return False
    return True


async def _peered_anywhere(client: KubeClient) -> bool:
    """Whether the cluster still has a peering in either role (virtual nodes, tenants)."""
    return bool((await client.list(VIRTUALNODES))["items"] or (await client.list(TENANTS))["items"])


async def _forget_cluster(
    client: KubeClient, side: str, *, admission: bool, going: list[tuple[KubeClient, str]]
) -> list[str]:
    """Remove what only existed for peerings: the admission policy (consumer) and the
    ``gpuferry-system`` namespace with the cluster ID (both sides), added to ``going`` if it was
    there, for the caller to wait for."""
    from ..admission import admission_objects

    removed = []
    if admission:
        for resource, body in reversed(admission_objects()):  # bindings before their policies
            name = body["metadata"]["name"]
            with contextlib.suppress(NotFound):
                await client.delete(resource, name)
                removed.append(f"{side}: {resource.kind}/{name}")
    with contextlib.suppress(NotFound):
        await client.delete(NAMESPACES, flow.CONSUMER_NAMESPACE)
        removed.append(f"{side}: namespace/{flow.CONSUMER_NAMESPACE}")
        going.append((client, flow.CONSUMER_NAMESPACE))
    return removed


def add_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    remote = argparse.ArgumentParser(add_help=False)
    remote.add_argument("--remote-kubeconfig", help="admin kubeconfig of the provider cluster")
    remote.add_argument("--remote-context", help="context in --remote-kubeconfig")
    remote.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for each step (120)")
    remote.add_argument(
        "--agents",
        choices=["auto", "local", "none"],
        default=os.environ.get("GPUFERRY_AGENTS", "auto"),
        help="auto (default, or $GPUFERRY_AGENTS): the controllers `gpuferry install` runs in both "
        "clusters; local: run them on this machine as background processes instead (development "
        "mode, for clusters without gpuferry installed); none: start nothing, whatever runs",
    )
    add_output_argument(remote)
    remote.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")

    peer = sub.add_parser(
        "peer",
        parents=[common, remote],
        help="peer this (consumer) cluster with a provider: authenticate, negotiate a GPU slice, "
        "start a virtual node",
        **described(
            """Peer the consumer cluster (--kubeconfig) with a provider (--remote-kubeconfig): the
            provider issues the consumer an identity limited to its tenant and grants a slice of
            its GPUs, and the consumer gets a virtual node advertising them, plus (unless
            --no-network) a WireGuard tunnel between the two clusters' pod networks.

            It waits for each step and prints it; a provider that cannot grant what is asked says
            why (--allow-partial takes what there is). Idempotent: running it again shows the
            state, or changes the slice asked for. Then offload a namespace to use it.""",
            "gpuferry peer --kubeconfig consumer.yaml --remote-kubeconfig provider.yaml --gpus 4",
            "gpuferry peer --kubeconfig consumer.yaml --remote-kubeconfig provider.yaml --gpus 2 "
            "--selector nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3 --tolerate nvidia.com/gpu:NoSchedule",
            "gpuferry peer --kubeconfig consumer.yaml --remote-kubeconfig provider.yaml "
            "--resource nvidia.com/mig-1g.10gb=7",
            "gpuferry offload namespace ml-team --kubeconfig consumer.yaml",
        ),
    )
    peer.add_argument(
        "--gpus",
        type=int,
        help="whole GPUs (nvidia.com/gpu) to ask for; required unless --resource asks for slices of GPUs",
    )
    peer.add_argument("--cpu", help="CPU to ask for (default: 8 per GPU; a MIG 1g instance is 1/7 of one)")
    peer.add_argument("--memory", help="memory to ask for (default: 64Gi per GPU, likewise)")
    peer.add_argument("--pods", type=int, default=110, help="pods the virtual node accepts (110)")
    peer.add_argument(
        "--resource",
        action="append",
        metavar="NAME=QUANTITY",
        help="any other resource, verbatim, repeatable: MIG instances (nvidia.com/mig-1g.10gb=7), "
        "time-sliced replicas (nvidia.com/gpu.shared=4), HAMi's GPU memory in MiB and cores in %% "
        "(nvidia.com/gpumem=20000, nvidia.com/gpucores=50, beside --gpus), MetaGPU units "
        "(cnvrg.io/metagpu=200)",
    )
    peer.add_argument(
        "--devices",
        action="append",
        metavar="CLASS=COUNT",
        help="GPUs the provider hands out by Dynamic Resource Allocation: devices of its DeviceClass "
        "CLASS (gpu.nvidia.com=2); pods claim them with ResourceClaims, repeatable",
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
        "--tolerate",
        action="append",
        metavar="KEY[=VALUE][:EFFECT]",
        help="provider nodes with this taint count too, and the twins tolerate it (real GPU nodes are "
        "often tainted nvidia.com/gpu:NoSchedule), repeatable",
    )
    peer.add_argument(
        "--no-network",
        action="store_true",
        help="do not set up the network fabric (by default each cluster's declared network, the "
        "ConfigMap kube-system/gpuferry-network with podCIDRs and serviceCIDRs, is joined by WireGuard)",
    )
    peer.add_argument(
        "--remote-server",
        metavar="URL",
        help="the provider's API server as the consumer's agent reaches it (default: the one in "
        "--remote-kubeconfig; give it when the agent runs elsewhere, e.g. in the consumer cluster)",
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
        **described(
            """Undo `gpuferry peer` on both clusters at once: the consumer (--kubeconfig) loses the
            virtual node and the pods on it (their twins are deleted on the provider), the provider
            (--remote-kubeconfig) revokes the grant, the consumer's identity and its tenant with
            the twin namespaces, and the network fabric between them is taken down.

            It waits until every namespace it deletes is gone and lists what it removed; if a
            gateway left anything of the tunnel behind, that is named and the exit status is 1.
            Clusters that are not peered are left as they are.""",
            "gpuferry unpeer --kubeconfig consumer.yaml --remote-kubeconfig provider.yaml",
        ),
    )
    unpeer.set_defaults(handler=cmd_unpeer)
