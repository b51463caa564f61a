"""What the API server requires of a structural CRD schema, checked before any cluster sees it
(the API server refused a toleration schema with both properties and additionalProperties)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from peering.crds import load_crds


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
