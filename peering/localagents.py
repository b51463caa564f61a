"""gpuferry's controllers as local background processes: the embedded mode of the CLI.

In a cluster the Helm chart runs the controllers; on a laptop or a CI machine (the local
clusters of ``hack/``, or any clusters reachable with admin kubeconfigs) ``gpuferry peer``
starts them here instead, one per cluster and role:

* ``provider``: ``python -m peering.provider`` — tenants, identities, grants, twin namespaces;
* ``consumer``: ``python -m peering.consumer`` — one virtual kubelet per VirtualNode;
* ``gateway``: ``python -m netfabric gateway`` — the network fabric's gateway of one cluster
  towards one peer (``<cluster>`` is then ``<cluster-id>-<peer-id>``), in the network namespace
  the cluster's declaration names (see :mod:`peering.network`).

Each is detached from the terminal (its own session), logs to a file, and is recorded in
``$GPUFERRY_CACHE/agents/<role>-<cluster>/`` (``pid``, ``cmdline``, ``log``), where
``<cluster>`` is the cluster's ID; a second ``ensure`` finds it alive and does nothing. An agent
whose process died is started again; ``stop`` ends it (SIGTERM, then SIGKILL). An agent whose
kubeconfig, or a file it names, changed since it started (the cluster was made again: new CA,
new credentials, same paths) is started again too: it would only fail TLS against the new
cluster, and ``peer`` waited for it until its timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from kube.kubeconfigs import ConfigError, load_kubeconfig
from kube.settings import cache_dir

__all__ = ["Agent", "agents_dir", "all_agents", "ensure_agent", "exited", "find_agent", "stop_agent"]

ROLES = {"provider": "peering.provider", "consumer": "peering.consumer", "gateway": "netfabric"}


def agents_dir() -> Path:
    base = cache_dir()
    return base / "agents"


@dataclass(frozen=True)
class Agent:
    role: str
    cluster_id: str
    kubeconfig: str
    args: tuple[str, ...] = ()
    """Role-specific arguments (a gateway's)."""
    kubeconfig_sha256: str = ""
    """:func:`_fingerprint` of its kubeconfig when the agent was started ("": not known)."""

    @property
    def directory(self) -> Path:
        return agents_dir() / f"{self.role}-{self.cluster_id}"

    @property
    def log(self) -> Path:
        return self.directory / "log"

    def command(self) -> list[str]:
        cmd = [sys.executable, "-m", ROLES[self.role], "--kubeconfig", self.kubeconfig, *self.args]
        if self.role == "provider":
            cmd.append("--install-crds")
        return cmd

    def pid(self) -> int | None:
        """The agent's pid when its process is alive and is this agent, else ``None``."""
        try:
            pid = int((self.directory / "pid").read_text())
            recorded = json.loads((self.directory / "cmdline").read_text())
            running = _cmdline(pid)
        except (OSError, ValueError):
            return None
        return pid if running == recorded else None


def _cmdline(pid: int, settle: float = 1.0) -> list[str]:
    """The arguments of a live process. Just after ``Popen`` returns, the kernel may not have put
    the new program's arguments in place yet (the parent resumes before ``execve`` is through):
    an empty command line of a process that is not a zombie is read again, briefly."""
    deadline = time.monotonic() + settle
    while True:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
        if raw or time.monotonic() > deadline:
            return [part.decode() for part in raw.split(b"\0")[:-1]]
        if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
            return []
        time.sleep(0.01)


def _load(directory: Path) -> Agent | None:
    try:
        data = json.loads((directory / "agent.json").read_text())
        return Agent(
            role=data["role"],
            cluster_id=data["cluster_id"],
            kubeconfig=data["kubeconfig"],
            args=tuple(data.get("args") or ()),
            kubeconfig_sha256=data.get("kubeconfig_sha256") or "",
        )
    except (OSError, ValueError, KeyError):
        return None


def all_agents() -> list[Agent]:
    root = agents_dir()
    if not root.is_dir():
        return []
    return [agent for d in sorted(root.iterdir()) if (agent := _load(d)) is not None]


def find_agent(role: str, cluster_id: str) -> Agent | None:
    """The recorded agent of this role and cluster (alive or not)."""
    return _load(agents_dir() / f"{role}-{cluster_id}")


def _fingerprint(kubeconfig: str) -> str:
    """A digest of what the agent reads from its kubeconfig once, at its start: the file, and the
    server, CA and client credentials it leads to (:func:`kube.kubeconfigs.load_kubeconfig`
    reads the files it names: ``hack/``'s clusters name theirs, made anew with the cluster while
    the kubeconfig stays the same). A token file is left out: the agent reads it again as it
    rotates. "" when the kubeconfig cannot be read."""
    try:
        raw = Path(kubeconfig).read_bytes()
    except OSError:
        return ""
    digest = hashlib.sha256(raw)
    with contextlib.suppress(ConfigError, OSError):
        conn = load_kubeconfig(kubeconfig)
        for part in (conn.server.encode(), conn.ca_pem, conn.client_cert_pem, conn.client_key_pem):
            digest.update(b"\0" + (part or b""))
    return digest.hexdigest()


def ensure_agent(
    role: str, cluster_id: str, kubeconfig: str | os.PathLike[str], *, args: tuple[str, ...] = ()
) -> tuple[Agent, bool]:
    """Start the agent unless it runs already; returns it and whether it was started now."""
    path = str(Path(kubeconfig).resolve())
    agent = Agent(
        role=role, cluster_id=cluster_id, kubeconfig=path, args=args, kubeconfig_sha256=_fingerprint(path)
    )
    existing = _load(agent.directory)
    if existing is not None and existing.pid() is not None:
        if (existing.kubeconfig, existing.args, existing.kubeconfig_sha256) == (
            agent.kubeconfig,
            agent.args,
            agent.kubeconfig_sha256,
        ):
            return existing, False
        # the same cluster through another kubeconfig, or its kubeconfig changed (the cluster was
        # made again): the agent reads it once, at its start, so a new one replaces it
        stop_agent(existing)
    agent.directory.mkdir(parents=True, exist_ok=True)
    command = agent.command()
    with agent.log.open("ab") as log:
        log.write(f"---- {time.strftime('%Y-%m-%d %H:%M:%S')} starting: {' '.join(command)}\n".encode())
        log.flush()
        proc = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    (agent.directory / "cmdline").write_text(json.dumps(command))
    (agent.directory / "pid").write_text(str(proc.pid))
    (agent.directory / "agent.json").write_text(
        json.dumps(
            {
                "role": role,
                "cluster_id": cluster_id,
                "kubeconfig": agent.kubeconfig,
                "args": list(args),
                "kubeconfig_sha256": agent.kubeconfig_sha256,
            }
        )
    )
    return agent, True


async def exited(agent: Agent) -> None:
    """Returns once the agent's process has exited (at once if it is not running). Event-driven:
    a pidfd becomes readable when its process ends."""
    pid = agent.pid()
    if pid is None:
        return
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    def readable() -> None:
        if not done.done():
            done.set_result(None)

    loop.add_reader(fd, readable)
    try:
        await done
    finally:
        loop.remove_reader(fd)
        os.close(fd)


def _signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, sig)


def stop_agent(agent: Agent, *, grace: float = 10.0) -> bool:
    """Stop the agent's process (if alive) and forget it; returns whether one was running."""
    pid = agent.pid()
    if pid is not None:
        # the agent leads its own process group (start_new_session): its children, the
        # virtual kubelets, get the signal too and cannot be left behind
        _signal_group(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and agent.pid() is not None:
            time.sleep(0.1)
        _signal_group(pid, signal.SIGKILL)
        while agent.pid() is not None:
            time.sleep(0.05)
    for name in ("pid", "cmdline", "agent.json"):
        (agent.directory / name).unlink(missing_ok=True)
    return pid is not None
