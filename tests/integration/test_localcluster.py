"""The cluster lifecycle of hack/localcluster itself, on throwaway clusters (profile "scratch").

Start is idempotent, a crashed component is reported with the tail of its log and restarted by
the next ``up``, and ``down`` leaves no process, no listening port and no state behind.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from hack.localcluster import COMPONENTS, LocalCluster, profile_clusters
from hack.localcluster.processes import port_in_use

pytestmark = pytest.mark.integration


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def _started(messages: list[str]) -> list[str]:
    """Component names from progress lines like 'consumer: etcd started in 0.4s'."""
    return [m.split(": ", 1)[1].split()[0] for m in messages if " started in " in m]


@pytest.fixture(scope="module")
def scratch() -> LocalCluster:
    cluster = profile_clusters("scratch")["consumer"]
    cluster.down()  # a previous run that died half-way must not decide this one
    return cluster


def test_up_is_idempotent_and_crashes_are_reported_then_down_leaves_nothing(scratch: LocalCluster) -> None:
    messages: list[str] = []
    scratch.up(progress=messages.append)
    assert _started(messages) == list(COMPONENTS)
    pids = {st.name: st.pid for st in scratch.status()}
    assert all(pids.values()), pids
    nodes = json.loads(scratch.kubectl("get", "nodes", "-o", "json"))["items"]
    assert sorted(n["metadata"]["name"] for n in nodes) == ["worker-0", "worker-1"]

    # a second start changes nothing: same processes, nothing started
    messages.clear()
    scratch.up(progress=messages.append)
    assert _started(messages) == [], messages
    assert {st.name: st.pid for st in scratch.status()} == pids

    # a component that dies is reported with the tail of its log ...
    os.kill(pids["kube-scheduler"], signal.SIGKILL)
    deadline = time.monotonic() + 10
    while _alive(pids["kube-scheduler"]) and time.monotonic() < deadline:
        time.sleep(0.05)
    crashed = scratch.crashed()
    assert [c.name for c in crashed] == ["kube-scheduler"]
    assert "kube-scheduler has exited" in str(crashed[0])
    assert "last lines of" in str(crashed[0]) and "kube-scheduler.log" in str(crashed[0])
    assert str(crashed[0]).count("\n") > 3, "the log tail is part of the report"
    # ... and the next start brings back only that one
    messages.clear()
    scratch.up(progress=messages.append)
    assert _started(messages) == ["kube-scheduler"]
    assert scratch.crashed() == []

    # down: no process, no listening port, no state
    pids = {st.name: st.pid for st in scratch.status()}
    stopped = scratch.down()
    assert sorted(stopped) == sorted(COMPONENTS)
    assert not [name for name, pid in pids.items() if pid and _alive(pid)]
    assert not [port for port in scratch.spec.ports.all().values() if port_in_use(port)]
    assert not scratch.spec.run_dir.exists()
    assert not scratch.spec.run_dir.parent.exists(), "the profile folder is removed with its last cluster"
    assert scratch.down() == [], "a second down is a no-op"
