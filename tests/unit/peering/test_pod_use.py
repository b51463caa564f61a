"""The pool's pod sums, kept as pods change, are the sums of the pods there are: after any
sequence of additions, bindings, finishings, deletions and relists, and for the pass too."""

from __future__ import annotations

import copy
import logging
import random
from decimal import Decimal
from typing import Any

import pytest

from kube.clients import KubeClient
from kube.informers import Informer
from kube.kubeconfigs import Connection
from kube.objects import NODES, PODS, ObjectKey
from kube.watching import Listed, WatchEvent
from peering.provider.planning import free_capacity, free_capacity_of_use, pod_use
from peering.provider.settings import ProviderSettings
from peering.provider.slices import PoolReconciler, project_pod
from peering.provider.usage import PodUse
from peering.resources import GPUSLICES

NOWHERE = KubeClient(Connection(server="https://127.0.0.1:1"))  # never called
NODE_NAMES = ("gpu-a", "gpu-b", "gpu-c")
NAMESPACES = ("ml", "gpuferry-tenant-x", "kube-system")


def pod(name: str, namespace: str, *, node: str | None, phase: str = "Pending", gpus: int = 1,
        cpu: str = "500m", version: int = 1) -> dict[str, Any]:  # fmt: skip
    gpu = {"nvidia.com/gpu": str(gpus)}
    resources = {"requests": {"cpu": cpu, **gpu}, "limits": gpu}
    metadata = {"name": name, "namespace": namespace, "uid": f"uid-{namespace}-{name}",
                "resourceVersion": str(version)}  # fmt: skip
    spec = {**({"nodeName": node} if node else {}), "containers": [{"name": "main", "resources": resources}]}
    return {"metadata": metadata, "spec": spec, "status": {"phase": phase}}


def node(name: str) -> dict[str, Any]:
    allocatable = {"nvidia.com/gpu": "8", "cpu": "64", "pods": "110"}
    status = {"allocatable": allocatable, "conditions": [{"type": "Ready", "status": "True"}]}
    return {"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}}, "status": status}


def test_the_sums_follow_every_change_and_relist() -> None:
    rng = random.Random(15)
    pods = Informer(NOWHERE, PODS, project=project_pod)
    use = PodUse()
    pods.add_handler(use.changed)
    version = 1
    for _ in range(3000):
        version += 1
        name = f"p-{rng.randrange(40)}"
        namespace = rng.choice(NAMESPACES)
        key = ObjectKey(namespace, name)
        roll = rng.random()
        if roll < 0.15 and key in pods:
            pods._apply(WatchEvent("DELETED", pod(name, namespace, node=None)))
        elif roll < 0.18:
            # a relist that misses some pods: they are gone
            kept = frozenset(k for k in pods if rng.random() < 0.8)
            pods._relisted(Listed(str(version), kept))
        else:
            bound = rng.choice((None, *NODE_NAMES))
            phase = rng.choice(("Pending", "Running", "Running", "Succeeded", "Failed"))
            pods._apply(WatchEvent("ADDED", pod(name, namespace, node=bound, phase=phase,
                                                gpus=rng.randrange(0, 4), cpu=rng.choice(("250m", "1", "2")),
                                                version=version)))  # fmt: skip
        assert use.sums == pod_use(pods.values()), f"after step {version}"
    assert len(use) == sum(1 for p in pods.values() if p["spec"].get("nodeName")
                           and p["status"]["phase"] not in ("Succeeded", "Failed"))  # fmt: skip


def test_a_pod_counts_once_on_its_node_and_not_once_it_is_finished_or_gone() -> None:
    use = PodUse()
    key = ObjectKey("ml", "train-0")
    use.set(key, pod("train-0", "ml", node=None))
    assert use.sums == {}, "not bound: it holds no room"
    use.set(key, pod("train-0", "ml", node="gpu-a", gpus=2))
    use.set(ObjectKey("ml", "train-1"), pod("train-1", "ml", node="gpu-a", gpus=1))
    both = {"cpu": Decimal("1.0"), "nvidia.com/gpu": Decimal(3), "pods": Decimal(2)}
    assert use.sums == {("ml", "gpu-a"): both}
    use.set(key, pod("train-0", "ml", node="gpu-a", gpus=2, phase="Succeeded"))
    one = {"cpu": Decimal("0.5"), "nvidia.com/gpu": Decimal(1), "pods": Decimal(1)}
    assert use.sums == {("ml", "gpu-a"): one}
    use.set(ObjectKey("ml", "train-1"), None)
    assert use.sums == {} and len(use) == 0


async def test_the_pool_pass_frees_what_the_pods_free_without_reading_them() -> None:
    caches = [Informer(NOWHERE, resource) for resource in (NODES, GPUSLICES, PODS)]
    nodes, slices, twins = caches
    pods = Informer(NOWHERE, PODS, project=project_pod)
    for name in NODE_NAMES:
        nodes._apply(WatchEvent("ADDED", node(name)))
    pods._apply(WatchEvent("ADDED", pod("early", "ml", node="gpu-a", gpus=3)))
    reconciler = PoolReconciler(NOWHERE, nodes=nodes, pods=pods, slices=slices, twins=twins,
                                settings=ProviderSettings())  # fmt: skip
    for i in range(5):
        pods._apply(WatchEvent("ADDED", pod(f"p-{i}", "ml", node="gpu-b", gpus=1)))
    pods._apply(WatchEvent("DELETED", pod("p-0", "ml", node="gpu-b")))
    expected = free_capacity(nodes.values(), pods.values())
    assert free_capacity_of_use(nodes.values(), reconciler.usage.sums) == expected
    free = {n.name: n.free["nvidia.com/gpu"] for n in expected}
    # twin pods and others on one node, a grant there: the pass sums them, changing no kept sum
    pods._apply(WatchEvent("ADDED", pod("twin-0", "gpuferry-tenant-x", node="gpu-b", gpus=2)))
    kept = copy.deepcopy(dict(reconciler.usage.sums))
    twins_of = {"gpuferry-tenant-x": "x"}
    reserved = {"x": {"gpu-b": {"nvidia.com/gpu": Decimal(1)}}}
    for _ in range(2):
        again = free_capacity_of_use(nodes.values(), reconciler.usage.sums, twins_of, reserved)
        assert again == free_capacity(nodes.values(), pods.values(), twins_of, reserved)
        assert {n.name: n.free["nvidia.com/gpu"] for n in again}["gpu-b"] == Decimal(3)
    assert dict(reconciler.usage.sums) == kept
    assert free == {"gpu-a": Decimal(5), "gpu-b": Decimal(4), "gpu-c": Decimal(8)}, "the first pod counts too"


def test_a_pod_whose_requests_cannot_be_read_is_said_and_not_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    use = PodUse()
    key = ObjectKey("ml", "train-0")
    use.set(key, pod("train-0", "ml", node="gpu-a", gpus=2))
    unreadable = pod("train-0", "ml", node="gpu-a", cpu="lots")
    with caplog.at_level(logging.WARNING):
        use.set(key, unreadable)  # raises nowhere: this is an informer's handler
    assert use.sums == {} and len(use) == 0, "its old share is taken back, the new one not counted"
    assert "ml/train-0" in caplog.text and "invalid quantity 'lots'" in caplog.text
    use.set(key, pod("train-0", "ml", node="gpu-a", gpus=1))
    assert use.sums[("ml", "gpu-a")]["nvidia.com/gpu"] == Decimal(1)
