"""Start, inspect and stop one local cluster: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler and kwok as host processes, its simulated nodes, and (as root) its real node
(containerd, kubelet, kube-proxy; hack/localcluster/realnode.py) with CoreDNS and metrics-server.

The demo (``python -m hack.localcluster up``) and the integration-test fixtures call the same
functions here: one implementation.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import shutil
import ssl
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kube import goyaml

from ..images import BuiltImage, build_images
from . import addons
from .binaries import HACK_DIR, Binaries, versions
from .dra import device_class, resource_slice
from .network import api_advertise_address, can_make_networks, declaration, remove_network, setup_network
from .nodes import node_manifest
from .pki import ClientIdentity, ensure_pki, ensure_server_cert
from .processes import Component, ComponentFailed, PortBusy, ProcessTable, port_held
from .realnode import NODE_COMPONENTS, NodeFailed, RealNode
from .spec import REAL_NODE_LABEL, ClusterSpec

# Taints the node lifecycle controller sets on nodes that are not (yet) Ready.
LIFECYCLE_TAINTS = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")

# Start order of the control plane; stop goes in reverse. The real node's (realnode.NODE_COMPONENTS)
# start after these and stop before them.
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")

CLIENTS = [
    ClientIdentity("admin", "gpuferry-admin", ("system:masters",)),
    ClientIdentity("controller-manager", "system:kube-controller-manager"),
    ClientIdentity("scheduler", "system:kube-scheduler"),
    ClientIdentity("kwok", "kwok-controller", ("system:masters",)),
    # the API server's identity towards kubelets (logs, exec, port-forward); see _bootstrap()
    ClientIdentity("apiserver-kubelet-client", "kube-apiserver-kubelet-client"),
]

# kwok's configuration and stages: ours (hack/kwok) first, then the upstream stages kept beside
# the kwok binary.
UPSTREAM_STAGES = (
    "node/fast/node-initialize.yaml",
    "pod/fast/pod-ready.yaml",
    "pod/fast/pod-delete.yaml",
)
OWN_KWOK_CONFIGS = ("kwok-configuration.yaml", "pod-complete.yaml", "node-heartbeat-with-lease.yaml")
NODE_LEASE_SECONDS = 40
"""kwok renews each fake node's Lease every quarter of this, as a kubelet with its default does."""

# kwok's per-pod debugging objects (kwok v0.8.0 CRDs, kept in hack/kwok/crds): a ``Logs``,
# ``Exec``, ``Attach`` or ``PortForward`` named after a pod tells kwok's kubelet-like server what
# `kubectl logs/exec/attach/port-forward` get for that fake pod.
KWOK_DEBUGGING_CRDS = ("Logs", "Exec", "Attach", "PortForward")
KWOK_CRD_DIR = HACK_DIR / "kwok" / "crds"


class KubectlFailed(RuntimeError):
    """A kubectl call of the cluster code failed; the message has the command and its error."""


@dataclass(frozen=True)
class ComponentStatus:
    name: str
    running: bool
    pid: int | None
    log: Path


def _https_ok(spec: ClusterSpec, port: int, path: str, *, client_cert: bool) -> bool:
    ctx = ssl.create_default_context(cafile=str(spec.pki_dir / "ca.crt"))
    if client_cert:
        ctx.load_cert_chain(spec.pki_dir / "admin.crt", spec.pki_dir / "admin.key")
    else:  # controller-manager and scheduler serve self-signed certificates
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    return _get_ok(http.client.HTTPSConnection("127.0.0.1", port, timeout=2, context=ctx), path)


def http_ok(port: int, path: str) -> bool:
    """Whether ``GET path`` on loopback ``port`` answers 200 (health checks of local processes)."""
    return _get_ok(http.client.HTTPConnection("127.0.0.1", port, timeout=2), path)


