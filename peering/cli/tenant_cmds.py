"""``gpuferry tenant``: what the provider's operator decides for one consumer (issue 16).

A consumer changes by itself only what the provider's admission policies let it
(:mod:`peering.provider.admission`); these commands write what needs the provider:

``tenant limit C --max nvidia.com/gpu=8,cpu=64``
    the most the consumer may ask for in its GPUSlice (``--unlimited`` lifts it);
``tenant approve C --selector nvidia.com/gpu.product=NVIDIA-L4``
    lets the consumer move its slice to those nodes (``--withdraw`` takes it back); its agent
    tries a refused change again every 10 s, so the move follows by itself;
``tenant accept-network C --pod-cidrs 10.244.0.0/16 --service-cidrs 10.96.0.0/16``
    the consumer CIDRs the provider's gateway routes from now on.

Each prints the tenant's policy as it now stands (``-o json|yaml`` for scripts). Run them with the
provider's kubeconfig; bad input is one ``error:`` line and nothing is written.
"""

from __future__ import annotations

import argparse
from typing import Any

from kube.clients import KubeClient
from kube.declaration import ipv4_cidrs
from kube.errors import NotFound
from kube.objects import NAMESPACES, RawObject

from ..provider.admission import APPROVED_SELECTOR_ANNOTATION, MAX_RESOURCES_ANNOTATION
from ..resources import TENANTS, tenant_namespace
from .common import UserError, add_output_argument, described, emit, fold_table, parse_pairs
from .peering_cmds import check_quantity, check_selector

__all__ = ["add_parser", "parse_cidrs", "parse_limits", "policy_of"]


def parse_limits(text: str) -> str:
    """``--max`` as the annotation's value: ``name=quantity`` pairs, comma-separated, sorted. Pure."""
    pairs = parse_pairs([p.strip() for p in text.split(",") if p.strip()], "--max")
    if not pairs:
        raise UserError("--max expects RESOURCE=QUANTITY[,...], e.g. nvidia.com/gpu=8,cpu=64")
    for name, value in pairs.items():
        check_quantity("--max", name, value)
    return ",".join(f"{k}={v}" for k, v in sorted(pairs.items()))


def parse_cidrs(text: str, flag: str) -> list[str]:
    """IPv4 network addresses, comma-separated, none overlapping another. Pure."""
    try:
        out = ipv4_cidrs(text.split(","))
    except ValueError as exc:
        raise UserError(f"{flag} {exc}") from None
    if not out:
        raise UserError(f"{flag} expects at least one CIDR, e.g. 10.244.0.0/16")
    return list(out)


def policy_of(tenant: RawObject, namespace: RawObject) -> dict[str, Any]:
    """What the provider decided for this tenant, as ``-o json`` prints it. Pure."""
    annotations = (namespace.get("metadata") or {}).get("annotations") or {}
    status = tenant.get("status") or {}
    spec = tenant.get("spec") or {}
    return {
        "consumer": spec.get("consumerClusterID"),
        "tenantNamespace": (namespace.get("metadata") or {}).get("name"),
        "maxResources": annotations.get(MAX_RESOURCES_ANNOTATION),
        "approvedNodeSelector": annotations.get(APPROVED_SELECTOR_ANNOTATION),
        "acceptedNetwork": status.get("acceptedNetwork"),
        "podSecurity": spec.get("podSecurity", "baseline"),
        "maxTwinNamespaces": spec.get("maxTwinNamespaces", 64),
    }


async def _tenant(client: KubeClient, consumer_id: str) -> tuple[RawObject, RawObject]:
    ns = tenant_namespace(consumer_id)
    try:
        return await client.get(TENANTS, consumer_id, ns), await client.get(NAMESPACES, ns)
    except NotFound:
        raise UserError(
            f"no tenant {consumer_id} on this cluster (is it the provider? `gpuferry info` lists consumers)"
        ) from None


async def _annotate(client: KubeClient, consumer_id: str, key: str, value: str | None) -> RawObject:
    return await client.patch(
        NAMESPACES, tenant_namespace(consumer_id), {"metadata": {"annotations": {key: value}}}
    )


