"""Tables are printed whole: piped (``gpuferry info | less``, a CI log) as wide as their
contents, on a narrow terminal folded onto more lines; never cut to ``gpu-f…``."""

from __future__ import annotations

from typing import Any

import pytest

from peering.cli.common import emit
from peering.cli.info_cmd import _render

# what `gpuferry info -o json` printed on the demo's consumer (2026-11-28), its Kueue part left out
INFO: dict[str, Any] = {
    "cluster": {"id": "ml-eu", "server": "https://127.0.0.1:16100"},
    "roles": ["consumer"],
    "consumers": [],
    "network": [{
        "bytes": {"received": 564, "sent": 880}, "endpoint": "172.31.1.12:31820", "handshakeAge": "92s",
        "peer": "gpu-farm", "peerSeenFrom": "172.31.1.12:31820", "ready": True, "reason": "HandshakeRecent",
        "message": "handshake 91s ago", "remaps": [{"here": "10.64.0.0/16", "peer": "10.244.0.0/16"},
                                                   {"here": "10.65.0.0/16", "peer": "10.96.0.0/16"}],
    }],
    "offloadedNamespaces": [{
        "namespace": "ml-team", "podOffloadingStrategy": "LocalAndRemote",
        "remoteNamespaces": [{"namespace": "ml-team-ml-eu", "provider": "gpu-farm"}],
    }],
    "pool": {"accelerators": {"nvidia.com/gpu": {"free": 8, "granted": 8, "used": 0}},
             "gpus": {"free": 8, "granted": 8, "used": 0}, "providers": 1, "ready": 1},
    "providers": [{
        "accelerators": {"nvidia.com/gpu": {"free": 8, "granted": 8, "used": 0}},
        "gpuProduct": "NVIDIA-H100-80GB-HBM3", "gpus": {"free": 8, "granted": 8, "used": 0},
        "id": "gpu-farm", "identity": {"notAfter": "2026-12-28T03:46:17Z"}, "largestBlock": "8",
        "ready": True, "readyReason": "ProviderReachable", "virtualNode": "gpuferry-gpu-farm",
    }],
}  # fmt: skip

WHOLE = [
    "gpuferry-gpu-farm", "NVIDIA-H100-80GB-HBM3", "2026-12-28T03:46:17Z", "ml-team-ml-eu",
    "accelerators (used/granted)", "10.244.0.0/16 → 10.64.0.0/16, 10.96.0.0/16 → 10.65.0.0/16",
]  # fmt: skip


def test_piped_every_value_is_printed_whole_on_its_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    emit(INFO, "table", lambda console: _render(INFO, console))
    out = capsys.readouterr().out
    assert "…" not in out
    missing = [value for value in WHOLE if value not in out]
    assert missing == [], out


def test_on_a_narrow_terminal_cells_fold_rather_than_end_in_an_ellipsis(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    emit(INFO, "table", lambda console: _render(INFO, console))
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 80
    assert "…" not in out
    assert "NVIDIA" in out and "BM3" in out  # the GPU product, folded over lines


def test_a_twin_namespace_not_ready_says_why(capsys: pytest.CaptureFixture[str]) -> None:
    remote = [
        {"namespace": "ml-team-ml-eu", "provider": "gpu-farm", "phase": "Ready"},
        {
            "namespace": "ml-team-ml-eu",
            "provider": "gpu-farm-b",
            "phase": "Pending",
            "reason": "ProviderUnreachable",
        },
        {"namespace": None, "provider": "gpu-farm-c", "phase": "Pending"},
    ]
    info = {**INFO, "offloadedNamespaces": [{**INFO["offloadedNamespaces"][0], "remoteNamespaces": remote}]}
    emit(info, "table", lambda console: _render(info, console))
    out = " ".join(capsys.readouterr().out.split())
    assert "gpu-farm: ml-team-ml-eu," in out
    assert "gpu-farm-b: ml-team-ml-eu (Pending: ProviderUnreachable)" in out
    assert "gpu-farm-c: - (Pending)" in out
