"""The Helm chart: rendered and checked against the real API servers, bad values refused with a
clear message, and installed on both local clusters (their real nodes run the gpuferry image),
where the controllers peer and offload as pods, without any local agent, and the API server
reaches the kubelet API of a virtual kubelet that runs in a pod.

What it does not cover yet (issue 13 goes on): the virtual kubelets as Deployments of their own,
the gateway and route agent as pods (the test peers with --no-network), ``gpuferry install``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from hack.localcluster import LocalCluster
from hack.localcluster.network import api_advertise_address
from kube.api import SYSTEM_NAMESPACE, virtual_node_name
from kube.clients import KubeClient
from kube.objects import NODES, PODS, RawObject

from .clirunner import Cli
from .waiting import condition, wait_for

pytestmark = pytest.mark.integration

CHART = Path(__file__).resolve().parents[2] / "charts" / "gpuferry"
H100 = "nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3"


def helm(cluster: LocalCluster, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([str(cluster.bin.helm), "--kubeconfig", str(cluster.spec.kubeconfig), *args],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    if check:
        assert proc.returncode == 0, f"helm {' '.join(args)}: {proc.stderr}"
    return proc


def local_values(cluster: LocalCluster, tmp: Path, **more: object) -> Path:
    """The image built here, on the real node (pulled from nowhere)."""
    repository, tag = cluster.images["gpuferry"].rsplit(":", 1)
    values = {
        "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
        "nodeSelector": {"gpuferry.io/real-node": "true"},
        "tolerations": [{"key": "gpuferry.io/real-node", "operator": "Exists", "effect": "NoSchedule"}],
        **more,
    }
    path = tmp / f"{cluster.spec.name}-values.yaml"
    path.write_text(yaml.safe_dump(values))
    return path


def test_the_chart_renders_objects_the_api_server_accepts(consumer: LocalCluster) -> None:
    assert helm(consumer, "lint", str(CHART), "--set", "clusterID=ml-eu", "--set", "consumer.enabled=true",
                "--namespace", SYSTEM_NAMESPACE).returncode == 0  # fmt: skip
    for role in ("provider", "consumer"):
        rendered = helm(consumer, "template", "gpuferry", str(CHART), "-n", SYSTEM_NAMESPACE,
                        "--set", "clusterID=ml-eu", "--set", f"{role}.enabled=true",
                        "--set", f"{role}.replicas=2").stdout  # fmt: skip
        kinds = sorted({d["kind"] for d in yaml.safe_load_all(rendered) if d})
        assert kinds == [
            "ClusterRole",
            "ClusterRoleBinding",
            "ConfigMap",
            "Deployment",
            "PodDisruptionBudget",
            "Role",
            "RoleBinding",
            "Service",
            "ServiceAccount",
        ], kinds
        (deployment,) = [d for d in yaml.safe_load_all(rendered) if d and d["kind"] == "Deployment"]
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        security = container["securityContext"]
        assert security["runAsNonRoot"] and security["readOnlyRootFilesystem"]
        assert security["capabilities"]["drop"] == ["ALL"] and not security["allowPrivilegeEscalation"]
        assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
        assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
        # every object as the API server validates it (server-side dry run, nothing is stored)
        consumer.kubectl("create", "namespace", SYSTEM_NAMESPACE, check=False)
        consumer.kubectl("apply", "--dry-run=server", "-f", "-", input=rendered)


@pytest.mark.parametrize(
    "args,message",
    [
        ([], "clusterID is required"),
        (["--set", "clusterID=ML_EU"], "does not match pattern"),
        (["--set", "clusterID=ml-eu", "--set", "provider.replicas=0"], "minimum"),
        (["--set", "clusterID=ml-eu", "--set", "image.pullPolicy=Sometimes"], "must be one of"),
        (
            ["--set", "clusterID=ml-eu", "--namespace", "default"],
            "install gpuferry into the namespace gpuferry-system",
        ),
    ],
)
def test_bad_values_are_refused_with_a_clear_message(
    consumer: LocalCluster, args: list[str], message: str
) -> None:
    namespace = [] if "--namespace" in args else ["--namespace", SYSTEM_NAMESPACE]
    proc = helm(consumer, "template", "gpuferry", str(CHART), *namespace, *args, check=False)
    assert proc.returncode != 0
    assert message in proc.stderr, proc.stderr


@pytest.fixture
def installed(consumer: LocalCluster, provider: LocalCluster, tmp_path: Path) -> Iterator[None]:
    """gpuferry installed by its chart on both clusters; uninstalled afterwards, namespace and all."""
    if not (consumer.has_real_node and provider.has_real_node):
        pytest.fail("the chart's components run on the real nodes: run the tests as root")
    for cluster, cid, role in ((provider, "gpu-farm", "provider"), (consumer, "ml-eu", "consumer")):
        cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CHART / "crds"))
        helm(cluster, "install", "gpuferry", str(CHART), "-n", SYSTEM_NAMESPACE, "--create-namespace",
             "-f", str(local_values(cluster, tmp_path)), "--set", f"clusterID={cid}",
             "--set", f"{role}.enabled=true", "--set", f"{role}.replicas=2",
             "--wait", "--timeout", "120s")  # fmt: skip
    try:
        yield
    finally:
        # a test that failed half-way leaves its peering: undone while the controllers still run
        unpeer = [sys.executable, "-m", "peering.cli.main", "unpeer", "--agents", "none", "-q",
                  "--kubeconfig", str(consumer.spec.kubeconfig),
                  "--remote-kubeconfig", str(provider.spec.kubeconfig)]  # fmt: skip
        env = {**os.environ, "GPUFERRY_CACHE": str(tmp_path / "cache")}
        subprocess.run(unpeer, capture_output=True, timeout=300, env=env, check=False)
        for cluster in (consumer, provider):
            helm(cluster, "uninstall", "gpuferry", "-n", SYSTEM_NAMESPACE, "--wait", check=False)
            cluster.kubectl("delete", "namespace", SYSTEM_NAMESPACE, "--ignore-not-found", "--timeout=120s")


async def test_installed_controllers_peer_and_offload_as_pods(
    installed: None, consumer: LocalCluster, provider: LocalCluster,
    consumer_client: KubeClient, provider_client: KubeClient, tmp_path: Path,
) -> None:  # fmt: skip
    for cluster, role in ((provider, "provider"), (consumer, "consumer")):
        pods = json.loads(cluster.kubectl("-n", SYSTEM_NAMESPACE, "get", "pods", "-o", "json",
                                          "-l", f"app.kubernetes.io/component={role}"))["items"]  # fmt: skip
        assert len(pods) == 2 and all(p["spec"]["nodeName"] == "real-0" for p in pods)
        assert all(p["status"]["phase"] == "Running" for p in pods), role
        # one of the two leads (the Lease names a pod), the other stands by
        lease = json.loads(cluster.kubectl("-n", SYSTEM_NAMESPACE, "get", "lease", f"gpuferry-{role}",
                                           "-o", "json"))  # fmt: skip
        assert any(lease["spec"]["holderIdentity"].startswith(p["metadata"]["name"]) for p in pods), lease

    # the CLI starts nothing: it writes objects; the controllers in the clusters peer
    cli = Cli(consumer, provider, tmp_path / "cache")
    server = f"https://{api_advertise_address(provider.spec)}:{provider.spec.ports.apiserver}"
    out = await cli.ok("peer", "--kubeconfig", cli.c, "--remote-kubeconfig", cli.p, "--agents", "none",
                       "--no-network", "--remote-server", server, "--gpus", "2", "--selector", H100,
                       "-o", "json")  # fmt: skip
    assert json.loads(out)["provider"] == "gpu-farm"
    assert json.loads(await cli.ok("agents", "-o", "json")) == {"agents": []}

    def ready(n: RawObject) -> bool:
        return (condition(n, "Ready") or {}).get("status") == "True"

    node = await wait_for(consumer_client, NODES, virtual_node_name("gpu-farm"), ready, timeout=60)
    # its kubelet runs in the consumer's pod: the Node reports the pod's address
    pod_ips = {
        p["status"]["podIP"]
        for p in json.loads(
            consumer.kubectl(
                "-n",
                SYSTEM_NAMESPACE,
                "get",
                "pods",
                "-o",
                "json",
                "-l",
                "app.kubernetes.io/component=consumer",
            )
        )["items"]
    }
    addresses = {a["address"] for a in node["status"]["addresses"] if a["type"] == "InternalIP"}
    assert addresses <= pod_ips and addresses, (addresses, pod_ips)

    consumer.kubectl("create", "namespace", "chart-work")
    try:
        await cli.ok("offload", "namespace", "chart-work", "--kubeconfig", cli.c)
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "train", "namespace": "chart-work"},
               "spec": {"containers": [{"name": "c", "image": "cuda",
                                        "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}  # fmt: skip
        consumer.kubectl("apply", "-f", "-", input=json.dumps(pod))
        running = await wait_for(consumer_client, PODS, "train",
                                 lambda p: (p.get("status") or {}).get("phase") == "Running",
                                 namespace="chart-work", timeout=90)  # fmt: skip
        assert running["spec"]["nodeName"] == virtual_node_name("gpu-farm")
        twins = (await provider_client.list(PODS, namespace="chart-work-ml-eu"))["items"]
        assert [t["status"]["phase"] for t in twins] == ["Running"]
        # the API server dials the virtual kubelet's API at the consumer pod's address (logs and
        # exec go that way): its /pods, through the node proxy, lists the pod
        proxy = f"/api/v1/nodes/{virtual_node_name('gpu-farm')}/proxy/pods"
        listed = json.loads(consumer.kubectl("get", "--raw", proxy))
        assert [p["metadata"]["name"] for p in listed["items"]] == ["train"]
        await cli.ok("unoffload", "namespace", "chart-work", "--kubeconfig", cli.c)
    finally:
        consumer.kubectl("delete", "namespace", "chart-work", "--wait=false")
    await cli.ok("unpeer", "--kubeconfig", cli.c, "--remote-kubeconfig", cli.p, "--agents", "none")
    # the installation stays: its namespace, its controllers
    for cluster in (consumer, provider):
        replicas = cluster.kubectl("-n", SYSTEM_NAMESPACE, "get", "deploy", "-o",
                                   "jsonpath={.items[*].status.readyReplicas}")  # fmt: skip
        assert replicas.split() == ["2"]
