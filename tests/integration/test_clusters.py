"""Real Kubernetes behaviour the rest of gpuferry relies on, checked on the local clusters:
GPU scheduling on kwok nodes, quota, controllers, CSR signing, Job completion."""

from __future__ import annotations

import base64
import contextlib
import json
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from hack.localcluster import LocalCluster
from kube.clients import KubeClient
from kube.errors import Forbidden, namespace_terminating
from kube.objects import (
    CONFIGMAPS,
    CSRS,
    DEVICECLASSES,
    EVENTS,
    JOBS,
    NAMESPACES,
    NODES,
    PODS,
    RESOURCEQUOTAS,
    RESOURCESLICES,
    RawObject,
)

from .conftest import NamespaceFactory
from .waiting import condition, wait_for, wait_for_deletion, wait_for_empty

pytestmark = pytest.mark.integration


def gpu_pod(name: str, gpus: int, **annotations: str) -> RawObject:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {
            "containers": [
                {
                    "name": "cuda",
                    "image": "nvcr.io/nvidia/cuda:13.0.0-base-ubuntu24.04",
                    "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
                }
            ],
        },
    }


async def test_provider_nodes_look_like_gpu_nodes(
    provider: LocalCluster, provider_client: KubeClient
) -> None:
    nodes = {n["metadata"]["name"]: n for n in (await provider_client.list(NODES))["items"]}
    # and, as root, the real node (a kubelet), with two GPUs as an extended resource
    real = {"real-0": "2"} if provider.has_real_node else {}
    gpus = {name: n["status"]["allocatable"].get("nvidia.com/gpu") for name, n in nodes.items()}
    assert gpus == {
        "gpu-h100-0": "8",
        "gpu-h100-1": "8",
        "gpu-h100-2": "8",
        "gpu-h100-3": "8",
        "gpu-l4-0": "2",
        "gpu-l4-1": "2",
        "cpu-0": None,
        "gpu-a100-mig-0": None,
        "gpu-a100-mig-1": None,
        "gpu-l4-shared-0": None,
        "gpu-hami-0": "40",
        "gpu-metagpu-0": None,
        "gpu-dra-h100-0": None,  # DRA devices, not an extended resource
        "gpu-dra-l4-0": None,
        **real,
    }
    # the shared and partitioned pools advertise their own units (issue 18)
    devices = {
        name: {k: v for k, v in n["status"]["allocatable"].items() if "/" in k and k != "nvidia.com/gpu"}
        for name, n in nodes.items()
    }
    mig = {"nvidia.com/mig-1g.10gb": "16", "nvidia.com/mig-2g.20gb": "8", "nvidia.com/mig-3g.40gb": "8"}
    assert devices["gpu-a100-mig-0"] == devices["gpu-a100-mig-1"] == mig
    assert devices["gpu-l4-shared-0"] == {"nvidia.com/gpu.shared": "16"}
    assert devices["gpu-hami-0"] == {"nvidia.com/gpumem": "92112", "nvidia.com/gpucores": "400"}
    assert devices["gpu-metagpu-0"] == {"cnvrg.io/metagpu": "200"}
    assert devices["gpu-h100-0"] == {}
    mig_labels = nodes["gpu-a100-mig-0"]["metadata"]["labels"]
    assert mig_labels["nvidia.com/mig.strategy"] == "mixed"
    assert mig_labels["nvidia.com/mig-3g.40gb.count"] == "8"
    shared = nodes["gpu-l4-shared-0"]["metadata"]["labels"]
    assert shared["nvidia.com/gpu.replicas"] == "4"
    assert shared["nvidia.com/gpu.sharing-strategy"] == "time-slicing"
    assert shared["nvidia.com/gpu.product"] == "NVIDIA-L4-SHARED"
    assert [t["key"] for t in nodes["gpu-hami-0"]["spec"]["taints"]] == ["hami.io/vgpu"]
    # what NVIDIA's DRA driver would publish for the DRA nodes
    slices = (await provider_client.list(RESOURCESLICES))["items"]
    dra = {s["spec"]["nodeName"]: s for s in slices if s["spec"]["driver"] == "gpu.nvidia.com"}
    assert sorted(dra) == ["gpu-dra-h100-0", "gpu-dra-l4-0"]
    devices_h100 = dra["gpu-dra-h100-0"]["spec"]["devices"]
    assert len(devices_h100) == 4 and devices_h100[0]["capacity"]["memory"]["value"] == "80Gi"
    assert devices_h100[0]["attributes"]["productName"] == {"string": "NVIDIA H100 80GB HBM3"}
    assert (await provider_client.get(DEVICECLASSES, "gpu.nvidia.com"))["spec"]["selectors"]
    h100 = nodes["gpu-h100-0"]["metadata"]["labels"]
    assert h100["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert h100["nvidia.com/gpu.memory"] == "81559"
    assert h100["nvidia.com/gpu.count"] == "8"
    assert nodes["gpu-l4-1"]["metadata"]["labels"]["nvidia.com/gpu.product"] == "NVIDIA-L4"
    assert all(condition(n, "Ready")["status"] == "True" for n in nodes.values())  # type: ignore[index]


async def test_gpu_pod_is_scheduled_on_a_gpu_node_and_runs(
    provider_client: KubeClient, provider_ns: str
) -> None:
    await provider_client.create(PODS, gpu_pod("train", 2), namespace=provider_ns)
    pod = await wait_for(
        provider_client,
        PODS,
        "train",
        lambda p: p.get("status", {}).get("phase") == "Running",
        namespace=provider_ns,
    )
    node = await provider_client.get(NODES, pod["spec"]["nodeName"])
    assert int(node["status"]["allocatable"]["nvidia.com/gpu"]) >= 2
    assert pod["status"]["podIP"].startswith("10.244.")


async def test_pod_asking_more_gpus_than_any_node_has_stays_pending(
    provider_client: KubeClient, provider_ns: str
) -> None:
    await provider_client.create(PODS, gpu_pod("too-big", 9), namespace=provider_ns)
    pod = await wait_for(
        provider_client,
        PODS,
        "too-big",
        lambda p: (condition(p, "PodScheduled") or {}).get("reason") == "Unschedulable",
        namespace=provider_ns,
    )
    scheduled = condition(pod, "PodScheduled")
    assert scheduled is not None and scheduled["status"] == "False"
    assert "Insufficient nvidia.com/gpu" in scheduled["message"]
    assert pod["status"]["phase"] == "Pending"


async def test_resource_quota_on_gpus_refuses_a_pod_over_it(
    provider_client: KubeClient, provider_ns: str
) -> None:
    quota: RawObject = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "gpus"},
        "spec": {"hard": {"requests.nvidia.com/gpu": "3"}},
    }
    await provider_client.create(RESOURCEQUOTAS, quota, namespace=provider_ns)
    # the quota controller must have computed usage before admission can count against it
    await wait_for(
        provider_client,
        RESOURCEQUOTAS,
        "gpus",
        lambda q: "used" in q.get("status", {}),
        namespace=provider_ns,
    )
    await provider_client.create(PODS, gpu_pod("fits", 2), namespace=provider_ns)
    with pytest.raises(Forbidden) as refused:
        await provider_client.create(PODS, gpu_pod("over", 2), namespace=provider_ns)
    assert "exceeded quota: gpus" in str(refused.value)
    assert (
        "requests.nvidia.com/gpu=2, used: requests.nvidia.com/gpu=2, limited: requests.nvidia.com/gpu=3"
        in str(refused.value)
    )


