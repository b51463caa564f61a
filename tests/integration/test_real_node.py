"""The local clusters' real nodes (containerd, kubelet, kube-proxy, CoreDNS, metrics-server): real
containers from images built here, reached with the user's tools.

What a user of a real cluster takes for granted, checked with the real kubectl: a Service by its
DNS name, ``logs -f``, ``exec -i``, ``port-forward``, ``cp`` and ``top``; a kubelet API that wants
credentials; GPUs advertised as an extended resource; the gpuferry image running as a pod; and
two clusters on the same pod CIDR whose pods cannot reach each other without the fabric.
"""

from __future__ import annotations

import ipaddress
import json
import re
import ssl
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest

from hack.localcluster import LocalCluster

from .realpods import (
    ON_REAL_NODE,
    apply,
    get,
    http_server,
    namespace,
    need_real_node,
    pod,
    pod_ip,
    run_in,
    top,
    wait_ready,
)

pytestmark = pytest.mark.integration

POD_CIDR = ipaddress.ip_network("10.244.0.0/16")


def _kubectl(cluster: LocalCluster, *args: str) -> list[str]:
    return [str(cluster.bin.kubectl), f"--kubeconfig={cluster.spec.kubeconfig}", *args]


def test_a_service_answers_by_its_dns_name_from_another_pod(consumer: LocalCluster) -> None:
    need_real_node(consumer)
    image = consumer.images["testbox"]
    with namespace(consumer, "svc") as ns:
        template = http_server("web", image)
        deployment = {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "web"},
            "spec": {
                "replicas": 2,
                "selector": {"matchLabels": {"app": "web"}},
                "template": {"metadata": {"labels": {"app": "web"}}, "spec": template["spec"]},
            },
        }
        service = {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "web"},
            "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]},
        }
        apply(consumer, ns, deployment, service, pod("client", image, ["sleep", "3600"]))
        consumer.kubectl("-n", ns, "rollout", "status", "deployment/web", "--timeout=90s")
        wait_ready(consumer, ns, "client")
        backends = set(consumer.kubectl("-n", ns, "get", "pods", "-l", "app=web", "-o", "name").split())
        backends = {b.removeprefix("pod/") for b in backends}
        assert len(backends) == 2

        answered: set[str] = set()
        refused: list[str] = []
        for _ in range(60):  # kube-proxy spreads connections over both endpoints
            got = run_in(
                consumer, ns, "client", "timeout", "5", "wget", "-qO-", f"http://web.{ns}.svc.cluster.local/"
            )
            if got.returncode != 0 and not answered and len(refused) < 30:
                # the EndpointSlice controller, kube-proxy and CoreDNS follow the rollout on their
                # own time: until the first answer, a refusal is a wait; after it, an error
                refused.append(got.stderr.strip())
                time.sleep(1)
                continue
            assert got.returncode == 0, (got.stderr, refused)
            answered.add(got.stdout.strip())
            if answered == backends:
                break
        assert answered == backends, refused
        # the short name through the pod's search domains, as an application would use it
        short = run_in(consumer, ns, "client", "timeout", "5", "wget", "-qO-", "http://web/")
        assert short.returncode == 0 and short.stdout.strip() in backends, short.stderr
        # and a name that does not exist is an error, not an answer
        assert (
            run_in(consumer, ns, "client", "timeout", "5", "wget", "-qO-", "http://nosuch/").returncode != 0
        )


