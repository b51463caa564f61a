"""YAML written for Go programs keeps every string a string there (kube.goyaml)."""

from __future__ import annotations

import pytest
import yaml

from kube import goyaml

# each is a string that go-yaml v2 (helm, kubectl) reads as a number or a bool when unquoted
GO_READS_AS_OTHER = [
    "0e5363800296",  # the image tag of a CI run: a float (0) to helm, "got number, want string"
    "1e5",
    "1.0e5",
    "+1e5",
    "-2E10",
    ".5",
    "7.",
    "0o17",
    "1_000",
    "0x1F",
    "y",
    "N",
    "yes",
    "false",
    "12",
    "3.14",
]


@pytest.mark.parametrize("text", GO_READS_AS_OTHER)
def test_a_string_go_would_read_as_another_type_is_quoted(text: str) -> None:
    out = goyaml.dump({"tag": text})
    assert out in (f"tag: '{text}'\n", f'tag: "{text}"\n'), out
    assert yaml.safe_load(out) == {"tag": text}


@pytest.mark.parametrize("text", ["abc", "v1.36.4", "0.1.0", "e5", "1e", "deadbeef", "12ab34cd", "1e5x"])
def test_other_strings_stay_plain(text: str) -> None:
    assert goyaml.dump({"tag": text}) == f"tag: {text}\n"


def test_numbers_bools_and_nulls_are_written_as_such_and_documents_are_separated() -> None:
    data = {"replicas": 2, "pace": 0.5, "enabled": True, "tag": None}
    assert yaml.safe_load(goyaml.dump(data)) == data
    assert goyaml.dump({"b": 1, "a": 2}, sort_keys=False) == "b: 1\na: 2\n"
    out = goyaml.dump_all([{"tag": "1e5"}, {"tag": "x"}])
    assert out == "tag: '1e5'\n---\ntag: x\n"
    assert list(yaml.safe_load_all(out)) == [{"tag": "1e5"}, {"tag": "x"}]