async def test_job_pods_complete_when_asked_and_other_pods_keep_running(
    provider_client: KubeClient, provider_ns: str
) -> None:
    job: RawObject = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "finetune"},
        "spec": {
            "completions": 2,
            "parallelism": 2,
            "backoffLimit": 0,
            "template": {
                "metadata": {"annotations": {"gpuferry.io/simulate-complete-after": "1s"}},
                "spec": {**gpu_pod("x", 1)["spec"], "restartPolicy": "Never"},
            },
        },
    }
    await provider_client.create(JOBS, job, namespace=provider_ns)
    await provider_client.create(PODS, gpu_pod("server", 1), namespace=provider_ns)
    done = await wait_for(
        provider_client,
        JOBS,
        "finetune",
        lambda j: (condition(j, "Complete") or {}).get("status") == "True",
        namespace=provider_ns,
        timeout=60,
    )
    assert done["status"]["succeeded"] == 2
    # kwok runs it on its own time, as it ran the Job's pods
    await wait_for(provider_client, PODS, "server", lambda p: p.get("status", {}).get("phase") == "Running",
                   namespace=provider_ns, timeout=60)  # fmt: skip


async def test_controllers_run_deployments_service_accounts_and_garbage_collection(
    provider_client: KubeClient, provider_ns: str
) -> None:
    from kube.objects import CONFIGMAPS, SERVICEACCOUNTS, Resource

    deployments = Resource("apps", "v1", "deployments", "Deployment", namespaced=True)
    replicasets = Resource("apps", "v1", "replicasets", "ReplicaSet", namespaced=True)
    # service-account and root-CA publisher controllers
    await wait_for(provider_client, SERVICEACCOUNTS, "default", lambda _: True, namespace=provider_ns)
    root_ca = await wait_for(
        provider_client, CONFIGMAPS, "kube-root-ca.crt", lambda _: True, namespace=provider_ns
    )
    assert "BEGIN CERTIFICATE" in root_ca["data"]["ca.crt"]

    deploy: RawObject = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web"},
        "spec": {
            "replicas": 3,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "c", "image": "nginx"}]},
            },
        },
    }
    await provider_client.create(deployments, deploy, namespace=provider_ns)
    await wait_for(
        provider_client,
        deployments,
        "web",
        lambda d: d.get("status", {}).get("readyReplicas") == 3,
        namespace=provider_ns,
        timeout=60,
    )
    # garbage collector: deleting the Deployment in the foreground removes its ReplicaSet and pods
    await provider_client.delete(deployments, "web", namespace=provider_ns, propagation_policy="Foreground")
    await wait_for_empty(provider_client, replicasets, provider_ns)
    await wait_for_empty(provider_client, PODS, provider_ns)


