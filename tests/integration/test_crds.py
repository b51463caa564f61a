"""The gpuferry CRDs (charts/gpuferry/crds/) on a real kube-apiserver: they install and become
Established, every example in charts/gpuferry/examples/ is accepted, and bad objects are refused by
the API server itself with a message that says what is wrong.

The CRDs are left installed at the end: other tests share the clusters and rely on them.
"""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from hack.localcluster import LocalCluster

pytestmark = pytest.mark.integration

CHART = Path(__file__).resolve().parents[2] / "charts" / "gpuferry"
CRD_FILES = sorted((CHART / "crds").glob("*.yaml"))
# every example of a custom resource; peering-token.yaml holds built-in kinds (checked against the
# builders in tests/unit/peering/test_examples.py)
EXAMPLE_FILES = sorted(p for p in (CHART / "examples").glob("*.yaml") if p.name != "peering-token.yaml")

Obj = dict[str, Any]


def load(path: Path) -> Obj:
    doc = yaml.safe_load(path.read_text())
    assert isinstance(doc, dict), path
    return doc


CRDS = {load(p)["spec"]["names"]["kind"]: load(p) for p in CRD_FILES}
EXAMPLES = {load(p)["kind"]: load(p) for p in EXAMPLE_FILES}

# Where each kind lives in a real peering (the refusal tests run there).
HOME = {
    "ForeignCluster": "consumer",
    "Tenant": "provider",
    "GPUSlice": "provider",
    "VirtualNode": "consumer",
    "NamespaceOffloading": "consumer",
    "PeerNetwork": "consumer",
}

# The immutable-field checks and the rules below use the shared layout documented in the chart README.
EXPECTED_GROUPS = {
    "ForeignCluster": ("core.gpuferry.io", "Cluster"),
    "Tenant": ("core.gpuferry.io", "Namespaced"),
    "GPUSlice": ("sharing.gpuferry.io", "Namespaced"),
    "VirtualNode": ("offloading.gpuferry.io", "Namespaced"),
    "NamespaceOffloading": ("offloading.gpuferry.io", "Namespaced"),
    "PeerNetwork": ("net.gpuferry.io", "Namespaced"),
}


class Env:
    """Both clusters with the CRDs installed, a fresh namespace on each, and cleanup of
    cluster-scoped objects the tests create."""

    def __init__(self, clusters: dict[str, LocalCluster]) -> None:
        self.clusters = clusters
        self.namespace = f"crd-test-{uuid.uuid4().hex[:8]}"
        self.cluster_scoped: list[tuple[str, str, str]] = []  # (cluster, resource, name)
        self.extra_namespaces: list[tuple[str, str]] = []  # (cluster, namespace)

    def extra_namespace(self, kind: str) -> str:
        """Another fresh namespace on kind's cluster (for kinds that allow one object per namespace)."""
        name = unique("crd-test")
        self.cluster(kind).kubectl("create", "namespace", name)
        self.extra_namespaces.append((HOME[kind], name))
        return name

    def cluster(self, kind: str) -> LocalCluster:
        return self.clusters[HOME[kind]]

    def namespaced(self, kind: str) -> bool:
        return bool(CRDS[kind]["spec"]["scope"] == "Namespaced")

    def resource(self, kind: str) -> str:
        crd = CRDS[kind]
        return f"{crd['spec']['names']['plural']}.{crd['spec']['group']}"

    def ns_args(self, kind: str, namespace: str | None = None) -> list[str]:
        return ["-n", namespace or self.namespace] if self.namespaced(kind) else []

    def prepare(self, obj: Obj) -> Obj:
        """A copy of obj with a unique name when it is cluster-scoped (and tracked for cleanup)."""
        obj = copy.deepcopy(obj)
        kind = obj["kind"]
        if not self.namespaced(kind) and not obj["metadata"].get("name", "").startswith("crd-test-"):
            obj["metadata"]["name"] = f"crd-test-{uuid.uuid4().hex[:8]}"
        if not self.namespaced(kind):
            self.cluster_scoped.append((HOME[kind], self.resource(kind), obj["metadata"]["name"]))
        return obj

    def create(self, obj: Obj, *, namespace: str | None = None) -> Obj:
        obj = self.prepare(obj)
        kind = obj["kind"]
        out = self.cluster(kind).kubectl(
            "create", *self.ns_args(kind, namespace), "-o", "json", "-f", "-", input=json.dumps(obj)
        )
        created: Obj = json.loads(out)
        return created

    def refused(self, obj: Obj, *, namespace: str | None = None) -> str:
        """Creates obj, expects the API server to refuse it; returns kubectl's error text."""
        obj = self.prepare(obj)
        kind = obj["kind"]
        args = ["create", *self.ns_args(kind, namespace), "-f", "-"]
        with pytest.raises(RuntimeError) as info:
            self.cluster(kind).kubectl(*args, input=json.dumps(obj))
        return str(info.value)

    def patch_refused(
        self,
        kind: str,
        name: str,
        patch: Obj,
        *,
        subresource: str | None = None,
        namespace: str | None = None,
    ) -> str:
        args = ["patch", self.resource(kind), name, *self.ns_args(kind, namespace), "--type=merge"]
        args += ["-p", json.dumps(patch)]
        if subresource:
            args.append(f"--subresource={subresource}")
        with pytest.raises(RuntimeError) as info:
            self.cluster(kind).kubectl(*args)
        return str(info.value)

    def patch(self, kind: str, name: str, patch: Obj, *, subresource: str | None = None) -> Obj:
        args = ["patch", self.resource(kind), name, *self.ns_args(kind), "--type=merge", "-o", "json"]
        args += ["-p", json.dumps(patch)]
        if subresource:
            args.append(f"--subresource={subresource}")
        result: Obj = json.loads(self.cluster(kind).kubectl(*args))
        return result

    def get(self, kind: str, name: str, *extra: str) -> str:
        return self.cluster(kind).kubectl("get", self.resource(kind), name, *self.ns_args(kind), *extra)


