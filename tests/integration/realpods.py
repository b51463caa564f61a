"""Pods on the local clusters' real nodes (containerd + kubelet), driven with the real kubectl.

Only root gets a real node (hack/localcluster/realnode.py); elsewhere the tests that need one
skip, except in CI, where a missing real node is a failure.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from hack.localcluster import REAL_NODE_LABEL, LocalCluster

ON_REAL_NODE: dict[str, Any] = {
    "nodeSelector": {REAL_NODE_LABEL: "true"},
    "tolerations": [{"key": REAL_NODE_LABEL, "operator": "Exists", "effect": "NoSchedule"}],
}


def need_real_node(cluster: LocalCluster) -> None:
    if not cluster.has_real_node:
        pytest.fail(f"{cluster.spec.name} has no real node: run the tests as root (hack/setup.sh's packages)")


def pod(name: str, image: str, command: list[str], **spec: Any) -> dict[str, Any]:
    """A pod of one container ``main`` on the real node, stopped at once on delete."""
    container: dict[str, Any] = {
        "name": "main",
        "image": image,
        "imagePullPolicy": "Never",
        "command": command,
    }
    container |= spec.pop("container", {})
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": spec.pop("labels", {"app": name})},
        "spec": {**ON_REAL_NODE, "terminationGracePeriodSeconds": 0, "containers": [container], **spec},
    }


def http_server(name: str, image: str, *, port: int = 8080, **spec: Any) -> dict[str, Any]:
    """A testbox pod serving ``GET /`` -> its own name (busybox httpd)."""
    script = f"mkdir -p /tmp/www && hostname > /tmp/www/index.html && exec httpd -f -p {port} -h /tmp/www"
    ready = {"readinessProbe": {"httpGet": {"path": "/", "port": port}, "periodSeconds": 1}}
    return pod(name, image, ["sh", "-c", script], container=ready, **spec)


def apply(cluster: LocalCluster, namespace: str, *objects: dict[str, Any]) -> None:
    items = {"apiVersion": "v1", "kind": "List", "items": list(objects)}
    cluster.kubectl("-n", namespace, "apply", "-f", "-", input=json.dumps(items))


def wait_ready(cluster: LocalCluster, namespace: str, *pods: str, timeout: int = 90) -> None:
    cluster.kubectl(
        "-n", namespace, "wait", "--for=condition=Ready", f"--timeout={timeout}s", *[f"pod/{p}" for p in pods]
    )


def get(cluster: LocalCluster, namespace: str, kind: str, name: str) -> dict[str, Any]:
    obj: dict[str, Any] = json.loads(cluster.kubectl("-n", namespace, "get", kind, name, "-o", "json"))
    return obj


def pod_ip(cluster: LocalCluster, namespace: str, name: str) -> str:
    ip: str = get(cluster, namespace, "pod", name)["status"]["podIP"]
    return ip


def run_in(
    cluster: LocalCluster, namespace: str, name: str, *argv: str, timeout: float = 30
) -> subprocess.CompletedProcess[str]:
    """``kubectl exec`` without raising: the completed process."""
    return subprocess.run(
        [
            str(cluster.bin.kubectl),
            f"--kubeconfig={cluster.spec.kubeconfig}",
            "-n",
            namespace,
            "exec",
            name,
            "--",
            *argv,
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@contextlib.contextmanager
def namespace(cluster: LocalCluster, prefix: str) -> Iterator[str]:
    """A fresh namespace, deleted afterwards (without waiting for its pods to go)."""
    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", name)
    deadline = time.monotonic() + 30  # pods are refused until the "default" service account exists
    while "serviceaccount/default" not in cluster.kubectl(
        "-n", name, "get", "serviceaccounts", "-o", "name", check=False
    ):
        if time.monotonic() > deadline:
            raise TimeoutError(f"no default service account in {name}")
        time.sleep(0.2)
    try:
        yield name
    finally:
        cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def top(cluster: LocalCluster, *what: str, timeout: float = 150) -> tuple[str, int, int]:
    """``kubectl top`` of one pod or node: its name, its CPU in millicores and its memory in MiB,
    once metrics-server has two scrapes of it (15 s apart)."""
    deadline = time.monotonic() + timeout
    while True:
        out = cluster.kubectl("top", *what, "--no-headers", check=False)
        fields = out.split()  # a pod: NAME CPU MEMORY; a node: NAME CPU CPU% MEMORY MEMORY%
        memory = [f for f in fields[2:] if f.endswith("Mi")]
        if len(fields) >= 3 and fields[1].endswith("m") and memory:
            return fields[0], int(fields[1][:-1]), int(memory[0][:-2])
        assert time.monotonic() < deadline, (
            f"no metrics for {' '.join(what)} on {cluster.spec.name} after {timeout:.0f} s: {out}"
        )
        time.sleep(3)
