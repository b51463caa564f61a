"""YAML for Go programs (helm, kubectl, the kubelet): every string stays a string there.

PyYAML writes a string plain (unquoted) when its own YAML 1.1 rules read it back as a string,
but Go's YAML (``sigs.k8s.io/yaml``, go-yaml v2) reads more plain scalars as numbers and bools:
``0e5363800296`` (an image tag, a hex digest's first digits) is a float there, and so are
``1e5`` and ``1.0e5``; ``y``/``n`` are bools, ``0o17`` an int. helm then refuses the values
("got number, want string"). :func:`dump` quotes those too. Pure.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import yaml

__all__ = ["dump", "dump_all"]


class _GoSafeDumper(yaml.SafeDumper):
    """SafeDumper whose implicit resolvers also know what go-yaml v2 reads as a non-string, so
    that such strings are quoted."""


# go-yaml v2's resolve.go: a plain scalar matching this is a float (PyYAML's float needs a dot
# and a signed exponent)
_GO_FLOAT = re.compile(r"^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$")
# strconv.ParseInt(s, 0, 64), which go-yaml tries first: 0o octal and underscores in any base
_GO_INT = re.compile(r"^[-+]?(0[oO][0-7_]+|0[bB][01_]+|0[xX][0-9a-fA-F_]+|[0-9][0-9_]*)$")
# go-yaml v2's YAML 1.1 bools that PyYAML does not have
_GO_BOOL = re.compile(r"^(y|Y|n|N)$")

_GoSafeDumper.add_implicit_resolver("tag:yaml.org,2002:float", _GO_FLOAT, list("-+.0123456789"))
_GoSafeDumper.add_implicit_resolver("tag:yaml.org,2002:int", _GO_INT, list("-+0123456789"))
_GoSafeDumper.add_implicit_resolver("tag:yaml.org,2002:bool", _GO_BOOL, list("yYnN"))


def dump(data: Any, *, sort_keys: bool = True) -> str:
    """``yaml.safe_dump(data)``, with every string that Go would read as another type quoted."""
    return str(yaml.dump(data, Dumper=_GoSafeDumper, sort_keys=sort_keys))


def dump_all(documents: Iterable[Any], *, sort_keys: bool = True) -> str:
    """:func:`dump` for a stream of documents (``---`` between them)."""
    return str(yaml.dump_all(documents, Dumper=_GoSafeDumper, sort_keys=sort_keys))
