"""Kueue v0.10.0 against a local cluster: its CRDs, its manager as a process of the cluster, and
its webhooks, which the API server reaches on loopback.

The module proxy serves Kueue up to v0.10.0 (hack/build-k8s.sh builds it). Its manager runs like
the cluster's other processes (recorded in the cluster's process table, stopped by ``down``),
with a configuration of its own: no leader election, no internal certificate management (a
serving certificate from the cluster CA instead), Job integration only, and only Jobs that name a
queue (``kueue.x-k8s.io/queue-name``) managed. Its webhook configurations are Kueue's own with the
Service replaced by ``https://127.0.0.1:<port>``, where the API server (a host process too) calls
them; the Job webhooks match only Jobs labelled with a queue, so that a stopped Kueue never blocks
the cluster's other Jobs.
"""

from __future__ import annotations

import base64
import json
import shutil
from pathlib import Path
from typing import Any

import yaml

from kube import goyaml

from .binaries import Binaries
from .cluster import LocalCluster, http_ok
from .pki import ensure_server_cert
from .processes import Component

__all__ = [
    "KUEUE_NAMESPACE",
    "QUEUE_LABEL",
    "kueue_ports",
    "start_kueue",
    "stop_kueue",
    "webhook_configurations",
]

KUEUE_NAMESPACE = "kueue-system"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
_NAME = "kueue"
# the webhooks Kueue serves for what the local clusters use: Jobs and Kueue's own objects
_KEPT = ("job", "clusterqueue", "localqueue", "resourceflavor", "workload", "cohort")


def kueue_ports(cluster: LocalCluster) -> tuple[int, int, int]:
    """(health, metrics, webhook) ports: just above the cluster's own."""
    base = cluster.spec.ports.kwok
    return base + 1, base + 2, base + 3


def _config(cluster: LocalCluster, cert_dir: Path) -> dict[str, Any]:
    health, metrics, webhook = kueue_ports(cluster)
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta1",
        "kind": "Configuration",
        "namespace": KUEUE_NAMESPACE,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health}"},
        "metrics": {"bindAddress": f"127.0.0.1:{metrics}"},
        "webhook": {"port": webhook, "host": "127.0.0.1", "certDir": str(cert_dir)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "manageJobsWithoutQueueName": False,
        "integrations": {"frameworks": ["batch/job"]},
    }


def webhook_configurations(manifests: str, *, port: int, ca_bundle: bytes) -> list[dict[str, Any]]:
    """Kueue's webhook configurations for Jobs and its own objects, calling ``127.0.0.1:port``."""
    out = []
    for doc in yaml.safe_load_all(manifests):
        if not doc:
            continue
        kept = []
        for hook in doc.get("webhooks") or ():
            if not any(hook["name"] in (f"m{k}.kb.io", f"v{k}.kb.io") for k in _KEPT):
                continue
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}",
                                    "caBundle": base64.b64encode(ca_bundle).decode()}  # fmt: skip
            if hook["name"] in ("mjob.kb.io", "vjob.kb.io"):
                hook["objectSelector"] = {"matchExpressions": [{"key": QUEUE_LABEL, "operator": "Exists"}]}
            kept.append(hook)
        doc["metadata"]["name"] = f"kueue-{doc['metadata']['name']}"
        doc["webhooks"] = kept
        out.append(doc)
    return out


def start_kueue(cluster: LocalCluster, binaries: Binaries, *, timeout: float = 120.0) -> None:
    """Kueue's CRDs, namespace, manager and webhooks on ``cluster`` (idempotent)."""
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(binaries.kueue_crds))
    cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", "-f", str(binaries.kueue_crds))
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": KUEUE_NAMESPACE}}
    cluster.kubectl("apply", "--server-side", "-f", "-", input=json.dumps(namespace))
    work = cluster.spec.run_dir / _NAME
    cert_dir = work / "certs"
    cert_dir.mkdir(parents=True, exist_ok=True)
    pki = cluster.spec.pki_dir
    ensure_server_cert(pki, "kueue-webhook", common_name="kueue-webhook", ips=("127.0.0.1",))
    shutil.copy(pki / "kueue-webhook.crt", cert_dir / "tls.crt")
    shutil.copy(pki / "kueue-webhook.key", cert_dir / "tls.key")
    config = work / "config.yaml"
    config.write_text(goyaml.dump(_config(cluster, cert_dir)))
    health, _, webhook = kueue_ports(cluster)
    component = Component(
        name=_NAME,
        # the visibility API server wants in-cluster credentials, and serves nothing we use
        argv=[
            str(binaries.kueue),
            f"--config={config}",
            "--zap-log-level=2",
            "--feature-gates=VisibilityOnDemand=false",
        ],
        healthy=lambda: http_ok(health, "/readyz"),
        ports=list(kueue_ports(cluster)),
        env={"KUBECONFIG": str(cluster.spec.kubeconfig)},
    )
    cluster.procs.start(component, timeout=timeout)
    hooks = webhook_configurations(
        (binaries.kueue_crds.parent / "webhooks.yaml").read_text(),
        port=webhook,
        ca_bundle=(pki / "ca.crt").read_bytes(),
    )
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-",
                    input=json.dumps({"apiVersion": "v1", "kind": "List", "items": hooks}))  # fmt: skip


def stop_kueue(cluster: LocalCluster) -> None:
    """Remove Kueue's webhooks first (the API server would call a stopped process), then stop it."""
    for kind in ("mutating", "validating"):
        cluster.kubectl("delete", f"{kind}webhookconfiguration", f"kueue-{kind}-webhook-configuration",
                        "--ignore-not-found", check=False)  # fmt: skip
    cluster.procs.stop(_NAME)
