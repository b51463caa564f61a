"""The cluster lifecycle of hack/localcluster itself, on throwaway clusters (profile "scratch").

Start is idempotent, a crashed component is reported with the tail of its log and restarted by
the next ``up``, and ``down`` leaves no process, no listening port and no state behind: as root,
also none of what the real node made (its pods' processes, mounts, network namespaces, cgroups,
containerd's shim sockets and state, the kubelet's log links).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hack.localcluster import LocalCluster, profile_clusters
from hack.localcluster.network import host_nft_table, local_network
from hack.localcluster.nodeconfig import cgroup_root
from hack.localcluster.processes import port_in_use, running

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def _mounts() -> list[str]:
    return [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]


def _started(messages: list[str]) -> list[str]:
    """Component names from progress lines like 'consumer: etcd started in 0.4s'."""
    return [m.split(": ", 1)[1].split()[0] for m in messages if " started in " in m]


@pytest.fixture(scope="module")
def scratch() -> Iterator[LocalCluster]:
    cluster = profile_clusters("scratch")["consumer"]
    cluster.down()  # a previous run that died half-way must not decide this one
    yield cluster
    cluster.down()  # nor must a test here that failed half-way decide the next one


def _leftovers(cluster: LocalCluster, shim_sockets: list[Path]) -> list[str]:
    """Whatever of the cluster is still on the machine, by kind (``shim_sockets``: its shims')."""
    run = str(cluster.spec.run_dir)
    net = local_network(cluster.spec)
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if run in cmdline or net.node_netns in cmdline:
                found.append(f"process {proc.name}: {cmdline[:120]}")
    found += [f"mount {m}" for m in _mounts() if m.startswith(run)]
    found += [f"netns {n.name}" for n in Path("/run/netns").glob(f"gf-{cluster.spec.run_dir.parent.name}-*")]
    cgroup = cgroup_root(cluster.spec).lstrip("/")
    found += [f"cgroup {h / cgroup}" for h in Path("/sys/fs/cgroup").iterdir() if (h / cgroup).exists()]
    logs = Path("/var/log/containers")
    if logs.is_dir():
        found += [f"log link {link}" for link in logs.iterdir() if str(link.resolve()).startswith(run)]
    found += [f"shim socket {s}" for s in shim_sockets if s.exists()]
    if Path(f"/sys/class/net/{net.host_link}").exists():
        found.append(f"host interface {net.host_link}")
    if cluster.spec.real_node is not None:
        # its own route (another profile's clusters, up beside it, route the same range elsewhere)
        show = ["ip", "route", "show", cluster.spec.real_node.pod_cidr, "via", net.node_address]
        routes = subprocess.run(show, capture_output=True, text=True).stdout.strip()
        found += [f"host route {routes}"] if routes else []
    tables = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout
    found += [f"host nft {t}" for t in tables.splitlines() if t.endswith(host_nft_table(net))]
    return found


def test_up_is_idempotent_and_crashes_are_reported_then_down_leaves_nothing(scratch: LocalCluster) -> None:
    messages: list[str] = []
    scratch.up(progress=messages.append)
    assert _started(messages) == list(scratch.component_names())
    pids = {st.name: st.pid for st in scratch.status()}
    assert all(pids.values()), pids
    nodes = json.loads(scratch.kubectl("get", "nodes", "-o", "json"))["items"]
    real = ["real-0"] if scratch.has_real_node else []
    assert sorted(n["metadata"]["name"] for n in nodes) == [*real, "worker-0", "worker-1"]
    if scratch.has_real_node:
        # a pod with a real process, volumes (service-account token: a tmpfs mount) and a log
        scratch.kubectl("run", "busy", f"--image={scratch.images['testbox']}", "--image-pull-policy=Never",
                        "--overrides", json.dumps({"spec": {"nodeSelector": {"gpuferry.io/real-node": "true"},
                        "tolerations": [{"operator": "Exists"}]}}), "--", "sleep", "3600")  # fmt: skip
        scratch.kubectl("wait", "--for=condition=Ready", "pod/busy", "--timeout=60s")
        run = str(scratch.spec.run_dir)
        assert any(m.startswith(run) for m in _mounts()), "the pod's volumes are mounted"
    shim_sockets = scratch.node.shim_sockets() if scratch.node is not None else []
    assert not scratch.has_real_node or [s for s in shim_sockets if s.exists()], "the pods' shims listen"

    # a second start changes nothing: same processes, nothing started
    messages.clear()
    scratch.up(progress=messages.append)
    assert _started(messages) == [], messages
    assert {st.name: st.pid for st in scratch.status()} == pids

    # a component that dies is reported with the tail of its log ...
    scheduler = pids["kube-scheduler"]
    assert scheduler is not None
    os.kill(scheduler, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while running(scheduler) and time.monotonic() < deadline:
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
    assert sorted(stopped) == sorted(scratch.component_names())
    assert not [name for name, pid in pids.items() if pid and running(pid)]
    assert not [port for port in scratch.spec.ports.all().values() if port_in_use(port)]
    assert _leftovers(scratch, shim_sockets) == []
    assert not scratch.spec.run_dir.exists()
    assert not scratch.spec.run_dir.parent.exists(), "the profile folder is removed with its last cluster"
    assert scratch.down() == [], "a second down is a no-op"


def _up(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m hack.localcluster --profile scratch ARGS up``, as a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "hack.localcluster", "--profile", "scratch", *args, "up"],
        capture_output=True, text=True, timeout=300, cwd=REPO, env={**os.environ, **(env or {})},
    )  # fmt: skip


def test_a_port_in_use_is_one_clear_error_and_nothing_starts(scratch: LocalCluster) -> None:
    port = scratch.spec.ports.apiserver
    with socket.socket() as holder:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.bind(("127.0.0.1", port))
        holder.listen()
        result = _up("--cluster", "consumer")
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        f"error: consumer: kube-apiserver needs 127.0.0.1:{port}, which a process that this cluster did not "
        "start holds; stop that process, or run this profile's clusters elsewhere (--profile dev1 or dev2 "
        "use other ports)"
    ]
    assert [st.name for st in scratch.status() if st.running] == [], (
        "a half-started cluster is worse than none"
    )
    assert scratch.down() == []


def test_a_failed_image_build_is_one_clear_error(scratch: LocalCluster, tmp_path: Path) -> None:
    assert scratch.has_real_node, "images are built for the real node: run the tests as root (hack/setup.sh)"
    # a cache with every binary but where the images cannot be written (a full or broken disk)
    cache = tmp_path / "cache"
    cache.mkdir()
    real_cache = scratch.spec.run_dir.parent.parent.parent
    for built in real_cache.iterdir():
        if (built / ".complete").exists():
            (cache / built.name).symlink_to(built)
    (cache / "images").write_text("not a folder")
    result = _up(env={"GPUFERRY_CACHE": str(cache)})
    assert result.returncode == 1, result.stdout
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith(
        f"error: pause: cannot build the image: [Errno 17] File exists: '{cache}/images'"
    )
    assert not (cache / "run").exists(), "nothing was started"
