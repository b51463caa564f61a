"""``gpuferry info``: what this cluster lends or borrows, from either side.

On a consumer: its providers (virtual node, readiness, GPUs granted and in use, the largest
block one pod can get, the identity's expiry), its offloaded namespaces, and the global GPU
pool summed over every provider. On a provider: its consumers (authenticated or not, slices and
what was granted, twin namespaces, GPUs in use). A cluster can be both.
"""

from __future__ import annotations

import argparse
import base64
from collections.abc import Iterable
from decimal import Decimal
from typing import Any

from cryptography import x509

from kube import goyaml
from kube.accelerators import dra_resource, is_accelerator, short_name
from kube.api import GPU_RESOURCE
from kube.clients import KubeClient
from kube.errors import Forbidden, NotFound
from kube.objects import FOREIGNCLUSTERS, NAMESPACES, NODES, PODS, RESOURCECLAIMS, SECRETS, RawObject
from kube.quantities import format_quantity, parse_quantity, sum_requests
from kube.times import rfc3339

from .. import flow
from ..admission import OFFLOADING_NAME
from ..clusterid import read_cluster_id
from ..conditions import find_condition
from ..kueue import cluster_queue, resource_flavor
from ..resources import GPUSLICES, LABEL_TENANT, NAMESPACEOFFLOADINGS, TENANTS
from ..virtualnodes import VIRTUALNODES
from .common import UserError, add_output_argument, described, emit, fold_table
from .network_cmds import network_rows, render_rows
from .tenant_cmds import policy_of

__all__ = ["add_parser", "collect"]

GPU = GPU_RESOURCE
_TERMINAL = ("Succeeded", "Failed")
KUEUE_QUEUE = "gpuferry"
"""The ClusterQueue ``info --kueue`` prints."""


def _gpus(pods: Iterable[RawObject]) -> Decimal:
    """GPUs held by unfinished pods, counted as the scheduler counts them."""
    return sum_requests(p for p in pods if (p.get("status") or {}).get("phase") not in _TERMINAL).get(
        GPU, Decimal(0)
    )


def _claimed(claims: Iterable[RawObject]) -> dict[str, Decimal]:
    """DRA devices allocated to ``claims``, per DeviceClass (as :func:`dra_resource` names)."""
    out: dict[str, Decimal] = {}
    for claim in claims:
        classes: dict[str, str] = {}
        for request in ((claim.get("spec") or {}).get("devices") or {}).get("requests") or ():
            if (request.get("exactly") or {}).get("deviceClassName"):
                classes[str(request["name"])] = str(request["exactly"]["deviceClassName"])
            for sub in request.get("firstAvailable") or ():
                classes[f"{request['name']}/{sub['name']}"] = str(sub.get("deviceClassName"))
        allocation = (claim.get("status") or {}).get("allocation") or {}
        for result in (allocation.get("devices") or {}).get("results") or ():
            device_class = classes.get(str(result.get("request")))
            if device_class:
                key = dra_resource(device_class)
                out[key] = out.get(key, Decimal(0)) + 1
    return out


async def _claims_of(client: KubeClient, pods: Iterable[RawObject]) -> list[RawObject]:
    """The ResourceClaims of unfinished ``pods`` (from templates or shared by name), each once."""
    names: set[tuple[str, str]] = set()
    for pod in pods:
        if (pod.get("status") or {}).get("phase") in _TERMINAL:
            continue
        namespace = str(pod["metadata"].get("namespace") or "")
        for status in (pod.get("status") or {}).get("resourceClaimStatuses") or ():
            if status.get("resourceClaimName"):
                names.add((namespace, str(status["resourceClaimName"])))
        for ref in (pod.get("spec") or {}).get("resourceClaims") or ():
            if ref.get("resourceClaimName"):
                names.add((namespace, str(ref["resourceClaimName"])))
    claims = []
    for namespace, name in sorted(names):
        try:
            claims.append(await client.get(RESOURCECLAIMS, name, namespace))
        except NotFound:
            continue
    return claims


