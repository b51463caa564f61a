"""What a compact informer store costs against a store of dicts, per pod and per pod at rest.

The virtual kubelet keeps its pods (consumer) and twins (provider) in compact stores
(:class:`kube.informers.Informer` with ``compact=True``): deflated JSON, a dict only for the last
objects read or changed. This replays the changes a pod goes through in a burst, in-process and
without an API server: bound (ADDED), its conditions, Running, deleted (a deletionTimestamp), gone,
each change followed by a read as a reconciler's; ``--in-flight`` pods at a time, a new one
starting as one reaches Running; each event decoded from its JSON, as a watch gives it. Prints,
per N, the CPU time per pod's changes each way (decoding included), their ratio, and the bytes
each store holds per pod with all N Running.

    .venv/bin/python -m bench.informer_store --pods 1000 --pods 10000
"""

from __future__ import annotations

import argparse
import copy
import time
import tracemalloc
from collections import deque

import orjson

from kube.informers import Informer
from kube.objects import PODS, ObjectKey, RawObject
from kube.watching import WatchEvent

NODE = "gpuferry-provider-1"
STAMP = "2026-11-27T18:00:00Z"


def pod(i: int) -> RawObject:
    """A one-GPU pod of a Job as the API server gives it once bound: defaults, the service
    account token volume, a Pending status."""
    name = f"train-{i:05d}-x7k2p"
    gpu = {"nvidia.com/gpu": "1"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "generateName": f"train-{i:05d}-",
            "namespace": "ml-team",
            "uid": f"{i:08x}-5c3e-4b1e-9f3a-{i * 7919:012x}",
            "resourceVersion": str(100000 + i),
            "creationTimestamp": STAMP,
            "labels": {"batch.kubernetes.io/job-name": f"train-{i:05d}", "job-name": f"train-{i:05d}",
                       "batch.kubernetes.io/controller-uid": f"{i:08x}-aaaa-bbbb-cccc-{i:012x}"},
            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": f"train-{i:05d}",
                                 "uid": f"{i:08x}-aaaa-bbbb-cccc-{i:012x}", "controller": True,
                                 "blockOwnerDeletion": True}],
            "finalizers": ["batch.kubernetes.io/job-tracking"],
        },
        "spec": {
            "containers": [{
                "name": "train", "image": "registry.example/ml/train:2026.11",
                "command": ["python", "-m", "train"], "args": ["--epochs", "3"],
                "env": [{"name": "NCCL_DEBUG", "value": "WARN"}],
                "resources": {"limits": gpu, "requests": gpu},
                "volumeMounts": [{"name": "kube-api-access-abcde", "readOnly": True,
                                  "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}],
                "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File",
                "imagePullPolicy": "IfNotPresent",
            }],
            "restartPolicy": "Never", "terminationGracePeriodSeconds": 30, "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "default", "serviceAccount": "default", "nodeName": NODE,
            "securityContext": {}, "schedulerName": "default-scheduler", "priority": 0,
            "enableServiceLinks": True, "preemptionPolicy": "PreemptLowerPriority",
            "tolerations": [
                {"key": "virtual-node.gpuferry.io/not-allowed", "operator": "Exists", "effect": "NoSchedule"},
                {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute",
                 "tolerationSeconds": 300},
                {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute",
                 "tolerationSeconds": 300},
            ],
            "volumes": [{"name": "kube-api-access-abcde", "projected": {"defaultMode": 420, "sources": [
                {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {
                    "apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}},
            ]}}],
        },
        "status": {"phase": "Pending", "qosClass": "BestEffort", "conditions": [
            {"type": "PodScheduled", "status": "True", "lastProbeTime": None, "lastTransitionTime": STAMP}]},
    }  # fmt: skip


def stages(obj: RawObject) -> list[tuple[str, RawObject]]:
    """The watch events of one pod through its life, each a new object as the API server sends."""
    started = copy.deepcopy(obj)
    started["status"].update(hostIP="10.0.0.7", podIP="10.244.3.17", startTime=STAMP)
    started["status"]["conditions"] += [
        {"type": t, "status": "False", "lastProbeTime": None, "lastTransitionTime": STAMP}
        for t in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady")
    ]
    running = copy.deepcopy(started)
    running["status"]["phase"] = "Running"
    for condition in running["status"]["conditions"]:
        condition["status"] = "True"
    running["status"]["containerStatuses"] = [{
        "name": "train", "ready": True, "restartCount": 0, "started": True,
        "image": "registry.example/ml/train:2026.11", "imageID": "sha256:" + "ab" * 32,
        "containerID": "containerd://" + "cd" * 32, "state": {"running": {"startedAt": STAMP}},
    }]  # fmt: skip
    deleting = copy.deepcopy(running)
    deleting["metadata"].update(deletionTimestamp=STAMP, deletionGracePeriodSeconds=30)
    out = [("ADDED", obj), ("MODIFIED", started), ("MODIFIED", running), ("MODIFIED", deleting),
           ("DELETED", copy.deepcopy(deleting))]  # fmt: skip
    base = int(obj["metadata"]["resourceVersion"]) * 10
    for n, (_, o) in enumerate(out):
        o["metadata"]["resourceVersion"] = str(base + n)
    return out


def replay(informer: Informer, lives: list[list[tuple[str, bytes]]], in_flight: int) -> None:
    """Each pod's changes up to Running, ``in_flight`` pods at a time, each event decoded from
    its JSON as a watch does, and read after it as a reconciler does."""
    waiting = deque(range(len(lives)))
    flight: deque[tuple[int, int]] = deque()
    while waiting or flight:
        while waiting and len(flight) < in_flight:
            flight.append((waiting.popleft(), 0))
        i, stage = flight.popleft()
        kind, raw = lives[i][stage]
        obj = orjson.loads(raw)
        informer._apply(WatchEvent(kind, obj))  # type: ignore[arg-type]
        informer.get(ObjectKey.of(obj))
        if stage < 2:
            flight.append((i, stage + 1))


def finish(informer: Informer, lives: list[list[tuple[str, bytes]]]) -> None:
    """Every pod's deletion, then its removal."""
    for life in lives:
        for kind, raw in life[3:]:
            obj = orjson.loads(raw)
            informer._apply(WatchEvent(kind, obj))  # type: ignore[arg-type]
            informer.get(ObjectKey.of(obj))


def one_way(n: int, in_flight: int, compact: bool) -> tuple[float, float]:
    """CPU seconds per pod (all its changes) and bytes per pod held with all N Running (from a
    second replay, traced: tracing slows what it traces)."""
    lives = [[(kind, orjson.dumps(obj)) for kind, obj in stages(pod(i))] for i in range(n)]
    informer = Informer(None, PODS, compact=compact)  # type: ignore[arg-type]
    start = time.process_time()
    replay(informer, lives, in_flight)
    finish(informer, lives)
    cpu = time.process_time() - start
    assert len(informer) == 0
    informer = Informer(None, PODS, compact=compact)  # type: ignore[arg-type]
    tracemalloc.start()
    try:
        replay(informer, lives, in_flight)
        held = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert len(informer) == n
    return cpu / n, held / n


def measure(n: int, in_flight: int) -> str:
    one_way(min(n, 200), in_flight, True)  # warm up: imports, allocator
    dicts, dict_bytes = one_way(n, in_flight, compact=False)
    compact, compact_bytes = one_way(n, in_flight, compact=True)
    return (
        f"N={n}, {in_flight} in flight: dicts {dicts * 1e6:.0f} µs per pod, compact {compact * 1e6:.0f} µs "
        f"({compact / dicts:.2f}x); held with all Running: dicts {dict_bytes / 1024:.1f} KiB per pod, "
        f"compact {compact_bytes / 1024:.2f} KiB ({compact_bytes / dict_bytes:.2f}x)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pods", type=int, action="append", help="N (repeatable; default 1000 and 10000)")
    parser.add_argument("--in-flight", type=int, default=64, help="pods between bound and Running at once")
    args = parser.parse_args()
    if args.in_flight < 1:
        parser.error(f"--in-flight must be at least 1, not {args.in_flight}")
    pods = args.pods or [1000, 10000]
    if min(pods) < 1:
        parser.error(f"--pods must be at least 1, not {min(pods)}")
    for n in pods:
        print(measure(n, args.in_flight), flush=True)


if __name__ == "__main__":
    main()