def test_logs_exec_port_forward_cp_and_top_on_a_real_pod(consumer: LocalCluster, tmp_path: Path) -> None:
    need_real_node(consumer)
    script = (
        "mkdir -p /tmp/www && hostname > /tmp/www/index.html && httpd -p 8080 -h /tmp/www && "
        "i=0; while true; do echo line $i; i=$((i+1)); sleep 0.2; done"
    )
    with namespace(consumer, "verbs") as ns:
        apply(consumer, ns, pod("box", consumer.images["testbox"], ["sh", "-c", script]))
        wait_ready(consumer, ns, "box")

        # logs -f: lines keep arriving while we read
        follow = subprocess.Popen(
            _kubectl(consumer, "-n", ns, "logs", "-f", "box"), stdout=subprocess.PIPE, text=True
        )
        try:
            assert follow.stdout is not None
            numbers = [int(follow.stdout.readline().split()[1]) for _ in range(15)]
        finally:
            follow.kill()
            follow.wait()
        assert numbers == list(range(numbers[0], numbers[0] + 15)), numbers

        # exec -i: stdin reaches the process, its stdout comes back
        upper = subprocess.run(
            _kubectl(consumer, "-n", ns, "exec", "-i", "box", "--", "tr", "a-z", "A-Z"),
            input="hello real node\n",
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert upper.stdout == "HELLO REAL NODE\n", upper.stderr

        # port-forward: a local port reaches the pod's server
        forward = subprocess.Popen(
            _kubectl(consumer, "-n", ns, "port-forward", "pod/box", ":8080"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert forward.stdout is not None
            match = re.search(r"127\.0\.0\.1:(\d+) -> 8080", forward.stdout.readline())
            assert match, "port-forward did not say where it listens"
            with urllib.request.urlopen(f"http://127.0.0.1:{match[1]}/", timeout=10) as resp:
                assert resp.read().decode().strip() == "box"
        finally:
            forward.kill()
            forward.wait()

        # cp both ways: the bytes survive the round trip
        payload = tmp_path / "payload.txt"
        payload.write_text(f"gpuferry {uuid.uuid4()}\n" * 100)
        consumer.kubectl("-n", ns, "cp", str(payload), "box:/tmp/payload.txt")
        assert run_in(consumer, ns, "box", "cat", "/tmp/payload.txt").stdout == payload.read_text()
        back = tmp_path / "back.txt"
        consumer.kubectl("-n", ns, "cp", "box:/tmp/payload.txt", str(back))
        assert back.read_text() == payload.read_text()

        # attach: to the stdin and stdout of a running container's main process
        echo = pod(
            "echo",
            consumer.images["testbox"],
            ["sh", "-c", 'while read l; do echo "got $l"; done'],
            restartPolicy="Never",
            container={"stdin": True, "stdinOnce": True},
        )
        apply(consumer, ns, echo)
        wait_ready(consumer, ns, "echo")
        attached = subprocess.run(
            _kubectl(consumer, "-n", ns, "attach", "-i", "echo"),
            input="ping\n",
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert "got ping" in attached.stdout, attached.stderr

        # top: metrics-server scrapes the real kubelet (resolution 15 s); top() returns once CPU
        # reads in millicores and memory in MiB
        name, cpu, memory = top(consumer, "-n", ns, "pod", "box", timeout=120)
        assert name == "box" and cpu >= 0 and memory >= 0


def test_the_real_kubelet_api_wants_credentials(consumer: LocalCluster) -> None:
    need_real_node(consumer)
    node = get(consumer, "", "node", "real-0")
    address = next(a["address"] for a in node["status"]["addresses"] if a["type"] == "InternalIP")
    port = node["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"]
    url = f"https://{address}:{port}/pods"
    pki = consumer.spec.pki_dir
    anonymous = ssl.create_default_context(cafile=str(pki / "ca.crt"))  # its serving certificate verifies
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(url, context=anonymous, timeout=10)
    assert refused.value.code == 401
    admin = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    admin.load_cert_chain(pki / "admin.crt", pki / "admin.key")
    with urllib.request.urlopen(url, context=admin, timeout=10) as resp:
        pods = json.loads(resp.read())
    assert any(p["metadata"]["name"].startswith("coredns-") for p in pods["items"])


def test_the_provider_real_node_runs_gpu_pods_as_real_containers(provider: LocalCluster) -> None:
    need_real_node(provider)
    node = get(provider, "", "node", "real-0")
    assert node["status"]["capacity"]["nvidia.com/gpu"] == "2"
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "2"
    assert node["metadata"]["labels"]["nvidia.com/gpu.product"] == "Tesla-T4"
    image = provider.images["testbox"]
    one_gpu = {"resources": {"limits": {"nvidia.com/gpu": "1"}}}
    with namespace(provider, "gpu") as ns:
        script = "echo training on $(hostname); sleep 3600"
        apply(
            provider,
            ns,
            pod("train", image, ["sh", "-c", script], container=one_gpu),
            pod(
                "too-big",
                image,
                ["sleep", "3600"],
                container={"resources": {"limits": {"nvidia.com/gpu": "3"}}},
            ),
        )
        wait_ready(provider, ns, "train")
        assert get(provider, ns, "pod", "train")["spec"]["nodeName"] == "real-0"
        assert provider.kubectl("-n", ns, "logs", "train").strip() == "training on train"
        deadline = time.monotonic() + 30
        while "Insufficient nvidia.com/gpu" not in provider.kubectl("-n", ns, "get", "events", "-o", "json"):
            assert time.monotonic() < deadline, "the 3-GPU pod was not refused for GPUs"
            time.sleep(0.5)
        assert get(provider, ns, "pod", "too-big")["status"]["phase"] == "Pending"


def test_the_gpuferry_image_runs_as_a_pod(consumer: LocalCluster) -> None:
    need_real_node(consumer)
    checks = (
        "gpuferry --help >/dev/null && echo cli-ok && "
        "python -c 'import kube, vk, peering, netfabric; print(\"modules-ok\")' && "
        "nft --version && ip -V && wireguard-go --version"
    )
    with namespace(consumer, "image") as ns:
        apply(
            consumer,
            ns,
            pod("gpuferry", consumer.images["gpuferry"], ["sh", "-c", checks], restartPolicy="Never"),
        )
        consumer.kubectl(
            "-n", ns, "wait", "--for=jsonpath={.status.phase}=Succeeded", "pod/gpuferry", "--timeout=120s"
        )
        out = consumer.kubectl("-n", ns, "logs", "gpuferry")
    assert "cli-ok" in out and "modules-ok" in out
    assert "nftables v" in out and "iproute2" in out and "wireguard-go v" in out


def test_pods_of_the_two_clusters_reach_each_other_only_through_the_fabric(
    consumer: LocalCluster, provider: LocalCluster
) -> None:
    need_real_node(consumer)
    need_real_node(provider)
    with namespace(consumer, "iso") as cns, namespace(provider, "iso") as pns:
        for cluster, ns in ((consumer, cns), (provider, pns)):
            image = cluster.images["testbox"]
            apply(cluster, ns, http_server("server", image), pod("client", image, ["sleep", "3600"]))
        for cluster, ns in ((consumer, cns), (provider, pns)):
            wait_ready(cluster, ns, "server", "client")
        c_server, p_server = pod_ip(consumer, cns, "server"), pod_ip(provider, pns, "server")
        assert ipaddress.ip_address(c_server) in POD_CIDR and ipaddress.ip_address(p_server) in POD_CIDR

        def fetch(cluster: LocalCluster, ns: str, target: str) -> subprocess.CompletedProcess[str]:
            return run_in(cluster, ns, "client", "timeout", "3", "wget", "-qO-", target)

        # each cluster's pods reach each other ...
        assert fetch(consumer, cns, f"http://{c_server}:8080/").stdout.strip() == "server"
        assert fetch(provider, pns, f"http://{p_server}:8080/").stdout.strip() == "server"
        # ... and the other cluster's nodes on the WAN (its kubelet's health endpoint) ...
        p_node = get(provider, "", "node", "real-0")["status"]["addresses"][0]["address"]
        assert fetch(consumer, cns, f"http://{p_node}:10248/healthz").stdout.strip() == "ok"
        # ... but not the other cluster's pods: without the fabric there is no way in
        assert fetch(consumer, cns, f"http://{p_server}:8080/").returncode != 0
        assert fetch(provider, pns, f"http://{c_server}:8080/").returncode != 0


def test_real_node_workloads_stay_off_it_unless_they_ask(consumer: LocalCluster) -> None:
    """The real node is tainted: pods written for kwok's simulated nodes (images that exist
    nowhere) never land on the one node that really pulls images."""
    need_real_node(consumer)
    node = get(consumer, "", "node", "real-0")
    assert {"key": "gpuferry.io/real-node", "value": "true", "effect": "NoSchedule"} in node["spec"]["taints"]
    with namespace(consumer, "taint") as ns:
        plain = pod("plain", "registry.example/nothing:1", ["true"])
        plain["spec"] = {k: v for k, v in plain["spec"].items() if k not in ON_REAL_NODE}
        apply(consumer, ns, plain)
        consumer.kubectl("-n", ns, "wait", "--for=condition=PodScheduled", "pod/plain", "--timeout=30s")
        assert get(consumer, ns, "pod", "plain")["spec"]["nodeName"] != "real-0"
