"""The project's shell scripts: under ``set -o pipefail`` a pipe into ``head`` ends the script
at random when ``head`` exits before the writer is done (SIGPIPE, status 141): ``make demo``
failed so on its second run."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
SCRIPTS = sorted({*ROOT.glob("hack/*.sh"), *ROOT.glob("bench/*.sh"), ROOT / ".ci" / "run"})
EARLY_EXIT = re.compile(r"\|\s*(head|grep\s+(-\w*[qm]\w*))\b")


def pipefail(text: str) -> bool:
    return bool(re.search(r"^\s*set\s+-\w*o\s+pipefail|^\s*set\s+-o\s+pipefail", text, re.M))


@pytest.mark.parametrize(
    "script", [p for p in SCRIPTS if p.is_file()], ids=lambda p: str(p.relative_to(ROOT))
)
def test_no_pipe_into_a_reader_that_stops_early_under_pipefail(script: Path) -> None:
    text = script.read_text()
    if not pipefail(text):
        return
    found = [f"{script.name}:{n}: {line.strip()}" for n, line in enumerate(text.splitlines(), 1)
             if not line.lstrip().startswith("#") and EARLY_EXIT.search(line)]  # fmt: skip
    assert not found, "use sed -n 1p (it reads all of its input): " + "; ".join(found)


def test_the_check_sees_what_failed_the_demo() -> None:
    assert pipefail("#!/bin/bash\nset -euo pipefail\n") and pipefail("set -o pipefail\n")
    assert not pipefail("set -eu\n")
    assert EARLY_EXIT.search("kubectl=$(bash hack/build-k8s.sh --print-bin-dirs | head -1)/kubectl")
    assert EARLY_EXIT.search("x | grep -q foo") and not EARLY_EXIT.search("x | grep foo | sed -n 1p")
