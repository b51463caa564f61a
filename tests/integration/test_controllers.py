"""gpuferry's controllers on their own, as they will run in the clusters: started as separate
processes (two replicas each of the provider's and the consumer's), driven by objects alone.

- ``kubectl apply`` of a ForeignCluster (with its peering token Secret) and of a
  NamespaceOffloading, with no gpuferry CLI involved, gives a Ready virtual node whose pods run
  on the provider, and an offloaded namespace;
- ``gpuferry peer --agents none`` against these controllers (and separately started gateways)
  peers with the network, exactly as with its own local agents;
- one replica leads; when it is SIGKILLed the other takes over within the lease time, and a
  SIGTERM releases the Lease at once;
- every component answers ``/healthz``, ``/readyz`` and ``/metrics`` without credentials.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import pytest
import yaml

from hack.localcluster import LocalCluster
from kube.api import SYSTEM_NAMESPACE, tenant_namespace, virtual_node_name
from kube.clients import KubeClient
from kube.errors import Invalid, NotFound
from kube.objects import (
    FOREIGNCLUSTERS,
    LEASES,
    NAMESPACEOFFLOADINGS,
    NAMESPACES,
    NODES,
    PEERNETWORKS,
    PODS,
    RawObject,
)
from kube.ports import free_port
from peering.admission import BINDING_NAME, POLICY_NAME, TAINT_KEY, VALIDATION_NAME
from peering.admissionprobe import PROBE_PREFIX, probe_pod
from peering.clusterid import read_cluster_id
from peering.consumer.app import LEASE_NAME as CONSUMER_LEASE
from peering.provider.builders import peering_token_manifests
from peering.provider.settings import ProviderSettings
from peering.resources import TENANTS

from .clirunner import Cli
from .waiting import condition, wait_for, wait_for_deletion

pytestmark = pytest.mark.integration

PROVIDER_LEASE = ProviderSettings().lease_name
LEASE_SECONDS = 6
RENEW_SECONDS = 2.0
CONSUMER_ID, PROVIDER_ID = "ml-ctl", "gpu-ctl"
H100 = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
CONDITIONS = ("Authenticated", "SliceGranted", "VirtualNodeReady", "NetworkReady")


@dataclass
class Replica:
    """One controller process, its probe port and its log."""

    name: str
    argv: list[str]
    log: Path
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.port = free_port()
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [*self.argv, "--probe-port", str(self.port)],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    async def get(self, path: str) -> tuple[int, str]:
        """A plain HTTP GET of the probe port: no certificate, no token."""
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"http://127.0.0.1:{self.port}{path}") as answer,
        ):
            return answer.status, await answer.text()

    async def until_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        last: object = "no answer"
        while time.monotonic() < deadline:
            assert self.alive(), f"{self.name} exited; its log:\n{self.output()[-3000:]}"
            with contextlib.suppress(aiohttp.ClientConnectionError):
                last = await self.get("/readyz")
                if last[0] == 200:
                    return
            await asyncio.sleep(0.2)
        raise AssertionError(f"{self.name}: /readyz {last!r} after {timeout}s; log:\n{self.output()[-3000:]}")


@dataclass
class Controllers:
    provider: list[Replica]
    consumer: list[Replica]
    gateways: list[Replica]

    def all(self) -> list[Replica]:
        return [*self.provider, *self.consumer, *self.gateways]


def _controller(name: str, module: str, kubeconfig: Path, log_dir: Path, *extra: str) -> Replica:
    argv = [sys.executable, "-m", module, "--kubeconfig", str(kubeconfig), *extra]
    return Replica(name, argv, log_dir / f"{name}.log")


async def _ensure_cluster_id(client: KubeClient, cluster: LocalCluster, wanted: str) -> str:
    """The cluster's ID (as an admin would install it: a namespace and a ConfigMap)."""
    if (current := await read_cluster_id(client)) is not None:
        return current
    cluster.kubectl("create", "namespace", SYSTEM_NAMESPACE, check=False)  # there already, or not
    cluster.kubectl("-n", SYSTEM_NAMESPACE, "create", "configmap", "gpuferry-cluster-id",
                    f"--from-literal=clusterID={wanted}")  # fmt: skip
    return wanted


