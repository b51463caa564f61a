"""Our own writes coming back wake nobody; anyone else's do (issue 15: a status pass and a twin
pass per pod only found what the pass before them had just written).

The virtual kubelet is assembled for real; its informers are fed by hand as their watches would
be, and the API servers' answers come from stand-ins that record what was asked."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
from typing import Any

from kube.objects import ObjectKey
from kube.watching import Listed, WatchEvent
from vk.forge.tokens import matters_to_token
from vk.reflection.echoes import Echoes

from .assembled import KEY, NONE, SETTINGS, ApiServer, VirtualKubelet
from .builders import VIRTUAL_NODE, consumer_pod, gpu_pod, node


async def test_the_twin_created_and_the_status_written_come_back_without_a_pass() -> None:
    vk = VirtualKubelet()
    pod = consumer_pod()
    vk.consumer.objects[pod["metadata"]["name"]] = pod
    vk.local._apply(WatchEvent("ADDED", pod))
    # no twin yet: status back has nothing to write, and the twin's arrival wakes it
    assert vk.pending() == ({KEY}, NONE, {KEY})
    vk.drain()

    assert await vk.pods.reconcile(KEY) is None
    assert [w[1] for w in vk.provider.writes] == ["namespaces", "secrets", "pods"]
    # the twin's watch event brings the create's answer back: status back looks, the twin sync not
    created = vk.provider.answers[-1]
    vk.twins._apply(WatchEvent("ADDED", created))
    assert vk.pending() == (NONE, {KEY}, NONE)
    assert vk.pods.settled(KEY), "a resync finds the pair in sync without a pass"
    vk.drain()

    assert await vk.status.reconcile(KEY) is None
    assert vk.consumer.writes == [("create", "serviceaccounts", "token")], "the twin as made changes nothing"
    assert vk.status.settled(KEY)

    # the provider's scheduler binds it: nothing status back reads changes, so no pass, and a
    # resync still finds the pair in sync
    bound = copy.deepcopy(created)
    bound["metadata"]["resourceVersion"] = str(vk.provider.version + 1)
    bound["spec"]["nodeName"] = "gpu-h100-3"
    bound["status"] = {**bound.get("status", {}), "conditions": [{"type": "PodScheduled", "status": "True"}]}
    vk.twins._apply(WatchEvent("MODIFIED", bound))
    assert vk.pending() == (NONE, NONE, NONE)
    assert vk.status.settled(KEY) and vk.pods.settled(KEY)

    # its node runs it: status back writes that
    running = copy.deepcopy(bound)
    running["metadata"]["resourceVersion"] = str(vk.provider.version + 2)
    running["status"] = {"phase": "Running", "podIP": "10.244.3.7", "startTime": "2024-06-01T10:00:03Z"}
    vk.twins._apply(WatchEvent("MODIFIED", running))
    assert vk.pending() == (NONE, {KEY}, NONE)
    assert vk.pods.settled(KEY), "its binding and status leave the pair in sync for the twin sync"
    vk.drain()
    assert await vk.status.reconcile(KEY) is None
    assert vk.consumer.writes == [("create", "serviceaccounts", "token"), ("patch", "pods", "status")]

    # its echo wakes no queue at all: not status back, not the twin sync, not the token
    written = vk.consumer.answers[-1]
    assert written["status"]["phase"] == "Running"
    vk.local._apply(WatchEvent("MODIFIED", written))
    assert vk.pending() == (NONE, NONE, NONE)
    assert vk.status.settled(KEY) and vk.pods.settled(KEY), "a resync passes over neither"

    # someone else writing the pod's status is no echo: status back looks again
    theirs = copy.deepcopy(written)
    theirs["metadata"]["resourceVersion"] = str(vk.consumer.version + 1)
    theirs["status"]["phase"] = "Pending"
    vk.local._apply(WatchEvent("MODIFIED", theirs))
    assert vk.pending() == (NONE, {KEY}, NONE)
    assert not vk.status.settled(KEY)

    vk.drain()

    # and a twin changed by anyone else wakes the twin sync as before, not status back when
    # its status is the same
    relabelled = copy.deepcopy(running)
    relabelled["metadata"]["resourceVersion"] = str(vk.provider.version + 3)
    relabelled["metadata"]["labels"]["app"] = "tampered"
    vk.twins._apply(WatchEvent("MODIFIED", relabelled))
    assert KEY in vk.to_remote.pending
    assert not vk.pods.settled(KEY)
    assert KEY not in vk.back.pending


def test_echoes_are_exactly_our_last_write_and_go_with_it() -> None:
    echoes = Echoes()
    assert not echoes.is_echo(KEY, "5")
    assert echoes.wrote(KEY, {"metadata": {"resourceVersion": "5"}}) == "5"
    assert not echoes.is_echo(KEY, "4"), "an earlier version, still on its way, is not it"
    assert not echoes.is_echo(KEY, None)
    assert echoes.is_echo(KEY, "5")
    assert not echoes.is_echo(KEY, "5"), "once only"
    echoes.wrote(KEY, {"metadata": {"resourceVersion": "9"}})
    echoes.forget(KEY)
    assert not echoes.is_echo(KEY, "9") and len(echoes) == 0
    assert echoes.wrote(KEY, {}) is None and len(echoes) == 0


def test_a_token_cares_for_its_pod_starting_ending_and_changing_not_for_its_status() -> None:
    pod = consumer_pod()
    running = copy.deepcopy(pod)
    running["status"] = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
    assert not matters_to_token("MODIFIED", pod, running)
    for change in (
        lambda p: p["status"].update(phase="Succeeded"),
        lambda p: p["status"].update(phase="Failed"),
        lambda p: p["metadata"].update(deletionTimestamp="2024-06-01T11:00:00Z"),
        lambda p: p["metadata"].update(uid="another"),
        lambda p: p["spec"].update(serviceAccountName="evaluator"),
    ):
        new = copy.deepcopy(running)
        change(new)
        assert matters_to_token("MODIFIED", running, new), new
    finished = copy.deepcopy(running)
    finished["status"]["phase"] = "Succeeded"
    again = copy.deepcopy(finished)
    again["status"]["conditions"] = []
    assert not matters_to_token("MODIFIED", finished, again)
    assert matters_to_token("ADDED", None, pod) and matters_to_token("DELETED", pod, None)
    terminating = copy.deepcopy(running)
    terminating["metadata"].update(deletionTimestamp="2024-06-01T11:00:30Z", deletionGracePeriodSeconds=30)
    cut_short = copy.deepcopy(terminating)  # removed with grace 0 once its twin is gone
    cut_short["metadata"].update(deletionTimestamp="2024-06-01T11:00:02Z", deletionGracePeriodSeconds=0)
    assert not matters_to_token("MODIFIED", terminating, cut_short), "its token went when it began"


async def test_a_terminating_pods_token_secret_is_deleted_once() -> None:
    vk = VirtualKubelet()
    pod = consumer_pod()
    vk.local._apply(WatchEvent("ADDED", pod))
    await vk.token.reconcile(KEY)
    assert ("create", "secrets", None) in vk.provider.writes
    terminating = copy.deepcopy(pod)
    terminating["metadata"].update(deletionTimestamp="2024-06-01T11:00:00Z", resourceVersion="48300")
    vk.local._apply(WatchEvent("MODIFIED", terminating))
    assert KEY in vk.tokens.pending
    await vk.token.reconcile(KEY)
    await vk.token.reconcile(KEY)  # another change while it terminates
    vk.local._apply(WatchEvent("DELETED", terminating))
    assert KEY in vk.tokens.pending
    await vk.token.reconcile(KEY)
    assert [w for w in vk.provider.writes if w[0] == "delete"] == [("delete", "secrets", None)]

    # a restart forgot all that: a pod gone is looked for all the same
    fresh = VirtualKubelet()
    fresh.local._apply(WatchEvent("ADDED", pod))
    fresh.local._apply(WatchEvent("DELETED", pod))
    await fresh.token.reconcile(KEY)
    assert fresh.provider.writes == [("delete", "secrets", None)]


async def test_a_pod_on_its_way_out_wakes_no_status_pass_unless_one_is_running() -> None:
    vk = VirtualKubelet()
    pod = consumer_pod()
    vk.local._apply(WatchEvent("ADDED", pod))
    await vk.pods.reconcile(KEY)
    created = vk.provider.answers[-1]
    vk.twins._apply(WatchEvent("ADDED", created))
    vk.drain()
    vk.status._in_sync[KEY] = ("kept",)  # what a pass had found

    terminating = copy.deepcopy(pod)
    terminating["metadata"].update(deletionTimestamp="2024-06-01T11:00:00Z", resourceVersion="48300")
    vk.local._apply(WatchEvent("MODIFIED", terminating))
    assert KEY not in vk.back.pending and KEY in vk.to_remote.pending
    assert KEY not in vk.status._in_sync, "forgotten without a pass"

    # a status pass that is running now sees the change itself: it is asked to look again
    vk.back._processing.add(KEY)
    vk.twins._apply(WatchEvent("DELETED", created))
    assert vk.back.pending == {KEY}
    vk.back._processing.discard(KEY)
    vk.drain()

    vk.local._apply(WatchEvent("DELETED", terminating))
    assert vk.back.pending == NONE and KEY in vk.to_remote.pending


async def test_a_resync_queues_a_pair_only_where_it_is_not_in_sync() -> None:
    vk = VirtualKubelet(dataclasses.replace(SETTINGS, resync_seconds=0.01))
    pod = consumer_pod()
    vk.consumer.objects[pod["metadata"]["name"]] = pod
    vk.local._apply(WatchEvent("ADDED", pod))
    await vk.pods.reconcile(KEY)
    vk.twins._apply(WatchEvent("ADDED", vk.provider.answers[-1]))
    waiting = copy.deepcopy(pod)  # another pod, whose twin is not made yet (a burst's backlog)
    waiting["metadata"].update(name="finetune-llama-b7k4m", uid="another-uid")
    vk.local._apply(WatchEvent("ADDED", waiting))
    other = ObjectKey("ml-team", "finetune-llama-b7k4m")
    vk.drain()
    assert vk.pods.settled(KEY) and not vk.status.settled(KEY)  # no status pass yet
    assert vk.status.settled(other), "no twin: no status to write"

    resync = next(t for t in vk.manager._tasks if t.name == "resync")
    task = asyncio.create_task(resync.factory())
    await asyncio.sleep(0.05)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert vk.pending() == ({other}, {KEY}, NONE)


async def test_a_token_written_before_its_twin_is_renewed_by_the_queue() -> None:
    vk = VirtualKubelet()
    pod = consumer_pod()
    vk.local._apply(WatchEvent("ADDED", pod))
    vk.drain()
    await vk.token.ensure_for(pod)  # the pod reflector, about to create the twin
    assert ("create", "secrets", None) in vk.provider.writes
    delayed = vk.tokens._delayed.get(KEY)
    assert delayed is not None, "its renewal is in the queue"
    # at 80 % of the token's life, not now
    assert delayed[0] - asyncio.get_running_loop().time() > 3600


async def test_room_freed_while_a_pod_is_being_held_retries_it_at_once() -> None:
    """A pod that fits nowhere is held (its status and an Event say so). Room that frees up while
    those writes are on their way must retry it: the gate's retry list has it from the moment the
    fit failed, not from the end of the writes (else it waited for the 30 s backstop)."""
    vk = VirtualKubelet()
    view = vk.node.view
    view.handle_node(WatchEvent("ADDED", node("h100-1", gpus=8)))
    view.handle_node(Listed("1", frozenset({ObjectKey(None, "h100-1")})))
    blocker = gpu_pod("blocker", None, gpus=8)
    blocker["metadata"]["namespace"] = "others"
    blocker["spec"]["nodeName"] = "h100-1"
    view.handle_pod(WatchEvent("ADDED", blocker))
    view.handle_pod(Listed("1", frozenset({ObjectKey("others", "blocker")})))
    vk.node.reachable = True

    pod = gpu_pod("train-0", VIRTUAL_NODE, gpus=8, phase=None)
    key = ObjectKey("ml", "train-0")
    vk.consumer.objects["train-0"] = pod
    vk.local._apply(WatchEvent("ADDED", pod))
    vk.drain()
    seen_while_holding: list[bool] = []

    async def freed_meanwhile(resource: Any, name: str, body: Any, namespace: Any = None,
                              **options: Any) -> Any:  # fmt: skip
        # the blocker goes while the pod's status is being written
        view.handle_pod(WatchEvent("DELETED", blocker))
        seen_while_holding.append(key in vk.to_remote.pending)
        return await ApiServer.patch(vk.consumer, resource, name, body, namespace, **options)

    vk.consumer.patch = freed_meanwhile  # type: ignore[method-assign]
    assert await vk.pods.reconcile(key) is not None  # held, and looked at again in 30 s at the latest
    assert vk.consumer.writes[0] == ("patch", "pods", "status")
    assert seen_while_holding == [True], "the room that freed up retries it now"
