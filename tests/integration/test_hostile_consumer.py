"""A hostile consumer (issue 16): the identity the provider issued to the consumer, taken from the
consumer's Secret and used straight against the provider's API server, tries what it must not.

Every attempt is one row: what it tries, and the exact words of the refusal (RBAC, Pod Security,
the grant's quota, or one of the provider's admission policies). The five escalations the issue
found working (other nodes, a priority class, externalIPs, rewriting its network, choosing other
nodes for its slice), and what else a consumer writes in its Tenant, are rows too; each of them
passes on the code before issue 16 (the request was admitted), so each row fails there.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest

from kube.clients import KubeClient
from kube.errors import Forbidden, KubeError
from kube.objects import (
    CLUSTERROLEBINDINGS,
    CSRS,
    ENDPOINTSLICES,
    LIMITRANGES,
    NAMESPACES,
    NODES,
    PEERNETWORKS,
    PODS,
    RESOURCEQUOTAS,
    ROLEBINDINGS,
    ROLES,
    SECRETS,
    SERVICEACCOUNTS,
    SERVICES,
    TENANTS,
    VALIDATINGADMISSIONPOLICIES,
    VALIDATINGADMISSIONPOLICYBINDINGS,
    RawObject,
)
from peering.resources import GPUSLICES
from vk.kubelet.certificates import csr_object, make_key_and_csr

from .clirunner import Cli
from .conftest import NamespaceFactory
from .test_e2e_story import H100, gpu_pod, peer_quietly

pytestmark = pytest.mark.integration

ME = "gpuferry:consumer:ml-eu"
TENANT_NS = "gpuferry-tenant-ml-eu"
H100_SELECTOR = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
L4_SELECTOR = {"nvidia.com/gpu.product": "NVIDIA-L4"}
OTHER_TENANT_NS = "gpuferry-tenant-someone-else"
POLICY = "ValidatingAdmissionPolicy '{0}' with binding '{0}' denied request: "


@dataclass(frozen=True)
class Attempt:
    name: str
    call: Callable[[KubeClient], Awaitable[Any]]
    refusal: str
    """The refusal, word for word (a part of the API server's message that says who refused and why)."""


def rbac(verb: str, resource: str, group: str = "", namespace: str | None = None) -> str:
    where = f' in the namespace "{namespace}"' if namespace else " at the cluster scope"
    return f'User "{ME}" cannot {verb} resource "{resource}" in API group "{group}"{where}'


def pod(name: str, *, gpus: int = 1, selector: dict[str, str] | None = None, **spec: Any) -> RawObject:
    body = gpu_pod(name, gpus)
    body["spec"]["nodeSelector"] = dict(H100_SELECTOR if selector is None else selector)
    container = spec.pop("container", None)
    if container:
        body["spec"]["containers"][0].update(container)
    body["spec"].update(spec)
    if not body["spec"]["nodeSelector"]:
        del body["spec"]["nodeSelector"]
    return body


def service(name: str, **spec: Any) -> RawObject:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name},
        "spec": {"ports": [{"port": 80}], **spec},
    }


ENDPOINTS_REFUSAL = (
    "a tenant's EndpointSlice may point at pods only (IPv4 addresses in 10.244.0.0/16): anything else "
    "would send its Service's traffic outside the tenant (CVE-2021-25740)"
)


def endpoint_slice(name: str, address: str) -> RawObject:
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"name": name, "labels": {"kubernetes.io/service-name": "plain"}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": [address]}],
        "ports": [{"port": 443}],
    }


def baseline(field: str) -> str:
    return f'violates PodSecurity "baseline:latest": {field}'


