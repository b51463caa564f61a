"""The virtual kubelet of a VirtualNode ends when what it read of the spec at start changes, and
only then: a new grant is handed to the running node, and the spec's largest free block, which
follows the provider's occupancy, the kubelet computes live (a restart on each change of them
would restart the kubelet, and relist every pod, whenever a provider pod comes or goes)."""

from __future__ import annotations

import copy
from typing import Any

from kube.api import kubelet_spec_digest
from kube.clients import KubeClient
from kube.kubeconfigs import Connection
from kube.manager import Manager
from kube.watching import WatchEvent
from vk.app import VirtualNodeFollower

VN: dict[str, Any] = {
    "apiVersion": "offloading.gpuferry.io/v1alpha1",
    "kind": "VirtualNode",
    "metadata": {"name": "gpu-farm", "namespace": "gpuferry-system", "generation": 7},
    "spec": {
        "nodeName": "gpuferry-gpu-farm",
        "resources": {"nvidia.com/gpu": "8"},
        "shape": {"nvidia.com/gpu": "8"},
        "labels": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
    },
}


GRANTS: list[tuple[dict[str, str], dict[str, str]]] = []
GONE: list[bool] = []


def _follower() -> tuple[VirtualNodeFollower, Manager]:
    GRANTS.clear()
    GONE.clear()
    manager = Manager(name="virtual-kubelet")
    nowhere = KubeClient(Connection(server="https://127.0.0.1:1"))  # never called here
    digest = kubelet_spec_digest(VN["spec"])
    follower = VirtualNodeFollower(nowhere, "gpuferry-system", "gpu-farm", digest, manager=manager,
                                   on_grant=lambda r, lb: GRANTS.append((r, lb)),
                                   on_gone=lambda: GONE.append(manager.stopping))  # fmt: skip
    return follower, manager


def _changed(**spec: Any) -> dict[str, Any]:
    vn = copy.deepcopy(VN)
    vn["metadata"]["generation"] += 1
    vn["spec"].update(spec)
    return vn


def test_a_new_largest_free_block_is_no_reason_to_restart() -> None:
    follower, manager = _follower()
    follower._seen(WatchEvent("MODIFIED", _changed(shape={"nvidia.com/gpu": "3"})))
    assert follower.outcome is None and not manager.stopping


def test_a_new_grant_is_handed_over_while_it_runs() -> None:
    follower, manager = _follower()
    follower._seen(WatchEvent("MODIFIED", _changed(resources={"nvidia.com/gpu": "4"}, labels={"a": "b"})))
    assert follower.outcome is None and not manager.stopping
    assert GRANTS == [({"nvidia.com/gpu": "4"}, {"a": "b"})]


def test_what_it_read_at_start_restarts_it() -> None:
    for change in ({"providerNodeSelector": {"pool": "b"}}, {"nodeName": "gpuferry-other"},
                   {"kubeconfigSecretRef": {"name": "new", "key": "kubeconfig"}}):  # fmt: skip
        follower, manager = _follower()
        follower._seen(WatchEvent("MODIFIED", _changed(**change)))
        assert follower.outcome == "changed" and manager.stopping, change
        assert GRANTS == [] and GONE == []


def test_deleted_is_gone() -> None:
    follower, manager = _follower()
    follower._seen(WatchEvent("DELETED", VN))
    assert follower.outcome == "gone" and manager.stopping
    assert GONE == [False], "told once, before the manager stops (the Node is retired first)"
    follower._seen(WatchEvent("DELETED", VN))
    assert GONE == [False]