def install_crds(cluster: LocalCluster) -> None:
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CHART / "crds"))
    names = [f"crd/{crd['metadata']['name']}" for crd in CRDS.values()]
    cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", *names)


@pytest.fixture(scope="module")
def env(clusters: dict[str, LocalCluster]) -> Iterator[Env]:
    for cluster in clusters.values():
        install_crds(cluster)
    e = Env(clusters)
    for cluster in clusters.values():
        cluster.kubectl("create", "namespace", e.namespace)
    yield e
    for cluster_name, resource, name in e.cluster_scoped:
        e.clusters[cluster_name].kubectl("delete", resource, name, "--ignore-not-found", "--wait=false")
    for cluster_name, namespace in e.extra_namespaces:
        e.clusters[cluster_name].kubectl(
            "delete", "namespace", namespace, "--ignore-not-found", "--wait=false"
        )
    for cluster in clusters.values():
        cluster.kubectl("delete", "namespace", e.namespace, "--ignore-not-found", "--wait=false")


def example(kind: str, name: str | None = None, **spec: Any) -> Obj:
    """The chart's example of kind, renamed, with spec fields replaced (None removes one)."""
    obj = copy.deepcopy(EXAMPLES[kind])
    if name:
        obj["metadata"]["name"] = name
    for key, value in spec.items():
        if value is None:
            obj["spec"].pop(key, None)
        else:
            obj["spec"][key] = value
    return obj


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


# --- the definitions themselves -------------------------------------------------------------------


def test_every_kind_has_a_crd_and_an_example() -> None:
    assert set(CRDS) == set(EXPECTED_GROUPS)
    assert set(EXAMPLES) == set(EXPECTED_GROUPS)


@pytest.mark.parametrize("kind", sorted(EXPECTED_GROUPS))
def test_crd_conventions(kind: str) -> None:
    spec = CRDS[kind]["spec"]
    assert (spec["group"], spec["scope"]) == EXPECTED_GROUPS[kind]
    assert CRDS[kind]["metadata"]["name"] == f"{spec['names']['plural']}.{spec['group']}"
    assert spec["names"]["categories"] == ["gpuferry"]
    assert spec["names"]["shortNames"]
    [version] = spec["versions"]
    assert (version["name"], version["served"], version["storage"]) == ("v1alpha1", True, True)
    assert version["subresources"] == {"status": {}}
    columns = [c["name"] for c in version["additionalPrinterColumns"]]
    assert columns[-1] == "Age"
    schema = version["schema"]["openAPIV3Schema"]
    assert "conditions" in schema["properties"]["status"]["properties"]


