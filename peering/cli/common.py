"""What the CLI commands share: user errors, progress lines, output formats, flag parsing."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import textwrap
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from kube import goyaml
from kube.accelerators import is_accelerator, short_name
from kube.clients import KubeClient
from kube.errors import AlreadyExists, NotFound
from kube.objects import NAMESPACES, Resource

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

__all__ = [
    "Progress",
    "UserError",
    "add_output_argument",
    "console",
    "described",
    "emit",
    "fold_table",
    "format_resources",
    "kubeconfig_context_name",
    "parse_pairs",
]


class UserError(Exception):
    """Something the user can fix; printed as one ``error:`` line, exit status ``code``."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


class Progress:
    """Progress lines on stderr (``✓ step (1.2s)``), so that stdout stays machine-readable."""

    def __init__(self, quiet: bool = False) -> None:
        self.quiet = quiet
        self.start = time.monotonic()

    def step(self, message: str) -> None:
        if not self.quiet:
            print(f"  ✓ {message} ({time.monotonic() - self.start:.1f}s)", file=sys.stderr, flush=True)

    def note(self, message: str) -> None:
        if not self.quiet:
            print(f"    {message}", file=sys.stderr, flush=True)

    def warn(self, message: str) -> None:
        """Something the user should know although the command goes on; printed also when quiet."""
        print(f"warning: {message}", file=sys.stderr, flush=True)


def parse_pairs(values: Sequence[str] | None, flag: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for value in values or ():
        key, sep, val = value.partition("=")
        if not sep or not key:
            raise UserError(f"{flag} expects KEY=VALUE, got {value!r}")
        out[key] = val
    return out


def kubeconfig_context_name(path: str | None, context: str | None) -> str:
    """The context's name in a kubeconfig (what a derived cluster ID is made from)."""
    if context:
        return context
    if not path:
        return "in-cluster"
    try:
        config = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise UserError(f"cannot read kubeconfig {path}: {exc}") from None
    return str(config.get("current-context") or Path(path).stem)


def format_resources(resources: Mapping[str, Any] | None) -> str:
    """``{"nvidia.com/mig-1g.10gb": "7", "cpu": "8"}`` → ``mig-1g.10gb=7, cpu=8``: accelerators
    first (by their short name), then the rest; ``-`` for none."""
    if not resources:
        return "-"
    order = sorted(resources, key=lambda r: (not is_accelerator(r), r))
    return ", ".join(f"{short_name(r) if is_accelerator(r) else r}={resources[r]}" for r in order)


def add_output_argument(parser: argparse.ArgumentParser) -> None:
    """``-o table|json|yaml``, the same for every command that prints something."""
    parser.add_argument(
        "-o",
        "--output",
        choices=["table", "json", "yaml"],
        default="table",
        help="table (default); json or yaml: the same facts, for scripts (progress stays on stderr)",
    )


def described(text: str, *examples: str) -> dict[str, Any]:
    """``add_parser`` keywords for a command's own ``--help``: ``text`` (paragraphs apart by blank
    lines) wrapped to 88 columns, then ``examples``, one command line each, as written. Pure."""
    paragraphs = [textwrap.fill(" ".join(p.split()), 88) for p in text.strip().split("\n\n")]
    epilog = "examples:\n" + "\n".join(f"  {e}" for e in examples) if examples else None
    return {
        "description": "\n\n".join(paragraphs),
        "epilog": epilog,
        "formatter_class": argparse.RawDescriptionHelpFormatter,
    }


UNBOUNDED_WIDTH = 1000
"""The width of tables and lines written to a pipe or a file (``gpuferry info | less``, a CI
log): as wide as their contents. rich's default there, 80 columns, cut IDs, GPU products and
dates to ``gpu-f…``."""


def console() -> Console:
    """Where tables go: stdout, as wide as the terminal (or ``$COLUMNS``); unbounded when stdout
    is not a terminal."""
    from rich.console import Console

    wide = not sys.stdout.isatty() and not os.environ.get("COLUMNS")
    return Console(width=UNBOUNDED_WIDTH if wide else None)


def fold_table(columns: Iterable[str], *, title: str | None = None, **options: Any) -> Table:
    """A rich Table whose cells fold onto more lines where the terminal is too narrow, rather
    than end in ``…``: what they hold (IDs, namespaces, CIDRs) is what people copy."""
    from rich.table import Table

    t = Table(title=title, **options)
    for column in columns:
        t.add_column(column, overflow="fold")
    return t


def emit(data: Mapping[str, Any], output: str, render_table: Any) -> None:
    """Print ``data`` as JSON or YAML, or call ``render_table(console)`` for a table."""
    if output == "json":
        print(json.dumps(data, indent=2, sort_keys=True))
    elif output == "yaml":
        print(goyaml.dump(dict(data)), end="")
    else:
        render_table(console())


async def ensure_namespace(client: KubeClient, name: str) -> None:
    """Create namespace ``name`` unless it exists (gpuferry-system, before its first object)."""
    with contextlib.suppress(AlreadyExists):
        await client.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})


async def delete_and_wait(
    client: KubeClient, resource: Resource, name: str, namespace: str | None, *,
    timeout: float, stuck: str, deleted: Callable[[], None] = lambda: None,
) -> bool:  # fmt: skip
    """Delete an object whose finalizer a controller runs (``deleted`` is called then, to say what
    is being waited for), and wait until it is gone. False when it was not there;
    UserError(``stuck``) when it is still there after ``timeout``."""
    from ..waits import StillThere, wait_gone

    try:
        await client.delete(resource, name, namespace)
    except NotFound:
        return False
    deleted()
    try:
        await wait_gone(client, resource, name, namespace, timeout=timeout)
    except StillThere as exc:
        raise UserError(stuck + exc.held) from None
    return True