def _accelerators(
    granted: dict[str, Any], pods: Iterable[RawObject], claims: Iterable[RawObject] = ()
) -> dict[str, dict[str, int | str]]:
    """Per accelerator resource of a grant (GPUs, MIG instances, shared replicas, HAMi's memory
    and cores, MetaGPU units, DRA devices): granted, held by unfinished pods (DRA devices: by
    their ``claims``), free."""
    used = {
        **sum_requests(p for p in pods if (p.get("status") or {}).get("phase") not in _TERMINAL),
        **_claimed(claims),
    }
    out: dict[str, dict[str, int | str]] = {}
    for res in sorted(r for r in granted if is_accelerator(r)):
        amount, taken = _q(granted[res]), used.get(res, Decimal(0))
        out[res] = {"granted": _n(amount), "used": _n(taken), "free": _n(max(amount - taken, Decimal(0)))}
    return out


def _sum_accelerators(entries: Iterable[dict[str, Any]]) -> dict[str, dict[str, int | str]]:
    total: dict[str, dict[str, Decimal]] = {}
    for entry in entries:
        for res, amounts in entry["accelerators"].items():
            acc = total.setdefault(res, {})
            for k, v in amounts.items():
                acc[k] = acc.get(k, Decimal(0)) + _q(v)
    return {res: {k: _n(v) for k, v in amounts.items()} for res, amounts in sorted(total.items())}


def _usage(accelerators: dict[str, dict[str, Any]]) -> str:
    """``gpu 2/8, mig-1g.10gb 0/7``: used/granted of each accelerator; ``-`` for none."""
    parts = [f"{short_name(r)} {a['used']}/{a['granted']}" for r, a in accelerators.items()]
    return ", ".join(parts) or "-"


def _q(value: Any) -> Decimal:
    return parse_quantity(str(value)) if value not in (None, "") else Decimal(0)


def _n(value: Decimal) -> int | str:
    return int(value) if value == value.to_integral_value() else format_quantity(value)


def _not_after(secret: RawObject | None) -> str | None:
    cert = ((secret or {}).get("data") or {}).get("tls.crt")
    if not cert:
        return None
    parsed = x509.load_pem_x509_certificate(base64.b64decode(cert))
    return rfc3339(parsed.not_valid_after_utc)