def test_crds_are_established_on_both_clusters(env: Env) -> None:
    for cluster in env.clusters.values():
        out = cluster.kubectl("api-resources", "--categories=gpuferry", "-o", "name")
        assert sorted(out.split()) == sorted(env.resource(kind) for kind in CRDS)
        for kind, crd in CRDS.items():
            got = json.loads(cluster.kubectl("get", "crd", crd["metadata"]["name"], "-o", "json"))
            conditions = {c["type"]: c["status"] for c in got["status"]["conditions"]}
            assert conditions.get("Established") == "True", (kind, conditions)
            assert conditions.get("NamesAccepted") == "True", (kind, conditions)


def test_crds_apply_again_without_changes(env: Env) -> None:
    """Re-applying (what the CLI does on every peer) is a no-op, not an error."""
    for cluster in env.clusters.values():
        install_crds(cluster)


# --- valid objects --------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", sorted(EXPECTED_GROUPS))
def test_example_is_accepted(env: Env, kind: str) -> None:
    created = env.create(EXAMPLES[kind])
    assert created["kind"] == kind
    assert created["spec"] == {**created["spec"], **EXAMPLES[kind]["spec"]}, "the server changed the spec"


def test_defaults_are_applied(env: Env) -> None:
    nso = env.create(
        {
            "apiVersion": "offloading.gpuferry.io/v1alpha1",
            "kind": "NamespaceOffloading",
            "metadata": {"name": "offloading"},
        },
        namespace=env.extra_namespace("NamespaceOffloading"),
    )
    assert nso["spec"]["podOffloadingStrategy"] == "LocalAndRemote"
    assert nso["spec"]["namespaceMappingStrategy"] == "DefaultName"

    pnet = env.create(example("PeerNetwork", unique("pnet"), mtu=None, sourceNatMode=None, endpoint=None))
    assert pnet["spec"]["mtu"] == 1420
    assert pnet["spec"]["sourceNatMode"] == "Gateway"

    gs = env.create(example("GPUSlice", unique("gs"), allowPartial=None))
    assert gs["spec"]["allowPartial"] is False

    tenant = env.create(
        example("Tenant", unique("tnt"), podSecurity=None, peeringTokenSecretRef={"name": "t"})
    )
    assert tenant["spec"]["podSecurity"] == "baseline"
    assert tenant["spec"]["peeringTokenSecretRef"] == {"name": "t", "key": "token"}

    fc = env.create(example("ForeignCluster", networkingEnabled=None))
    assert fc["spec"]["networkingEnabled"] is True

    vn = env.create(
        example("VirtualNode", unique("vn"), nodeName=unique("gpuferry-n"), kubeconfigSecretRef={"name": "k"})
    )
    assert vn["spec"]["kubeconfigSecretRef"] == {"name": "k", "key": "kubeconfig"}


# --- refused objects ------------------------------------------------------------------------------


def without(kind: str, *path: str) -> Obj:
    obj = example(kind, unique(kind.lower()))
    parent = obj
    for key in path[:-1]:
        parent = parent[key]
    del parent[path[-1]]
    return obj


def nested(kind: str, field: str, **values: Any) -> Obj:
    obj = example(kind, unique(kind.lower()))
    obj["spec"][field] = {**obj["spec"][field], **values}
    return obj


QUANTITY_PATTERN = "should match '^(\\+|-)?(([0-9]+(\\.[0-9]*)?)|(\\.[0-9]+))"

