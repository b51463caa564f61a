"""What a dry-run pod's admitted form says of the offloading rule (peering.admissionprobe)."""

from __future__ import annotations

from typing import Any

import pytest

from kube.api import NODE_TYPE_LABEL, NODE_TYPE_VIRTUAL_KUBELET, VIRTUAL_NODE_TAINT_KEY
from kube.errors import Forbidden, Invalid, ServerError
from peering.admission import POLICY_NAME
from peering.admissionprobe import Probe, not_applied, probe_pod, refused
from peering.consumer.offloadings import with_admission

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


def test_a_refusal_that_passes_by_itself_is_not_yet() -> None:
    account = Forbidden(
        'pods "gpuferry-offload-probe-x" is forbidden: error looking up service account w/default: '
        'serviceaccount "default" not found', status=403, reason="Forbidden")  # fmt: skip
    assert refused(account).live is False
    assert refused(ServerError("etcdserver: request timed out", status=500)).live is False
    ours = Forbidden(f"policy '{POLICY_NAME}' with binding '{POLICY_NAME}' denied request: paramKind kind "
                     "`NamespaceOffloading` not yet synced to use for admission", status=403)  # fmt: skip
    assert refused(ours).live is False
    assert "serviceaccount" in refused(account).detail


def test_the_namespaces_own_refusal_cannot_tell() -> None:
    quota = Forbidden('pods "p" is forbidden: exceeded quota: no-pods, requested: pods=1', status=403)
    theirs = Invalid("ValidatingAdmissionPolicy 'team-labels' with binding 'team-labels' denied request: "
                     "pods need a team label", status=422)  # fmt: skip
    assert refused(quota) == Probe(None, f"a dry-run pod was refused: {quota}")
    assert refused(theirs).live is None


def test_ready_waits_for_the_rule_and_goes_on_where_it_cannot_tell() -> None:
    ready = ("Ready", "twin namespaces ready on gpu-farm")
    assert with_admission(*ready, Probe(True)) == ("Ready", "Ready", "twin namespaces ready on gpu-farm")
    phase, reason, message = with_admission(*ready, Probe(False, "pods are still admitted without it"))
    assert (phase, reason) == ("Pending", "AdmissionPending")
    assert message.endswith("pods are still admitted without it")
    phase, reason, message = with_admission(*ready, Probe(None, "a dry-run pod was refused: quota"))
    assert (phase, reason) == ("Ready", "Ready")
    assert message == "twin namespaces ready on gpu-farm; the offloading rule could not be checked " \
                      "(a dry-run pod was refused: quota)"
