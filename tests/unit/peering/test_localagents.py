from __future__ import annotations

import time
from pathlib import Path

import pytest

from peering import localagents
from peering.localagents import all_agents, ensure_agent, stop_agent


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split()[2]
    except OSError:
        return False
    return state != "Z"


def test_an_agent_is_started_once_and_stopped_with_its_children(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUFERRY_CACHE", str(tmp_path))
    monkeypatch.setitem(localagents.ROLES, "sleeper", "tests.unit.peering.sleeper")
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("")
    agent, started = ensure_agent("sleeper", "c1", kubeconfig)
    assert started
    assert ensure_agent("sleeper", "c1", kubeconfig) == (agent, False), "a running agent is reused"
    pid = agent.pid()
    assert pid is not None and [a.cluster_id for a in all_agents()] == ["c1"]
    for _ in range(400):  # the agent prints its child's pid once it started it (slow on a busy machine)
        text = agent.log.read_text().splitlines()
        if text and text[-1].strip().isdigit():
            break
        time.sleep(0.05)
    child = int(agent.log.read_text().splitlines()[-1])
    assert _alive(child)

    assert stop_agent(agent, grace=2)
    assert agent.pid() is None and all_agents() == []
    for _ in range(400):
        if not _alive(child):
            break
        time.sleep(0.05)
    assert not _alive(child), "the agent's children are stopped with it"
    assert not stop_agent(agent), "stopping twice is a no-op"


def test_a_just_started_process_is_read_with_its_arguments() -> None:
    """Just after Popen returns, /proc/PID/cmdline can still be empty (the parent resumes before
    execve is through): an agent started a moment ago was taken for a dead one and started twice."""
    import subprocess

    from peering.localagents import _cmdline

    for _ in range(300):  # about 0.1 s; the bare read was empty a few times in 300 here
        proc = subprocess.Popen(["sleep", "5"], stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            assert _cmdline(proc.pid) == ["sleep", "5"]
        finally:
            proc.kill()
            proc.wait()
    exited = subprocess.Popen(["true"])
    time.sleep(0.2)  # a zombie (not waited for yet) has no arguments
    assert _cmdline(exited.pid) == []
    exited.wait()


def test_an_agent_whose_kubeconfig_changed_is_started_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cluster made again (make down, make demo): the same kubeconfig, naming the same CA and
    client certificate files, with new contents. The agent, which read the old ones, only fails
    TLS against the new cluster; it was reused all the same, and `gpuferry peer` waited for it
    until its timeout (151 s)."""
    monkeypatch.setenv("GPUFERRY_CACHE", str(tmp_path))
    monkeypatch.setitem(localagents.ROLES, "sleeper", "tests.unit.peering.sleeper")
    kubeconfig, ca = tmp_path / "kubeconfig", tmp_path / "pki" / "ca.crt"
    ca.parent.mkdir()
    ca.write_text("first CA\n")
    kubeconfig.write_text(
        "clusters:\n- name: c1\n  cluster:\n    server: https://127.0.0.1:1\n"
        "    certificate-authority: pki/ca.crt\n"
        "contexts:\n- name: c1\n  context: {cluster: c1}\ncurrent-context: c1\n"
    )
    agent, started = ensure_agent("sleeper", "c1", kubeconfig)
    assert started
    try:
        assert ensure_agent("sleeper", "c1", kubeconfig) == (agent, False), "nothing changed: reused"
        for change in (lambda: ca.write_text("second CA\n"), lambda: kubeconfig.write_text("clusters: []\n")):
            old = agent.pid()
            assert old is not None
            change()
            agent, started = ensure_agent("sleeper", "c1", kubeconfig)
            assert started, "the agent of the old cluster was reused"
            assert agent.pid() not in (None, old)
            for _ in range(200):
                if not _alive(old):
                    break
                time.sleep(0.05)
            assert not _alive(old), "the old agent is stopped"
        assert ensure_agent("sleeper", "c1", kubeconfig) == (agent, False)
    finally:
        for running in all_agents():
            stop_agent(running, grace=2)