@pytest.fixture(scope="module")
def controllers(
    clusters: dict[str, LocalCluster], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Controllers]:
    """Two replicas each of the provider's and the consumer's controllers, one gateways process per
    cluster: started as an installation would start them, before any peering."""
    consumer, provider = clusters["consumer"], clusters["provider"]
    logs = tmp_path_factory.mktemp("controllers")
    for cluster in (consumer, provider):  # what an installation brings: the CRDs and the namespace
        cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f",
                        str(Path(__file__).resolve().parents[2] / "charts/gpuferry/crds"))  # fmt: skip
        cluster.kubectl("create", "namespace", SYSTEM_NAMESPACE, check=False)
    lease = ("--lease-seconds", str(LEASE_SECONDS), "--renew-seconds", str(RENEW_SECONDS))
    found = Controllers(
        provider=[
            _controller(f"provider-{i}", "peering.provider", provider.spec.kubeconfig, logs, *lease)
            for i in range(2)
        ],
        consumer=[
            _controller(
                f"consumer-{i}",
                "peering.consumer",
                consumer.spec.kubeconfig,
                logs,
                *lease,
                "--log-dir",
                str(logs / f"vk-{i}"),
                "--kubelet-csr-self-approve",
            )
            for i in range(2)
        ],
        gateways=[
            _controller(f"{side}-gateways", "netfabric", cluster.spec.kubeconfig, logs, "gateways")
            for side, cluster in (("consumer", consumer), ("provider", provider))
        ],
    )
    # the module's argv puts the subcommand after --kubeconfig: python -m netfabric --kubeconfig X gateways
    for replica in found.all():
        replica.start()
    try:
        yield found
    finally:
        for replica in found.all():
            replica.stop()
        # uninstalled: the namespace goes with the cluster IDs and the Leases, as after `gpuferry unpeer`
        for cluster in (consumer, provider):
            cluster.kubectl("delete", "namespace", SYSTEM_NAMESPACE, "--ignore-not-found", "--timeout=120s")


def _children(pid: int) -> list[int]:
    found: list[int] = []
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                found += [int(child) for child in (task / "children").read_text().split()]
    return found


