"""``gpuferry install`` and ``gpuferry uninstall``: the chart, through the ``helm`` binary.

``install`` finds helm and the chart, settles the cluster ID (the one the cluster already has,
the one given, or one derived from the kubeconfig context), runs ``helm upgrade --install`` with
the values it knows plus the user's (``-f``, ``--set``), over those of the last install (an
upgrade keeps what was set before, as ``helm upgrade --reset-then-reuse-values`` would; not with
``--reset-values``), then waits until every component's
Deployment is available, saying which are, and stops at the first pod that cannot start with why
(an image not on the node, a crash loop and its last words, no node for it).

``uninstall`` refuses while the cluster still peers (``gpuferry unpeer`` first, or ``--force``),
then uninstalls the release and deletes its namespace; with ``--crds`` the CRDs go too.

Plain ``helm install`` with values works as well (see the chart's README); this is the short way.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import glob
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from kube import goyaml
from kube.api import SYSTEM_NAMESPACE
from kube.clients import KubeClient
from kube.declaration import DECLARATION_NAME, DECLARATION_NAMESPACE, ipv4_cidrs
from kube.errors import KubeError, NotFound
from kube.informers import Informer
from kube.objects import (
    CLUSTERROLEBINDINGS,
    CONFIGMAPS,
    CRDS,
    DAEMONSETS,
    DEPLOYMENTS,
    FOREIGNCLUSTERS,
    NAMESPACES,
    NODES,
    PODS,
    SERVICECIDRS,
    TENANTS,
    VIRTUALNODES,
    RawObject,
)
from kube.settings import cache_dir

from .. import netdiscovery
from ..admission import admission_objects
from ..clusterid import CLUSTER_ID_CONFIGMAP, ClusterIDError, choose_cluster_id, read_cluster_id
from ..crds import ensure_crds, load_crds
from ..helmrelease import (
    RELEASE,
    RELEASE_NAME,
    ROLES,
    ReleaseState,
    configmap_as_was,
    dropped_in_use,
    flat_keys,
    helm_ownership,
    peers_by_role,
    pending_message,
    release_state,
    set_keys,
    upgrade_failed,
    values_arguments,
    without_helm_ownership,
    without_long_quotes,
)
from ..kubeletworkload import COMPONENT
from ..podtrouble import IMAGE_TROUBLE, pod_trouble
from ..waits import wait_all_gone, wait_gone
from .common import (
    Progress,
    UserError,
    add_output_argument,
    described,
    emit,
    fold_table,
    kubeconfig_context_name,
)

__all__ = [
    "add_install_arguments",
    "add_uninstall_parser",
    "chart_dir",
    "cmd_install",
    "find_helm",
    "helm_values",
    "installation_state",
]


def chart_dir() -> Path:
    """``$GPUFERRY_CHART_DIR``, else ``peering/chart``: a link to ``charts/gpuferry`` in the
    source tree, the chart itself in the wheel."""
    if env := os.environ.get("GPUFERRY_CHART_DIR"):
        return Path(env)
    return Path(__file__).parents[1] / "chart"


def _version_key(path: str) -> tuple[int, ...]:
    """``…/helm-v3.21.4/bin/helm`` -> (3, 21, 4). Pure."""
    folder = Path(path).parent.parent.name
    return tuple(int(n) for n in re.findall(r"\d+", folder))


def find_helm(flag: str | None) -> str:
    """``--helm``, ``$GPUFERRY_HELM``, ``helm`` on PATH, or the one ``make build-k8s`` built."""
    for candidate in (flag, os.environ.get("GPUFERRY_HELM")):
        if candidate:
            if not (Path(candidate).is_file() and os.access(candidate, os.X_OK)):
                raise UserError(f"helm binary {candidate} is not an executable file")
            return candidate
    if on_path := shutil.which("helm"):
        return on_path
    cache = cache_dir()
    built = sorted(glob.glob(str(cache / "helm-*" / "bin" / "helm")), key=_version_key)
    if built:
        return built[-1]  # the newest: helm-v3.21.4 after helm-v3.9.0, which a text sort puts last
    raise UserError(
        "no helm binary: give --helm PATH, set $GPUFERRY_HELM, put helm on PATH, "
        "or build one with `make build-k8s`"
    )


def helm_values(
    *,
    cluster_id: str,
    roles: Sequence[str],
    replicas: int | None,
    image: str | None,
    pull_policy: str | None,
    networking: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The values ``install``'s flags set: they win over the user's ``-f`` files, ``--set``
    wins over them. Pure."""
    values: dict[str, Any] = {"clusterID": cluster_id}
    if networking:
        values["networking"] = dict(networking)
    for role in ROLES:
        values[role] = {"enabled": role in roles}
        if replicas is not None and role in roles:
            values[role]["replicas"] = replicas
    image_values: dict[str, Any] = {}
    if image:
        repository, sep, tag = image.rpartition(":")
        if not sep or "/" in tag:  # no tag (a registry port is not a tag)
            repository, tag = image, ""
        image_values["repository"] = repository
        if tag:
            image_values["tag"] = tag
    if pull_policy:
        image_values["pullPolicy"] = pull_policy
    if image_values:
        values["image"] = image_values
    return values