def _csr_pem(
    common_name: str, groups: list[str], *, server: bool
) -> tuple[bytes, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, g) for g in groups]
    attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    builder = x509.CertificateSigningRequestBuilder().subject_name(x509.Name(attrs))
    if server:
        import ipaddress

        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False
        )
    csr = builder.sign(key, hashes.SHA256())
    return csr.public_bytes(serialization.Encoding.PEM), key


async def _approve_and_fetch(
    client: KubeClient, name: str, signer: str, pem: bytes, usages: list[str]
) -> bytes:
    body: RawObject = {
        "apiVersion": "certificates.k8s.io/v1",
        "kind": "CertificateSigningRequest",
        "metadata": {"name": name},
        "spec": {
            "request": base64.b64encode(pem).decode(),
            "signerName": signer,
            "usages": usages,
            "expirationSeconds": 3600,
        },
    }
    created = await client.create(CSRS, body)
    created["status"] = {
        "conditions": [
            {
                "type": "Approved",
                "status": "True",
                "reason": "GpuferryTest",
                "message": "approved by the test",
            }
        ]
    }
    await client.replace(CSRS, name, created, subresource="approval")
    signed = await wait_for(client, CSRS, name, lambda c: bool(c.get("status", {}).get("certificate")))
    await client.delete(CSRS, name)
    return base64.b64decode(signed["status"]["certificate"])