async def _consumer_side(client: KubeClient) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    try:
        vns = (await client.list(VIRTUALNODES, flow.CONSUMER_NAMESPACE))["items"]
    except NotFound:  # CRDs not installed
        return [], []
    providers = []
    for vn in vns:
        spec = vn.get("spec") or {}
        node_name = str(spec.get("nodeName") or "")
        try:
            node: RawObject | None = await client.get(NODES, node_name)
        except NotFound:
            node = None
        node_conditions = ((node or {}).get("status") or {}).get("conditions")
        ready = find_condition(node_conditions, "Ready") or {}
        reachable = find_condition(node_conditions, "ProviderReachable") or {}
        if reachable.get("status") == "False":  # the node stays Ready (its pods run on): not us
            ready = {"status": "False", "reason": "ProviderUnreachable"}
        pods = (await client.list(PODS, field_selector=f"spec.nodeName={node_name}"))["items"]
        granted = _q((spec.get("resources") or {}).get(GPU))
        used = _gpus(pods)
        secret_ref = spec.get("kubeconfigSecretRef") or {}
        try:
            secret: RawObject | None = await client.get(
                SECRETS, secret_ref.get("name", ""), flow.CONSUMER_NAMESPACE
            )
        except NotFound:
            secret = None
        labels = ((node or {}).get("metadata") or {}).get("labels") or {}
        try:
            fc: RawObject | None = await client.get(FOREIGNCLUSTERS, str(spec.get("providerClusterID") or ""))
        except NotFound:
            fc = None
        # a change the provider refused: the grant above is the one before it (and the refused
        # spec is asked again on every pass, so that room appearing later grants it)
        refused = (((fc or {}).get("status") or {}).get("slice") or {}).get("refusedChange")
        providers.append(
            {
                "id": spec.get("providerClusterID"),
                "virtualNode": node_name,
                "ready": ready.get("status", "Unknown") == "True",
                "readyReason": ready.get("reason"),
                "phase": (vn.get("status") or {}).get("phase"),
                "gpuProduct": labels.get("nvidia.com/gpu.product"),
                "granted": dict(spec.get("resources") or {}),
                "accelerators": _accelerators(
                    dict(spec.get("resources") or {}), pods, await _claims_of(client, pods)
                ),
                "largestBlock": labels.get("gpuferry.io/largest-gpu-block"),
                "gpus": {
                    "granted": _n(granted),
                    "used": _n(used),
                    "free": _n(max(granted - used, Decimal(0))),
                },
                "pods": len([p for p in pods if (p.get("status") or {}).get("phase") not in _TERMINAL]),
                "identity": {
                    "username": f"gpuferry:consumer:{spec.get('consumerClusterID')}",
                    "notAfter": _not_after(secret),
                },
                "network": "not configured",
                **({"refusedChange": dict(refused)} if refused else {}),
            }
        )
    offloaded = []
    try:
        items = (await client.list(NAMESPACEOFFLOADINGS))["items"]
    except NotFound:
        items = []
    for item in items:
        if item["metadata"]["name"] != OFFLOADING_NAME:
            continue
        spec, status = item.get("spec") or {}, item.get("status") or {}
        offloaded.append(
            {
                "namespace": item["metadata"]["namespace"],
                "podOffloadingStrategy": spec.get("podOffloadingStrategy"),
                "namespaceMappingStrategy": spec.get("namespaceMappingStrategy"),
                "remoteNamespaces": [
                    {
                        "provider": r.get("clusterID"),
                        "namespace": r.get("remoteNamespace"),
                        "phase": r.get("phase"),
                        **({"reason": r["reason"]} if r.get("reason") else {}),
                    }
                    for r in status.get("remoteNamespaces") or []
                ],
            }
        )
    return providers, offloaded


def _twin_cell(r: dict[str, Any]) -> str:
    """A provider's twin namespace, and why it is not ready when it is not (a provider that does
    not answer: ``Pending: ProviderUnreachable``). Pure."""
    cell = f"{r['provider']}: {r.get('namespace') or '-'}"
    phase = r.get("phase")
    if phase and phase != "Ready":
        cell += f" ({phase}: {r['reason']})" if r.get("reason") else f" ({phase})"
    return cell


async def _provider_side(client: KubeClient) -> list[dict[str, Any]]:
    try:
        tenants = (await client.list(TENANTS))["items"]
    except NotFound:
        return []
    consumers = []
    for tenant in tenants:
        spec, status = tenant.get("spec") or {}, tenant.get("status") or {}
        consumer_id = spec.get("consumerClusterID")
        ns = tenant["metadata"]["namespace"]
        slices = (await client.list(GPUSLICES, ns))["items"]
        namespaces = (await client.list(NAMESPACES, label_selector=f"{LABEL_TENANT}={consumer_id}"))["items"]
        twins = [n["metadata"]["name"] for n in namespaces if n["metadata"]["name"] != ns]
        own = next((n for n in namespaces if n["metadata"]["name"] == ns), {"metadata": {"name": ns}})
        twin_pods: list[RawObject] = []
        for twin in twins:
            twin_pods += (await client.list(PODS, twin))["items"]
        used = _gpus(twin_pods)
        grants: dict[str, Decimal] = {}
        for s in slices:
            for res, amount in ((s.get("status") or {}).get("granted") or {}).items():
                grants[res] = grants.get(res, Decimal(0)) + _q(amount)
        granted = sum(
            (_q(((s.get("status") or {}).get("granted") or {}).get(GPU)) for s in slices), Decimal(0)
        )
        auth = find_condition(status.get("conditions"), "Authenticated") or {}
        consumers.append(
            {
                "id": consumer_id,
                "tenantNamespace": ns,
                "authenticated": auth.get("status") == "True",
                "identity": {
                    "username": (status.get("identity") or {}).get("username"),
                    "notAfter": (status.get("identity") or {}).get("notAfter"),
                },
                "slices": [
                    {
                        "name": s["metadata"]["name"],
                        "phase": (s.get("status") or {}).get("phase"),
                        "requested": dict((s.get("spec") or {}).get("resources") or {}),
                        "granted": dict((s.get("status") or {}).get("granted") or {}),
                        "reason": (s.get("status") or {}).get("reason"),
                    }
                    for s in slices
                ],
                "twinNamespaces": sorted(twins),
                "gpus": {"granted": _n(granted), "used": _n(used)},
                "accelerators": _accelerators(
                    {k: format_quantity(v) for k, v in grants.items()},
                    twin_pods,
                    await _claims_of(client, twin_pods),
                ),
                "policy": {
                    k: v
                    for k, v in policy_of(tenant, own).items()
                    if k not in ("consumer", "tenantNamespace")
                },
            }
        )
    return consumers