def attempts(twin: str, l4_node: str) -> list[Attempt]:
    """Every attempt, against the twin namespace ``twin`` of an offloaded namespace."""
    pinned = (
        "a tenant's pod must keep to the nodes of its grant: its nodeSelector must carry "
        "nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3"
    )
    slices = POLICY.format("gpuferry-slice-self-service")
    tenants = POLICY.format("gpuferry-tenant-self-service")
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": "mine"},
        "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}],
    }
    admin_binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": "ml-eu-admin"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": ME}],
    }
    pem = make_key_and_csr("gpu-h100-0", ("10.0.0.1",)).csr_pem
    csr = csr_object("ml-eu-node", pem, expiration_seconds=3600)

    def tenant_spec(**spec: Any) -> Callable[[KubeClient], Awaitable[Any]]:
        return lambda me: me.patch(TENANTS, "ml-eu", {"spec": spec}, TENANT_NS)

    def raw(method: str, path: str, **headers: str) -> Callable[[KubeClient], Awaitable[Any]]:
        return lambda me: me.request(method, path, headers=headers)

    return [
        # -- beyond its namespaces ---------------------------------------------------------------
        Attempt(
            "pods elsewhere", lambda me: me.list(PODS, "default"), rbac("list", "pods", namespace="default")
        ),
        Attempt(
            "a pod elsewhere",
            lambda me: me.create(PODS, pod("elsewhere"), "default"),
            rbac("create", "pods", namespace="default"),
        ),
        Attempt(
            "secrets of kube-system",
            lambda me: me.list(SECRETS, "kube-system"),
            rbac("list", "secrets", namespace="kube-system"),
        ),
        Attempt(
            "the peering token",
            lambda me: me.get(SECRETS, "peering-token", TENANT_NS),
            rbac("get", "secrets", namespace=TENANT_NS),
        ),
        Attempt("every secret", lambda me: me.list(SECRETS), rbac("list", "secrets")),
        Attempt(
            "secrets of its twin namespace's neighbours",
            lambda me: me.list(SECRETS, "gpuferry-system"),
            rbac("list", "secrets", namespace="gpuferry-system"),
        ),
        Attempt(
            "a namespace",
            lambda me: me.create(
                NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ml-eu-mine"}}
            ),
            rbac("create", "namespaces"),
        ),
        Attempt(
            "deleting its twin namespace",
            lambda me: me.delete(NAMESPACES, twin),
            rbac("delete", "namespaces", namespace=twin),
        ),
        Attempt(
            "a privileged label on its twin namespace",
            lambda me: me.patch(
                NAMESPACES,
                twin,
                {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "privileged"}}},
            ),
            rbac("patch", "namespaces", namespace=twin),
        ),
        Attempt(
            "another tenant's slice",
            lambda me: me.list(GPUSLICES, OTHER_TENANT_NS),
            rbac("list", "gpuslices", "sharing.gpuferry.io", OTHER_TENANT_NS),
        ),
        Attempt(
            "another tenant's Tenant",
            lambda me: me.get(TENANTS, "someone-else", OTHER_TENANT_NS),
            rbac("get", "tenants", "core.gpuferry.io", OTHER_TENANT_NS),
        ),
        Attempt(
            "another tenant's pods",
            lambda me: me.list(PODS, OTHER_TENANT_NS),
            rbac("list", "pods", namespace=OTHER_TENANT_NS),
        ),
        Attempt("every tenant", lambda me: me.list(TENANTS), rbac("list", "tenants", "core.gpuferry.io")),
        # -- Pod Security (baseline) in its twin namespace ------------------------------------------
        Attempt(
            "privileged",
            lambda me: me.create(
                PODS, pod("privileged", container={"securityContext": {"privileged": True}}), twin
            ),
            baseline('privileged (container "c" must not set securityContext.privileged=true)'),
        ),
        Attempt(
            "hostPath",
            lambda me: me.create(
                PODS, pod("hostpath", volumes=[{"name": "root", "hostPath": {"path": "/"}}]), twin
            ),
            baseline('hostPath volumes (volume "root")'),
        ),
        Attempt(
            "hostNetwork",
            lambda me: me.create(PODS, pod("hostnet", hostNetwork=True), twin),
            baseline("host namespaces (hostNetwork=true)"),
        ),
        Attempt(
            "hostPID",
            lambda me: me.create(PODS, pod("hostpid", hostPID=True), twin),
            baseline("host namespaces (hostPID=true)"),
        ),
        Attempt(
            "hostIPC",
            lambda me: me.create(PODS, pod("hostipc", hostIPC=True), twin),
            baseline("host namespaces (hostIPC=true)"),
        ),
        Attempt(
            "hostPort",
            lambda me: me.create(
                PODS, pod("hostport", container={"ports": [{"containerPort": 80, "hostPort": 80}]}), twin
            ),
            baseline('hostPort (container "c" uses hostPort 80)'),
        ),
        Attempt(
            "CAP_SYS_ADMIN",
            lambda me: me.create(
                PODS,
                pod("sysadmin", container={"securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}}}),
                twin,
            ),
            baseline(
                'non-default capabilities (container "c" must not include "SYS_ADMIN" in '
                "securityContext.capabilities.add)"
            ),
        ),
        Attempt(
            "an unsafe sysctl",
            lambda me: me.create(
                PODS,
                pod("sysctl", securityContext={"sysctls": [{"name": "kernel.msgmax", "value": "1"}]}),
                twin,
            ),
            baseline("forbidden sysctls (kernel.msgmax)"),
        ),
        Attempt(
            "no AppArmor",
            lambda me: me.create(
                PODS, pod("unconfined", securityContext={"appArmorProfile": {"type": "Unconfined"}}), twin
            ),
            baseline('forbidden AppArmor profile (pod must not set AppArmor profile type to "Unconfined")'),
        ),
        # -- the grant (2 GPUs) and its quota --------------------------------------------------------
        Attempt(
            "more GPUs than granted",
            lambda me: me.create(PODS, pod("greedy", gpus=3), twin),
            "exceeded quota: gpuferry-grant, requested: requests.nvidia.com/gpu=3, used: "
            "requests.nvidia.com/gpu=0, limited: requests.nvidia.com/gpu=2",
        ),
        Attempt(
            "a NodePort Service",
            lambda me: me.create(SERVICES, service("np", type="NodePort"), twin),
            "exceeded quota: gpuferry-grant, requested: services.nodeports=1, used: "
            "services.nodeports=0, limited: services.nodeports=0",
        ),
        Attempt(
            "a LoadBalancer Service",
            lambda me: me.create(SERVICES, service("lb", type="LoadBalancer"), twin),
            "exceeded quota: gpuferry-grant, requested: services.loadbalancers=1,services.nodeports=1, "
            "used: services.loadbalancers=0,services.nodeports=0, limited: services.loadbalancers=0,"
            "services.nodeports=0",
        ),
        Attempt(
            "raising its quota",
            lambda me: me.patch(
                RESOURCEQUOTAS, "gpuferry-grant", {"spec": {"hard": {"requests.nvidia.com/gpu": "64"}}}, twin
            ),
            rbac("patch", "resourcequotas", namespace=twin),
        ),
        Attempt(
            "deleting its quota",
            lambda me: me.delete(RESOURCEQUOTAS, "gpuferry-grant", twin),
            rbac("delete", "resourcequotas", namespace=twin),
        ),
        Attempt(
            "a quota of its own",
            lambda me: me.create(
                RESOURCEQUOTAS,
                {
                    "apiVersion": "v1",
                    "kind": "ResourceQuota",
                    "metadata": {"name": "mine"},
                    "spec": {"hard": {"pods": "1000"}},
                },
                twin,
            ),
            rbac("create", "resourcequotas", namespace=twin),
        ),
        Attempt(
            "editing its LimitRange",
            lambda me: me.patch(LIMITRANGES, "gpuferry-defaults", {"spec": {"limits": []}}, twin),
            rbac("patch", "limitranges", namespace=twin),
        ),
        Attempt(
            "deleting its LimitRange",
            lambda me: me.delete(LIMITRANGES, "gpuferry-defaults", twin),
            rbac("delete", "limitranges", namespace=twin),
        ),
        Attempt(
            "granting itself more",
            lambda me: me.patch(
                GPUSLICES,
                "ml-eu",
                {"status": {"granted": {"nvidia.com/gpu": "64"}}},
                TENANT_NS,
                subresource="status",
            ),
            rbac("patch", "gpuslices/status", "sharing.gpuferry.io", TENANT_NS),
        ),
        Attempt(
            "writing its Tenant's status",
            lambda me: me.patch(
                TENANTS,
                "ml-eu",
                {"status": {"acceptedNetwork": {"podCIDRs": ["172.16.0.0/12"]}}},
                TENANT_NS,
                subresource="status",
            ),
            rbac("patch", "tenants/status", "core.gpuferry.io", TENANT_NS),
        ),
        # -- RBAC, certificates, nodes, impersonation, the provider's own policies ----------------------
        Attempt(
            "a Role",
            lambda me: me.create(ROLES, role, twin),
            rbac("create", "roles", "rbac.authorization.k8s.io", twin),
        ),
        Attempt(
            "a RoleBinding",
            lambda me: me.create(ROLEBINDINGS, {**admin_binding, "kind": "RoleBinding"}, twin),
            rbac("create", "rolebindings", "rbac.authorization.k8s.io", twin),
        ),
        Attempt(
            "cluster-admin",
            lambda me: me.create(CLUSTERROLEBINDINGS, admin_binding),
            rbac("create", "clusterrolebindings", "rbac.authorization.k8s.io"),
        ),
        Attempt(
            "a node's certificate",
            lambda me: me.create(CSRS, csr),
            rbac("create", "certificatesigningrequests", "certificates.k8s.io"),
        ),
        Attempt(
            "the CSRs",
            lambda me: me.list(CSRS),
            rbac("list", "certificatesigningrequests", "certificates.k8s.io"),
        ),
        Attempt("the nodes", lambda me: me.list(NODES), rbac("list", "nodes")),
        Attempt(
            "a node's labels",
            lambda me: me.patch(
                NODES, l4_node, {"metadata": {"labels": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}}}
            ),
            rbac("patch", "nodes"),
        ),
        Attempt(
            "impersonating an admin",
            raw(
                "GET", "/api/v1/nodes", **{"Impersonate-User": "admin", "Impersonate-Group": "system:masters"}
            ),
            rbac("impersonate-on:user-info:list", "nodes"),
        ),
        Attempt(
            "a ServiceAccount token",
            lambda me: me.create(
                SERVICEACCOUNTS,
                {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}},
                twin,
                name="default",
                subresource="token",
            ),
            rbac("create", "serviceaccounts/token", namespace=twin),
        ),
        Attempt(
            "turning a policy off",
            lambda me: me.delete(VALIDATINGADMISSIONPOLICYBINDINGS, "gpuferry-twin-pods"),
            rbac("delete", "validatingadmissionpolicybindings", "admissionregistration.k8s.io"),
        ),
        Attempt(
            "reading the policies",
            lambda me: me.list(VALIDATINGADMISSIONPOLICIES),
            rbac("list", "validatingadmissionpolicies", "admissionregistration.k8s.io"),
        ),
        Attempt(
            "its PeerNetwork",
            lambda me: me.patch(PEERNETWORKS, "ml-eu", {"spec": {"podCIDRs": ["172.16.0.0/12"]}}, TENANT_NS),
            rbac("patch", "peernetworks", "net.gpuferry.io", TENANT_NS),
        ),
        # -- issue 16 §1: the nodes of the grant --------------------------------------------------
        Attempt(
            "naming an L4 node",
            lambda me: me.create(PODS, pod("named", nodeName=l4_node), twin),
            "a tenant's pod may not name its node: the provider's scheduler places it on the nodes of "
            "the grant",
        ),
        Attempt(
            "selecting L4 nodes", lambda me: me.create(PODS, pod("l4", selector=L4_SELECTOR), twin), pinned
        ),
        Attempt("selecting no nodes", lambda me: me.create(PODS, pod("anywhere", selector={}), twin), pinned),
        # -- §2: a priority class ----------------------------------------------------------------
        Attempt(
            "system-node-critical",
            lambda me: me.create(PODS, pod("preempting", priorityClassName="system-node-critical"), twin),
            "a tenant's pod may not take a priority class (system-node-critical): it could preempt the "
            "provider's own workloads",
        ),
        # -- §3: externalIPs ---------------------------------------------------------------------
        Attempt(
            "externalIPs",
            lambda me: me.create(SERVICES, service("intercept", externalIPs=["172.31.0.2"]), twin),
            "a tenant's Service may not have externalIPs (CVE-2020-8554: they intercept traffic to "
            "those addresses for the whole provider cluster)",
        ),
        # -- an EndpointSlice may point at pods only (CVE-2021-25740) ------------------------------
        Attempt(
            "an EndpointSlice to the API server",
            lambda me: me.create(ENDPOINTSLICES, endpoint_slice("to-apiserver", "10.96.0.1"), twin),
            POLICY.format("gpuferry-twin-endpoints") + ENDPOINTS_REFUSAL,
        ),
        Attempt(
            "an EndpointSlice to a node",
            lambda me: me.create(ENDPOINTSLICES, endpoint_slice("to-node", "172.31.0.12"), twin),
            POLICY.format("gpuferry-twin-endpoints") + ENDPOINTS_REFUSAL,
        ),
        # -- §4: its network (the provider accepted 10.244.0.0/16 and 10.96.0.0/16) --------------------
        Attempt(
            "rewriting its CIDRs",
            tenant_spec(network={"podCIDRs": ["172.16.0.0/12"], "serviceCIDRs": ["10.96.0.0/16"]}),
            tenants + "a consumer may rotate its gateway key, not change its CIDRs: the provider "
            "accepted pod CIDRs 10.244.0.0/16 and Service CIDRs 10.96.0.0/16; new CIDRs need the "
            "provider: its operator accepts them with `gpuferry tenant accept-network ml-eu --pod-cidrs "
            "... --service-cidrs ...`",
        ),
        # -- what else its Tenant says ------------------------------------------------------------
        Attempt(
            "privileged twin namespaces",
            tenant_spec(podSecurity="privileged"),
            tenants + "a consumer may make its Pod Security level stricter, not looser (privileged): a "
            "looser one is the provider's to give",
        ),
        Attempt(
            "more twin namespaces",
            tenant_spec(maxTwinNamespaces=100000),
            tenants + "a consumer may lower maxTwinNamespaces, not raise it (100000): more is the "
            "provider's to give",
        ),
        Attempt(
            "another token Secret",
            tenant_spec(peeringTokenSecretRef={"name": "gpuferry-gateway-ml-eu", "key": "privateKey"}),
            tenants + "a consumer may not choose the Secret its peering token is checked against "
            "(spec.peeringTokenSecretRef: peering-token)",
        ),
        # -- §5: its slice ------------------------------------------------------------------------
        Attempt(
            "another product for its slice",
            lambda me: me.patch(GPUSLICES, "ml-eu", {"spec": {"nodeSelector": L4_SELECTOR}}, TENANT_NS),
            slices + "which nodes a slice covers (nodeSelector, tolerations) is the provider's to change: "
            "its operator approves them with `gpuferry tenant approve ml-eu --selector "
            "nvidia.com/gpu.product=NVIDIA-L4` (the annotation sharing.gpuferry.io/approved-node-selector "
            f"on namespace {TENANT_NS})",
        ),
        Attempt(
            "tolerating every taint",
            lambda me: me.patch(
                GPUSLICES, "ml-eu", {"spec": {"tolerations": [{"operator": "Exists"}]}}, TENANT_NS
            ),
            slices + "which nodes a slice covers (nodeSelector, tolerations) is the provider's to change",
        ),
        Attempt(
            "more than the tenant's limit",
            lambda me: me.patch(
                GPUSLICES, "ml-eu", {"spec": {"resources": {"nvidia.com/gpu": 5}}}, TENANT_NS
            ),
            slices + "a consumer may ask for at most nvidia.com/gpu=4 (the provider's limit for this tenant; "
            "its operator changes it with `gpuferry tenant limit ml-eu`)",
        ),
    ]


