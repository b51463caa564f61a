"""The controller runtime every gpuferry component runs on: informers, controllers, leader
election, probes and a clean stop. Modelled on controller-runtime's manager and kopf's operator.

A :class:`Manager` runs, as named root tasks:

* its **informers** (:class:`kube.informers.Informer`) from the start, leader or not, so that a
  standby replica has warm caches when it takes over;
* the ``/healthz``, ``/readyz`` and ``/metrics`` server (:mod:`kube.probes`): ready once every
  informer has listed; unhealthy when a root task has died;
* with leader election, the wait for the Lease (:mod:`kube.leaderelection`), then its renewal;
* once leading (at once without leader election): each **controller**'s workers, after the
  informers it reads have synced, and the other leader-only tasks.

A leader that loses its Lease (not renewed in time — the process was paused, the API server
was slow — or taken by another holder) **steps down**: its controllers' workers and leader-only
tasks are cancelled at once (a key being worked on goes back to its queue), the informers keep
running, and it campaigns again as a standby. It does not exit: nothing may be running to
restart it, and a warm standby is what a replica should be.

It stops when :meth:`Manager.stop` is called (SIGTERM and SIGINT call it) or when a root task
ends. Stopping is graceful and in this order: the controllers' queues are shut down and the
work in progress drains (up to ``drain_timeout``); the other tasks are cancelled; the Lease is
released at once (a successor need not wait for it to expire); the watches and the probe
server stop. A root task that failed (a lost Lease included) makes :meth:`Manager.run` raise,
so that the process exits non-zero and its supervisor restarts it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any

from .clients import KubeClient
from .informers import Informer
from .leaderelection import LeaderElector, LostLeadership
from .metrics import track_gc_time
from .probes import Probes, serve_probes
from .queueing import KeyedQueue
from .reconciling import Reconciler, run_workers
from .settings import LeaderElectionSettings, ProbeSettings
from .tasks import cancel_and_wait

__all__ = ["Controller", "Manager"]

logger = logging.getLogger(__name__)

TaskFactory = Callable[[], Coroutine[Any, Any, Any]]


@dataclass
class Controller:
    """A work queue, the reconciler of its keys, and the informers it reads (its workers start
    once those have listed: an empty cache would read as "everything is gone")."""

    name: str
    queue: KeyedQueue[Any]
    reconciler: Reconciler[Any]
    kind: str = "object"
    """What a key names, for log lines (``Tenant ns/name: …``)."""
    informers: Sequence[Informer] = ()
    logger: logging.Logger | None = None


@dataclass
class _Task:
    name: str
    factory: TaskFactory
    leader_only: bool


@dataclass
class Manager:
    """See the module docstring. Add informers, controllers and tasks, then ``await run()``."""

    name: str
    client: KubeClient | None = None
    """For the leader-election Lease (required with ``leader_election``)."""
    probes_settings: ProbeSettings = field(default_factory=ProbeSettings)
    leader_election: LeaderElectionSettings | None = None
    drain_timeout: float = 30.0
    probes: Probes = field(default_factory=Probes)
    informers: list[Informer] = field(default_factory=list)
    controllers: list[Controller] = field(default_factory=list)
    elector: LeaderElector | None = None
    probe_port: int | None = None
    """The port the probes are served on, once listening."""
    received: signal.Signals | None = None
    """The signal that stopped the manager, if one did."""
    leading: bool = False
    """Whether the controllers and leader-only tasks run now (from taking the Lease to a stop
    or a step-down; at once without leader election)."""
    _tasks: list[_Task] = field(default_factory=list)
    _stopping: asyncio.Event = field(default_factory=asyncio.Event)
    _listening: asyncio.Event = field(default_factory=asyncio.Event)

    # ---- assembling ----------------------------------------------------------------------------

    def add_informer(self, informer: Informer) -> Informer:
        self.informers.append(informer)
        return informer

    def add_controller(self, controller: Controller) -> Controller:
        self.controllers.append(controller)
        for informer in controller.informers:
            if informer not in self.informers:
                self.informers.append(informer)
        return controller

    def add_task(self, name: str, factory: TaskFactory, *, leader_only: bool = True) -> None:
        """A long-lived task, started anew from ``factory`` each time the manager runs it."""
        self._tasks.append(_Task(name, factory, leader_only))

    # ---- stopping ------------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask for a graceful stop (what SIGTERM does)."""
        if not self._stopping.is_set():
            logger.info("%s: stopping", self.name)
        self._stopping.set()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    async def listening(self) -> int:
        """Wait until the probes are served; their port."""
        await self._listening.wait()
        assert self.probe_port is not None
        return self.probe_port

    # ---- running -------------------------------------------------------------------------------

    def _on_listening(self, port: int) -> None:
        self.probe_port = port
        self._listening.set()

    async def _controller(self, controller: Controller) -> None:
        await asyncio.gather(*(i.synced.wait() for i in controller.informers))
        await run_workers(controller.queue, controller.reconciler, logger=controller.logger or logger,
                          kind=controller.kind)  # fmt: skip

    async def run(self, *, handle_signals: bool = True) -> None:
        """Run until stopped or until a root task ends; see the module docstring."""
        previous = self._install_signal_handlers() if handle_signals else {}
        roots: dict[str, asyncio.Task[Any]] = {}
        leading: dict[str, asyncio.Task[Any]] = {}
        try:
            self._start_common(roots)
            while await self._lead(roots):
                self._start_leading(leading)
                if not await self._wait_for_the_end({**roots, **leading}, leading.get("renew-lease")):
                    break
                await self._step_down(leading)
        finally:
            failure = await self._shut_down(roots, leading)
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        if failure is not None:
            raise failure

    def _install_signal_handlers(self) -> dict[int, Any]:
        """SIGTERM and SIGINT ask for a graceful stop, in this process only.

        Not ``loop.add_signal_handler``: it routes signals through a wakeup socket that a forked
        child shares (pyroute2 forks helpers into network namespaces and ends them with SIGTERM),
        so a signal sent to such a child reached this process's handler as if it were for this
        process. Here, a fork that receives the signal dies of it, as it would by default.
        """
        loop = asyncio.get_running_loop()
        owner = os.getpid()

        def on_signal(signum: int, _frame: object) -> None:
            if os.getpid() != owner:
                signal.signal(signum, signal.SIG_DFL)
                os.kill(os.getpid(), signum)
                return
            self.received = signal.Signals(signum)
            loop.call_soon_threadsafe(self.stop)

        return {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}

    def _start_common(self, roots: dict[str, asyncio.Task[Any]]) -> None:
        if self.probes_settings.port >= 0:
            track_gc_time()  # served on /metrics with the rest
            serving = serve_probes(
                self.probes,
                host=self.probes_settings.bind_address,
                port=self.probes_settings.port,
                on_listening=self._on_listening,
            )
            roots["probes"] = asyncio.create_task(serving, name=f"{self.name}/probes")
        for informer in self.informers:
            name = f"watch-{informer.name}"
            roots[name] = asyncio.create_task(informer.run(), name=f"{self.name}/{name}")
            self.probes.add_readiness(f"informer-{informer.name}", informer.synced.is_set)
        for task in self._tasks:
            if not task.leader_only:
                roots[task.name] = asyncio.create_task(task.factory(), name=f"{self.name}/{task.name}")
        for name, running in roots.items():
            self.probes.add_liveness(name, lambda t=running: not t.done())  # type: ignore[misc]

    async def _lead(self, roots: dict[str, asyncio.Task[Any]]) -> bool:
        """Wait for the Lease (if elected); False when stopped or a root task ended first."""
        settings = self.leader_election
        if settings is None or not settings.enabled:
            return True
        if self.client is None:
            raise ValueError(f"{self.name}: leader election needs a client")
        identity = {"identity": settings.identity} if settings.identity else {}
        if self.elector is None:  # one identity for the process, across step-downs
            self.elector = LeaderElector(
                self.client,
                settings.namespace,
                settings.name,
                lease_seconds=settings.lease_seconds,
                renew_seconds=settings.renew_seconds,
                **identity,
            )
        acquire = asyncio.create_task(self.elector.acquire(), name=f"{self.name}/acquire-lease")
        stopped = asyncio.create_task(self._stopping.wait())
        done, _ = await asyncio.wait([acquire, stopped, *roots.values()], return_when=asyncio.FIRST_COMPLETED)
        stopped.cancel()
        if acquire not in done:
            await cancel_and_wait([acquire], logger=logger)
            return False
        acquire.result()
        return True

    def _start_leading(self, leading: dict[str, asyncio.Task[Any]]) -> None:
        self.leading = True
        if self.elector is not None:
            leading["renew-lease"] = asyncio.create_task(self.elector.keep(), name=f"{self.name}/renew-lease")
        for controller in self.controllers:
            name = f"reconcile-{controller.name}"
            leading[name] = asyncio.create_task(self._controller(controller), name=f"{self.name}/{name}")
        for task in self._tasks:
            if task.leader_only:
                leading[task.name] = asyncio.create_task(task.factory(), name=f"{self.name}/{task.name}")
        for name, running in leading.items():
            self.probes.add_liveness(name, lambda t=running: not t.done())  # type: ignore[misc]

    async def _wait_for_the_end(
        self, tasks: dict[str, asyncio.Task[Any]], renewal: asyncio.Task[Any] | None = None
    ) -> bool:
        """Until stopped or a task ends; True when the only news is a lost Lease (``renewal``
        failed with :class:`LostLeadership`): then the manager steps down rather than stop."""
        stopped = asyncio.create_task(self._stopping.wait())
        try:
            done, _ = await asyncio.wait([stopped, *tasks.values()], return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
        if (
            renewal is not None
            and done == {renewal}
            and not self._stopping.is_set()
            and not renewal.cancelled()
            and isinstance(renewal.exception(), LostLeadership)
        ):
            logger.warning("%s: %s; stepping down, campaigning again", self.name, renewal.exception())
            return True
        for name, task in tasks.items():
            if task in done and not self._stopping.is_set():
                if task.cancelled() or task.exception() is None:
                    logger.warning("%s: root task %s ended; stopping", self.name, name)
                else:
                    logger.error(
                        "%s: root task %s failed; stopping", self.name, name, exc_info=task.exception()
                    )
                break
        return False

    async def _step_down(self, leading: dict[str, asyncio.Task[Any]]) -> None:
        """Stop leading at once, without draining (another replica may lead already): cancel the
        workers and leader-only tasks; their queues keep their keys for the next term."""
        self.leading = False
        await cancel_and_wait(leading.values(), logger=logger)
        for name in leading:
            self.probes.liveness.pop(name, None)
        leading.clear()

    async def _shut_down(
        self, roots: dict[str, asyncio.Task[Any]], leading: dict[str, asyncio.Task[Any]]
    ) -> BaseException | None:
        """Drain, cancel, release, stop; the first failure of a root task (None: a clean stop).

        Cancelled meanwhile (a second SIGTERM's worth: whoever runs the manager wants it gone),
        it drains no longer but still stops every task, the Lease's renewer after the other leader
        tasks, and then raises CancelledError."""
        self._stopping.set()
        self.leading = False
        failure = _first_failure({**roots, **leading})
        interrupted = False
        # 1. the queues: no new keys, work in progress finishes (queue.run honours drain_timeout)
        for controller in self.controllers:
            controller.queue.shutdown()
        workers = [t for n, t in leading.items() if n.startswith("reconcile-")]
        if workers:
            try:
                await asyncio.wait(workers, timeout=self.drain_timeout + 5)
            except asyncio.CancelledError:
                interrupted = True
        # 2. the other leader tasks, the workers left; the Lease last of them (keep() releases it
        # when cancelled); 3. the watches, common tasks and probes
        others = [t for n, t in leading.items() if n != "renew-lease"]
        renewal = [leading["renew-lease"]] if "renew-lease" in leading else []
        for tasks in (others, renewal, list(roots.values())):
            try:
                await cancel_and_wait(tasks, logger=logger)
            except asyncio.CancelledError:
                interrupted = True
        if interrupted:
            raise asyncio.CancelledError
        return failure


def _first_failure(tasks: dict[str, asyncio.Task[Any]]) -> BaseException | None:
    for task in tasks.values():
        if task.done() and not task.cancelled() and task.exception() is not None:
            return task.exception()
    return None