def _exists(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


async def _until(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"after {timeout}s: not yet: {what}"
        await asyncio.sleep(0.2)


async def _leader(client: KubeClient, lease: str, replicas: list[Replica], timeout: float = 30) -> Replica:
    """The replica that holds ``lease`` (its identity carries its pid)."""
    by_pid = {r.pid: r for r in replicas if r.alive()}
    deadline = time.monotonic() + timeout
    holder = None
    while time.monotonic() < deadline:
        with contextlib.suppress(NotFound):
            spec = (await client.get(LEASES, lease, SYSTEM_NAMESPACE)).get("spec") or {}
            holder = spec.get("holderIdentity")
            if holder and (pid := int(holder.rsplit("-", 2)[1])) in by_pid:
                return by_pid[pid]
        await asyncio.sleep(0.2)
    raise AssertionError(f"nobody of {[r.name for r in replicas]} holds Lease {lease} (holder {holder!r})")


@pytest.fixture
async def peers(
    controllers: Controllers, consumer: LocalCluster, provider: LocalCluster,
    consumer_client: KubeClient, provider_client: KubeClient,
) -> AsyncIterator[tuple[str, str]]:  # fmt: skip
    """The two cluster IDs; afterwards the clusters are as before (peering objects, IDs, policy)."""
    consumer_id = await _ensure_cluster_id(consumer_client, consumer, CONSUMER_ID)
    provider_id = await _ensure_cluster_id(provider_client, provider, PROVIDER_ID)
    yield consumer_id, provider_id
    for fc in (await consumer_client.list(FOREIGNCLUSTERS))["items"]:
        with contextlib.suppress(NotFound):
            await consumer_client.delete(FOREIGNCLUSTERS, fc["metadata"]["name"])
    for fc in (await consumer_client.list(FOREIGNCLUSTERS))["items"]:  # the consumer controllers undo it
        await wait_for_deletion(consumer_client, FOREIGNCLUSTERS, fc["metadata"]["name"], None, timeout=120)
    # the token Secrets: the one applied by hand, the one `gpuferry peer` writes
    consumer.kubectl("-n", SYSTEM_NAMESPACE, "delete", "secret", f"peering-{provider_id}",
                     f"gpuferry-peering-{provider_id}", "--ignore-not-found")  # fmt: skip
    with contextlib.suppress(NotFound):
        await provider_client.delete(NAMESPACES, tenant_namespace(consumer_id))
    await wait_for_deletion(provider_client, NAMESPACES, tenant_namespace(consumer_id), None, timeout=120)
    consumer.kubectl("delete", "mutatingadmissionpolicybinding", BINDING_NAME, "--ignore-not-found")
    consumer.kubectl("delete", "mutatingadmissionpolicy", POLICY_NAME, "--ignore-not-found")
    consumer.kubectl("delete", "validatingadmissionpolicybinding,validatingadmissionpolicy",
                     VALIDATION_NAME, "--ignore-not-found")  # fmt: skip


REFUSE = "refuse-probes"
PASSING = "error looking up service account (a stand-in for the ServiceAccount admission's refusal)"
"""A refusal that passes by itself: the ServiceAccount admission refuses pods of a namespace whose
``default`` account is not made yet, which cannot be held back on demand."""


def _refuse_probes(namespace: str) -> list[RawObject]:
    """A ValidatingAdmissionPolicy that refuses gpuferry's dry-run probe pods in ``namespace``."""
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": REFUSE},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                                                    "operations": ["CREATE"], "resources": ["pods"]}]},
            "validations": [{"expression": "!has(object.metadata.generateName) || "
                                           f"!object.metadata.generateName.startsWith('{PROBE_PREFIX}')",
                             "message": PASSING}],
        },
    }  # fmt: skip
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": REFUSE},
        "spec": {
            "policyName": REFUSE,
            "validationActions": ["Deny"],
            "matchResources": {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
            },
        },
    }
    return [policy, binding]


async def _until_probes_refused(client: KubeClient, namespace: str) -> None:
    """Until the API server applies :func:`_refuse_probes` (policies reach it by informer)."""
    for _ in range(100):
        try:
            await client.create(PODS, probe_pod(), namespace, dry_run=True)
        except Invalid as e:  # a ValidatingAdmissionPolicy's denial is 422
            assert PASSING in str(e)
            return
        await asyncio.sleep(0.1)
    raise AssertionError("the probe-refusing policy never took effect")


def _api_server(cluster: LocalCluster) -> tuple[str, str]:
    """The API server's URL and CA (base64), as the provider's admin hands them over."""
    return cluster.spec.server, base64.b64encode((cluster.spec.pki_dir / "ca.crt").read_bytes()).decode()


def _render(objects: list[RawObject]) -> str:
    return yaml.safe_dump_all(objects, sort_keys=False)


def _fc_table(consumer: LocalCluster, name: str) -> dict[str, str]:
    header, row = consumer.kubectl("get", "foreigncluster", name).splitlines()
    # columns by the header's offsets: an empty column would shift a split()
    starts = [i for i, ch in enumerate(header) if ch != " " and (i == 0 or header[i - 1] == " ")]
    ends = [*starts[1:], None]
    return {header[a:b].strip(): row[a:b].strip() for a, b in zip(starts, ends, strict=True)}


