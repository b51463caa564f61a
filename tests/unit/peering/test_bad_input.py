"""Bad input to the gpuferry command, through its real entry point: one ``error:`` line, the right
exit code, no traceback and no usage block, and refused before anything is sent (the kubeconfigs
here lead nowhere: an error about them would mean the flag was not checked first)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

NOWHERE = ["--kubeconfig", "/nonexistent/consumer", "--remote-kubeconfig", "/nonexistent/provider"]


def gpuferry(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "peering.cli.main", *args], capture_output=True, text=True,
                          timeout=60, check=False)  # fmt: skip


def one_error_line(proc: subprocess.CompletedProcess[str]) -> str:
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: "), proc.stderr
    assert "Traceback" not in proc.stderr and "usage:" not in proc.stderr
    return lines[0]


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["peer", "--gpus", "abc"], "error: gpuferry peer: argument --gpus: invalid int value: 'abc'"),
        (["peer", "--gpus", "1.5"], "invalid int value: '1.5'"),
        (["offload", "namespace", "ml", "--pod-offloading-strategy", "Up"], "invalid choice: 'Up'"),
        (["peer", "--no-such-flag"], "unrecognized arguments: --no-such-flag"),
        (["launch"], "argument COMMAND: invalid choice: 'launch'"),
    ],
)
def test_argument_errors_are_one_line_with_where_to_look(args: list[str], said: str) -> None:
    proc = gpuferry(*args)
    assert proc.returncode == 2
    line = one_error_line(proc)
    assert said in line and "--help)" in line, line


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--gpus", "1", "--cpu", "-5"], "cpu: '-5' is negative"),
        (["--gpus", "1", "--memory", "lots"], "memory: 'lots' is not a Kubernetes quantity"),
        (["--gpus", "1", "--resource", "nvidia.com/gpu=0.5"], "nvidia.com/gpu comes in whole units"),
        (["--gpus", "1", "--resource", "a b=1"], "not a resource name"),
        (["--gpus", "1", "--selector", "a=("], "'(' is not a valid label value"),
        (["--gpus", "1", "--selector", "a b=c"], "'a b' is not a valid label key"),
        (["--gpus", "1", "--cluster-id", "a" * 64], "--cluster-id: invalid cluster ID"),
        (["--gpus", "1", "--remote-cluster-id", "GPU_farm"], "--remote-cluster-id: invalid cluster ID"),
        (["--gpus", "1", "--tolerate", "a:Never"], "the effect is NoSchedule, PreferNoSchedule or NoExecute"),
        ([], "say how many GPUs to ask for: --gpus N (N >= 1), slices of them with --resource"),
        (["--resource", "cpu=4"], "say how many GPUs to ask for"),
        (["--gpus", "0", "--resource", "nvidia.com/mig-1g.10gb=7"], "--gpus N: N must be 1 or more"),
        (["--resource", "nvidia.com/mig-1g.10gb=1.5"], "nvidia.com/mig-1g.10gb comes in whole units"),
        (["--resource", "nvidia.com/gpu.shared=-1"], "nvidia.com/gpu.shared: '-1' is negative"),
        (["--devices", "gpu.nvidia.com"], "--devices expects KEY=VALUE, got 'gpu.nvidia.com'"),
        (["--devices", "gpu.nvidia.com=two"], "'two' is not a Kubernetes quantity"),
        (["--devices", "gpu.nvidia.com=1.5"], "comes in whole units"),
        (["--devices", "no such class=1"], "is not a resource name"),
    ],
)
def test_peer_checks_every_flag_that_reaches_an_object_before_connecting(flags: list[str], said: str) -> None:
    proc = gpuferry("peer", *NOWHERE, *flags)
    assert proc.returncode == 1
    line = one_error_line(proc)
    assert said in line, line
    assert "kubeconfig" not in line  # refused before the kubeconfigs were even read


def test_a_system_namespace_is_not_offloaded_and_nothing_is_sent() -> None:
    proc = gpuferry("offload", "namespace", "kube-system", "--kubeconfig", "/nonexistent/consumer")
    assert proc.returncode == 1
    assert "kube-system is a system namespace" in one_error_line(proc)


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (b"\xef\x00\xff binary \x80\x81", "is not a kubeconfig: not UTF-8 text"),
        (b"a: [\n  b: {\n", "is not a kubeconfig: YAML error at line 3, column 1"),
        (b"- just\n- a list\n", "not a kubeconfig"),
    ],
)
def test_a_kubeconfig_that_is_not_one_is_one_line(tmp_path: Path, content: bytes, said: str) -> None:
    bad = tmp_path / "kubeconfig"
    bad.write_bytes(content)
    proc = gpuferry("info", "--kubeconfig", str(bad))
    assert proc.returncode == 1
    assert said in one_error_line(proc)


@pytest.mark.parametrize(
    ("value", "said"), [("-1", "must be 0 or more, not -1"), ("fast", "not a number: 'fast'")]
)
@pytest.mark.parametrize("flag", ["--pool-pace", "--pool-pod-batch"])
def test_the_provider_controller_refuses_a_pool_pace_that_is_not_a_rest(
    flag: str, value: str, said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from peering.provider.__main__ import main

    with pytest.raises(SystemExit) as exited:
        main([flag, value])
    assert exited.value.code == 2
    assert f"argument {flag}: {said}" in capsys.readouterr().err