def _rolled_out(workload: RawObject) -> bool:
    """kubectl rollout status's test: the current generation observed, every replica (or every
    node's pod, for a DaemonSet) updated and available."""
    status = workload.get("status") or {}
    if status.get("observedGeneration") != workload["metadata"].get("generation"):
        return False
    if "desiredNumberScheduled" in status:  # a DaemonSet
        want = status.get("desiredNumberScheduled") or 0
        updated, ready = status.get("updatedNumberScheduled") or 0, status.get("numberAvailable") or 0
        return bool(updated >= want and ready >= want)
    want = (workload.get("spec") or {}).get("replicas", 1)
    updated = status.get("updatedReplicas") or 0
    return bool(
        updated >= want
        and (status.get("replicas") or 0) <= updated
        and (status.get("availableReplicas") or 0) >= updated
    )


def installation_state(
    workloads: Sequence[RawObject], pods: Sequence[RawObject]
) -> tuple[list[str], list[str], str | None]:
    """(rolled out, not yet, the first pod trouble that will not fix itself or None), for the
    Deployments and DaemonSets given. Pure."""
    available: list[str] = []
    waiting: list[str] = []
    for workload in workloads:
        (available if _rolled_out(workload) else waiting).append(workload["metadata"]["name"])
    for pod in pods:
        if pod["metadata"].get("deletionTimestamp"):
            continue
        trouble = pod_trouble(pod)
        if trouble is not None and (trouble.reason in IMAGE_TROUBLE or trouble.reason == "Crashed"):
            return available, waiting, trouble.message
    return available, waiting, None


def _readiness(workload: RawObject) -> tuple[int, int]:
    status = workload.get("status") or {}
    if "desiredNumberScheduled" in status:
        return status.get("numberReady") or 0, status.get("desiredNumberScheduled") or 0
    return status.get("readyReplicas") or 0, (workload.get("spec") or {}).get("replicas", 1)


def _helm(helm: str, kubeconfig: str | None, context: str | None, *args: str, timeout: float) -> str:
    cmd = [helm, *args]
    if kubeconfig:
        cmd += ["--kubeconfig", kubeconfig]
    if context:
        cmd += ["--kube-context", context]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise UserError(f"helm {args[0]} did not finish in {timeout:.0f}s") from None
    except OSError as exc:
        raise UserError(f"cannot run {helm}: {exc}") from None
    if proc.returncode != 0:
        said = " ".join((proc.stderr or proc.stdout).strip().splitlines()[-3:])
        raise UserError(f"helm {args[0]} failed: {without_long_quotes(said)}")
    return proc.stdout


async def _cluster_id(client: KubeClient, args: argparse.Namespace) -> str:
    """As ``peer`` settles it, without recording it: the chart's ConfigMap does."""
    fallback = kubeconfig_context_name(args.kubeconfig, args.context)
    try:
        return choose_cluster_id(await read_cluster_id(client), args.cluster_id, fallback)
    except ClusterIDError as exc:
        raise UserError(str(exc)) from None