async def collect(client: KubeClient, peer: str | None = None) -> dict[str, Any]:
    """Everything ``info`` shows, as data (what ``-o json`` prints)."""
    cluster_id = await read_cluster_id(client)
    providers, offloaded = await _consumer_side(client)
    consumers = await _provider_side(client)
    if peer is not None:
        providers = [p for p in providers if p["id"] == peer]
        consumers = [c for c in consumers if c["id"] == peer]
        if not providers and not consumers:
            raise UserError(f"no peer called {peer!r} on this cluster")
    networks = await network_rows(client)
    by_peer = {row["peer"]: row for row in networks}
    for entry in providers + consumers:
        row = by_peer.get(entry["id"])
        if row is None:
            entry["network"] = "not configured"
        else:
            entry["network"] = "up" if row["ready"] else f"down ({row['reason']}: {row['message']})"
    if peer is not None:
        networks = [row for row in networks if row["peer"] == peer]
    roles = (["consumer"] if providers else []) + (["provider"] if consumers else [])
    granted = sum((_q(p["gpus"]["granted"]) for p in providers), Decimal(0))
    used = sum((_q(p["gpus"]["used"]) for p in providers), Decimal(0))
    kueue = (
        {
            "resourceFlavors": [resource_flavor(str(p["id"])) for p in providers],
            "clusterQueue": cluster_queue(KUEUE_QUEUE, {str(p["id"]): p["granted"] for p in providers}),
        }
        if providers
        else None
    )
    return {
        "cluster": {"id": cluster_id, "server": client.base_url},
        "roles": roles,
        **({"kueue": kueue} if kueue else {}),
        "providers": providers,
        "consumers": consumers,
        "offloadedNamespaces": offloaded,
        "network": networks,
        "pool": {
            "providers": len(providers),
            "ready": len([p for p in providers if p["ready"]]),
            "gpus": {"granted": _n(granted), "used": _n(used), "free": _n(max(granted - used, Decimal(0)))},
            "accelerators": _sum_accelerators(providers),
        },
    }


