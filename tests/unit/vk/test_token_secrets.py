"""What a pod's token Secret costs the provider, and that none is left behind (issue 15).

A pod without a token volume never had a token Secret (a pod's volumes never change): it costs
no request, from its addition to its deletion. A twin found without its consumer pod (the pod
was deleted while no virtual kubelet ran) takes its token Secret with it.

The virtual kubelet is assembled for real; its informers are fed by hand as their watches would
be, and the API servers' answers come from stand-ins that record what was asked."""

from __future__ import annotations

import copy
from typing import Any

from kube.watching import WatchEvent
from vk.forge.pods import remote_pod
from vk.forge.tokens import token_secret_name

from .assembled import KEY, NONE, VirtualKubelet
from .builders import consumer_pod


def tokenless(pod: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(pod)
    out["spec"]["automountServiceAccountToken"] = False
    out["spec"]["volumes"] = [v for v in out["spec"].get("volumes") or () if "projected" not in v]
    return out


async def written(pod: dict[str, Any]) -> VirtualKubelet:
    """A virtual kubelet whose consumer pods are listed, ``pod`` among them, its token pass done."""
    vk = VirtualKubelet()
    vk.local.synced.set()
    vk.local._apply(WatchEvent("ADDED", pod))
    await vk.token.reconcile(KEY)
    return vk


def made_before(pod: dict[str, Any], vk: VirtualKubelet) -> dict[str, Any]:
    """The twin of ``pod`` as a virtual kubelet that ran before this one made it."""
    twin = remote_pod(pod, vk.pods.opts)
    twin["metadata"].update(resourceVersion="31", uid="twin-uid")
    return twin


async def test_a_pod_without_a_token_volume_costs_no_secret_request_from_start_to_end() -> None:
    vk = VirtualKubelet()
    vk.local.synced.set()
    pod = tokenless(consumer_pod())
    vk.local._apply(WatchEvent("ADDED", pod))
    assert KEY in vk.tokens.pending
    await vk.token.reconcile(KEY)
    await vk.token.ensure_for(pod)  # the pod reflector, before its twin
    finished = copy.deepcopy(pod)
    finished["status"] = {"phase": "Succeeded"}
    finished["metadata"]["resourceVersion"] = "48300"
    vk.local._apply(WatchEvent("MODIFIED", finished))
    await vk.token.reconcile(KEY)
    terminating = copy.deepcopy(finished)
    terminating["metadata"].update(deletionTimestamp="2024-06-01T11:00:00Z", resourceVersion="48301")
    vk.local._apply(WatchEvent("MODIFIED", terminating))
    await vk.token.reconcile(KEY)
    vk.local._apply(WatchEvent("DELETED", terminating))
    await vk.token.reconcile(KEY)
    assert vk.provider.writes == [] and vk.consumer.writes == []
    assert KEY not in vk.token._removed, "nothing is kept for a pod gone"


async def test_a_pod_with_a_token_volume_still_has_its_secret_written_and_deleted() -> None:
    pod = consumer_pod()
    vk = await written(pod)
    vk.local._apply(WatchEvent("DELETED", pod))
    await vk.token.reconcile(KEY)
    assert vk.provider.writes == [("create", "secrets", None), ("delete", "secrets", None)]


async def test_another_pod_of_the_name_without_a_token_volume_deletes_the_first_ones_secret() -> None:
    pod = consumer_pod()
    vk = await written(pod)
    replaced = tokenless(pod)
    replaced["metadata"].update(uid="another-uid", resourceVersion="48400")
    vk.local._apply(WatchEvent("DELETED", pod))
    vk.local._apply(WatchEvent("ADDED", replaced))
    await vk.token.reconcile(KEY)
    vk.local._apply(WatchEvent("DELETED", replaced))
    await vk.token.reconcile(KEY)
    assert vk.provider.writes == [("create", "secrets", None), ("delete", "secrets", None)]


async def test_an_orphan_twin_found_at_start_takes_its_token_secret_with_it() -> None:
    vk = VirtualKubelet()
    pod = consumer_pod()
    twin = made_before(pod, vk)
    # the twins are listed first; the consumer's pods are not listed yet: nothing is known
    vk.twins._apply(WatchEvent("ADDED", twin))
    assert KEY in vk.tokens.pending and KEY in vk.to_remote.pending
    vk.local.synced.set()  # listed: the pod is not there (deleted while no virtual kubelet ran)
    await vk.token.reconcile(KEY)
    assert vk.provider.writes == [("delete", "secrets", None)]
    assert vk.provider.deleted == [token_secret_name(KEY.name)]


async def test_a_twin_listed_with_its_pod_there_wakes_no_token_pass() -> None:
    vk = VirtualKubelet()
    pod = consumer_pod()
    vk.local._apply(WatchEvent("ADDED", pod))
    vk.local.synced.set()
    vk.drain()
    twin = made_before(pod, vk)
    vk.twins._apply(WatchEvent("ADDED", twin))  # a twin made before a restart, its pod still there
    assert vk.pending()[2] == NONE
