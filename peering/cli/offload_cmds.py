"""``gpuferry offload namespace`` and ``gpuferry unoffload namespace``.

Offloading a namespace on the consumer:

1. writes the namespace's ``NamespaceOffloading`` named ``offloading`` (the admission policy's
   parameter; restricted to ``--provider`` when given);
2. waits while the consumer agent asks each selected provider for the twin namespace and
   applies the admission policy (:mod:`peering.consumer.offloadings`), until the offloading is
   settled (:func:`peering.offloadstatus.offload_settled`): Ready, or Ready on some providers
   while the others do not answer;
3. waits until the API server applies the policy to the namespace's pods.

On failure, an offloading this command created is deleted (its finalizer withdraws what was
asked); one that was there before is left (deleting it would take its pods off the virtual nodes).

Unoffloading removes the pods of the namespace that run on virtual nodes (their twins go first),
withdraws the twin namespaces, and deletes the ``NamespaceOffloading``; pods on local nodes are
left alone.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from typing import Any

from kube.api import (
    NODE_TYPE_LABEL,
    NODE_TYPE_VIRTUAL_KUBELET,
    PROVIDER_LABEL,
    PROVIDER_UNREACHABLE_TAINT_KEY,
)
from kube.clients import KubeClient
from kube.errors import Forbidden, KubeError, NotFound
from kube.objects import (
    NAMESPACES,
    NODES,
    RawObject,
)

from .. import flow
from ..admission import OFFLOADING_NAME
from ..admissionprobe import admission_in_effect
from ..clusterid import read_cluster_id
from ..consumer.offloadings import unreachable_providers
from ..offloadstatus import Settled, offload_settled, why_waiting
from ..resources import NAMESPACEOFFLOADINGS, is_system_namespace
from ..virtualnodes import VIRTUALNODES
from ..waits import wait_until
from .common import Progress, UserError, add_output_argument, delete_and_wait, described, emit, fold_table

__all__ = ["add_parsers"]


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


async def _wait_offloaded(
    consumer: KubeClient, ns: str, generation: int, timeout: float
) -> tuple[RawObject, Settled]:
    """Until the offloading is settled (:func:`peering.offloadstatus.offload_settled`): Ready,
    or Ready on some providers while the others do not answer."""
    outcome = Settled(False)
    seen: RawObject | None = None

    def settled(obj: RawObject) -> str | None:
        nonlocal outcome, seen
        seen = obj
        found = offload_settled(obj, generation)
        if found is None:
            return None
        outcome = found
        return "" if found.ok else found.message

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
        return done, outcome
    except flow.PeeringError:
        if outcome.message:  # refused, or nothing selected
            raise UserError(f"namespace {ns} cannot be offloaded: {outcome.message}") from None
        why = why_waiting(seen, generation)
        raise UserError(
            f"the offloading of namespace {ns} is not settled after {timeout:.0f}s: {why}"
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
        try:
            consumer_id = await read_cluster_id(consumer)
            if consumer_id is None:
                raise UserError("this cluster is not peered with any provider: run `gpuferry peer` first")
            # peered: the CRDs are there (`peer` or the chart put them); applying them again here
            # would ask a cluster-wide right of whoever offloads a namespace, and a CLI older than
            # the installed gpuferry would put its older schemas back over the newer ones
            await peered_providers(consumer, args.provider)
        except Forbidden:
            # a namespace's admin (consumer.namespaceAdminsOffload) does not read gpuferry's own
            # namespace: the offloading's status says which providers take it, or why none does
            progress.note(
                f"cannot read the peerings in {flow.CONSUMER_NAMESPACE} (not allowed): the offloading's "
                "status tells which providers take it"
            )
        body = offloading_object(ns, args)
        try:
            try:
                await consumer.get(NAMESPACEOFFLOADINGS, OFFLOADING_NAME, ns)
                existed = True
            except NotFound:
                existed = False
            obj = await consumer.patch(
                NAMESPACEOFFLOADINGS,
                OFFLOADING_NAME,
                body,
                ns,
                patch_type="apply",
                field_manager="gpuferry-cli",
                force=True,
            )
        except Forbidden as exc:
            raise UserError(
                f"{exc.args[0]}: offloading {ns} takes the right to write its NamespaceOffloading, which "
                "the namespace's admins have where gpuferry is installed with "
                "consumer.namespaceAdminsOffload=true"
            ) from None
        progress.step(
            f"NamespaceOffloading {ns}/{OFFLOADING_NAME} applied; the consumer agent asks for twin namespaces"
        )
        try:
            done, outcome = await _wait_offloaded(
                consumer, ns, int(obj["metadata"].get("generation") or 0), args.timeout
            )
        except UserError as e:
            if existed:
                # offloaded before: deleting it now would take its pods off the virtual nodes
                raise UserError(
                    f"{e}; it was offloaded before and stays offloaded, as now applied: its pods "
                    f"keep running (`gpuferry unoffload namespace {ns}` undoes it)"
                ) from None
            # a refused offloading leaves nothing behind: its finalizer withdraws what was asked for
            with contextlib.suppress(NotFound):
                await consumer.delete(NAMESPACEOFFLOADINGS, OFFLOADING_NAME, ns)
            raise
        remote = (done.get("status") or {}).get("remoteNamespaces") or []
        for entry in remote:
            if entry.get("phase") == "Ready":
                progress.step(f"{entry['clusterID']}: twin namespace {entry.get('remoteNamespace')} ready")
        for provider in outcome.unreachable:
            progress.note(
                f"{provider} does not answer: its twin namespace is asked for when it answers again; "
                "meanwhile new pods may go to the providers that answer"
            )
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
            ["provider", "twin namespace", "state"],
            title=f"namespace {ns} offloaded ({args.pod_offloading_strategy})",
        )
        for r in remote:
            state = "ready" if r.get("phase") == "Ready" else f"{r.get('phase')}: {r.get('message', '')}"
            t.add_row(r["clusterID"], r.get("remoteNamespace", "-"), state)
        console.print(t)

    emit(result, args.output, table)
    return 0


def unoffload_stuck(ns: str, timeout: float, providers: list[str], down: set[str]) -> str:
    """Why namespace ``ns`` is still offloaded ``timeout`` s after its unoffload, given its
    providers and those that do not answer (``down``: their virtual nodes' taint). Pure."""
    late = f"namespace {ns} is still offloaded after {timeout:.0f}s"
    held = [p for p in providers if p in down]
    if not held:
        return f"{late}: is the consumer agent running? (see `gpuferry agents`)"
    who = f"{', '.join(held)} {'does' if len(held) == 1 else 'do'} not answer"
    return (
        f"{late}: {who} (taint {PROVIDER_UNREACHABLE_TAINT_KEY} on the virtual node); the namespace's "
        "pods there, its twin namespaces and then its offloading go when they answer again"
    )


async def cmd_unoffload(args: argparse.Namespace) -> int:
    progress = Progress(args.quiet)
    ns = args.namespace
    async with KubeClient.from_config(args.kubeconfig, context=args.context) as consumer:
        try:
            offloading = await consumer.get(NAMESPACEOFFLOADINGS, OFFLOADING_NAME, ns)
        except NotFound:
            raise UserError(f"namespace {ns} is not offloaded") from None
        try:
            await delete_and_wait(
                consumer, NAMESPACEOFFLOADINGS, OFFLOADING_NAME, ns, timeout=args.timeout,
                deleted=lambda: progress.note(
                    f"NamespaceOffloading {ns}/{OFFLOADING_NAME} deleted: the consumer agent removes the "
                    "namespace's pods on virtual nodes (their twins first) and the twin namespaces"
                ),
                stuck="",
            )  # fmt: skip
        except UserError as e:
            try:  # which of its providers do not answer, as their virtual nodes say
                listed = await consumer.list(
                    NODES, label_selector=f"{NODE_TYPE_LABEL}={NODE_TYPE_VIRTUAL_KUBELET}"
                )
                down = unreachable_providers(listed["items"])
            except KubeError:  # e.g. not allowed to list nodes: the message without them
                down = set()
            providers = [
                str(r["clusterID"]) for r in (offloading.get("status") or {}).get("remoteNamespaces") or []
            ]
            said = unoffload_stuck(ns, args.timeout, providers, down)
            raise UserError(said + str(e)) from None
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
            rule in NAMESPACE. A provider that does not answer (its virtual node tainted
            gpuferry.io/provider-unreachable) is not waited for when another is ready: it is named,
            and gets its twin namespace when it answers again. Pods created before are not moved.
            If a provider refuses, or nothing is ready in --timeout, the reason is printed and
            nothing is left behind; a namespace offloaded before stays offloaded (its pods keep
            running). Idempotent: running it again with the same flags shows the state.
            `gpuferry unoffload namespace` undoes it.""",
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