# (id, object, every substring expected in kubectl's error). Each object differs from the chart's
# valid example in one way only, so the message is the one for that mistake.
REFUSALS: list[tuple[str, Callable[[], Obj], list[str]]] = [
    # ForeignCluster
    (
        "fc-missing-clusterID",
        lambda: without("ForeignCluster", "spec", "clusterID"),
        ["spec.clusterID: Required value"],
    ),
    ("fc-missing-spec", lambda: without("ForeignCluster", "spec"), ["spec: Required value"]),
    (
        "fc-role-not-in-enum",
        lambda: example("ForeignCluster", role="Leader"),
        ['spec.role: Unsupported value: "Leader": supported values: "Consumer", "Provider"'],
    ),
    (
        "fc-clusterID-uppercase",
        lambda: example("ForeignCluster", clusterID="GPU-Farm"),
        ['spec.clusterID: Invalid value: "GPU-Farm"', "should match '^[a-z0-9]([-a-z0-9]*[a-z0-9])?$'"],
    ),
    (
        "fc-clusterID-trailing-dash",
        lambda: example("ForeignCluster", clusterID="farm-"),
        ['spec.clusterID: Invalid value: "farm-"'],
    ),
    (
        "fc-clusterID-too-long",
        lambda: example("ForeignCluster", clusterID="a" * 64),
        ["spec.clusterID: Too long: may not be more than 63"],
    ),
    (
        "fc-apiServerURL-http",
        lambda: example("ForeignCluster", apiServerURL="http://10.0.0.1:6443"),
        ["spec.apiServerURL", "must be an https:// URL with a host"],
    ),
    (
        "fc-caBundle-not-base64",
        lambda: example("ForeignCluster", caBundle="-----BEGIN CERTIFICATE-----"),
        ["spec.caBundle", "should match"],
    ),
    # Tenant
    (
        "tenant-missing-token-ref",
        lambda: without("Tenant", "spec", "peeringTokenSecretRef"),
        ["spec.peeringTokenSecretRef: Required value"],
    ),
    (
        "tenant-consumer-uppercase",
        lambda: example("Tenant", consumerClusterID="ML"),
        ['spec.consumerClusterID: Invalid value: "ML"'],
    ),
    (
        "tenant-pod-security",
        lambda: example("Tenant", podSecurity="anything-goes"),
        ['spec.podSecurity: Unsupported value: "anything-goes"'],
    ),
    # GPUSlice
    (
        "slice-missing-resources",
        lambda: without("GPUSlice", "spec", "resources"),
        ["spec.resources: Required value"],
    ),
    (
        "slice-empty-resources",
        lambda: example("GPUSlice", resources={}),
        ["spec.resources", "should have at least 1 properties"],
    ),
    (
        "slice-zero-resources",
        lambda: example("GPUSlice", resources={"nvidia.com/gpu": 0, "cpu": "0"}),
        ["spec.resources", "must request at least one resource with a quantity above zero"],
    ),
    (
        "slice-negative-string",
        lambda: example("GPUSlice", resources={"nvidia.com/gpu": "-1", "cpu": "4"}),
        ['spec.resources[nvidia.com/gpu]: Invalid value: "-1": quantities must not be negative'],
    ),
    (
        "slice-negative-int",
        lambda: example("GPUSlice", resources={"nvidia.com/gpu": -1, "cpu": "4"}),
        ["spec.resources[nvidia.com/gpu]: Invalid value: -1: quantities must not be negative"],
    ),
    (
        "slice-garbage-quantity",
        lambda: example("GPUSlice", resources={"nvidia.com/gpu": "lots"}),
        ['spec.resources.nvidia.com/gpu: Invalid value: "lots"', QUANTITY_PATTERN],
    ),
    (
        "slice-bad-resource-name",
        lambda: example("GPUSlice", resources={"GPU please": 1}),
        ["spec.resources", "resource names must look like cpu, memory, pods or nvidia.com/gpu"],
    ),
    (
        "slice-without-consumer",
        lambda: without("GPUSlice", "spec", "consumerClusterID"),
        ["spec.consumerClusterID: Required value"],
    ),
    (
        "slice-half-a-gpu",
        lambda: example("GPUSlice", resources={"nvidia.com/gpu": "0.5", "cpu": "4"}),
        ["spec.resources", "extended resources such as nvidia.com/gpu come in whole units"],
    ),
    (
        "slice-selector-key-with-a-space",
        lambda: example("GPUSlice", nodeSelector={"a b": "x"}),
        ["spec.nodeSelector", "node selector keys must be label keys"],
    ),
    (
        "slice-selector-value-not-a-label-value",
        lambda: example("GPUSlice", nodeSelector={"a": "("}),
        ["spec.nodeSelector", "node selector values must be label values"],
    ),
    (
        "slice-allowPartial-not-bool",
        lambda: example("GPUSlice", allowPartial="yes"),
        ['spec.allowPartial: Invalid value: "string": spec.allowPartial in body must be of type boolean'],
    ),
    (
        "slice-toleration-exists-with-value",
        lambda: example("GPUSlice", tolerations=[{"key": "gpu", "operator": "Exists", "value": "x"}]),
        ["spec.tolerations[0]", "a toleration with operator Exists has no value"],
    ),
    (
        "slice-toleration-bad-effect",
        lambda: example("GPUSlice", tolerations=[{"key": "nvidia.com/gpu", "effect": "Never"}]),
        ['spec.tolerations[0].effect: Unsupported value: "Never"'],
    ),
    (
        "slice-toleration-no-key-equal",
        lambda: example("GPUSlice", tolerations=[{"operator": "Equal", "value": "x"}]),
        ["a toleration without a key must have operator Exists"],
    ),
    # VirtualNode
    (
        "vn-missing-kubeconfig",
        lambda: without("VirtualNode", "spec", "kubeconfigSecretRef"),
        ["spec.kubeconfigSecretRef: Required value"],
    ),
    (
        "vn-taint-effect",
        lambda: example("VirtualNode", taints=[{"key": "k", "effect": "Sometimes"}]),
        [
            'spec.taints[0].effect: Unsupported value: "Sometimes"',
            '"NoSchedule", "PreferNoSchedule", "NoExecute"',
        ],
    ),
    (
        "vn-negative-capacity",
        lambda: example("VirtualNode", resources={"nvidia.com/gpu": "-8"}),
        ["quantities must not be negative"],
    ),
    (
        "vn-node-name",
        lambda: example("VirtualNode", nodeName="Not_A_Node"),
        ['spec.nodeName: Invalid value: "Not_A_Node"'],
    ),
    # NamespaceOffloading
    (
        "nso-wrong-name",
        lambda: example("NamespaceOffloading", "my-offloading"),
        ['a NamespaceOffloading must be named "offloading" (one per namespace)'],
    ),
    (
        "nso-strategy",
        lambda: example("NamespaceOffloading", unique("x"), podOffloadingStrategy="Everywhere"),
        [
            'spec.podOffloadingStrategy: Unsupported value: "Everywhere"',
            'supported values: "Remote", "LocalAndRemote"',
        ],
    ),
    (
        "nso-mapping",
        lambda: example("NamespaceOffloading", unique("x"), namespaceMappingStrategy="Random"),
        ['spec.namespaceMappingStrategy: Unsupported value: "Random"'],
    ),
    (
        "nso-operator",
        lambda: example(
            "NamespaceOffloading",
            unique("x"),
            clusterSelector={"matchExpressions": [{"key": "a", "operator": "Gt"}]},
        ),
        ['spec.clusterSelector.matchExpressions[0].operator: Unsupported value: "Gt"'],
    ),
    (
        "nso-in-without-values",
        lambda: example(
            "NamespaceOffloading", clusterSelector={"matchExpressions": [{"key": "a", "operator": "In"}]}
        ),
        ["values must be non-empty for In and NotIn"],
    ),
    # PeerNetwork
    (
        "pnet-invalid-cidr",
        lambda: example("PeerNetwork", podCIDRs=["10.244.0.0/33"]),
        ['spec.podCIDRs[0]: Invalid value: "10.244.0.0/33": must be a CIDR such as 10.244.0.0/16'],
    ),
    (
        "pnet-not-a-cidr",
        lambda: example("PeerNetwork", serviceCIDRs=["10.96.0.1"]),
        ['spec.serviceCIDRs[0]: Invalid value: "10.96.0.1": must be a CIDR'],
    ),
    (
        "pnet-host-bits",
        lambda: example("PeerNetwork", podCIDRs=["10.244.1.7/16"]),
        ["must be a network address (host bits zero)"],
    ),
    (
        "pnet-no-pod-cidrs",
        lambda: example("PeerNetwork", podCIDRs=[]),
        ["spec.podCIDRs", "should have at least 1 items"],
    ),
    (
        "pnet-port-70000",
        lambda: nested("PeerNetwork", "endpoint", port=70000),
        ["spec.endpoint.port: Invalid value: 70000", "should be less than or equal to 65535"],
    ),
    (
        "pnet-port-0",
        lambda: nested("PeerNetwork", "endpoint", port=0),
        ["spec.endpoint.port", "should be greater than or equal to 1"],
    ),
    (
        "pnet-address",
        lambda: nested("PeerNetwork", "endpoint", address="not an address"),
        ["address must be an IP address or a DNS name"],
    ),
    (
        "pnet-mtu",
        lambda: example("PeerNetwork", mtu=576),
        ["spec.mtu", "should be greater than or equal to 1280"],
    ),
    (
        "pnet-public-key",
        lambda: example("PeerNetwork", publicKey="x" * 44),
        ["spec.publicKey", "should match"],
    ),
    (
        "pnet-snat-mode",
        lambda: example("PeerNetwork", sourceNatMode="Masquerade"),
        ['spec.sourceNatMode: Unsupported value: "Masquerade": supported values: "Gateway", "Preserve"'],
    ),
]