async def test_kubectl_apply_alone_peers_and_offloads(
    controllers: Controllers, peers: tuple[str, str], consumer: LocalCluster, provider: LocalCluster,
    consumer_client: KubeClient, provider_client: KubeClient,
) -> None:  # fmt: skip
    consumer_id, provider_id = peers
    # the provider's admin: the tenant namespace and the peering token, as manifests
    provider.kubectl("apply", "-f", "-", input=_render(peering_token_manifests(consumer_id)))
    ns = tenant_namespace(consumer_id)
    token_b64 = ""
    for _ in range(100):
        token_b64 = provider.kubectl(
            "-n", ns, "get", "secret", "peering-token", "-o", "jsonpath={.data.token}"
        )
        if token_b64:
            break
        await asyncio.sleep(0.1)
    assert token_b64, "the token controller fills the peering token in"

    # the consumer's admin: the token as a Secret, and the ForeignCluster
    consumer.kubectl("-n", SYSTEM_NAMESPACE, "create", "secret", "generic", f"peering-{provider_id}",
                     f"--from-literal=token={base64.b64decode(token_b64).decode()}")  # fmt: skip
    server, ca = _api_server(provider)
    fc = {
        "apiVersion": "core.gpuferry.io/v1alpha1",
        "kind": "ForeignCluster",
        "metadata": {"name": provider_id},
        "spec": {
            "clusterID": provider_id,
            "role": "Provider",
            "apiServerURL": server,
            "caBundle": ca,
            "peeringTokenSecretRef": {"name": f"peering-{provider_id}", "key": "token"},
            "slice": {"resources": {"nvidia.com/gpu": "2"}, "nodeSelector": H100},
            "networkingEnabled": False,
        },
    }
    consumer.kubectl("apply", "-f", "-", input=json.dumps(fc))
    for name in CONDITIONS:
        consumer.kubectl("wait", f"foreigncluster/{provider_id}", f"--for=condition={name}", "--timeout=120s")
    got = await consumer_client.get(FOREIGNCLUSTERS, provider_id)
    assert condition(got, "NetworkReady")["reason"] == "NetworkDisabled"  # type: ignore[index]
    assert got["status"]["slice"]["granted"]["nvidia.com/gpu"] in (2, "2")
    table = _fc_table(consumer, provider_id)
    assert [table[c] for c in ("AUTHENTICATED", "SLICE", "VIRTUALNODE", "NETWORK")] == ["True"] * 4, table
    node = virtual_node_name(provider_id)
    assert (await consumer_client.get(NODES, node))["status"]["allocatable"]["nvidia.com/gpu"] == "2"
    tenant = await provider_client.get(TENANTS, consumer_id, ns)
    assert tenant["metadata"]["name"] == consumer_id

    # a namespace offloaded by its NamespaceOffloading alone; a GPU pod there runs on the provider
    work = "ctl-work"
    # no admission policy yet: the controller writes it now, and the API server applies a policy
    # only after its informers and a compile (up to a second or more on a busy machine)
    consumer.kubectl("delete", "mutatingadmissionpolicybinding", BINDING_NAME, "--ignore-not-found")
    consumer.kubectl("delete", "mutatingadmissionpolicy", POLICY_NAME, "--ignore-not-found")
    consumer.kubectl("create", "namespace", work)
    try:
        offloading = {
            "apiVersion": "offloading.gpuferry.io/v1alpha1",
            "kind": "NamespaceOffloading",
            "metadata": {"name": "offloading", "namespace": work},
            "spec": {"podOffloadingStrategy": "LocalAndRemote", "namespaceMappingStrategy": "DefaultName"},
        }
        # the dry-run pod that shows the offloading rule live is refused as it is while the
        # namespace's ServiceAccount is missing: the offloading is not Ready, and says why
        consumer.kubectl("apply", "-f", "-", input=_render(_refuse_probes(work)))
        await _until_probes_refused(consumer_client, work)
        consumer.kubectl("apply", "-f", "-", input=json.dumps(offloading))
        reason = "jsonpath={.status.conditions[?(@.type=='Ready')].reason}"
        consumer.kubectl("-n", work, "wait", "namespaceoffloading/offloading", "--timeout=60s",
                         f"--for={reason}=AdmissionPending")  # fmt: skip
        held = await consumer_client.get(NAMESPACEOFFLOADINGS, "offloading", work)
        assert held["status"]["phase"] == "Pending"
        assert PASSING in condition(held, "Ready")["message"]  # type: ignore[index]
        consumer.kubectl("delete", "validatingadmissionpolicybinding,validatingadmissionpolicy", REFUSE)
        consumer.kubectl("-n", work, "wait", "namespaceoffloading/offloading", "--for=condition=Ready",
                         "--timeout=60s")  # fmt: skip
        status = json.loads(
            consumer.kubectl("-n", work, "get", "namespaceoffloading", "offloading", "-o", "json")
        )
        assert "could not be checked" not in condition(status, "Ready")["message"]  # type: ignore[index]
        # Ready means the very next pod is offloaded (CI, stop 27: a pod created just after
        # Ready was admitted without the virtual node's toleration and stayed Pending)
        probe = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "first"},
                 "spec": {"containers": [{"name": "c", "image": "cuda"}]}}  # fmt: skip
        admitted = await consumer_client.create(PODS, probe, work, dry_run=True)
        assert TAINT_KEY in [t.get("key") for t in admitted["spec"].get("tolerations") or []], admitted
        (remote,) = status["status"]["remoteNamespaces"]
        assert remote["clusterID"] == provider_id and remote["phase"] == "Ready"
        twin_ns = remote["remoteNamespace"]
        await provider_client.get(NAMESPACES, twin_ns)
        pod = {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "train", "namespace": work},
            "spec": {"containers": [{"name": "c", "image": "cuda",
                                     "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
        }  # fmt: skip
        consumer.kubectl("apply", "-f", "-", input=json.dumps(pod))
        running = await wait_for(consumer_client, PODS, "train",
                                 lambda p: (p.get("status") or {}).get("phase") == "Running",
                                 namespace=work, timeout=90)  # fmt: skip
        assert running["spec"]["nodeName"] == node
        twins = (await provider_client.list(PODS, namespace=twin_ns))["items"]
        assert [t["status"].get("phase") for t in twins] == ["Running"]

        # the consumer's leader dies (SIGKILL): its virtual kubelet goes with it, the standby
        # leads and runs its own; the pod and its twin carry on
        leader = await _leader(consumer_client, CONSUMER_LEASE, controllers.consumer)
        kubelets = _children(leader.pid)
        assert kubelets, "the leading consumer runs the virtual kubelet"
        os.kill(leader.pid, signal.SIGKILL)
        assert leader.proc is not None
        leader.proc.wait()
        await _until(lambda: not any(_exists(pid) for pid in kubelets), 15, "the orphaned kubelet exits")
        (standby,) = [r for r in controllers.consumer if r is not leader]
        assert await _leader(consumer_client, CONSUMER_LEASE, [standby], timeout=LEASE_SECONDS + 10)
        await _until(lambda: bool(_children(standby.pid)), 30, "the new leader runs a virtual kubelet")
        leader.start()
        await leader.until_ready()
        again = await wait_for(consumer_client, PODS, "train",
                               lambda p: (p.get("status") or {}).get("phase") == "Running",
                               namespace=work, timeout=30)  # fmt: skip
        assert again["metadata"]["uid"] == running["metadata"]["uid"]
    finally:
        consumer.kubectl("delete", "validatingadmissionpolicybinding,validatingadmissionpolicy", REFUSE,
                         "--ignore-not-found")  # fmt: skip
        consumer.kubectl("delete", "namespace", work, "--wait=false")
    # deleting the ForeignCluster undoes the peering on this side: virtual node, slice, identity
    consumer.kubectl("delete", "foreigncluster", provider_id, "--timeout=120s")
    with pytest.raises(NotFound):
        await consumer_client.get(NODES, node)
    assert not (await provider_client.list(TENANTS, namespace=ns))["items"][0].get("spec", {}).get("network")


async def test_gpuferry_peer_with_controllers_running_elsewhere(
    controllers: Controllers, peers: tuple[str, str], consumer: LocalCluster, provider: LocalCluster,
    consumer_client: KubeClient, provider_client: KubeClient, tmp_path: Path,
) -> None:  # fmt: skip
    """``--agents none``: the CLI starts nothing; it writes the objects and waits for the
    controllers above (and the gateways) to do the peering, network included."""
    consumer_id, provider_id = peers
    cli = Cli(consumer, provider, tmp_path / "cache")
    out = await cli.ok("peer", "--kubeconfig", cli.c, "--remote-kubeconfig", cli.p, "--agents", "none",
                       "--gpus", "1", "--selector", "nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3",
                       "-o", "json")  # fmt: skip
    result = json.loads(out)
    assert (result["consumer"], result["provider"]) == (consumer_id, provider_id)
    assert result["network"]["consumer"]["remappedPodCIDRs"], result["network"]
    assert not (tmp_path / "cache" / "agents").exists() or not list((tmp_path / "cache" / "agents").iterdir())
    # the gateways started here (not by the CLI) carry the tunnel: each PeerNetwork is Ready,
    # with the interface its gateway made, and each gateway's log names its PeerNetwork
    for client, key, gateways in (
        (consumer_client, (provider_id, SYSTEM_NAMESPACE), controllers.gateways[0]),
        (provider_client, (consumer_id, tenant_namespace(consumer_id)), controllers.gateways[1]),
    ):
        peer_network = await client.get(PEERNETWORKS, *key)
        assert (condition(peer_network, "NetworkReady") or {}).get("status") == "True", peer_network["status"]
        assert peer_network["status"]["interface"].startswith("gf")
        assert f"PeerNetwork {key[1]}/{key[0]}" in gateways.output()
    out = await cli.ok("unpeer", "--kubeconfig", cli.c, "--remote-kubeconfig", cli.p, "--agents", "none",
                       "-o", "json")  # fmt: skip
    assert json.loads(out)["provider"] == provider_id
    # the controllers keep running, and the installation's namespace (their Leases) stays
    assert all(r.alive() for r in controllers.all())
    await provider_client.get(NAMESPACES, SYSTEM_NAMESPACE)


async def test_one_replica_leads_a_standby_takes_over_and_sigterm_releases_at_once(
    controllers: Controllers, consumer_client: KubeClient, provider_client: KubeClient,
) -> None:  # fmt: skip
    for client, lease, replicas in (
        (provider_client, PROVIDER_LEASE, controllers.provider),
        (consumer_client, CONSUMER_LEASE, controllers.consumer),
    ):
        for replica in replicas:
            await replica.until_ready()
        leader = await _leader(client, lease, replicas)
        (standby,) = [r for r in replicas if r is not leader]
        assert await _leading(standby) == 0.0 and await _leading_soon(leader) == 1.0

        # SIGKILL: nothing is released; the standby waits out the lease, then leads
        killed_at = time.monotonic()
        os.kill(leader.pid, signal.SIGKILL)
        assert leader.proc is not None
        leader.proc.wait()
        new = await _leader(client, lease, [standby], timeout=LEASE_SECONDS + 3 * RENEW_SECONDS + 5)
        took = time.monotonic() - killed_at
        assert new is standby
        assert took <= LEASE_SECONDS + 2 * RENEW_SECONDS + 2, f"{lease}: took over after {took:.1f}s"
        assert await _leading_soon(standby) == 1.0

        # the killed one comes back as a standby (as its Deployment would restart it)
        leader.start()
        await leader.until_ready()
        assert await _leading(leader) == 0.0

        # SIGTERM: the Lease is released at once (no holder), and the other replica takes it
        # well before a lease time would have passed
        stopped_at = time.monotonic()
        standby.stop()
        assert standby.proc is not None and standby.proc.returncode == 0, standby.output()[-2000:]
        spec = (await client.get(LEASES, lease, SYSTEM_NAMESPACE))["spec"]
        released = not spec.get("holderIdentity") or str(leader.pid) in spec["holderIdentity"].split("-")
        assert released, f"{lease} still held by {spec.get('holderIdentity')} after SIGTERM"
        assert "released" in standby.output()
        new = await _leader(client, lease, [leader], timeout=LEASE_SECONDS)
        assert new is leader and time.monotonic() - stopped_at < LEASE_SECONDS
        standby.start()  # two replicas again for what follows
        await standby.until_ready()


async def test_a_leader_paused_past_its_lease_steps_down_and_stays_a_standby(
    controllers: Controllers, provider_client: KubeClient,
) -> None:  # fmt: skip
    """The provider controller SIGSTOPped longer than its Lease (as a loaded machine may): the
    standby takes over, and the paused one, once it runs again, steps down and stays a live,
    ready standby: it does not exit (locally nothing would restart it)."""
    replicas = controllers.provider
    for replica in replicas:
        await replica.until_ready()
    leader = await _leader(provider_client, PROVIDER_LEASE, replicas)
    (standby,) = [r for r in replicas if r is not leader]
    os.kill(leader.pid, signal.SIGSTOP)
    try:
        timeout = LEASE_SECONDS + 3 * RENEW_SECONDS + 5
        new = await _leader(provider_client, PROVIDER_LEASE, [standby], timeout=timeout)
        assert new is standby
    finally:
        os.kill(leader.pid, signal.SIGCONT)
    await _until(lambda: "stepping down" in leader.output(), 3 * RENEW_SECONDS + 5, "the leader steps down")
    await asyncio.sleep(2 * RENEW_SECONDS)
    assert leader.alive(), leader.output()[-3000:]
    await leader.until_ready()
    assert await _leading(leader) == 0.0 and await _leading(standby) == 1.0
    holder = (await provider_client.get(LEASES, PROVIDER_LEASE, SYSTEM_NAMESPACE))["spec"]["holderIdentity"]
    assert str(standby.pid) in holder.split("-"), holder


async def _leading_soon(replica: Replica, timeout: float = 5.0) -> float:
    """``gpuferry_leader`` of a replica seen holding the Lease: it sets the gauge once its write
    of the Lease has returned, a moment after the Lease says so (the last reading after
    ``timeout``)."""
    deadline = time.monotonic() + timeout
    for _ in range(int(timeout / 0.2) + 1):
        value = await _leading(replica)
        if value == 1.0 or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.2)
    return value


async def _leading(replica: Replica) -> float:
    status, text = await replica.get("/metrics")
    assert status == 200
    for line in text.splitlines():
        if line.startswith("gpuferry_leader{") or line.startswith("gpuferry_leader "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{replica.name}: no gpuferry_leader in /metrics:\n{text[:2000]}")


async def test_every_component_serves_probes_and_metrics_without_credentials(
    controllers: Controllers,
) -> None:
    for replica in controllers.all():
        await replica.until_ready()
        for path in ("/healthz", "/livez", "/readyz"):
            status, text = await replica.get(path)
            assert (status, text.strip()) == (200, "ok"), f"{replica.name} {path}: {status} {text}"
        status, text = await replica.get("/readyz?verbose")
        assert status == 200 and "[+]" in text and "[-]" not in text, f"{replica.name}: {text}"
        status, text = await replica.get("/metrics")
        assert status == 200 and "# TYPE" in text, replica.name
        assert "gpuferry_" in text, f"{replica.name}: none of our metrics:\n{text[:1000]}"