async def cmd_tenant(args: argparse.Namespace) -> int:
    if args.action == "limit":
        if bool(args.max) == bool(args.unlimited):
            raise UserError("say the limit: --max RESOURCE=QUANTITY[,...], or --unlimited")
        value = None if args.unlimited else parse_limits(args.max)
    elif args.action == "approve":
        if bool(args.selector) == bool(args.withdraw):
            raise UserError("say which nodes: --selector LABEL=VALUE (repeatable), or --withdraw")
        selector = check_selector(parse_pairs(args.selector, "--selector"))
        value = None if args.withdraw else ",".join(f"{k}={v}" for k, v in sorted(selector.items()))
    else:
        network = {"podCIDRs": parse_cidrs(args.pod_cidrs or "", "--pod-cidrs"),
                   "serviceCIDRs": parse_cidrs(args.service_cidrs or "", "--service-cidrs")}  # fmt: skip
    async with KubeClient.from_config(args.kubeconfig, context=args.context) as client:
        tenant, namespace = await _tenant(client, args.consumer)
        if args.action == "limit":
            namespace = await _annotate(client, args.consumer, MAX_RESOURCES_ANNOTATION, value)
        elif args.action == "approve":
            namespace = await _annotate(client, args.consumer, APPROVED_SELECTOR_ANNOTATION, value)
        else:
            tenant = await client.patch(TENANTS, args.consumer, {"status": {"acceptedNetwork": network}},
                                        tenant_namespace(args.consumer), subresource="status")  # fmt: skip
    policy = policy_of(tenant, namespace)

    def table(console: Any) -> None:
        view = fold_table(["", ""], title=f"tenant {policy['consumer']} ({policy['tenantNamespace']})",
                          show_header=False)  # fmt: skip
        accepted = policy["acceptedNetwork"] or {}
        rows = [
            ("may ask for at most", policy["maxResources"] or "no limit"),
            ("may move its slice to", policy["approvedNodeSelector"] or "no other nodes"),
            ("CIDRs routed", ", ".join([*accepted.get("podCIDRs", []), *accepted.get("serviceCIDRs", [])])
             or "none accepted yet"),
            ("Pod Security", policy["podSecurity"]),
            ("twin namespaces at most", str(policy["maxTwinNamespaces"])),
        ]  # fmt: skip
        for row in rows:
            view.add_row(*row)
        console.print(view)

    emit(policy, args.output, table)
    return 0


DESCRIPTION = """\
What the provider's operator decides for one consumer. A consumer changes by itself only how much
it asks for (up to its limit) and its gateway key; the rest needs the provider:

  gpuferry tenant limit C --max nvidia.com/gpu=8,cpu=64      the most C may ask for (--unlimited)
  gpuferry tenant approve C --selector nvidia.com/gpu.product=NVIDIA-L4
                                  lets C move its slice to those nodes (--withdraw takes it back);
                                  its agent tries a refused change again every 10 s
  gpuferry tenant accept-network C --pod-cidrs 10.244.0.0/16 --service-cidrs 10.96.0.0/16
                                  the CIDRs of C this provider's gateway routes from now on

Run with the provider's kubeconfig. Each prints the tenant's policy as it now stands."""


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    tenant = sub.add_parser(
        "tenant",
        help="provider side: what a consumer may ask for, and approvals of what it may not change itself",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = tenant.add_subparsers(dest="action", required=True, metavar="ACTION")
    out = argparse.ArgumentParser(add_help=False)
    out.add_argument("consumer", metavar="CONSUMER", help="the consumer's cluster ID (`gpuferry info`)")
    add_output_argument(out)
    limit = actions.add_parser(
        "limit",
        parents=[common, out],
        help="the most the consumer may ask for",
        **described(
            """The most CONSUMER may ask for, resource by resource; a peering or change beyond it is
            refused with the limit in the reason. Run with the provider's kubeconfig.""",
            "gpuferry tenant limit ml-eu --max nvidia.com/gpu=8,cpu=64 --kubeconfig provider.yaml",
            "gpuferry tenant limit ml-eu --unlimited --kubeconfig provider.yaml",
        ),
    )
    limit.add_argument("--max", metavar="RESOURCE=QUANTITY[,...]", help="e.g. nvidia.com/gpu=8,cpu=64")
    limit.add_argument("--unlimited", action="store_true", help="lift the limit")
    approve = actions.add_parser(
        "approve",
        parents=[common, out],
        help="let the consumer move its slice to other nodes",
        **described(
            """Let CONSUMER move its slice to the provider nodes with these labels (a GPU product),
            which it may not do by itself; its agent tries a refused change again every 10 s, so an
            approval takes effect within seconds. --withdraw takes the approval back.""",
            "gpuferry tenant approve ml-eu --selector nvidia.com/gpu.product=NVIDIA-L4 "
            "--kubeconfig provider.yaml",
        ),
    )
    approve.add_argument(
        "--selector", action="append", metavar="LABEL=VALUE", help="the nodes it may move to, repeatable"
    )
    approve.add_argument("--withdraw", action="store_true", help="take the approval back")
    accept = actions.add_parser(
        "accept-network",
        parents=[common, out],
        help="the consumer CIDRs this provider's gateway routes",
        **described(
            """The pod and service CIDRs of CONSUMER that this provider's gateway routes from now
            on (a consumer cannot widen them by itself).""",
            "gpuferry tenant accept-network ml-eu --pod-cidrs 10.244.0.0/16 --service-cidrs 10.96.0.0/16 "
            "--kubeconfig provider.yaml",
        ),
    )
    accept.add_argument("--pod-cidrs", metavar="CIDR[,CIDR]", required=True, help="the consumer's pod CIDRs")
    accept.add_argument(
        "--service-cidrs", metavar="CIDR[,CIDR]", required=True, help="the consumer's service CIDRs"
    )
    tenant.set_defaults(handler=cmd_tenant)