async def _wait_ready(
    client: KubeClient, namespace: str, timeout: float, progress: Progress
) -> list[dict[str, Any]]:
    """Until every gpuferry Deployment is rolled out (see :func:`installation_state`), watching
    them and their pods; UserError at the first pod that cannot start, or after ``timeout``."""
    ours = "app.kubernetes.io/name=gpuferry"
    deployments = Informer(client, DEPLOYMENTS, namespace=namespace, label_selector=ours)
    daemonsets = Informer(client, DAEMONSETS, namespace=namespace, label_selector=ours)
    pods = Informer(client, PODS, namespace=namespace, label_selector=ours)
    informers = (deployments, daemonsets, pods)
    changed = asyncio.Event()
    for informer in informers:
        informer.add_handler(lambda _change: changed.set())
    tasks = [asyncio.create_task(i.run(), name=f"install-wait {i.name}") for i in informers]
    said: set[str] = set()
    waiting: list[str] = []

    async def settle() -> list[dict[str, Any]]:
        nonlocal waiting
        await asyncio.gather(*(i.synced.wait() for i in informers))
        while True:
            kinds = {d["metadata"]["name"]: "Deployment" for d in deployments.values()}
            kinds.update({d["metadata"]["name"]: "DaemonSet" for d in daemonsets.values()})
            workloads = deployments.values() + daemonsets.values()
            available, waiting, trouble = installation_state(workloads, pods.values())
            for name in available:
                if name not in said:
                    progress.step(f"{kinds.get(name, 'Deployment')} {name} available")
                    said.add(name)
            if trouble:
                raise UserError(f"gpuferry cannot start: {trouble}")
            if len(deployments) and not waiting:
                return [
                    {"name": w["metadata"]["name"], "kind": kinds[w["metadata"]["name"]],
                     "ready": _readiness(w)[0], "replicas": _readiness(w)[1]}
                    for w in workloads
                ]  # fmt: skip
            changed.clear()
            await changed.wait()

    try:
        async with asyncio.timeout(timeout):
            return await settle()
    except TimeoutError:
        raise UserError(
            f"not available after {timeout:.0f}s: {', '.join(waiting) or 'no Deployment yet'} "
            f"(kubectl -n {namespace} describe pods)"
        ) from None
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _adopt(
    client: KubeClient, name: str, namespace: str, release_namespace: str, drop: Sequence[str] = ()
) -> RawObject | None:
    """Give a ConfigMap that exists outside any release to ours (helm's ownership label and
    annotations; helm alone refuses to take it over), without the keys ``drop`` (helm's merge
    would keep keys the chart does not render); the ConfigMap as it was when it did, else None."""
    try:
        cm = await client.get(CONFIGMAPS, name, namespace)
    except NotFound:
        return None
    if (cm["metadata"].get("annotations") or {}).get(RELEASE_NAME) == RELEASE:
        return None
    patch: dict[str, Any] = {"metadata": helm_ownership(release_namespace)}
    if drop:
        patch["data"] = dict.fromkeys(drop)
    await client.patch(CONFIGMAPS, name, patch, namespace)
    return cm


async def _adopt_cluster_id(client: KubeClient, namespace: str, progress: Progress) -> RawObject | None:
    """A cluster peered before it was installed has the cluster-ID ConfigMap that ``peer`` made,
    which the chart makes too: it is given to the release, keeping its data."""
    if adopted := await _adopt(client, CLUSTER_ID_CONFIGMAP, namespace, namespace):
        where = f"{namespace}/{CLUSTER_ID_CONFIGMAP}"
        progress.step(f"ConfigMap {where}, made by an earlier peer, given to the release")
    return adopted


