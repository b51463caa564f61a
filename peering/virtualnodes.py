"""The consumer's VirtualNode controller: one virtual kubelet process per VirtualNode.

For each ``VirtualNode`` it runs ``python -m vk --virtual-node NS/NAME`` (the virtual kubelet
reads everything else from the object and its kubeconfig Secret; this package never imports
``vk``: they meet through the object and a command line) and keeps it running:

* exit 75 — the VirtualNode's spec changed in what the kubelet reads only at start (a new grant
  it follows while running: :func:`kube.api.kubelet_spec_digest`): start it again at once;
* exit 0 — the VirtualNode was deleted and the kubelet removed its node: done;
* exit 2 — the object cannot be run as it is (missing Secret…): ``phase: Failed`` with the
  kubelet's own message, and no restart until the object changes;
* anything else — a crash: restart with exponential backoff (1 s … 60 s), ``phase: Pending``;
  a kubelet that ran 10 minutes before it ended starts its backoff over (as Kubernetes forgets a
  container's crash loop), so that a crash a week after the last one waits 1 s, not 60.

A process that cannot be started at all (no port on ``node_address`` to give its kubelet API, a
log directory it may not write, no interpreter) is retried with the same backoff: ``phase:
Pending``, reason ``KubeletStartFailed``, and the error in the message.

``status.phase`` says where it stands and ``status.conditions[KubeletRunning]`` why. When the
controller stops, its children are stopped (SIGTERM, then SIGKILL): their nodes stay and their
Leases expire, exactly as for a real kubelet that went away.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kube.api import VirtualKubeletExit
from kube.backoff import Backoff
from kube.clients import KubeClient
from kube.errors import KubeError, NotFound
from kube.logs import object_logger
from kube.metrics import counter, gauge
from kube.objects import VIRTUALNODES, ObjectKey, RawObject
from kube.ports import free_port
from kube.tasks import cancel_and_wait
from kube.times import rfc3339
from kube.watching import Listed, watch_objects

__all__ = ["VIRTUALNODES", "SupervisorSettings", "VirtualNodeSupervisor", "kubelet_command"]

logger = logging.getLogger(__name__)


EXIT_GONE = VirtualKubeletExit.GONE
EXIT_INVALID = VirtualKubeletExit.INVALID
EXIT_CHANGED = VirtualKubeletExit.CHANGED

_RUNNING = gauge("virtual_kubelets_running", "Virtual kubelet processes running.")
_STARTS = counter("virtual_kubelet_starts", "Virtual kubelet processes started, by why.", ["why"])


@dataclass(frozen=True, kw_only=True)
class SupervisorSettings:
    consumer_kubeconfig: Path | None
    """Kubeconfig handed to each virtual kubelet (None: in-cluster)."""
    namespace: str | None = None
    """Watch VirtualNodes in this namespace only (None: all namespaces)."""
    log_dir: Path | None = None
    """Each kubelet's output goes to ``<log_dir>/<namespace>.<name>.log`` (None: inherited)."""
    python: str = sys.executable
    extra_args: Sequence[str] = field(default_factory=tuple)
    """Extra flags for ``python -m vk`` (e.g. ``--metrics-port``), the same for every node."""
    kubelet_api: bool = True
    """Run each virtual kubelet with its kubelet API (logs, exec…) on a free loopback port."""
    kubelet_self_approve: bool = False
    """Let each virtual kubelet approve its own serving certificate (embedded mode only)."""
    node_address: str = "127.0.0.1"
    """Where the kubelet APIs listen and what their Nodes report as InternalIP: loopback for
    local processes, the pod's IP in a cluster (the API server dials it for logs and exec)."""
    stop_grace: float = 10.0
    max_backoff: float = 60.0
    backoff_reset_after: float = 600.0
    """A kubelet that ran this long (seconds) before it ended starts its backoff over."""