@pytest.mark.parametrize("build,expected", [pytest.param(b, e, id=i) for i, b, e in REFUSALS])
def test_bad_object_is_refused(env: Env, build: Callable[[], Obj], expected: list[str]) -> None:
    obj = build()
    namespace = env.extra_namespace(obj["kind"]) if obj["kind"] == "NamespaceOffloading" else None
    message = env.refused(obj, namespace=namespace)
    assert "is invalid" in message, message
    for text in expected:
        assert text in message, f"{text!r} not in:\n{message}"


# --- updates: immutable fields and the status subresource ----------------------------------------


@pytest.mark.parametrize(
    "kind,field,value",
    [
        ("ForeignCluster", "clusterID", "someone-else"),
        ("Tenant", "consumerClusterID", "someone-else"),
        ("GPUSlice", "consumerClusterID", "someone-else"),
        ("VirtualNode", "providerClusterID", "someone-else"),
        ("VirtualNode", "nodeName", "gpuferry-someone-else"),
        ("VirtualNode", "consumerClusterID", "someone-else"),
        ("PeerNetwork", "clusterID", "someone-else"),
        ("NamespaceOffloading", "namespaceMappingStrategy", "SameName"),
    ],
)
def test_immutable_field(env: Env, kind: str, field: str, value: str) -> None:
    namespace = env.extra_namespace(kind) if kind == "NamespaceOffloading" else None
    name = "offloading" if kind == "NamespaceOffloading" else unique(kind.lower())
    obj = env.create(example(kind, name), namespace=namespace)
    name = obj["metadata"]["name"]
    message = env.patch_refused(kind, name, {"spec": {field: value}}, namespace=namespace)
    assert f"spec.{field}: Invalid value" in message, message
    assert f"{field} is immutable" in message, message