def user_network_values(files: Sequence[str] | None, pairs: Sequence[str] | None) -> dict[str, Any]:
    """What the user's ``-f`` files and ``--set`` say of ``networking`` (flat keys such as
    ``podCIDRs``, ``endpoint.address``, ``enabled``): those are not discovered."""
    said: dict[str, Any] = {}
    for path in files or ():
        try:
            loaded = yaml.safe_load(Path(path).read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise UserError(f"cannot read the values file {path}: {exc}") from None
        net = loaded.get("networking") if isinstance(loaded, dict) else None
        if isinstance(net, dict):
            for key, value in net.items():
                if isinstance(value, dict):
                    said.update({f"{key}.{k}": v for k, v in value.items()})
                else:
                    said[key] = value
    for pair in pairs or ():
        key, _, value = pair.partition("=")
        if key.startswith("networking."):
            said[key.removeprefix("networking.")] = value
    return said


def _cidr_flags(texts: Sequence[str] | None, flag: str) -> list[str]:
    try:
        return list(ipv4_cidrs(texts or ()))
    except ValueError as exc:
        raise UserError(f"{flag} {exc}") from None


async def _network_values(
    client: KubeClient, args: argparse.Namespace, roles: Sequence[str], progress: Progress
) -> dict[str, Any]:
    """The chart's ``networking`` values the user did not give, found in the cluster."""
    said = user_network_values(args.values, args.set)
    if args.no_network or str(said.get("enabled", "true")).lower() == "false":
        progress.step("network fabric: off (peer with --no-network)")
        return {"enabled": False}
    pods = _cidr_flags(args.pod_cidr, "--pod-cidr")
    services = _cidr_flags(args.service_cidr, "--service-cidr")
    endpoint = args.endpoint_address
    how: list[str] = []
    try:
        declared = (await client.get(CONFIGMAPS, DECLARATION_NAME, DECLARATION_NAMESPACE)).get("data") or {}
    except NotFound:
        declared = {}
    where = f"{DECLARATION_NAMESPACE}/{DECLARATION_NAME}"
    if not pods and "podCIDRs" not in said:
        if declared.get("podCIDRs"):
            pods, source = [c.strip() for c in declared["podCIDRs"].split(",") if c.strip()], where
        else:
            pods, source = netdiscovery.pod_cidrs((await client.list(NODES))["items"]), "the nodes' pod CIDRs"
        if not pods:
            raise UserError("cannot find this cluster's pod CIDRs (no node has spec.podCIDRs): give "
                            "--pod-cidr CIDR, or --no-network")  # fmt: skip
        how.append(f"pod CIDRs {', '.join(pods)} (from {source})")
    if not services and "serviceCIDRs" not in said:
        if declared.get("serviceCIDRs"):
            services = [c.strip() for c in declared["serviceCIDRs"].split(",") if c.strip()]
            source = where
        else:
            try:
                services = netdiscovery.service_cidrs((await client.list(SERVICECIDRS))["items"])
            except NotFound:  # before Kubernetes 1.33
                services = []
            source = "the ServiceCIDRs"
        if not services:
            raise UserError("cannot find this cluster's service CIDRs (no ServiceCIDR object): give "
                            "--service-cidr CIDR, or --no-network")  # fmt: skip
        how.append(f"service CIDRs {', '.join(services)} (from {source})")
    if "provider" in roles and not endpoint and "endpoint.address" not in said:
        # an address declared for gateway processes on a machine (gatewayNetns) is not the gateway pod's
        if declared.get("endpointAddress") and not declared.get("gatewayNetns"):
            endpoint, source = declared["endpointAddress"], where
        else:
            endpoint, source = netdiscovery.endpoint_address((await client.list(NODES))["items"]), "a node"
        if not endpoint:
            raise UserError("cannot find an address where consumers reach this provider's gateway (no "
                            "Ready node with an address): give --endpoint-address")  # fmt: skip
        how.append(f"gateway endpoint {endpoint} (from {source})")
    for line in how:
        progress.step(f"network fabric: {line}")
    values: dict[str, Any] = {"enabled": True}
    if pods:
        values["podCIDRs"] = pods
    if services:
        values["serviceCIDRs"] = services
    if endpoint:
        values["endpoint"] = {"address": endpoint}
    return values


async def _adopt_declaration(client: KubeClient, namespace: str, progress: Progress) -> RawObject | None:
    """A network declaration written by hand (or by hack/) is given to the release, which
    renders it from values from now on (its CIDRs and address were read into them)."""
    # where gateway processes ran on a machine: the chart's gateway pod replaces them
    machine_keys = ("gatewayNetns", "gatewayIP")
    if adopted := await _adopt(client, DECLARATION_NAME, DECLARATION_NAMESPACE, namespace, drop=machine_keys):
        progress.step(f"ConfigMap {DECLARATION_NAMESPACE}/{DECLARATION_NAME}, made by hand, given to the "
                      "release (its CIDRs are kept)")  # fmt: skip
    return adopted


async def _upgrade_from(
    client: KubeClient, helm: str, args: argparse.Namespace, roles: Sequence[str], state: ReleaseState
) -> dict[str, Any]:
    """The values to keep of an installed release in ``state``; UserError, before anything is
    changed, where it is half-way through another operation or would drop a role peers use
    (unless --force)."""
    unchanged = " (nothing was changed on the cluster)"
    if state.pending is not None and not args.force:
        raise UserError(pending_message(state, args.namespace) + unchanged)
    before = {} if state.deployed is None else await asyncio.to_thread(_values_of, helm, args, state.deployed)
    had = [r for r in ROLES if (before.get(r) or {}).get("enabled")]
    dropped = dropped_in_use(had, roles, await _peers_by_role(client))
    if dropped and not args.force:
        raise UserError(dropped + unchanged)
    return {} if args.reset_values else before


def _history(helm: str, args: argparse.Namespace) -> ReleaseState | None:
    """The release's :class:`ReleaseState`; None where helm has no such release. Any other failure
    (the cluster unreachable, no right to read helm's Secrets) is an error, not a first install."""
    try:
        out = _helm(helm, args.kubeconfig, args.context, "history", RELEASE, "-n", args.namespace,
                    "-o", "json", "--max", "256", timeout=args.timeout)  # fmt: skip
    except UserError as exc:
        if "release: not found" in str(exc):
            return None
        raise
    history = json.loads(out or "[]")
    return release_state(history if isinstance(history, list) else [])


def _values_of(helm: str, args: argparse.Namespace, revision: int) -> dict[str, Any]:
    """The values revision ``revision`` was given (``-f``, ``--set``, and install's own), as
    ``helm get values`` says: not the chart's defaults."""
    out = _helm(helm, args.kubeconfig, args.context, "get", "values", RELEASE, "-n", args.namespace,
                "-o", "json", "--revision", str(revision), timeout=args.timeout)  # fmt: skip
    given = json.loads(out or "null")
    return given if isinstance(given, dict) else {}


async def _clear_pending(client: KubeClient, helm: str, args: argparse.Namespace, state: ReleaseState) -> str:
    """With --force: the unfinished operation cleared, as :func:`pending_message` says. An
    interrupted first install had taken over the cluster-ID ConfigMap and the network declaration:
    they outlive its removal, as they were. Says what was done."""
    common = ("-n", args.namespace, "--wait", "--timeout", f"{int(args.timeout)}s")
    if state.deployed is not None:
        await asyncio.to_thread(_helm, helm, args.kubeconfig, args.context, "rollback", RELEASE,
                                str(state.deployed), *common, timeout=args.timeout + 30)  # fmt: skip
        return f"the interrupted operation rolled back to revision {state.deployed}"
    taken = []
    ours = ((CLUSTER_ID_CONFIGMAP, args.namespace), (DECLARATION_NAME, DECLARATION_NAMESPACE))
    for name, namespace in ours:
        with contextlib.suppress(NotFound):
            taken.append(await client.get(CONFIGMAPS, name, namespace))
    await asyncio.to_thread(_helm, helm, args.kubeconfig, args.context, "uninstall", RELEASE, *common,
                            timeout=args.timeout + 30)  # fmt: skip
    kept = []
    for cm in taken:
        again = without_helm_ownership(configmap_as_was(cm))
        name, namespace = again["metadata"]["name"], again["metadata"]["namespace"]
        try:
            await client.get(CONFIGMAPS, name, namespace)  # not the release's: not removed with it
        except NotFound:
            await client.create(CONFIGMAPS, again, namespace)
            kept.append(f"{namespace}/{name}")
    return "the interrupted first install removed" + (f" (ConfigMaps {', '.join(kept)} kept)" if kept else "")


def _given_keys(ours: Mapping[str, Any], files: Sequence[str], sets: Sequence[str]) -> set[str]:
    """The keys this install gives: its own values', its ``-f`` files' (one that does not read is
    left to helm, which says why), its ``--set``'s."""
    keys = set(flat_keys(ours)) | set_keys(sets)
    for path in files:
        with contextlib.suppress(OSError, yaml.YAMLError):
            loaded = yaml.safe_load(Path(path).read_text())
            keys |= set(flat_keys(loaded)) if isinstance(loaded, Mapping) else set()
    return keys


def keep_manifest(obj: RawObject, now: float | None = None) -> Path:
    """``obj`` written as YAML under ``$GPUFERRY_CACHE/install/`` (a new file each time), for
    ``kubectl create -f``: what an undo could not put back is not lost."""
    cache = cache_dir()
    meta = obj["metadata"]
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(now))
    path = cache / "install" / f"{obj['kind'].lower()}-{meta['namespace']}-{meta['name']}-{stamp}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(goyaml.dump(obj))
    return path


