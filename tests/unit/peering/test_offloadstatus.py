"""When `gpuferry offload namespace` stops waiting (read from the offloading's status alone), and what
an offload or unoffload that does not end says."""

from __future__ import annotations

from typing import Any

from peering.cli.offload_cmds import unoffload_stuck
from peering.offloadstatus import UNREACHABLE, Settled, offload_settled, pending_message, why_waiting


def offloading(phase: str, entries: list[dict[str, Any]], *, reason: str | None = None,
               generation: int = 2, message: str = "m") -> dict[str, Any]:  # fmt: skip
    cond = {"type": "Ready", "status": str(phase == "Ready"), "reason": reason or phase,
            "message": message, "observedGeneration": generation}  # fmt: skip
    return {"status": {"phase": phase, "remoteNamespaces": entries, "conditions": [cond]}}


READY = {"clusterID": "farm", "phase": "Ready", "remoteNamespace": "ml-farm"}
DOWN = {"clusterID": "farm-b", "phase": "Pending", "reason": UNREACHABLE, "message": "does not answer"}
ASKED = {"clusterID": "farm-b", "phase": "Pending", "reason": "Requested"}
NO_ID = {"clusterID": "farm-b", "phase": "Pending", "reason": "NoIdentity", "message": "no identity"}


def test_ready_and_failures_settle_it() -> None:
    assert offload_settled(offloading("Ready", [READY]), 2) == Settled(True)
    assert offload_settled(offloading("SomeFailed", [READY], message="farm-b: quota"), 2) == Settled(
        False, "farm-b: quota"
    )
    assert offload_settled(offloading("AllFailed", [], message="x"), 2) == Settled(False, "x")
    assert offload_settled(offloading("NoClusterSelected", []), 2) == Settled(
        False, "no peered provider is selected"
    )


def test_a_status_of_an_older_spec_settles_nothing() -> None:
    assert offload_settled(offloading("Ready", [READY], generation=1), 2) is None
    assert offload_settled({"status": {"phase": "Ready"}}, 2) is None  # no condition yet
    assert offload_settled({}, 1) is None


def test_a_provider_that_does_not_answer_is_not_waited_for_when_another_is_ready() -> None:
    assert offload_settled(offloading("Pending", [READY, DOWN]), 2) == Settled(True, unreachable=("farm-b",))


def test_a_provider_that_may_still_answer_is_waited_for() -> None:
    assert offload_settled(offloading("Pending", [READY, ASKED]), 2) is None
    assert offload_settled(offloading("Pending", [READY, NO_ID]), 2) is None
    assert offload_settled(offloading("Pending", [READY, DOWN, ASKED]), 2) is None
    # an older agent writes no reason: waited for, as before
    assert offload_settled(offloading("Pending", [READY, {**DOWN, "reason": None}]), 2) is None


def test_no_provider_ready_is_waited_for_even_when_none_answers() -> None:
    assert offload_settled(offloading("Pending", [DOWN]), 2) is None
    assert offload_settled(offloading("Pending", [DOWN, {**DOWN, "clusterID": "farm-c"}]), 2) is None


def test_every_provider_ready_but_the_rule_not_applied_yet_is_waited_for() -> None:
    assert offload_settled(offloading("Pending", [READY], reason="AdmissionPending"), 2) is None


def test_the_message_of_an_offloading_that_waits_says_what_for() -> None:
    said = pending_message([READY, DOWN])
    assert said == "twin namespaces ready on farm; waiting for farm-b: does not answer"
    assert pending_message([ASKED]) == "waiting for farm-b: asked, not answered yet"
    assert pending_message([]) == "waiting for the twin namespaces"


def test_an_offload_that_does_not_settle_says_why_in_the_agents_words_or_that_no_agent_looked() -> None:
    waiting = offloading("Pending", [DOWN], message="waiting for farm-b: does not answer")
    assert why_waiting(waiting, 2) == "waiting for farm-b: does not answer"
    assert why_waiting(offloading("Pending", [DOWN], generation=1), 2).startswith(
        "the consumer agent has not looked at it"
    )
    assert why_waiting(None, 1).startswith("the consumer agent has not looked at it")


def test_an_unoffload_held_by_providers_that_do_not_answer_names_them() -> None:
    said = unoffload_stuck("ml", 5, ["farm", "farm-b"], {"farm-b", "elsewhere"})
    assert said.startswith("namespace ml is still offloaded after 5s: farm-b does not answer (taint ")
    both = unoffload_stuck("ml", 5, ["farm", "farm-b"], {"farm", "farm-b"})
    assert "farm, farm-b do not answer" in both
    assert unoffload_stuck("ml", 5, ["farm"], set()).endswith(
        "is the consumer agent running? (see `gpuferry agents`)"
    )