def test_mutable_fields_can_change(env: Env) -> None:
    fc = env.create(example("ForeignCluster"))
    got = env.patch("ForeignCluster", fc["metadata"]["name"], {"spec": {"networkingEnabled": False}})
    assert got["spec"]["networkingEnabled"] is False
    gs = env.create(example("GPUSlice", unique("gs")))
    got = env.patch("GPUSlice", gs["metadata"]["name"], {"spec": {"resources": {"nvidia.com/gpu": 2}}})
    assert got["spec"]["resources"]["nvidia.com/gpu"] == 2


def test_status_subresource_and_printer_columns(env: Env) -> None:
    name = unique("gs")
    env.create(example("GPUSlice", name))
    # Writing status through the main resource is ignored; through /status it sticks.
    env.patch("GPUSlice", name, {"status": {"phase": "Granted"}})
    assert "status" not in json.loads(env.get("GPUSlice", name, "-o", "json"))
    status = {
        "phase": "PartiallyGranted",
        "granted": {"nvidia.com/gpu": 6, "cpu": "48", "memory": "384Gi"},
        "shape": {
            "largest": {"nvidia.com/gpu": 4},
            "nodes": [
                {"name": "gpu-node-1", "free": {"nvidia.com/gpu": 4}},
                {"name": "gpu-node-2", "free": {"nvidia.com/gpu": 2}},
            ],
        },
        "labels": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
        "reason": "InsufficientGPUs",
        "message": "6 of 8 nvidia.com/gpu free on nodes matching the selector",
        "conditions": [
            {
                "type": "Accepted",
                "status": "True",
                "reason": "PartiallyGranted",
                "message": "6 of 8 GPUs granted",
                "lastTransitionTime": "2025-01-01T00:00:00Z",
                "observedGeneration": 1,
            }
        ],
    }
    got = env.patch("GPUSlice", name, {"status": status}, subresource="status")
    assert got["status"]["granted"]["nvidia.com/gpu"] == 6
    table = env.get("GPUSlice", name, "-o", "wide").splitlines()
    header, row = table[0].split(), table[1].split()
    values = dict(zip(header, row, strict=True))
    assert values["GPUS"] == "8"
    assert values["GRANTED"] == "6"
    assert values["LARGEST"] == "4"
    assert values["PHASE"] == "PartiallyGranted"
    assert values["REASON"] == "InsufficientGPUs"

    fc = env.create(example("ForeignCluster"))
    conditions = [
        {
            "type": t,
            "status": s,
            "reason": "Test",
            "message": "",
            "lastTransitionTime": "2025-01-01T00:00:00Z",
        }
        for t, s in [
            ("Authenticated", "True"),
            ("SliceGranted", "True"),
            ("VirtualNodeReady", "False"),
            ("NetworkReady", "False"),
        ]
    ]
    env.patch(
        "ForeignCluster", fc["metadata"]["name"], {"status": {"conditions": conditions}}, subresource="status"
    )
    header, row = (line.split() for line in env.get("ForeignCluster", fc["metadata"]["name"]).splitlines())
    values = dict(zip(header, row, strict=True))
    assert (values["ROLE"], values["CLUSTERID"]) == ("Provider", "gpu-farm-a")
    assert (values["AUTHENTICATED"], values["NETWORK"]) == ("True", "False")
    assert (values["SLICE"], values["VIRTUALNODE"]) == ("True", "False")