async def _undo_first_install(
    client: KubeClient, helm: str, args: argparse.Namespace, adopted: Sequence[RawObject]
) -> str:
    """A first install that helm did not finish, undone: its release uninstalled (which deletes
    what it had made, and the ConfigMaps given to it), those ConfigMaps made again as they were.
    Says what was done; a ConfigMap that could not be made again is saved to a file, named."""
    try:
        await asyncio.to_thread(
            _helm, helm, args.kubeconfig, args.context, "uninstall", RELEASE, "-n", args.namespace,
            "--wait", timeout=args.timeout,
        )  # fmt: skip
    except UserError as exc:
        if "not found" not in str(exc):
            return f"not undone ({exc}): `gpuferry uninstall --force` removes what it made"
    said = ["undone: the release removed"]
    for cm in adopted:
        again = configmap_as_was(cm)
        name, namespace = again["metadata"]["name"], again["metadata"]["namespace"]
        try:
            with contextlib.suppress(NotFound):
                await client.delete(CONFIGMAPS, name, namespace)
            await client.create(CONFIGMAPS, again, namespace)
        except KubeError as exc:  # told with helm's error, not in place of it
            kept = keep_manifest(again)
            said.append(f"ConfigMap {namespace}/{name} NOT made again ({exc}): it is saved in {kept} "
                        f"(`kubectl create -f {kept}` makes it again)")  # fmt: skip
        else:
            said.append(f"ConfigMap {namespace}/{name} as it was")
    return ", ".join(said)