async def test_client_certificate_from_the_csr_api_authenticates(
    provider: LocalCluster, provider_client: KubeClient, provider_ns: str, tmp_path: Any
) -> None:
    user = f"gpuferry-test-{provider_ns[-6:]}"
    pem, key = _csr_pem(user, ["gpuferry:testers"], server=False)
    cert = await _approve_and_fetch(
        provider_client,
        user,
        "kubernetes.io/kube-apiserver-client",
        pem,
        ["digital signature", "client auth"],
    )
    parsed = x509.load_pem_x509_certificate(cert)
    issuer = x509.load_pem_x509_certificate((provider.spec.pki_dir / "ca.crt").read_bytes())
    assert parsed.issuer == issuer.subject

    # a kubeconfig with the signed certificate: the API server knows who we are (not 401) ...
    (tmp_path / "tls.crt").write_bytes(cert)
    (tmp_path / "tls.key").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    kubeconfig = tmp_path / "user.kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {
                        "name": "p",
                        "cluster": {
                            "server": provider.spec.server,
                            "certificate-authority": str(provider.spec.pki_dir / "ca.crt"),
                        },
                    }
                ],
                "users": [
                    {
                        "name": "u",
                        "user": {
                            "client-certificate": str(tmp_path / "tls.crt"),
                            "client-key": str(tmp_path / "tls.key"),
                        },
                    }
                ],
                "contexts": [{"name": "c", "context": {"cluster": "p", "user": "u"}}],
                "current-context": "c",
            }
        )
    )
    async with KubeClient.from_kubeconfig(kubeconfig) as as_user:
        review = await as_user.request(
            "POST",
            "/apis/authentication.k8s.io/v1/selfsubjectreviews",
            json={"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
        )
        info = review["status"]["userInfo"]
        assert info["username"] == user
        assert "gpuferry:testers" in info["groups"]
        # ... and RBAC still decides what it may do: nothing, so far
        with pytest.raises(Forbidden):
            await as_user.list(PODS, namespace=provider_ns)


async def test_kubelet_serving_certificate_is_signed(provider_client: KubeClient) -> None:
    node = "gpuferry-test-node"
    pem, _ = _csr_pem(f"system:node:{node}", ["system:nodes"], server=True)
    cert = await _approve_and_fetch(
        provider_client,
        f"{node}-serving",
        "kubernetes.io/kubelet-serving",
        pem,
        ["digital signature", "server auth"],
    )
    parsed = x509.load_pem_x509_certificate(cert)
    assert parsed.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == f"system:node:{node}"
    usages = parsed.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert x509.oid.ExtendedKeyUsageOID.SERVER_AUTH in usages



async def test_a_namespace_being_deleted_refuses_new_content_with_its_own_cause(
    consumer_client: KubeClient, make_namespace: NamespaceFactory
) -> None:
    ns = await make_namespace(consumer_client)
    held = {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "held", "finalizers": ["test.gpuferry.io/hold"]}}  # fmt: skip
    await consumer_client.create(CONFIGMAPS, held, ns)
    event = {
        "apiVersion": "v1", "kind": "Event", "metadata": {"name": "late"}, "reason": "Late",
        "message": "a provider event", "involvedObject": {"kind": "Pod", "name": "p", "namespace": ns},
    }  # fmt: skip
    await consumer_client.create(EVENTS, {**event, "metadata": {"name": "early"}}, ns)
    await consumer_client.delete(NAMESPACES, ns)  # stays Terminating while the ConfigMap is held
    try:
        with pytest.raises(Forbidden) as refused:
            await consumer_client.create(EVENTS, event, ns)
        assert namespace_terminating(refused.value), refused.value.body
    finally:
        await consumer_client.patch(CONFIGMAPS, "held", {"metadata": {"finalizers": None}}, ns)
        await wait_for_deletion(consumer_client, NAMESPACES, ns, None, timeout=60)


def test_a_cluster_knows_every_process_it_runs(provider: LocalCluster) -> None:
    """What the bench's --split-cores pins: the components, and the processes of the node's pods."""
    names = set()
    for pid in provider.processes():
        with contextlib.suppress(FileNotFoundError):
            names.add(Path(f"/proc/{pid}/comm").read_text().strip())
    assert {"etcd", "kube-apiserver", "kube-scheduler", "kwok"} <= names
    if provider.has_real_node:
        assert {"kubelet", "containerd", "pause"} <= names, "the real node and its pods' processes"


async def test_kwok_logs_warnings_only(
    provider: LocalCluster, provider_client: KubeClient, provider_ns: str
) -> None:
    """kwok at INFO logs every Lease renewed and every pod and node patched (57 MB in 30 min at
    1252 nodes): the clusters start it at WARN."""
    await provider_client.create(PODS, gpu_pod("logged", 1), namespace=provider_ns)
    await wait_for(provider_client, PODS, "logged", lambda p: p.get("status", {}).get("phase") == "Running",
                   namespace=provider_ns)  # fmt: skip
    records = [json.loads(line) for line in (provider.spec.log_dir / "kwok.log").read_text().splitlines()
               if line.startswith("{")]  # fmt: skip
    chatter = [r for r in records if r.get("level") in ("DEBUG", "INFO")]
    assert chatter == [], "kwok ran the pod and said nothing about it"
