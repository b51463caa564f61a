"""The local API servers serve /debug/pprof only when asked (GPUFERRY_APISERVER_PROFILING=1)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hack.localcluster.binaries import Binaries
from hack.localcluster.cluster import LocalCluster
from hack.localcluster.spec import cluster_specs


def _apiserver_argv(tmp_path: Path) -> list[list[str]]:
    binaries = Binaries(**{name: tmp_path / name for name in Binaries.__dataclass_fields__})
    return [
        LocalCluster(spec, binaries).components()["kube-apiserver"].argv
        for spec in cluster_specs("scratch", run_root=tmp_path).values()
    ]


def test_off_by_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPUFERRY_APISERVER_PROFILING", raising=False)
    for argv in _apiserver_argv(tmp_path):
        assert "--profiling=false" in argv and "--profiling=true" not in argv


def test_on_when_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUFERRY_APISERVER_PROFILING", "1")
    for argv in _apiserver_argv(tmp_path):
        assert "--profiling=true" in argv and "--profiling=false" not in argv