async def _render(
    helm: str, chart_args: Sequence[str], version: str | None, timeout: float, hint: str = ""
) -> None:
    """``helm template`` with the values ``install`` will use, for Kubernetes ``version``: the
    chart's schema and templates refuse bad values here, before anything is changed."""
    kube_version = ["--kube-version", version] if version else []
    try:
        await asyncio.to_thread(
            _helm, helm, None, None, "template", *chart_args, *kube_version, timeout=timeout
        )
    except UserError as exc:
        raise UserError(f"{exc} (nothing was changed on the cluster){hint}") from None


async def cmd_install(args: argparse.Namespace) -> int:
    roles = list(ROLES) if args.role == "both" else [args.role]
    progress = Progress(args.quiet)  # on stderr: stdout stays machine-readable
    helm = find_helm(args.helm)
    chart = chart_dir()
    if not (chart / "Chart.yaml").is_file():
        raise UserError(f"no chart at {chart} (set $GPUFERRY_CHART_DIR)")
    async with KubeClient.from_config(args.kubeconfig, context=args.context) as client:
        version = (await client.server_version()).get("gitVersion")
        progress.step(f"cluster {client.base_url} (Kubernetes {version})")
        cluster_id = await _cluster_id(client, args)
        networking = await _network_values(client, args, roles, progress)
        values = helm_values(
            cluster_id=cluster_id,
            roles=roles,
            replicas=args.replicas,
            image=args.image,
            pull_policy=args.pull_policy,
            networking=networking,
        )
        found = await asyncio.to_thread(_history, helm, args)
        first, state = found is None, found or ReleaseState()
        before = {} if first else await _upgrade_from(client, helm, args, roles, state)
        if kept := sorted(set(flat_keys(before)) - _given_keys(values, args.values or (), args.set or ())):
            said = f"kept from revision {state.deployed} (--reset-values drops them): {', '.join(kept)}"
            progress.step(said)
        with tempfile.TemporaryDirectory(prefix="gpuferry-values-") as tmp:
            ours, last = Path(tmp, "values.yaml"), Path(tmp, "last-values.yaml")
            for path, content in ((ours, values), (last, before)):
                path.write_text(goyaml.dump(content))  # Go's YAML: a tag such as 0e5363800296 stays a string
            given = values_arguments(last=str(last) if before else None, files=args.values or (),
                                     ours=str(ours), sets=args.set or ())  # fmt: skip
            chart_args = [RELEASE, str(chart), "-n", args.namespace, *given]
            # rendered first, which checks the values against the chart's schema: values it refuses
            # change nothing on the cluster (the adoptions below drop keys from a declaration)
            hint = "; values kept from the last install are in it (--reset-values drops them)"
            await _render(helm, chart_args, version, args.timeout, hint if before else "")
            progress.step("values checked: the chart renders with them")
            # helm installs crds/ only on a first install and never upgrades them: applied here,
            # so that an upgrade brings the new schemas (server-side apply: a no-op when unchanged)
            crds = await ensure_crds(client, load_crds(chart / "crds"), timeout=min(args.timeout, 120.0),
                                     warn=progress.warn)  # fmt: skip
            progress.step(crds.summary("CRDs applied"))
            if state.pending is not None:  # --force; after the checks above, which change nothing
                progress.step(await _clear_pending(client, helm, args, state))
                first = state.deployed is None
            adopted = [await _adopt_cluster_id(client, args.namespace, progress)]
            if networking.get("enabled"):
                adopted.append(await _adopt_declaration(client, args.namespace, progress))
            try:
                out = await asyncio.to_thread(
                    _helm, helm, args.kubeconfig, args.context, "upgrade", "--install", *chart_args,
                    "--create-namespace", timeout=args.timeout,
                )  # fmt: skip
            except UserError as exc:
                if not first:  # helm keeps the last good revision; the objects it changed stay
                    raise UserError(upgrade_failed(str(exc), state, args.namespace)) from None
                undone = await _undo_first_install(client, helm, args, [a for a in adopted if a])
                raise UserError(f"{exc}; {undone}") from None
        revision = next(
            (line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("REVISION:")), "?"
        )
        progress.step(
            f"helm release {RELEASE} revision {revision} in {args.namespace}: "
            f"{' and '.join(roles)} of cluster {cluster_id}"
        )
        components = await _wait_ready(client, args.namespace, args.timeout, progress)
    data = {
        "clusterID": cluster_id,
        "roles": roles,
        "namespace": args.namespace,
        "release": RELEASE,
        "revision": revision,
        "components": components,
        "network": networking,
        "keptValues": kept,
    }

    def table(console: Any) -> None:
        t = fold_table(
            ["COMPONENT", "READY"], title=f"gpuferry installed: cluster {cluster_id} ({', '.join(roles)})"
        )
        for c in components:
            t.add_row(c["name"], f"{c['ready']}/{c['replicas']}")
        console.print(t)
        if "consumer" in roles:
            console.print(
                "next: gpuferry peer --kubeconfig <this> --remote-kubeconfig <provider>"
                + ("" if networking.get("enabled") else " --no-network")
            )

    emit(data, args.output, table)
    return 0


