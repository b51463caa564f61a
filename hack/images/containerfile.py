"""Reading the repository's Containerfile, enough to check it against the local build."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from .wheels import REPO

CONTAINERFILE = REPO / "Containerfile"


@dataclass(frozen=True)
class Instruction:
    keyword: str  # upper case: FROM, RUN, COPY, ARG, ENV, ...
    args: str  # continuation lines joined with single spaces
    stage: str  # the alias of the FROM it belongs to ("" before the first FROM, the last is "final")


def parse(text: str) -> list[Instruction]:
    """The instructions of a Containerfile: comments dropped, continued lines joined."""
    logical: list[str] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1].strip() + " "
            continue
        logical.append(pending + line)
        pending = ""
    if pending:
        logical.append(pending.strip())
    froms = [i for i, line in enumerate(logical) if line.upper().startswith("FROM ")]
    out: list[Instruction] = []
    stage = ""
    for i, line in enumerate(logical):
        keyword, _, args = line.partition(" ")
        if keyword.upper() == "FROM":
            alias = re.search(r"\s+AS\s+(\S+)\s*$", args, re.IGNORECASE)
            stage = "final" if i == froms[-1] else (alias.group(1) if alias else f"stage{froms.index(i)}")
        out.append(Instruction(keyword.upper(), re.sub(r"\s+", " ", args.strip()), stage))
    return out


def read(path: Path = CONTAINERFILE) -> list[Instruction]:
    return parse(path.read_text())


def global_args(instructions: list[Instruction]) -> dict[str, str]:
    """The ``ARG NAME=DEFAULT`` before the first FROM."""
    found: dict[str, str] = {}
    for ins in instructions:
        if ins.stage == "" and ins.keyword == "ARG":
            name, _, default = ins.args.partition("=")
            found[name] = default
    return found


def stage(instructions: list[Instruction], name: str) -> list[Instruction]:
    return [ins for ins in instructions if ins.stage == name]


def copied_sources(instructions: list[Instruction], stage_name: str) -> list[str]:
    """The build-context paths the stage COPYs (not those COPY --from another stage)."""
    sources: list[str] = []
    for ins in stage(instructions, stage_name):
        if ins.keyword == "COPY" and "--from=" not in ins.args:
            words = [w for w in ins.args.split() if not w.startswith("--")]
            sources += words[:-1]
    return sources
