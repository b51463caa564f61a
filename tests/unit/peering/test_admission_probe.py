"""What a dry-run pod's admitted form says of the offloading rule (peering.admissionprobe)."""

from __future__ import annotations

from typing import Any

import pytest

from kube.api import NODE_TYPE_LABEL, NODE_TYPE_VIRTUAL_KUBELET, VIRTUAL_NODE_TAINT_KEY
from peering.admissionprobe import not_applied, probe_pod

TOLERATION = {"key": VIRTUAL_NODE_TAINT_KEY, "operator": "Exists", "effect": "NoExecute"}
DEFAULT = {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"}


def admitted(**spec: Any) -> dict[str, Any]:
    pod = probe_pod()
    return {**pod, "spec": {**pod["spec"], **spec}}


def test_the_probe_has_nothing_the_rule_would_leave_alone() -> None:
    spec = probe_pod()["spec"]
    assert not {"tolerations", "nodeSelector", "affinity"} & spec.keys()
    assert probe_pod()["metadata"]["generateName"]  # never a name that another probe holds


@pytest.mark.parametrize("strategy", ["LocalAndRemote", "Remote", None])
def test_admitted_unchanged_is_not_applied(strategy: str | None) -> None:
    assert not_applied(admitted(), strategy) == "pods are still admitted without the virtual-node toleration"
    assert not_applied(admitted(tolerations=[DEFAULT]), strategy) is not None


def test_the_toleration_is_the_rule_for_local_and_remote() -> None:
    assert not_applied(admitted(tolerations=[DEFAULT, TOLERATION]), "LocalAndRemote") is None


def test_remote_needs_the_node_selector_as_well() -> None:
    tolerated = admitted(tolerations=[TOLERATION])
    assert "node selector type=virtual-kubelet" in str(not_applied(tolerated, "Remote"))
    pinned = admitted(tolerations=[TOLERATION], nodeSelector={NODE_TYPE_LABEL: NODE_TYPE_VIRTUAL_KUBELET})
    assert not_applied(pinned, "Remote") is None