async def _peering_objects(client: KubeClient) -> tuple[list[RawObject], list[RawObject]]:
    """The cluster's ForeignClusters and Tenants: its peerings, either side (a kind whose CRD is
    missing has none; a 403 is an error, not "none")."""
    listed: list[list[RawObject]] = []
    for resource in (FOREIGNCLUSTERS, TENANTS):
        try:
            listed.append((await client.list(resource))["items"])
        except NotFound:
            listed.append([])
    return listed[0], listed[1]


async def _peers_by_role(client: KubeClient) -> dict[str, list[str]]:
    """:func:`peers_by_role` of the cluster."""
    return peers_by_role(*await _peering_objects(client))


async def _peerings(client: KubeClient) -> list[str]:
    """Each peering object of the cluster, as ``Kind name``."""
    foreign_clusters, tenants = await _peering_objects(client)
    return [f"ForeignCluster {o['metadata']['name']}" for o in foreign_clusters] + [
        f"Tenant {o['metadata']['name']}" for o in tenants
    ]


async def cmd_uninstall(args: argparse.Namespace) -> int:
    progress = Progress(args.quiet)
    helm = find_helm(args.helm)
    async with KubeClient.from_config(args.kubeconfig, context=args.context) as client:
        peerings = await _peerings(client)
        if peerings and not args.force:
            raise UserError(
                f"this cluster still peers ({', '.join(peerings)}): run gpuferry unpeer first, "
                "or uninstall with --force"
            )
        releases = await asyncio.to_thread(
            _helm, helm, args.kubeconfig, args.context, "list", "-n", args.namespace, "-q", timeout=60
        )
        if RELEASE in releases.split():
            await asyncio.to_thread(
                _helm,
                helm,
                args.kubeconfig,
                args.context,
                "uninstall",
                RELEASE,
                "-n",
                args.namespace,
                "--wait",
                "--timeout",
                f"{int(args.timeout)}s",
                timeout=args.timeout + 30,
            )
            progress.step(f"helm release {RELEASE} uninstalled")
        else:
            progress.note(f"no helm release {RELEASE} in {args.namespace}")
        if args.force:  # nothing runs our finalizers any more
            await _drop_finalizers(client, args.namespace)
        for resource, _ in reversed(admission_objects()):
            # the offloading admission policies, made by the consumer's agent, not by the chart
            ours = (await client.list(resource, label_selector="gpuferry.io/managed-by=gpuferry"))["items"]
            for obj in ours:
                with contextlib.suppress(NotFound):
                    await client.delete(resource, obj["metadata"]["name"])
            if ours:
                progress.step(f"{len(ours)} {resource.kind} of the offloading removed")
        try:
            await client.delete(NAMESPACES, args.namespace)
            await wait_gone(client, NAMESPACES, args.namespace, None, args.timeout)
            progress.step(f"namespace {args.namespace} deleted")
        except NotFound:
            pass
        if args.crds:
            deleted = []
            for crd in load_crds():
                with contextlib.suppress(NotFound):
                    await client.delete(CRDS, crd["metadata"]["name"])
                    deleted.append(crd["metadata"]["name"])
            # each goes once the API server has removed its objects: waited for all at once
            await wait_all_gone(CRDS, [(client, name) for name in deleted], args.timeout)
            progress.step(f"{len(deleted)} CRDs deleted" if deleted else "no CRDs of gpuferry's to delete")
    print(f"gpuferry uninstalled{' with its CRDs' if args.crds else ''}")
    return 0