@pytest.mark.parametrize(
    "kind,status,expected",
    [
        ("GPUSlice", {"phase": "Approved"}, 'status.phase: Unsupported value: "Approved"'),
        (
            "GPUSlice",
            {"granted": {"nvidia.com/gpu": "many"}},
            'status.granted.nvidia.com/gpu: Invalid value: "many"',
        ),
        (
            "ForeignCluster",
            {
                "conditions": [
                    {
                        "type": "Authenticated",
                        "status": "Maybe",
                        "reason": "X",
                        "message": "",
                        "lastTransitionTime": "2025-01-01T00:00:00Z",
                    }
                ]
            },
            'status.conditions[0].status: Unsupported value: "Maybe": supported values: "True", "False"',
        ),
        (
            "VirtualNode",
            {
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True",
                        "message": "",
                        "lastTransitionTime": "2025-01-01T00:00:00Z",
                    }
                ]
            },
            "status.conditions[0].reason: Required value",
        ),
        ("PeerNetwork", {"remappedPodCIDRs": ["10.300.0.0/16"]}, "must be a CIDR"),
        ("PeerNetwork", {"bytes": {"received": -1}}, "status.bytes.received"),
    ],
)
def test_bad_status_is_refused(env: Env, kind: str, status: Obj, expected: str) -> None:
    obj = env.create(example(kind, unique(kind.lower())))
    message = env.patch_refused(kind, obj["metadata"]["name"], {"status": status}, subresource="status")
    assert expected in message, message


def test_category_lists_every_kind(env: Env) -> None:
    """`kubectl get gpuferry` shows every gpuferry object of a namespace, whatever its kind."""
    namespaces: dict[str, str] = {}
    expected: dict[str, set[str]] = {}
    for kind in sorted(CRDS):
        if not env.namespaced(kind):
            continue
        home = HOME[kind]
        if home not in namespaces:
            namespaces[home] = env.extra_namespace(kind)
        env.create(EXAMPLES[kind], namespace=namespaces[home])
        expected.setdefault(home, set()).add(f"{kind.lower()}.{CRDS[kind]['spec']['group']}")
    for home, namespace in namespaces.items():
        out = env.clusters[home].kubectl("get", "gpuferry", "-n", namespace, "-o", "name")
        seen = {line.split("/")[0] for line in out.split()}
        # Cluster-scoped kinds of the category (ForeignCluster) are listed too, when there are any.
        assert seen - {"foreigncluster.core.gpuferry.io"} == expected[home]
