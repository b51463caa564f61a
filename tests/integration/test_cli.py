"""The gpuferry console script, run as a user runs it, against the real clusters."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hack.localcluster import LocalCluster
from peering.crds import load_crds

pytestmark = pytest.mark.integration

GPUFERRY = Path(sys.executable).parent / "gpuferry"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(GPUFERRY), *args], capture_output=True, text=True, timeout=120)


def test_install_crds_is_idempotent_and_version_reports_them(provider: LocalCluster) -> None:
    kc = str(provider.spec.kubeconfig)
    for _ in range(2):
        done = run("install", "crds", "--kubeconfig", kc)
        assert done.returncode == 0, done.stderr
        assert "6 gpuferry CRDs installed and Established" in done.stdout
    ver = run("version", "--kubeconfig", kc, "-o", "json")
    assert ver.returncode == 0, ver.stderr
    data = json.loads(ver.stdout)
    assert data["serverVersion"] == "v1.36.4"
    assert data["server"] == provider.spec.server
    assert data["crds"] == {"installed": sorted(c["metadata"]["name"] for c in load_crds()), "missing": []}


@pytest.mark.parametrize(
    ("problem", "expected"),
    [
        ("missing-file", "error: kubeconfig: cannot read kubeconfig"),
        ("unreachable", "error: cannot reach the API server"),
        ("bad-context", "no context named 'nope'"),
    ],
)
def test_user_errors_are_one_line_and_a_non_zero_exit(
    provider: LocalCluster, tmp_path: Path, problem: str, expected: str
) -> None:
    kc = provider.spec.kubeconfig
    if problem == "missing-file":
        args = ["--kubeconfig", str(tmp_path / "absent")]
    elif problem == "unreachable":
        bad = tmp_path / "bad.kubeconfig"
        bad.write_text(kc.read_text().replace(provider.spec.server, "https://127.0.0.1:1"))
        args = ["--kubeconfig", str(bad)]
    else:
        args = ["--kubeconfig", str(kc), "--context", "nope"]
    done = run("version", *args)
    assert done.returncode == 1
    assert expected in done.stderr
    assert "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