async def _drop_finalizers(client: KubeClient, namespace: str) -> None:
    """With --force: what the uninstalled agent would have cleaned up is cleaned up here (the
    finalizers it held, its virtual kubelets' bindings and their Nodes)."""
    try:
        vns = (await client.list(VIRTUALNODES, namespace))["items"]
    except NotFound:
        vns = []  # no CRD
    for vn in vns:
        kept = [f for f in vn["metadata"].get("finalizers") or [] if not f.startswith("gpuferry.io/")]
        if kept != (vn["metadata"].get("finalizers") or []):
            await client.patch(
                VIRTUALNODES, vn["metadata"]["name"], {"metadata": {"finalizers": kept}}, namespace
            )
        node = (vn.get("spec") or {}).get("nodeName")
        if node:
            with contextlib.suppress(NotFound):
                await client.delete(NODES, node)
    ours = f"app.kubernetes.io/component={COMPONENT},app.kubernetes.io/managed-by=gpuferry-consumer"
    for crb in (await client.list(CLUSTERROLEBINDINGS, label_selector=ours))["items"]:
        with contextlib.suppress(NotFound):
            await client.delete(CLUSTERROLEBINDINGS, crb["metadata"]["name"])


def add_install_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--role",
        choices=[*ROLES, "both"],
        help="provider: lends GPUs; consumer: borrows them (virtual nodes); both",
    )
    parser.add_argument(
        "--cluster-id",
        help="this cluster's ID, as peers will know it (default: the one it "
        "has, else derived from the kubeconfig context's name)",
    )
    parser.add_argument("--image", help="gpuferry's image, REPOSITORY[:TAG] (default: the chart's)")
    parser.add_argument(
        "--pull-policy", choices=["Always", "IfNotPresent", "Never"], help="its imagePullPolicy"
    )
    parser.add_argument(
        "--replicas", type=int, help="replicas of each controller (leader election; default 1)"
    )
    parser.add_argument(
        "-f", "--values", action="append", metavar="FILE", help="more helm values (repeatable)"
    )
    parser.add_argument("--set", action="append", metavar="KEY=VALUE", help="a helm value (repeatable)")
    parser.add_argument(
        "--force",
        action="store_true",
        help="upgrade even when a role it drops still has peers (their peerings stop working); "
        "clear an install or upgrade that was interrupted (helm: another operation is in progress)",
    )
    parser.add_argument(
        "--reset-values",
        action="store_true",
        help="an upgrade starts from the chart's defaults, not from what the last install set",
    )
    net = parser.add_argument_group(
        "network fabric", "the gateway and route agents; what is not given is found in the cluster "
        "(its network declaration, else the nodes' pod CIDRs, the ServiceCIDRs, a node's address)"
    )  # fmt: skip
    net.add_argument("--no-network", action="store_true",
                     help="no gateway nor route agent (peer with --no-network)")  # fmt: skip
    net.add_argument("--pod-cidr", action="append", metavar="CIDR",
                     help="this cluster's pod CIDR (repeatable)")  # fmt: skip
    net.add_argument("--service-cidr", action="append", metavar="CIDR",
                     help="this cluster's service CIDR (repeatable)")  # fmt: skip
    net.add_argument("--endpoint-address", metavar="ADDRESS",
                     help="where consumers dial a provider's gateway (default: a node's)")  # fmt: skip
    parser.add_argument("-n", "--namespace", default=SYSTEM_NAMESPACE, help=f"(default {SYSTEM_NAMESPACE})")
    parser.add_argument("--helm", help="the helm binary (default: $GPUFERRY_HELM, PATH, make build-k8s's)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds to wait (default 300)")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    add_output_argument(parser)


def add_uninstall_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    un = sub.add_parser(
        "uninstall",
        parents=[common],
        help="remove gpuferry from a cluster (its release and namespace; --crds: the CRDs)",
        **described(
            """Remove gpuferry from this cluster: its Helm release, the offloading admission
            policies its consumer agent made, and its namespace, waiting until that is gone. The
            CRDs, and any objects of theirs, stay unless --crds is given.

            A cluster that still peers is refused: run `gpuferry unpeer` first. With --force it is
            uninstalled all the same, and the finalizers, virtual kubelet bindings and Nodes that
            the uninstalled controllers would have cleaned up are removed here.""",
            "gpuferry uninstall --kubeconfig consumer.yaml",
            "gpuferry uninstall --kubeconfig provider.yaml --crds",
        ),
    )
    un.add_argument("--crds", action="store_true", help="delete the CRDs too (and every object of theirs)")
    un.add_argument("--force", action="store_true", help="even while the cluster still peers")
    un.add_argument(
        "-n", "--namespace", default=SYSTEM_NAMESPACE, help=f"its namespace (default {SYSTEM_NAMESPACE})"
    )
    un.add_argument("--helm", help="the helm binary (default: $GPUFERRY_HELM, PATH, make build-k8s's)")
    un.add_argument("--timeout", type=float, default=300.0, help="seconds to wait (default 300)")
    un.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    un.set_defaults(handler=cmd_uninstall)
