"""Detached component processes: start with a pid file, probe health, report crashes, stop.

Processes outlive the Python process that started them (the demo starts clusters and exits), so
their identity is kept on disk: ``<run>/pids/<name>.pid`` holds the pid and the process start
time, which guards against a recycled pid being taken for ours.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path


class ComponentFailed(RuntimeError):
    """A component exited or never became healthy; the message carries the tail of its log."""

    def __init__(self, name: str, problem: str, log: Path) -> None:
        self.name = name
        self.log = log
        tail = log_tail(log)
        super().__init__(f"{name} {problem}; last lines of {log}:\n{tail}")


class PortBusy(RuntimeError):
    """A port a component needs is held by a process that is not ours."""


def log_tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return "  (no log file)"
    return "\n".join("  " + line for line in text.splitlines()[-lines:])


def _start_time(pid: int) -> str | None:
    """Field 22 of /proc/PID/stat: the process start time in clock ticks since boot."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # the command name (field 2) may contain spaces: split after its closing parenthesis
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] == "Z" and not _threads_left(pid):  # zombie: exited, not yet reaped
        return None
    return fields[19]


def _threads_left(pid: int) -> bool:
    """Whether threads of ``pid`` other than its main one still exist. A multi-threaded process
    that was killed shows its main thread as a zombie while the others are still exiting, and the
    last of them is the one that closes its files (its listening sockets): until then it has not
    really exited."""
    try:
        return any(task.name != str(pid) for task in Path(f"/proc/{pid}/task").iterdir())
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return False


def running(pid: int) -> bool:
    """Whether ``pid`` exists and has not finished exiting (every thread of it gone)."""
    return _start_time(pid) is not None


def port_in_use(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def port_held(port: int, *, grace: float = 3.0) -> bool:
    """Whether ``port`` stays in use for ``grace`` seconds. A multi-threaded process that was just
    killed looks dead (its main thread is a zombie) a moment before its last thread closes its
    listening socket: such a port is about to be free, not held."""
    deadline = time.monotonic() + grace
    while port_in_use(port):
        if time.monotonic() > deadline:
            return True
        time.sleep(0.1)
    return False


@dataclass(frozen=True)
class Component:
    """One long-running process of a cluster."""

    name: str
    argv: Sequence[str]
    healthy: Callable[[], bool]
    ports: Sequence[int] = ()
    env: dict[str, str] | None = None
    cwd: Path | None = None


class ProcessTable:
    """The processes of one cluster, as recorded under ``pid_dir``; logs under ``log_dir``."""

    def __init__(self, pid_dir: Path, log_dir: Path) -> None:
        self.pid_dir = pid_dir
        self.log_dir = log_dir

    def log_path(self, name: str) -> Path:
        return self.log_dir / f"{name}.log"

    def _pid_file(self, name: str) -> Path:
        return self.pid_dir / f"{name}.pid"

    def pid(self, name: str) -> int | None:
        """The pid of ``name`` if it is running and is the process we started; else None."""
        try:
            pid_s, started = self._pid_file(name).read_text().split()
        except (FileNotFoundError, ValueError):
            return None
        pid = int(pid_s)
        return pid if _start_time(pid) == started else None

    def recorded(self) -> list[str]:
        if not self.pid_dir.exists():
            return []
        return sorted(p.stem for p in self.pid_dir.glob("*.pid"))

    def start(self, component: Component, *, timeout: float = 60.0) -> bool:
        """Start ``component`` unless it already runs; wait until healthy. True if started now.

        Raises ComponentFailed (with the log tail) when the process exits or stays unhealthy,
        and PortBusy when one of its ports is taken by a process we did not start.
        """
        if self.pid(component.name) is not None:
            self.wait_healthy(component, timeout=timeout)
            return False
        for port in component.ports:
            if port_held(port):
                raise PortBusy(
                    f"{component.name}: port 127.0.0.1:{port} is in use by a process that this "
                    f"cluster did not start (another profile or program?)"
                )
        self.pid_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = self.log_path(component.name)
        with log.open("ab") as out:
            out.write(f"--- {time.strftime('%FT%T')} starting {' '.join(component.argv)}\n".encode())
            out.flush()
            proc = subprocess.Popen(
                list(component.argv),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, **(component.env or {})},
                cwd=component.cwd,
                start_new_session=True,  # survives our exit; not killed by the terminal's ^C
            )
        started = _start_time(proc.pid)
        if started is None:
            raise ComponentFailed(component.name, "exited immediately", log)
        self._pid_file(component.name).write_text(f"{proc.pid} {started}\n")
        self.wait_healthy(component, timeout=timeout, proc=proc)
        return True

    def wait_healthy(
        self, component: Component, *, timeout: float, proc: subprocess.Popen[bytes] | None = None
    ) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if proc is not None and proc.poll() is not None:
                self._pid_file(component.name).unlink(missing_ok=True)
                raise ComponentFailed(
                    component.name, f"exited with status {proc.returncode}", self.log_path(component.name)
                )
            if proc is None and self.pid(component.name) is None:
                raise ComponentFailed(component.name, "is not running", self.log_path(component.name))
            if component.healthy():
                return
            if time.monotonic() > deadline:
                raise ComponentFailed(
                    component.name, f"not healthy after {timeout:.0f}s", self.log_path(component.name)
                )
            time.sleep(0.25)

    def stop(self, name: str, *, timeout: float = 5.0) -> bool:
        """SIGTERM, then SIGKILL after ``timeout``; True if a process was stopped."""
        pid = self.pid(name)
        pid_file = self._pid_file(name)
        if pid is None:
            pid_file.unlink(missing_ok=True)
            return False
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while _start_time(pid) is not None and time.monotonic() < deadline:
            time.sleep(0.1)
        if _start_time(pid) is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
            while _start_time(pid) is not None:
                time.sleep(0.05)
        with contextlib.suppress(ChildProcessError):  # reap it if it is our child
            os.waitpid(pid, os.WNOHANG)
        pid_file.unlink(missing_ok=True)
        return True
