"""What the API server requires of a structural CRD schema, checked before any cluster sees it
(the API server refused a toleration schema with both properties and additionalProperties)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from peering.crds import REVISION_ANNOTATION, EnsuredCrds, load_crds, newer_on_cluster, schema_revision


def nodes(schema: Any, path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    if not isinstance(schema, dict):
        return
    yield path or "/", schema
    for name, sub in (schema.get("properties") or {}).items():
        yield from nodes(sub, f"{path}.{name}")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from nodes(schema["additionalProperties"], f"{path}[*]")
    if isinstance(schema.get("items"), dict):
        yield from nodes(schema["items"], f"{path}[]")


@pytest.mark.parametrize("crd", load_crds(), ids=lambda c: c["metadata"]["name"])
def test_every_schema_node_is_structural(crd: dict[str, Any]) -> None:
    for version in crd["spec"]["versions"]:
        for path, node in nodes(version["schema"]["openAPIV3Schema"]):
            name = crd["metadata"]["name"]
            assert not ("properties" in node and "additionalProperties" in node), (
                f"{name} {path}: properties and additionalProperties are mutually exclusive"
            )
            if "properties" in node or "items" in node or "additionalProperties" in node:
                assert "type" in node or node.get("x-kubernetes-int-or-string"), f"{path}: no type"


# ---- schema revisions (peering.crds: a newer CRD on the cluster is not replaced by an older one) ----

RECORD = Path(__file__).with_name("crd_revisions.txt")


def spec_digest(crd: dict[str, Any]) -> str:
    text = json.dumps(crd["spec"], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def recorded() -> list[tuple[str, int, str]]:
    rows = []
    for line in RECORD.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, revision, digest = line.split()
            rows.append((name, int(revision), digest))
    return rows


@pytest.mark.parametrize("crd", load_crds(), ids=lambda c: c["metadata"]["name"])
def test_a_changed_schema_has_a_new_revision(crd: dict[str, Any]) -> None:
    """Comparing revisions is only as good as their raising: a spec with the revision of another
    spec would pass for it on a cluster (an older CLI's schema kept, or a newer one replaced)."""
    name, revision, digest = crd["metadata"]["name"], schema_revision(crd), spec_digest(crd)
    mine = [(r, d) for n, r, d in recorded() if n == name]
    highest = max((r for r, _ in mine), default=0)
    assert (revision, digest) in mine, (
        f"the spec of {name} is not recorded at revision {revision} (its digest is {digest}): if it "
        f"changed, set its {REVISION_ANNOTATION} to {highest + 1} and add "
        f"'{name} {highest + 1} {digest}' to {RECORD.name}"
    )
    assert revision == highest, (
        f"{name}: revision {revision}, but {highest} is recorded: revisions only go up"
    )


def test_the_record_gives_each_revision_one_schema() -> None:
    rows = recorded()
    assert len({(n, r) for n, r, _ in rows}) == len(rows), "a revision recorded twice"
    assert len({(n, d) for n, _, d in rows}) == len(rows), "a schema recorded under two revisions"
    assert {n for n, _, _ in rows} == {c["metadata"]["name"] for c in load_crds()}


def stamped(revision: str | None) -> dict[str, Any]:
    annotations = {} if revision is None else {REVISION_ANNOTATION: revision}
    return {"metadata": {"name": "gpuslices.sharing.gpuferry.io", "annotations": annotations}}


@pytest.mark.parametrize(
    ("installed", "ours", "kept"),
    [
        ("absent", "1", False),  # not installed: applied
        ("1", "1", False),  # the same revision: applied (a no-op, or a hand edit undone)
        ("1", "2", False),  # older on the cluster: upgraded
        (None, "2", False),  # installed before revisions were stamped: older
        ("3", "2", True),  # newer on the cluster: kept
        ("x", "2", False),  # unreadable: taken for none
    ],
)
def test_only_a_newer_revision_on_the_cluster_is_kept(installed: str | None, ours: str, kept: bool) -> None:
    why = newer_on_cluster(None if installed == "absent" else stamped(installed), stamped(ours))
    assert (why is not None) == kept
    if kept:
        assert why == (
            "gpuslices.sharing.gpuferry.io is kept at schema revision 3: this gpuferry has revision 2, "
            "older (upgrade this gpuferry; to go back to the older schema on purpose, apply its CRD "
            "files yourself)"
        )


def test_what_was_kept_is_said_with_what_was_applied() -> None:
    """``install`` said "6 CRDs applied" right after the warning that one was kept."""
    names = [str(c["metadata"]["name"]) for c in load_crds()]
    assert EnsuredCrds(names, []).summary("CRDs applied") == "6 CRDs applied and Established"
    kept = EnsuredCrds(names[1:], names[:1])
    assert kept.summary("CRDs applied") == (
        "5 CRDs applied, 1 kept at a newer schema revision; all Established"
    )
    assert kept.names == sorted(names)