def _render(data: dict[str, Any], console: Any) -> None:

    roles = " and ".join(data["roles"]) or "not peered"
    name = data["cluster"]["id"] or "(no gpuferry cluster ID)"
    console.print(f"[bold]{name}[/] ({data['cluster']['server']}): {roles}")
    if data["providers"]:
        t = fold_table(
            [
                "provider",
                "virtual node",
                "ready",
                "GPU",
                "granted",
                "used",
                "largest block",
                "accelerators (used/granted)",
                "identity until",
            ],
            title="providers (GPUs borrowed)",
        )
        for p in data["providers"]:
            t.add_row(
                p["id"],
                p["virtualNode"],
                "yes" if p["ready"] else f"no ({p['readyReason']})",
                p["gpuProduct"] or "-",
                str(p["gpus"]["granted"]),
                str(p["gpus"]["used"]),
                str(p["largestBlock"] or "-"),
                _usage(p["accelerators"]),
                str(p["identity"]["notAfter"] or "-"),
            )
        console.print(t)
        for p in data["providers"]:
            if p.get("refusedChange"):
                change = p["refusedChange"]
                console.print(
                    f"{p['id']}: the provider refused the last change to the slice "
                    f"({change.get('reason')}: {change.get('message')}); the grant above stays"
                )
        pool = data["pool"]
        console.print(
            f"GPU pool: {pool['gpus']['granted']} granted by {pool['providers']} providers "
            f"({pool['ready']} ready), {pool['gpus']['used']} in use, {pool['gpus']['free']} free"
        )
        shared = {r: a for r, a in pool["accelerators"].items() if r != GPU}
        if shared:
            console.print(f"slices and shares of GPUs (used/granted): {_usage(shared)}")
    if data["offloadedNamespaces"]:
        t = fold_table(["namespace", "strategy", "twin namespaces"], title="offloaded namespaces")
        for o in data["offloadedNamespaces"]:
            twins = ", ".join(_twin_cell(r) for r in o["remoteNamespaces"]) or "-"
            t.add_row(o["namespace"], str(o["podOffloadingStrategy"]), twins)
        console.print(t)
    if data["network"]:
        render_rows(data["network"], console)
    if data["consumers"]:
        columns = ["consumer", "authenticated", "slices", "granted", "used", "accelerators (used/granted)",
                   "twin namespaces"]  # fmt: skip
        t = fold_table(columns, title="consumers (GPUs lent)")
        for c in data["consumers"]:
            slices = ", ".join(f"{s['name']}: {s['phase']}" for s in c["slices"]) or "-"
            t.add_row(
                c["id"],
                "yes" if c["authenticated"] else "no",
                slices,
                str(c["gpus"]["granted"]),
                str(c["gpus"]["used"]),
                _usage(c["accelerators"]),
                ", ".join(c["twinNamespaces"]) or "-",
            )
        console.print(t)


async def cmd_info(args: argparse.Namespace) -> int:
    if args.peer and (len(args.peer) != 2 or args.peer[0] != "peer"):
        raise UserError("usage: gpuferry info [peer NAME]")
    peer = args.peer[1] if args.peer else None
    async with KubeClient.from_config(args.kubeconfig, context=args.context) as client:
        try:
            data = await collect(client, peer)
        except Forbidden as exc:  # e.g. a namespace's admin: info reads cluster-wide objects
            raise UserError(
                f"{exc}: `gpuferry info` reads the whole cluster's peerings, which this user may not; "
                "a namespace's offloading and its twin namespaces: `kubectl get namespaceoffloadings "
                "-n NAMESPACE -o yaml`"
            ) from None
    if args.kueue:
        if "kueue" not in data:
            raise UserError("this cluster borrows no GPUs: there is no provider to queue for")
        docs = [*data["kueue"]["resourceFlavors"], data["kueue"]["clusterQueue"]]
        print(goyaml.dump_all(docs, sort_keys=False), end="")
        return 0
    emit(data, args.output, lambda console: _render(data, console))
    return 0


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    info = sub.add_parser(
        "info",
        parents=[common],
        help="peers, roles, granted and used GPUs, virtual nodes, offloaded namespaces, the GPU pool",
        **described(
            """What this cluster takes part in, read from it alone: its cluster ID and roles; as a
            consumer, each provider with its virtual node, whether it is ready (and why not), the
            GPUs granted and in use, and the pool they make; the offloaded namespaces and their
            twins; the network fabric's tunnels; as a provider, each consumer with its slices, the
            GPUs it uses and its twin namespaces.""",
            "gpuferry info --kubeconfig consumer.yaml",
            "gpuferry info peer gpu-farm -o yaml",
            "gpuferry info --kueue | kubectl apply -f -",
        ),
    )
    info.add_argument("peer", nargs="*", metavar="peer NAME", help="only this peer: `info peer NAME`")
    add_output_argument(info)
    info.add_argument(
        "--kueue",
        action="store_true",
        help=f"print, ready for kubectl apply, a Kueue ResourceFlavor per provider (its virtual node) "
        f"and a ClusterQueue {KUEUE_QUEUE!r} whose quota is what they grant",
    )
    info.set_defaults(handler=cmd_info)