def kubelet_command(s: SupervisorSettings, key: ObjectKey, kubelet_port: int | None) -> list[str]:
    """``python -m vk`` for the VirtualNode ``key``, its kubelet API on ``kubelet_port`` (None:
    without one), and the agent's extra flags last. Pure."""
    cmd = [s.python, "-m", "vk", "--virtual-node", f"{key.namespace}/{key.name}"]
    if s.consumer_kubeconfig is not None:
        cmd += ["--consumer-kubeconfig", str(s.consumer_kubeconfig)]
    if kubelet_port is not None:
        cmd += ["--kubelet-api", "--node-address", s.node_address, "--kubelet-port", str(kubelet_port)]
        if s.kubelet_self_approve:
            cmd.append("--kubelet-csr-self-approve")
    return cmd + list(s.extra_args)


def _now() -> str:
    return rfc3339()


class _StartFailed(Exception):
    """The virtual kubelet's process could not be started; the message says why."""


class _Child:
    """The process loop of one VirtualNode."""

    def __init__(
        self, supervisor: VirtualNodeSupervisor, key: ObjectKey, uid: str | None, generation: int | None
    ) -> None:
        self.supervisor = supervisor
        self.key = key
        self.uid = uid
        self.generation = generation
        self.log = object_logger(logger, "VirtualNode", key)
        self.proc: asyncio.subprocess.Process | None = None
        self.task = asyncio.create_task(self._loop(), name=f"virtual-kubelet {key}")

    def _command(self) -> list[str]:
        s = self.supervisor.settings
        return kubelet_command(s, self.key, free_port(s.node_address) if s.kubelet_api else None)

    def _log_path(self) -> Path | None:
        log_dir = self.supervisor.settings.log_dir
        return None if log_dir is None else log_dir / f"{self.key.namespace}.{self.key.name}.log"

    async def _loop(self) -> None:
        restarts, why = Backoff(base=1.0, cap=self.supervisor.settings.max_backoff), "new"
        while True:
            started = asyncio.get_running_loop().time()
            try:
                code, tail = await self._run_once(why)
            except _StartFailed as exc:
                delay = restarts.next()
                self.log.error("virtual kubelet not started; retrying in %.0fs: %s", delay, exc)
                await self.supervisor.set_status(
                    self.key, "Pending", "False", "KubeletStartFailed", f"{exc}; retrying in {delay:.0f}s"
                )
                await asyncio.sleep(delay)
                continue
            if code == EXIT_GONE:
                self.log.info("virtual kubelet ended: its VirtualNode is gone")
                return
            if code == EXIT_CHANGED:
                why = "changed"
                restarts.reset()
                continue
            if code == EXIT_INVALID:
                self.log.error("virtual kubelet cannot run this VirtualNode: %s", tail)
                await self.supervisor.set_status(self.key, "Failed", "False", "InvalidVirtualNode", tail)
                return  # until the object changes (a new child is started then)
            if asyncio.get_running_loop().time() - started >= self.supervisor.settings.backoff_reset_after:
                restarts.reset()
            delay = restarts.next()
            self.log.warning("virtual kubelet exited %s; restarting in %.0fs: %s", code, delay, tail)
            await self.supervisor.set_status(
                self.key,
                "Pending",
                "False",
                "KubeletCrashed",
                f"exited {code}, restarting in {delay:.0f}s: {tail}",
            )
            await asyncio.sleep(delay)
            why = "crash"

    async def _run_once(self, why: str) -> tuple[int, str]:
        path = self._log_path()
        out: Any = None
        try:
            try:
                if path is not None:
                    path.parent.mkdir(parents=True, exist_ok=True)
                    out = path.open("ab")
                self.proc = await asyncio.create_subprocess_exec(
                    *self._command(), stdout=out, stderr=asyncio.subprocess.STDOUT if out else None,
                    env={**os.environ}, preexec_fn=_die_with_parent,
                )  # fmt: skip
            except (OSError, subprocess.SubprocessError) as exc:
                raise _StartFailed(f"cannot start the virtual kubelet: {exc}") from exc
            _STARTS.labels(why).inc()
            _RUNNING.inc()
            self.log.info("virtual kubelet started (pid %s, %s)", self.proc.pid, why)
            await self.supervisor.set_status(
                self.key, "Running", "True", "KubeletRunning", f"pid {self.proc.pid}"
            )
            try:
                code = await self.proc.wait()
            finally:
                _RUNNING.dec()
        finally:
            if out is not None:
                out.close()
        return code, _last_line(path)

    async def stop(self) -> None:
        """Stop the supervising task, then its process (SIGTERM, SIGKILL after the grace): the
        process too when this caller is cancelled meanwhile, which it is told once both are."""
        try:
            await cancel_and_wait([self.task], logger=self.log)
        finally:
            await self._end_process()

    async def _end_process(self) -> None:
        proc = self.proc
        if proc is None or proc.returncode is not None:
            return
        proc.terminate()
        try:
            async with asyncio.timeout(self.supervisor.settings.stop_grace):
                await proc.wait()
        except TimeoutError:
            proc.kill()
            await proc.wait()


