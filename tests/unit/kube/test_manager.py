"""The manager's lifecycle without an API server: controllers drain on stop, a dead root task
stops the rest and is raised, the probes are served on a free port and say what is wrong."""

from __future__ import annotations

import asyncio
import os
import signal

import aiohttp
import pytest

from kube.manager import Controller, Manager
from kube.queueing import KeyedQueue
from kube.reconciling import Requeue
from kube.settings import ProbeSettings, QueueSettings


class Slow:
    """A reconciler that takes its time and records what it finished."""

    def __init__(self, seconds: float, expected: int) -> None:
        self.seconds = seconds
        self.expected = expected
        self.started: list[str] = []
        self.finished: list[str] = []
        self.all_started = asyncio.Event()

    async def reconcile(self, key: str) -> Requeue | None:
        self.started.append(key)
        if len(self.started) == self.expected:
            self.all_started.set()
        await asyncio.sleep(self.seconds)
        self.finished.append(key)
        return None


async def test_stop_drains_work_in_progress_before_returning() -> None:
    queue: KeyedQueue[str] = KeyedQueue("slow", settings=QueueSettings(workers=2, drain_timeout=5))
    reconciler = Slow(0.3, expected=2)
    manager = Manager("test", probes_settings=ProbeSettings(port=-1))
    manager.add_controller(Controller("slow", queue, reconciler))
    running = asyncio.create_task(manager.run(handle_signals=False))
    queue.add("a")
    queue.add("b")
    await asyncio.wait_for(reconciler.all_started.wait(), 5)
    manager.stop()
    await asyncio.wait_for(running, 5)
    assert sorted(reconciler.finished) == ["a", "b"], "work in progress finished, not cancelled"


async def test_a_dead_root_task_stops_the_others_and_is_raised() -> None:
    manager = Manager("test", probes_settings=ProbeSettings(port=-1))
    stopped = asyncio.Event()

    async def forever() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            stopped.set()

    async def dies() -> None:
        await asyncio.sleep(0.05)
        raise RuntimeError("the watch broke")

    manager.add_task("forever", forever)
    manager.add_task("dies", dies, leader_only=False)
    with pytest.raises(RuntimeError, match="the watch broke"):
        await asyncio.wait_for(manager.run(handle_signals=False), 5)
    assert stopped.is_set()


async def test_probes_are_served_while_running_and_stop_with_the_manager() -> None:
    manager = Manager("test", probes_settings=ProbeSettings(port=0))

    async def forever() -> None:
        await asyncio.Event().wait()

    manager.add_task("forever", forever)
    running = asyncio.create_task(manager.run(handle_signals=False))
    port = await asyncio.wait_for(manager.listening(), 5)
    async with aiohttp.ClientSession() as http:
        async with http.get(f"http://127.0.0.1:{port}/healthz?verbose") as resp:
            assert resp.status == 200 and "[+]forever ok" in await resp.text()
        async with http.get(f"http://127.0.0.1:{port}/readyz") as resp:
            assert resp.status == 200
        async with http.get(f"http://127.0.0.1:{port}/metrics") as resp:
            assert resp.status == 200 and "gpuferry_" in await resp.text()
        manager.stop()
        await asyncio.wait_for(running, 5)
        with pytest.raises(aiohttp.ClientConnectionError):
            await http.get(f"http://127.0.0.1:{port}/healthz")


async def test_sigterm_stops_this_process_but_not_through_a_fork() -> None:
    """pyroute2 forks helpers (no exec) and ends them with SIGTERM: that must not stop the parent.
    (With asyncio's add_signal_handler it did: the fork wrote the signal into the shared wakeup
    socket, and the parent's handler ran.)"""
    manager = Manager("test", probes_settings=ProbeSettings(port=-1))

    async def forever() -> None:
        await asyncio.Event().wait()

    manager.add_task("forever", forever)
    running = asyncio.create_task(manager.run(handle_signals=True))
    await asyncio.sleep(0.1)
    child = os.fork()
    if child == 0:  # the fork: SIGTERM must end it, as the default action would
        os.kill(os.getpid(), signal.SIGTERM)
        os._exit(3)  # still alive: the handler swallowed the signal
    _, status = await asyncio.to_thread(os.waitpid, child, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM, status
    await asyncio.sleep(0.2)
    assert not manager.stopping and not running.done(), "a signal to a fork stopped the parent"

    os.kill(os.getpid(), signal.SIGTERM)  # this process: a graceful stop
    await asyncio.wait_for(running, 5)
    assert manager.received == signal.SIGTERM


async def test_cancelled_while_stopping_it_still_stops_every_task_then_says_so() -> None:
    # with `suppress(CancelledError)` around each await, run() returned normally here
    manager = Manager("test", probes_settings=ProbeSettings(port=-1))
    winding, ended = asyncio.Event(), list[str]()

    async def slow_to_stop() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            winding.set()
            await asyncio.sleep(0.2)  # e.g. releasing a Lease
            ended.append("slow")
            raise

    async def common() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            ended.append("common")

    manager.add_task("slow", slow_to_stop)  # leader-only: stopped before the common ones
    manager.add_task("common", common, leader_only=False)
    running = asyncio.create_task(manager.run(handle_signals=False))
    await asyncio.sleep(0.05)
    manager.stop()
    await asyncio.wait_for(winding.wait(), 5)
    running.cancel()
    done, _ = await asyncio.wait({running}, timeout=5)
    assert running in done and running.cancelled(), "the cancellation was swallowed"
    assert ended == ["slow", "common"]


async def test_cancelled_while_draining_it_drains_no_longer_but_stops_every_task() -> None:
    # before, the drain's wait raised the cancellation straight out: the watches and the other
    # tasks were left running, orphans of a manager that had returned
    queue: KeyedQueue[str] = KeyedQueue("slow", settings=QueueSettings(workers=1, drain_timeout=30))
    reconciler = Slow(30, expected=1)
    manager = Manager("test", probes_settings=ProbeSettings(port=-1))
    manager.add_controller(Controller("slow", queue, reconciler))
    ended: list[str] = []

    async def common() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            ended.append("common")

    manager.add_task("common", common, leader_only=False)
    running = asyncio.create_task(manager.run(handle_signals=False))
    queue.add("a")
    await asyncio.wait_for(reconciler.all_started.wait(), 5)
    manager.stop()
    await asyncio.sleep(0.1)  # draining: the reconcile has 30 s to go
    running.cancel()
    done, _ = await asyncio.wait({running}, timeout=5)
    assert running in done and running.cancelled()
    assert reconciler.finished == [] and ended == ["common"]