async def test_a_consumer_identity_cannot_reach_beyond_its_slice(
    cli: Cli, consumer_client: KubeClient, provider_client: KubeClient, make_namespace: NamespaceFactory
) -> None:
    await cli.ok(*peer_quietly(cli), "--gpus", "2", "--selector", H100)
    ns = await make_namespace(consumer_client)
    await cli.ok("offload", "namespace", ns, "--kubeconfig", cli.c, "-q")
    twin = f"{ns}-ml-eu"
    l4_node = sorted(
        n["metadata"]["name"]
        for n in (await provider_client.list(NODES, label_selector="nvidia.com/gpu.product=NVIDIA-L4"))[
            "items"
        ]
    )[0]
    secret = await consumer_client.get(SECRETS, "gpuferry-identity-gpu-farm", "gpuferry-system")
    kubeconfig = base64.b64decode(secret["data"]["kubeconfig"])
    # what the provider's operator set: the CIDRs it accepted (as if peered with the fabric), a limit
    tenant = ["tenant", "--kubeconfig", cli.p, "-o", "json"]
    accepted = json.loads(await cli.ok(*tenant[:1], "accept-network", "ml-eu", *tenant[1:], "--pod-cidrs",
                                       "10.244.0.0/16", "--service-cidrs", "10.96.0.0/16"))  # fmt: skip
    assert accepted["acceptedNetwork"] == {"podCIDRs": ["10.244.0.0/16"], "serviceCIDRs": ["10.96.0.0/16"]}
    limit = ["--max", "nvidia.com/gpu=4"]
    limited = json.loads(await cli.ok(*tenant[:1], "limit", "ml-eu", *tenant[1:], *limit))
    assert limited["maxResources"] == "nvidia.com/gpu=4" and limited["approvedNodeSelector"] is None
    await provider_client.create(
        NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": OTHER_TENANT_NS}}
    )
    try:
        async with KubeClient.from_kubeconfig_data(kubeconfig) as me:
            await wait_for_the_policies(me, twin)
            failures: list[str] = []
            for attempt in attempts(twin, l4_node):
                try:
                    await attempt.call(me)
                except Forbidden as refused:
                    if attempt.refusal not in str(refused):
                        failures.append(f"{attempt.name}: refused otherwise: {refused}")
                except KubeError as other:
                    failures.append(f"{attempt.name}: {type(other).__name__}: {other}")
                else:
                    failures.append(f"{attempt.name}: ADMITTED")
            assert not failures, "\n".join(failures)
            assert len(attempts(twin, l4_node)) >= 48

            # what the consumer does by itself is still allowed: the virtual kubelet's twins and
            # Services, a smaller slice within the limit, a key rotation, a stricter Pod Security
            await me.create(PODS, pod("fine"), twin)
            created = await me.create(SERVICES, service("plain"), twin)
            await me.create(ENDPOINTSLICES, endpoint_slice("to-a-pod", "10.244.7.9"), twin)
            created["spec"]["externalIPs"] = ["172.31.0.2"]  # and not afterwards either
            with pytest.raises(Forbidden, match="externalIPs"):
                await me.replace(SERVICES, "plain", created, twin)
            await me.patch(GPUSLICES, "ml-eu", {"spec": {"resources": {"nvidia.com/gpu": 1}}}, TENANT_NS)
            key = base64.b64encode(bytes(32)).decode()
            await me.patch(
                TENANTS,
                "ml-eu",
                {
                    "spec": {
                        "network": {
                            "podCIDRs": ["10.244.0.0/16"],
                            "serviceCIDRs": ["10.96.0.0/16"],
                            "publicKey": key,
                        }
                    }
                },
                TENANT_NS,
            )
            await me.patch(TENANTS, "ml-eu", {"spec": {"podSecurity": "restricted"}}, TENANT_NS)
            # the provider's operator approves L4: now the consumer may move its slice there
            approved = json.loads(await cli.ok(*tenant[:1], "approve", "ml-eu", *tenant[1:],
                                               "--selector", "nvidia.com/gpu.product=NVIDIA-L4"))  # fmt: skip
            assert approved["approvedNodeSelector"] == "nvidia.com/gpu.product=NVIDIA-L4", approved
            # the policy reads the namespace's annotation from the API server's cache of
            # namespaces, which follows the approval within moments
            for _ in range(20):
                try:
                    await me.patch(GPUSLICES, "ml-eu", {"spec": {"nodeSelector": L4_SELECTOR}}, TENANT_NS)
                    break
                except Forbidden as refusal:
                    assert "approve" in str(refusal), refusal
                    await asyncio.sleep(0.5)
            else:
                await me.patch(GPUSLICES, "ml-eu", {"spec": {"nodeSelector": L4_SELECTOR}}, TENANT_NS)
    finally:
        await provider_client.delete(NAMESPACES, OTHER_TENANT_NS)


async def wait_for_the_policies(me: KubeClient, twin: str) -> None:
    """The provider controller applies its policies when it starts leading; the API server takes a
    moment to enforce a new one."""
    for _ in range(40):
        try:
            await me.create(PODS, pod("probe", selector={}), twin)
        except Forbidden as exc:
            if "must keep to the nodes" in str(exc):
                return
            raise
        await me.delete(PODS, "probe", twin)
        await asyncio.sleep(0.5)
    raise AssertionError("the twin-namespace policy never took effect")