_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM when the supervising process dies, however it dies
    (SIGKILL included). A standby that takes over then never finds a second kubelet for a node."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _last_line(path: Path | None) -> str:
    if path is None or not path.exists():
        return ""
    with path.open("rb") as f:
        f.seek(max(0, path.stat().st_size - 4096))
        lines = [line for line in f.read().decode(errors="replace").splitlines() if line.strip()]
    return lines[-1][:1000] if lines else ""


class VirtualNodeSupervisor:
    """Watches VirtualNodes and keeps one virtual kubelet process per object (see the module)."""

    def __init__(self, client: KubeClient, settings: SupervisorSettings) -> None:
        self.client = client
        self.settings = settings
        self.children: dict[ObjectKey, _Child] = {}

    async def run(self) -> None:
        try:
            async for item in watch_objects(self.client, VIRTUALNODES, namespace=self.settings.namespace):
                if isinstance(item, Listed):
                    present = set(item.keys)
                    for key in [k for k in self.children if k not in present]:
                        await self._forget(key)
                elif item.type == "DELETED":
                    # the kubelet sees the deletion itself, removes its node and exits 0; a
                    # child that is not running one (failed, backing off) is stopped here
                    child = self.children.get(item.key)
                    if child is not None and (child.proc is None or child.proc.returncode is not None):
                        await self._forget(item.key)
                else:
                    self._observe(item.object)
        finally:
            await asyncio.gather(*(child.stop() for child in self.children.values()))
            self.children.clear()

    def _observe(self, obj: RawObject) -> None:
        meta = obj["metadata"]
        key = ObjectKey(meta.get("namespace"), meta["name"])
        if meta.get("deletionTimestamp"):
            return
        child = self.children.get(key)
        if child is not None and not child.task.done():
            return  # running: a change it cannot follow makes the kubelet exit 75 and start again
        if child is not None and (child.uid, child.generation) == (meta.get("uid"), meta.get("generation")):
            return  # ended (failed or gone) and nothing changed since; a new object of the same name
            # (deleted, then made again: generation 1 again) is not the one that ended
        self.children[key] = _Child(self, key, meta.get("uid"), meta.get("generation"))

    async def _forget(self, key: ObjectKey) -> None:
        child = self.children.pop(key, None)
        if child is not None:
            await child.stop()

    async def set_status(self, key: ObjectKey, phase: str, status: str, reason: str, message: str) -> None:
        body = {
            "status": {
                "phase": phase,
                "conditions": [
                    {
                        "type": "KubeletRunning",
                        "status": status,
                        "reason": reason,
                        "message": message or reason,
                        "lastTransitionTime": _now(),
                    }
                ],
            }
        }
        try:
            await self.client.patch(VIRTUALNODES, key.name, body, key.namespace, subresource="status")
        except NotFound:
            pass
        except KubeError as exc:
            object_logger(logger, "VirtualNode", key).warning("status not written: %s", exc)
