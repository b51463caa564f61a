"""``gpuferry offload namespace`` and ``gpuferry unoffload namespace``.

Offloading a namespace on the consumer:

1. installs (idempotently) the MutatingAdmissionPolicy that makes pods of offloaded namespaces
   eligible for virtual nodes (:mod:`peering.admission`);
2. asks every peered provider (or those given with ``--provider``) for the twin namespace,
   with the consumer's own scoped identity (:func:`peering.flow.request_twin_namespace`);
3. writes the namespace's ``NamespaceOffloading`` named ``offloading`` — the policy's parameter —
   with the twin namespaces in its status.

Unoffloading removes the pods of the namespace that run on virtual nodes (their twins go first),
withdraws the twin namespaces, and deletes the ``NamespaceOffloading``; pods on local nodes are
left alone.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from typing import Any

from kube.api import PROVIDER_LABEL
from kube.clients import KubeClient
from kube.errors import NotFound
from kube.objects import (
    NAMESPACES,
    RawObject,
)

from .. import flow
from ..admission import OFFLOADING_NAME, admission_objects
from ..admissionprobe import admission_in_effect
from ..clusterid import read_cluster_id
from ..conditions import find_condition
from ..crds import ensure_crds
from ..resources import NAMESPACEOFFLOADINGS, is_system_namespace
from ..virtualnodes import VIRTUALNODES
from ..waits import wait_until
from .common import Progress, UserError, add_output_argument, delete_and_wait, described, emit, fold_table

__all__ = ["add_parsers"]


async def ensure_admission(client: KubeClient) -> None:
    for resource, body in admission_objects():
        await client.patch(
            resource,
            body["metadata"]["name"],
            body,
            patch_type="apply",
            field_manager="gpuferry-cli",
            force=True,
        )


async def wait_admission_effective(client: KubeClient, namespace: str, strategy: str, timeout: float) -> str:
    """Until the API server applies the rule to pods of ``namespace``
    (:mod:`peering.admissionprobe`; the consumer agent says Ready only then, an older one may
    not). Returns "" when seen applied, else why it could not be checked."""
    deadline = asyncio.get_running_loop().time() + timeout
    while (probe := await admission_in_effect(client, namespace, strategy)).live is False:
        if asyncio.get_running_loop().time() > deadline:
            late = f"the offloading rule is not in effect after {timeout:.0f}s"
            raise UserError(f"namespace {namespace}: {late} ({probe.detail})")
        await asyncio.sleep(0.2)
    return probe.detail if probe.live is None else ""


async def peered_providers(consumer: KubeClient, only: list[str] | None) -> list[str]:
    """Provider IDs with a VirtualNode on this consumer (restricted to ``only`` when given)."""
    found = sorted(
        vn["spec"]["providerClusterID"]
        for vn in (await consumer.list(VIRTUALNODES, flow.CONSUMER_NAMESPACE))["items"]
    )
    if only:
        unknown = sorted(set(only) - set(found))
        if unknown:
            raise UserError(f"not peered with {', '.join(unknown)} (peered: {', '.join(found) or 'none'})")
        found = [p for p in found if p in only]
    if not found:
        raise UserError("this cluster is not peered with any provider: run `gpuferry peer` first")
    return found


def offloading_object(namespace: str, args: argparse.Namespace) -> RawObject:
    """The NamespaceOffloading the CLI writes; the consumer agent does the rest. Pure."""
    spec: dict[str, Any] = {
        "podOffloadingStrategy": args.pod_offloading_strategy,
        "namespaceMappingStrategy": args.namespace_mapping_strategy,
    }
    if args.provider:
        spec["clusterSelector"] = {
            "matchExpressions": [
                {"key": PROVIDER_LABEL, "operator": "In", "values": sorted(set(args.provider))}
            ]
        }
    return {
        "apiVersion": NAMESPACEOFFLOADINGS.api_version,
        "kind": NAMESPACEOFFLOADINGS.kind,
        "metadata": {"name": OFFLOADING_NAME, "namespace": namespace},
        "spec": spec,
    }


async def _wait_offloaded(consumer: KubeClient, ns: str, generation: int, timeout: float) -> RawObject:
    def settled(obj: RawObject) -> str | None:
        status = obj.get("status") or {}
        cond = find_condition(status.get("conditions"), "Ready")
        if cond is None or cond.get("observedGeneration") != generation:
            return None
        phase = status.get("phase")
        if phase == "Ready":
            return ""
        if phase in ("SomeFailed", "AllFailed"):
            return str(cond.get("message"))
        if phase == "NoClusterSelected":
            return "no peered provider is selected"
        return None

    try:
        done: RawObject = await wait_until(
            consumer,
            NAMESPACEOFFLOADINGS,
            OFFLOADING_NAME,
            ns,
            settled,
            timeout,
            f"the offloading of namespace {ns}",
        )
        return done
    except flow.PeeringError as e:
        raise UserError(
            f"namespace {ns} cannot be offloaded: {e} (is the consumer agent running? see `gpuferry agents`)"
        ) from None


async def cmd_offload(args: argparse.Namespace) -> int:
    progress = Progress(args.quiet)
    ns = args.namespace
    if is_system_namespace(ns):  # before anything is sent: nothing to undo afterwards
        raise UserError(f"{ns} is a system namespace (kube-*, gpuferry-*, openshift-*): its pods are not "
                        "offloaded; offload the namespace your workloads run in")  # fmt: skip
    async with KubeClient.from_config(args.kubeconfig, context=args.context) as consumer:
        try:
            await consumer.get(NAMESPACES, ns)
        except NotFound:
            raise UserError(f"namespace {ns} not found on the consumer") from None
        consumer_id = await read_cluster_id(consumer)
        if consumer_id is None:
            raise UserError("this cluster is not peered with any provider: run `gpuferry peer` first")
        await peered_providers(consumer, args.provider)
        await ensure_crds(consumer)
        body = offloading_object(ns, args)
        obj = await consumer.patch(
            NAMESPACEOFFLOADINGS,
            OFFLOADING_NAME,
            body,
            ns,
            patch_type="apply",
            field_manager="gpuferry-cli",
            force=True,
        )
        progress.step(
            f"NamespaceOffloading {ns}/{OFFLOADING_NAME} applied; the consumer agent asks for twin namespaces"
        )
        try:
            done = await _wait_offloaded(
                consumer, ns, int(obj["metadata"].get("generation") or 0), args.timeout
            )
        except UserError:
            # a refused offloading leaves nothing behind: its finalizer withdraws what was asked for
            with contextlib.suppress(NotFound):
                await consumer.delete(NAMESPACEOFFLOADINGS, OFFLOADING_NAME, ns)
            raise
        remote = (done.get("status") or {}).get("remoteNamespaces") or []
        for entry in remote:
            progress.step(f"{entry['clusterID']}: twin namespace {entry.get('remoteNamespace')} ready")
        unchecked = await wait_admission_effective(consumer, ns, args.pod_offloading_strategy, args.timeout)
        if unchecked:
            progress.note(f"the offloading rule could not be checked in {ns} ({unchecked})")
        progress.step(f"namespace {ns} offloaded ({args.pod_offloading_strategy}); new pods are eligible")
    result = {
        "namespace": ns,
        "podOffloadingStrategy": args.pod_offloading_strategy,
        "namespaceMappingStrategy": args.namespace_mapping_strategy,
        "remoteNamespaces": remote,
    }

    def table(console: Any) -> None:
        t = fold_table(
            ["provider", "twin namespace"], title=f"namespace {ns} offloaded ({args.pod_offloading_strategy})"
        )
        for r in remote:
            t.add_row(r["clusterID"], r.get("remoteNamespace", "-"))
        console.print(t)

    emit(result, args.output, table)
    return 0


async def cmd_unoffload(args: argparse.Namespace) -> int:
    progress = Progress(args.quiet)
    ns = args.namespace
    async with KubeClient.from_config(args.kubeconfig, context=args.context) as consumer:
        try:
            offloading = await consumer.get(NAMESPACEOFFLOADINGS, OFFLOADING_NAME, ns)
        except NotFound:
            raise UserError(f"namespace {ns} is not offloaded") from None
        await delete_and_wait(
            consumer, NAMESPACEOFFLOADINGS, OFFLOADING_NAME, ns, timeout=args.timeout,
            deleted=lambda: progress.note(
                f"NamespaceOffloading {ns}/{OFFLOADING_NAME} deleted: the consumer agent removes the "
                "namespace's pods on virtual nodes (their twins first) and the twin namespaces"
            ),
            stuck=f"namespace {ns} is still offloaded after {args.timeout:.0f}s: is the consumer agent "
            "running? (see `gpuferry agents`)",
        )  # fmt: skip
        for entry in (offloading.get("status") or {}).get("remoteNamespaces") or []:
            progress.step(f"{entry['clusterID']}: twin namespace {entry.get('remoteNamespace')} removed")
        progress.step(f"namespace {ns} no longer offloaded")
    emit(
        {"namespace": ns, "offloaded": False},
        args.output,
        lambda console: console.print(f"namespace {ns} no longer offloaded"),
    )
    return 0


def add_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    shared = argparse.ArgumentParser(add_help=False)
    shared.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for each step (120)")
    add_output_argument(shared)
    shared.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")

    offload = sub.add_parser("offload", help="offload a namespace to the peered providers")
    what = offload.add_subparsers(dest="what", required=True, metavar="WHAT")
    ns = what.add_parser(
        "namespace",
        parents=[common, shared],
        help="make the pods of NAMESPACE eligible for virtual nodes and create its twin namespaces",
        **described(
            """Offload NAMESPACE of this (consumer) cluster: each peered provider (or those named
            with --provider) makes a twin namespace for it, and from then on every pod created in
            NAMESPACE may be scheduled on a virtual node (with --pod-offloading-strategy Remote: on
            virtual nodes only) where its requests fit, GPUs included. A pod placed there runs as a
            twin pod in the twin namespace on the provider; its status, logs and exec come back here.

            It waits until every twin namespace is ready and the API server applies the offloading
            rule in NAMESPACE. Pods created before are not moved. If a provider refuses, nothing is
            left behind and its reason is printed. Idempotent: running it again with the same flags
            shows the state. `gpuferry unoffload namespace` undoes it.""",
            "gpuferry offload namespace ml-team --kubeconfig consumer.yaml",
            "gpuferry offload namespace ml-team --pod-offloading-strategy Remote --provider gpu-farm",
        ),
    )
    ns.add_argument("namespace", metavar="NAMESPACE", help="the namespace whose pods may be offloaded")
    ns.add_argument(
        "--pod-offloading-strategy",
        choices=["LocalAndRemote", "Remote"],
        default="LocalAndRemote",
        help="LocalAndRemote (default): the scheduler may use local or virtual nodes; "
        "Remote: virtual nodes only",
    )
    ns.add_argument(
        "--namespace-mapping-strategy",
        choices=["DefaultName", "SameName"],
        default="DefaultName",
        help="twin namespace name: <namespace>-<consumer-id> (default) or the same name",
    )
    ns.add_argument(
        "--provider",
        action="append",
        metavar="ID",
        help="only these providers (default: every peered one), repeatable",
    )
    ns.set_defaults(handler=cmd_offload)

    unoffload = sub.add_parser("unoffload", help="stop offloading a namespace")
    uwhat = unoffload.add_subparsers(dest="what", required=True, metavar="WHAT")
    uns = uwhat.add_parser(
        "namespace",
        parents=[common, shared],
        help="remove its pods from virtual nodes, its twin namespaces, and its offloading",
        **described(
            """Stop offloading NAMESPACE: its pods on virtual nodes are deleted (their twins on the
            providers first), its twin namespaces withdrawn, and its NamespaceOffloading deleted.
            Pods on the cluster's own nodes are left alone; new pods (a Job's, a Deployment's) stay
            on local nodes from then on.

            It waits until the consumer agent has done all that (a twin namespace takes its provider
            5 s or more to delete).""",
            "gpuferry unoffload namespace ml-team --kubeconfig consumer.yaml",
        ),
    )
    uns.add_argument("namespace", metavar="NAMESPACE", help="an offloaded namespace of this cluster")
    uns.set_defaults(handler=cmd_unoffload)
