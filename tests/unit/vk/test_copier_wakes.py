"""What a consumer pod's changes wake among the copiers (ConfigMaps, Secrets, DRA claims and
Services copied to its twin namespace): its appearing, its going and a change of its spec wake
the copies it references; the namespace's first pod on the node and its last, its Services. Not
its status written back nor the start of its termination (issue 15: each change of each pod
woke every copier, and every Service of the namespace).

The virtual kubelet is assembled for real; its informers are fed by hand as their watches would
be."""

from __future__ import annotations

import copy
from typing import Any

from kube.objects import ObjectKey
from kube.queueing import KeyedQueue
from kube.watching import WatchEvent
from vk.forge.accessories import matters_to_copies
from vk.reflection.services import ServiceReflector

from .assembled import KEY, VirtualKubelet
from .builders import consumer_pod

SERVICE = {"apiVersion": "v1", "kind": "Service",
           "metadata": {"name": "tracking", "namespace": KEY.namespace, "uid": "svc-uid",
                        "resourceVersion": "7"},
           "spec": {"selector": {"app": "mlflow"}, "ports": [{"port": 5000}]}}  # fmt: skip


def queues(vk: VirtualKubelet) -> dict[str, KeyedQueue[ObjectKey]]:
    return {c.name: c.queue for c in vk.manager.controllers
            if c.name.startswith(("sync_configmaps", "sync_secrets", "sync_services"))}  # fmt: skip


def woken(vk: VirtualKubelet) -> dict[str, set[ObjectKey]]:
    return {name: set(q.pending) for name, q in queues(vk).items() if q.pending}


def drain(vk: VirtualKubelet) -> None:
    for queue in queues(vk).values():
        for key in queue.pending:
            queue.discard(key)


def mounting(pod: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(pod)
    out["spec"].setdefault("volumes", []).append({"name": "cfg", "configMap": {"name": "train-config"}})
    return out


async def test_only_a_pod_appearing_going_or_changing_its_spec_wakes_the_copiers() -> None:
    vk = VirtualKubelet()
    services = next(c.reconciler for c in vk.manager.controllers if c.name == "sync_services_to_remote")
    assert isinstance(services, ServiceReflector)
    pod = mounting(consumer_pod())
    config, tracking = ObjectKey(KEY.namespace, "train-config"), ObjectKey(KEY.namespace, "tracking")
    debug_env = ObjectKey(KEY.namespace, "debug-env")

    vk.local._apply(WatchEvent("ADDED", pod))
    assert woken(vk) == {"sync_configmaps_to_remote": {config}}
    services._services[KEY.namespace]._apply(WatchEvent("ADDED", SERVICE))  # its namespace's Service
    assert woken(vk) == {"sync_configmaps_to_remote": {config}, "sync_services_to_remote": {tracking}}
    drain(vk)

    running = copy.deepcopy(pod)
    running["metadata"]["resourceVersion"] = "48300"
    running["status"] = {"phase": "Running", "podIP": "10.244.3.7"}
    vk.local._apply(WatchEvent("MODIFIED", running))
    terminating = copy.deepcopy(running)
    terminating["metadata"].update(deletionTimestamp="2024-06-01T11:00:00Z", resourceVersion="48301")
    vk.local._apply(WatchEvent("MODIFIED", terminating))
    assert woken(vk) == {}, "its status and its termination change nothing copied for it"

    debugged = copy.deepcopy(terminating)  # an ephemeral container, reading another ConfigMap
    debugged["metadata"]["resourceVersion"] = "48302"
    env_from = [{"configMapRef": {"name": "debug-env"}}]
    debugged["spec"]["ephemeralContainers"] = [{"name": "debug", "image": "busybox", "envFrom": env_from}]
    vk.local._apply(WatchEvent("MODIFIED", debugged))
    assert woken(vk) == {"sync_configmaps_to_remote": {config, debug_env}}
    drain(vk)

    # a second pod of the namespace: the Service is copied already, its copy stays
    other = copy.deepcopy(pod)
    other["metadata"].update(name="finetune-llama-b7k4m", uid="another-uid")
    vk.local._apply(WatchEvent("ADDED", other))
    assert woken(vk) == {"sync_configmaps_to_remote": {config}}
    drain(vk)
    vk.local._apply(WatchEvent("DELETED", debugged))
    assert woken(vk) == {"sync_configmaps_to_remote": {config, debug_env}}
    assert services._in_use(KEY.namespace)
    drain(vk)

    # the namespace's last pod on the node goes: its Service's copy goes too
    vk.local._apply(WatchEvent("DELETED", other))
    assert woken(vk) == {"sync_configmaps_to_remote": {config}, "sync_services_to_remote": {tracking}}
    assert not services._in_use(KEY.namespace)


def test_what_matters_to_copies_is_pure_and_reads_uid_and_spec_only() -> None:
    pod = consumer_pod()
    status = copy.deepcopy(pod)
    status["status"] = {"phase": "Running"}
    status["metadata"]["labels"]["app"] = "relabelled"
    assert not matters_to_copies("MODIFIED", pod, status)
    other = copy.deepcopy(pod)
    other["metadata"]["uid"] = "another"
    assert matters_to_copies("MODIFIED", pod, other)
    assert matters_to_copies("ADDED", None, pod) and matters_to_copies("DELETED", pod, None)