def build_node_images(
    binaries: Binaries, *, progress: Callable[[str], None] = print
) -> dict[str, BuiltImage]:
    """Every image a real node imports (hack/images; cached by the hash of their inputs): the
    pause image, the test image, the gpuferry image, CoreDNS and metrics-server."""
    pins = versions()
    return build_images(
        progress=progress,
        binaries={
            "coredns": (binaries.coredns, pins["COREDNS_VERSION"]),
            "metrics-server": (binaries.metrics_server, pins["METRICS_SERVER_VERSION"]),
        },
    )


def _wanted_real_node(spec: ClusterSpec) -> bool:
    """A real node needs root (network namespaces, mounts, cgroups, containerd)."""
    return spec.real_node is not None and can_make_networks()


def _get_ok(conn: http.client.HTTPConnection, path: str) -> bool:
    try:
        conn.request("GET", path)
        return conn.getresponse().status == 200
    except (OSError, http.client.HTTPException):
        return False
    finally:
        conn.close()


def write_kubeconfig(path: Path, spec: ClusterSpec, stem: str, user: str) -> None:
    """A kubeconfig for ``spec``'s API server authenticating with ``pki/<stem>.{crt,key}``."""
    ctx = f"gpuferry-{spec.name}"
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": ctx,
                "cluster": {"server": spec.server, "certificate-authority": str(spec.pki_dir / "ca.crt")},
            }
        ],
        "users": [
            {
                "name": user,
                "user": {
                    "client-certificate": str(spec.pki_dir / f"{stem}.crt"),
                    "client-key": str(spec.pki_dir / f"{stem}.key"),
                },
            }
        ],
        "contexts": [{"name": ctx, "context": {"cluster": ctx, "user": user}}],
        "current-context": ctx,
    }
    path.write_text(goyaml.dump(config, sort_keys=False))
    path.chmod(0o600)


class LocalCluster:
    """One cluster of a profile; every method is safe to call again."""

    def __init__(self, spec: ClusterSpec, binaries: Binaries) -> None:
        self.spec = spec
        self.bin = binaries
        self.procs = ProcessTable(spec.pid_dir, spec.log_dir)
        self.node = (
            RealNode(spec, spec.real_node, binaries, self.procs) if spec.real_node is not None else None
        )

    def processes(self) -> set[int]:
        """The pids of everything this cluster runs: its components (control plane, kwok, the
        real node's kubelet, containerd and kube-proxy) and the processes of its node's pods."""
        pids = {pid for name in self.procs.recorded() if (pid := self.procs.pid(name)) is not None}
        if self.node is not None:
            pids |= self.node.container_pids()
        return pids

    @property
    def has_real_node(self) -> bool:
        """Whether this cluster runs (or would run, once up) a real node: root and a spec for one."""
        return self.node is not None and _wanted_real_node(self.spec)

    @property
    def images(self) -> dict[str, str]:
        """Name -> reference of the images imported into the real node (``testbox``, ``gpuferry``,
        ...), as recorded by the last ``up``; empty without a real node."""
        path = self.spec.run_dir / "images.json"
        data: dict[str, str] = json.loads(path.read_text()) if path.exists() else {}
        return data

    def chart_values(self) -> dict[str, Any]:
        """Helm values that run gpuferry's chart on this cluster's real node: the image built here
        (imported, pulled from nowhere), on the real node, which is tainted. Empty without one."""
        if "gpuferry" not in self.images:
            return {}
        repository, tag = self.images["gpuferry"].rsplit(":", 1)
        return {
            "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
            "nodeSelector": {REAL_NODE_LABEL: "true"},
            "tolerations": [{"key": REAL_NODE_LABEL, "operator": "Exists", "effect": "NoSchedule"}],
        }

    # ---- configuration -------------------------------------------------------------------------

    def _kubeconfig(self, stem: str) -> Path:
        return self.spec.run_dir / f"{stem}.kubeconfig"

    def prepare(self) -> None:
        """Certificates and kubeconfigs; kept when present so clients stay valid across restarts."""
        spec = self.spec
        spec.run_dir.mkdir(parents=True, exist_ok=True)
        ensure_pki(spec.pki_dir, cluster=spec.name, service_ip=spec.first_service_ip, clients=CLIENTS,
                   advertise_address=api_advertise_address(spec))  # fmt: skip
        for identity in CLIENTS:
            path = self._kubeconfig(identity.stem)
            if not path.exists():
                write_kubeconfig(path, spec, identity.stem, identity.user)
        # kwok's kubelet-like server, verified by the API server like any kubelet
        ensure_server_cert(spec.pki_dir, "kwok-serving", common_name="kwok-kubelet", ips=("127.0.0.1",))

    def components(self) -> dict[str, Component]:
        spec, b, pki = self.spec, self.bin, self.spec.pki_dir
        p = spec.ports
        etcd_url = f"http://127.0.0.1:{p.etcd_client}"
        advertise = api_advertise_address(spec)

        def auth(stem: str) -> list[str]:
            kc = self._kubeconfig(stem)
            return [
                f"--kubeconfig={kc}",
                f"--authentication-kubeconfig={kc}",
                f"--authorization-kubeconfig={kc}",
                "--bind-address=127.0.0.1",
                "--leader-elect=false",
            ]

        stages = [str(HACK_DIR / "kwok" / s) for s in OWN_KWOK_CONFIGS]
        stages += [str(b.kwok_stages / s) for s in UPSTREAM_STAGES]
        return {
            "etcd": Component(
                name="etcd",
                argv=[
                    str(b.etcd),
                    f"--name={spec.name}",
                    f"--data-dir={spec.run_dir / 'etcd'}",
                    "--unsafe-no-fsync",
                    f"--listen-client-urls={etcd_url}",
                    f"--advertise-client-urls={etcd_url}",
                    f"--listen-peer-urls=http://127.0.0.1:{p.etcd_peer}",
                    f"--initial-advertise-peer-urls=http://127.0.0.1:{p.etcd_peer}",
                    f"--initial-cluster={spec.name}=http://127.0.0.1:{p.etcd_peer}",
                    "--listen-metrics-urls=",
                    "--log-level=warn",
                ],
                healthy=lambda: http_ok(p.etcd_client, "/health"),
                ports=[p.etcd_client, p.etcd_peer],
            ),
            "kube-apiserver": Component(
                name="kube-apiserver",
                argv=[
                    str(b.kube_apiserver),
                    f"--etcd-servers={etcd_url}",
                    # the host's loopback for local clients, its WAN address for nodes and pods
                    # (the ``kubernetes`` Service's endpoint)
                    f"--bind-address={'127.0.0.1' if advertise == '127.0.0.1' else '0.0.0.0'}",
                    f"--advertise-address={advertise}",
                    f"--secure-port={p.apiserver}",
                    f"--tls-cert-file={pki / 'apiserver.crt'}",
                    f"--tls-private-key-file={pki / 'apiserver.key'}",
                    f"--client-ca-file={pki / 'ca.crt'}",
                    f"--kubelet-client-certificate={pki / 'apiserver-kubelet-client.crt'}",
                    f"--kubelet-client-key={pki / 'apiserver-kubelet-client.key'}",
                    # kubelets (kwok, the virtual kubelet) serve certificates from the cluster CA;
                    # dial their InternalIP (a Hostname address is the node name, not resolvable)
                    f"--kubelet-certificate-authority={pki / 'ca.crt'}",
                    "--kubelet-preferred-address-types=InternalIP,Hostname",
                    "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                    f"--service-account-key-file={pki / 'sa.pub'}",
                    f"--service-account-signing-key-file={pki / 'sa.key'}",
                    f"--service-cluster-ip-range={spec.service_cidr}",
                    "--authorization-mode=Node,RBAC",
                    # on top of the default set (ServiceAccount, ResourceQuota, LimitRanger,
                    # DefaultTolerationSeconds, CertificateApproval/Signing/SubjectRestriction, ...)
                    "--enable-admission-plugins=NodeRestriction",
                    "--allow-privileged=true",
                    f"--profiling={'true' if spec.profiling else 'false'}",
                    # the aggregation layer (metrics-server), as kubeadm configures it
                    f"--requestheader-client-ca-file={pki / 'front-proxy-ca.crt'}",
                    "--requestheader-allowed-names=front-proxy-client",
                    "--requestheader-username-headers=X-Remote-User",
                    "--requestheader-group-headers=X-Remote-Group",
                    "--requestheader-extra-headers-prefix=X-Remote-Extra-",
                    f"--proxy-client-cert-file={pki / 'front-proxy-client.crt'}",
                    f"--proxy-client-key-file={pki / 'front-proxy-client.key'}",
                    # dial extension API servers at their endpoint (a node address the host can
                    # route to), not their ClusterIP (no route from the host)
                    "--enable-aggregator-routing=true",
                ],
                healthy=lambda: _https_ok(spec, p.apiserver, "/readyz", client_cert=True),
                ports=[p.apiserver],
            ),
            "kube-controller-manager": Component(
                name="kube-controller-manager",
                argv=[
                    str(b.kube_controller_manager),
                    *auth("controller-manager"),
                    f"--secure-port={p.controller_manager}",
                    "--controllers=*",
                    "--use-service-account-credentials=true",
                    f"--service-account-private-key-file={pki / 'sa.key'}",
                    f"--root-ca-file={pki / 'ca.crt'}",
                    f"--cluster-signing-cert-file={pki / 'ca.crt'}",
                    f"--cluster-signing-key-file={pki / 'ca.key'}",
                    f"--service-cluster-ip-range={spec.service_cidr}",
                    "--concurrent-job-syncs=10",
                    # its client's default, 20 requests/s, untaints new nodes 4.7 a second: the
                    # 1252 nodes of a 10,000-pod bench took 270 s to accept pods. Kubernetes' own
                    # 5000-node tests run it at 100 (perf-tests, CONTROLLER_MANAGER_TEST_ARGS)
                    "--kube-api-qps=100",
                    "--kube-api-burst=100",
                ],
                healthy=lambda: _https_ok(spec, p.controller_manager, "/healthz", client_cert=False),
                ports=[p.controller_manager],
            ),
            "kube-scheduler": Component(
                name="kube-scheduler",
                argv=[str(b.kube_scheduler), *auth("scheduler"), f"--secure-port={p.scheduler}"],
                healthy=lambda: _https_ok(spec, p.scheduler, "/healthz", client_cert=False),
                ports=[p.scheduler],
            ),
            "kwok": Component(
                name="kwok",
                argv=[
                    str(b.kwok),
                    f"--kubeconfig={self._kubeconfig('kwok')}",
                    # only nodes annotated as fake: never the gpuferry virtual node
                    "--manage-all-nodes=false",
                    "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
                    f"--cidr={spec.pod_cidr}",
                    "--node-ip=127.0.0.1",
                    f"--server-address=127.0.0.1:{p.kwok}",
                    # published in the nodes' daemonEndpoints: the API server proxies logs, exec,
                    # attach and port-forward of fake pods here (TLS, certificate from the CA)
                    f"--node-port={p.kwok}",
                    f"--tls-cert-file={pki / 'kwok-serving.crt'}",
                    f"--tls-private-key-file={pki / 'kwok-serving.key'}",
                    f"--enable-crds={','.join(KWOK_DEBUGGING_CRDS)}",
                    # liveness by Lease, status every 5 min (hack/kwok/node-heartbeat-with-lease.yaml)
                    f"--node-lease-duration-seconds={NODE_LEASE_SECONDS}",
                    # warnings and errors only: at INFO kwok logs every Lease it renews and every
                    # pod and node it patches, as JSON with its source line (57 MB in 30 min at
                    # 1252 nodes; issue 15)
                    "--v=WARN",
                    *[a for s in stages for a in ("-c", s)],
                ],
                healthy=lambda: http_ok(p.kwok, "/healthz"),
                ports=[p.kwok],
                # kwok always merges ~/.kwok/kwok.yaml unless given a work dir of its own
                env={"KWOK_WORKDIR": str(spec.run_dir / "kwok")},
            ),
        }

    # ---- lifecycle -----------------------------------------------------------------------------

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> str:
        proc = subprocess.run(
            [str(self.bin.kubectl), f"--kubeconfig={self.spec.kubeconfig}", *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if check and proc.returncode != 0:
            raise KubectlFailed(f"kubectl {' '.join(args)} failed on {self.spec.name}: {proc.stderr.strip()}")
        return proc.stdout

    def up(
        self,
        *,
        progress: Callable[[str], None] = print,
        timeout: float = 120.0,
        images: dict[str, BuiltImage] | None = None,
    ) -> None:
        """Start every component that is not running, then make sure the nodes exist.
        ``images``: built already (hack/images) for several clusters; built here when None."""
        real = self.node if self.has_real_node else None
        self._check_ports()
        # the network first: the API server advertises the host's WAN address
        net = setup_network(self.spec, pod_cidr=real.node.pod_cidr if real else None)
        self.prepare()
        comps = self.components()
        for name in COMPONENTS:
            self._start(comps[name], progress=progress, timeout=timeout)
            if name == "kube-apiserver":
                self._bootstrap()
        self._ensure_nodes(timeout=timeout)
        progress(f"{self.spec.name}: {len(self.spec.nodes)} simulated nodes Ready and schedulable")
        if real is not None:
            self._up_real_node(real, progress=progress, timeout=timeout, images=images)
        self.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-",
                     input=json.dumps(declaration(self.spec, net)))  # fmt: skip
        progress(
            f"{self.spec.name}: network declared"
            + (
                f"; gateways run in netns {net.netns}, reached at {net.wan_address}"
                if net
                else " (CIDRs only: not root, so no gateway network, no real node; peer with --no-network)"
            )
        )

    def _check_ports(self) -> None:
        """Every port a component that is not running needs must be free before anything starts:
        a half-started cluster is worse than none."""
        for name, component in self.components().items():
            if self.procs.pid(name) is None and (busy := [p for p in component.ports if port_held(p)]):
                raise PortBusy(
                    f"{self.spec.name}: {name} needs 127.0.0.1:{busy[0]}, which a process that this cluster "
                    f"did not start holds; stop that process, or run this profile's clusters elsewhere "
                    f"(--profile dev1 or dev2 use other ports)"
                )

    def _start(self, component: Component, *, progress: Callable[[str], None], timeout: float) -> None:
        started = time.monotonic()
        if self.procs.start(component, timeout=timeout):
            progress(f"{self.spec.name}: {component.name} started in {time.monotonic() - started:.1f}s")
        else:
            progress(f"{self.spec.name}: {component.name} already running")

    def _up_real_node(
        self,
        real: RealNode,
        *,
        progress: Callable[[str], None],
        timeout: float,
        images: dict[str, BuiltImage] | None,
    ) -> None:
        if images is None:
            images = build_node_images(self.bin, progress=progress)
        real.prepare(sandbox_image=images["pause"].ref)
        comps = real.components()
        self._start(comps["containerd"], progress=progress, timeout=timeout)
        real.import_images({img.ref: img.tar for img in images.values()}, progress=progress)
        refs = {name: img.ref for name, img in images.items()}
        (self.spec.run_dir / "images.json").write_text(json.dumps(refs, indent=2, sort_keys=True))
        self._start(comps["kubelet"], progress=progress, timeout=timeout)
        self._wait_registered(real, timeout=timeout)
        spec_patch, status_patch = real.node_patches()
        node = f"node/{real.node.name}"
        current = json.loads(self.kubectl("get", node, "-o", "json"))
        if not current["spec"].get("podCIDR"):
            self.kubectl("patch", node, "--type=merge", "-p", json.dumps(spec_patch))
        if status_patch is not None:
            self.kubectl(
                "patch", node, "--subresource=status", "--type=merge", "-p", json.dumps(status_patch)
            )
        self._start(comps["kube-proxy"], progress=progress, timeout=timeout)
        self._wait_ready([real.node.name], what="kubelet", timeout=timeout)
        progress(f"{self.spec.name}: real node {real.node.name} Ready at {real.address}")
        manifests = addons.coredns(self.spec, refs["coredns"]) + addons.metrics_server(refs["metrics-server"])
        self.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-",
                     input=json.dumps({"apiVersion": "v1", "kind": "List", "items": manifests}))  # fmt: skip
        for deployment in ("coredns", "metrics-server"):
            started = time.monotonic()
            argv = ["rollout", "status", f"deployment/{deployment}", f"--timeout={int(timeout)}s"]
            rollout = subprocess.run(
                [str(self.bin.kubectl), f"--kubeconfig={self.spec.kubeconfig}", "-n", "kube-system", *argv],
                capture_output=True, text=True, timeout=timeout + 30,
            )  # fmt: skip
            if rollout.returncode:
                pods = self._pod_problems("kube-system", deployment)
                raise NodeFailed(
                    f"{self.spec.name}: {deployment} did not become available in {timeout:.0f}s on the real "
                    f"node; its pods: {pods} (kubelet log: {self.procs.log_path('kubelet')})"
                )
            progress(f"{self.spec.name}: {deployment} available ({time.monotonic() - started:.1f}s)")

    def _pod_problems(self, namespace: str, prefix: str) -> str:
        """A line per pod of ``prefix``: phase, waiting reasons and the last warning Event."""
        pods = json.loads(self.kubectl("-n", namespace, "get", "pods", "-o", "json"))["items"]
        events = json.loads(self.kubectl("-n", namespace, "get", "events", "-o", "json"))["items"]
        lines = []
        for pod in pods:
            name = pod["metadata"]["name"]
            if not name.startswith(prefix):
                continue
            waiting = [
                f"{c['name']}: {c['state']['waiting'].get('reason')}"
                for c in pod.get("status", {}).get("containerStatuses") or []
                if "waiting" in c.get("state", {})
            ]
            warnings = [
                e["message"]
                for e in events
                if e["involvedObject"].get("name") == name and e.get("type") == "Warning"
            ]
            lines.append(f"{name} {pod['status'].get('phase')} {waiting} {warnings[-1:] or ''}".strip())
        return "; ".join(lines) or "none"

    def _wait_registered(self, real: RealNode, *, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while f"node/{real.node.name}" not in self.kubectl("get", "nodes", "-o", "name").split():
            if time.monotonic() > deadline:
                raise ComponentFailed("kubelet", f"did not register node {real.node.name}",
                                      self.procs.log_path("kubelet"))  # fmt: skip
            time.sleep(0.25)

    def _bootstrap(self) -> None:
        """Objects every real cluster has that no controller makes for us."""
        binding = {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "gpuferry:apiserver-kubelet-client"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "system:kubelet-api-admin",
            },
            "subjects": [
                {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "User",
                    "name": "kube-apiserver-kubelet-client",
                }
            ],
        }
        self.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=json.dumps(binding))
        # kwok watches its debugging objects from the start: their CRDs must be established first
        self.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(KWOK_CRD_DIR))
        self.kubectl("wait", "--for=condition=Established", "--timeout=60s", "-f", str(KWOK_CRD_DIR))

    def _ensure_nodes(self, *, timeout: float) -> None:
        existing = set(self.kubectl("get", "nodes", "-o", "name").split())
        missing = [n for n in self.spec.nodes if f"node/{n.name}" not in existing]
        if missing:
            items = {"apiVersion": "v1", "kind": "List", "items": [node_manifest(n) for n in missing]}
            # create, not apply: the status (capacity with nvidia.com/gpu) is only taken on create
            self.kubectl("create", "-f", "-", input=json.dumps(items))
        self._wait_ready([n.name for n in self.spec.nodes], what="kwok", timeout=timeout)
        dra = [resource_slice(n.name, n.dra) for n in self.spec.nodes if n.dra is not None]
        if dra:  # what a DRA driver would publish: its DeviceClass, a ResourceSlice per node
            items = {"apiVersion": "v1", "kind": "List", "items": [device_class(), *dra]}
            self.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=json.dumps(items))

    def _wait_ready(self, names: list[str], *, what: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            ready = self.ready_nodes()
            if all(n in ready for n in names):
                return
            if time.monotonic() > deadline:
                not_ready = sorted(set(names) - ready)
                raise ComponentFailed(what, f"left nodes {not_ready} not Ready", self.procs.log_path(what))
            time.sleep(0.5)

    def ready_nodes(self) -> set[str]:
        """Nodes that are Ready *and* schedulable: the node lifecycle controller has removed the
        ``node.kubernetes.io/not-ready`` taint every new node starts with."""
        data = json.loads(self.kubectl("get", "nodes", "-o", "json"))
        ready = set()
        for node in data["items"]:
            conditions = node.get("status", {}).get("conditions", [])
            is_ready = any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)
            lifecycle_taints = [
                t for t in node.get("spec", {}).get("taints") or [] if t["key"] in LIFECYCLE_TAINTS
            ]
            if is_ready and not lifecycle_taints:
                ready.add(node["metadata"]["name"])
        return ready

    def component_names(self) -> tuple[str, ...]:
        """Every process of this cluster, in start order."""
        return COMPONENTS + (NODE_COMPONENTS if self.has_real_node else ())

    def status(self) -> list[ComponentStatus]:
        return [
            ComponentStatus(
                name=name,
                running=(pid := self.procs.pid(name)) is not None,
                pid=pid,
                log=self.procs.log_path(name),
            )
            for name in self.component_names()
        ]

    def crashed(self) -> list[ComponentFailed]:
        """Components that were started (pid file present) but are no longer running."""
        return [
            ComponentFailed(name, "has exited", self.procs.log_path(name))
            for name in self.procs.recorded()
            if self.procs.pid(name) is None
        ]

    def restart(self, name: str, *, timeout: float = 120.0) -> None:
        """Stop and start one component (tests use this to restart the API server)."""
        comps = self.components()
        if self.node is not None and name in NODE_COMPONENTS:
            comps = self.node.components()
        self.procs.stop(name)
        self.procs.start(comps[name], timeout=timeout)

    def _etcd(self, path: str, body: dict[str, object]) -> dict[str, object]:
        conn = http.client.HTTPConnection("127.0.0.1", self.spec.ports.etcd_client, timeout=10)
        try:
            conn.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            data: dict[str, object] = json.loads(resp.read())
            if resp.status != 200:
                raise RuntimeError(f"etcd {path} on {self.spec.name}: {resp.status} {data}")
            return data
        finally:
            conn.close()

    def etcd_revision(self) -> int:
        header = self._etcd("/v3/kv/range", {"key": "AA=="})["header"]
        assert isinstance(header, dict)
        return int(header["revision"])

    def compact_etcd(self) -> int:
        """Compact etcd's history up to its current revision (what the API server does every
        five minutes); returns that revision. Watches from older resource versions then get 410."""
        revision = self.etcd_revision()
        self._etcd("/v3/kv/compaction", {"revision": str(revision), "physical": True})
        return revision

    def stop(self, name: str) -> bool:
        return self.procs.stop(name)

    def down(self, *, keep_state: bool = False) -> list[str]:
        """Stop every process (reverse order): the real node's first, with its pods, mounts and
        cgroups; remove the run folder unless ``keep_state``."""
        stopped = self.node.teardown() if self.node is not None else []
        stopped += [name for name in reversed(COMPONENTS) if self.procs.stop(name)]
        # anything recorded that is not a known component (should not happen, but leave nothing)
        stopped += [name for name in self.procs.recorded() if self.procs.stop(name)]
        remove_network(self.spec)  # the gateway network namespaces (no process is left in them)
        if not keep_state and self.spec.run_dir.exists():
            shutil.rmtree(self.spec.run_dir)
        if not keep_state:  # the profile folder too, once its last cluster is gone
            with contextlib.suppress(OSError):
                self.spec.run_dir.parent.rmdir()
        return stopped
