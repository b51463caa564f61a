"""A leader that loses its Lease steps down and campaigns again; it does not exit.

Against the provider's real API server: a manager leads, another holder takes its Lease (as a
replica would after this one was paused past the lease, or the API server was too slow to renew
it), the manager's controller stops working while it is a standby, and once the Lease is free
again the manager leads again and the work left in its queue is done.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest

from kube.clients import KubeClient
from kube.errors import NotFound
from kube.manager import Controller, Manager
from kube.objects import LEASES
from kube.queueing import KeyedQueue
from kube.reconciling import Requeue
from kube.settings import LeaderElectionSettings, ProbeSettings, QueueSettings

from .waiting import wait_for

pytestmark = pytest.mark.integration

NAMESPACE = "default"


class Recorder:
    def __init__(self) -> None:
        self.done: list[str] = []
        self.changed = asyncio.Event()

    async def reconcile(self, key: str) -> Requeue | None:
        self.done.append(key)
        self.changed.set()
        return None


@contextlib.asynccontextmanager
async def _running(manager: Manager, client: KubeClient, lease: str) -> AsyncIterator[asyncio.Task[None]]:
    """``manager.run()`` as a task; on the way out the manager is stopped and its Lease deleted."""
    running = asyncio.create_task(manager.run(handle_signals=False))
    try:
        yield running
    finally:
        manager.stop()
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(running, 10)
        with contextlib.suppress(NotFound):
            await client.delete(LEASES, lease, NAMESPACE)


def _micro(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


async def test_a_leader_that_loses_its_lease_steps_down_and_leads_again(provider_client: KubeClient) -> None:
    name = f"stepdown-{uuid.uuid4().hex[:6]}"
    settings = LeaderElectionSettings(namespace=NAMESPACE, name=name, lease_seconds=3, renew_seconds=0.5,
                                      identity="replica-a")  # fmt: skip
    queue: KeyedQueue[str] = KeyedQueue("stepdown", settings=QueueSettings(workers=1))
    recorder = Recorder()
    manager = Manager("stepdown", client=provider_client, probes_settings=ProbeSettings(port=-1),
                      leader_election=settings)  # fmt: skip
    manager.add_controller(Controller("record", queue, recorder))
    async with _running(manager, provider_client, name) as running:
        queue.add("first")
        await asyncio.wait_for(_until(recorder, "first"), 20)
        assert manager.elector is not None and manager.elector.leading

        # another holder takes the Lease
        lease = await provider_client.get(LEASES, name, NAMESPACE)
        lease["spec"].update(holderIdentity="replica-b", renewTime=_micro(datetime.now(UTC)),
                             leaseDurationSeconds=4)  # fmt: skip
        await provider_client.replace(LEASES, name, lease, NAMESPACE)
        for _ in range(100):
            if not manager.leading:
                break
            await asyncio.sleep(0.1)
        assert not manager.leading and not manager.elector.leading, "did not step down"
        assert not running.done(), "the manager exited instead of stepping down"

        # a standby does no work: the key waits in the queue
        queue.add("while-standby")
        await asyncio.sleep(1.5)
        assert "while-standby" not in recorder.done
        # replica-b stops renewing: after its lease runs out, this one leads again and works
        await asyncio.wait_for(_until(recorder, "while-standby"), 20)
        assert manager.leading and manager.elector.leading and not running.done()
        await wait_for(provider_client, LEASES, name,
                       lambda ls: ls["spec"].get("holderIdentity") == "replica-a",
                       namespace=NAMESPACE, timeout=10)  # fmt: skip
    assert running.done() and running.exception() is None


async def _until(recorder: Recorder, key: str) -> None:
    while key not in recorder.done:
        recorder.changed.clear()
        await recorder.changed.wait()


async def test_a_leader_cancelled_as_it_steps_down_stops_instead_of_campaigning_again(
    provider_client: KubeClient,
) -> None:
    # with `suppress(CancelledError)` around the wait for its leader tasks, the cancellation was
    # taken for theirs: run() went on to campaign again, and led again once the Lease was free
    name = f"stepdown-{uuid.uuid4().hex[:6]}"
    settings = LeaderElectionSettings(namespace=NAMESPACE, name=name, lease_seconds=2, renew_seconds=0.3,
                                      identity="replica-a")  # fmt: skip
    manager = Manager("stepdown", client=provider_client, probes_settings=ProbeSettings(port=-1),
                      leader_election=settings)  # fmt: skip
    leads, winding = asyncio.Event(), asyncio.Event()

    async def slow_to_stop() -> None:
        leads.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            winding.set()
            await asyncio.sleep(0.5)
            raise

    manager.add_task("slow", slow_to_stop)
    async with _running(manager, provider_client, name) as running:
        await asyncio.wait_for(leads.wait(), 20)
        lease = await provider_client.get(LEASES, name, NAMESPACE)
        lease["spec"].update(holderIdentity="replica-b", renewTime=_micro(datetime.now(UTC)),
                             leaseDurationSeconds=1)  # fmt: skip
        await provider_client.replace(LEASES, name, lease, NAMESPACE)
        await asyncio.wait_for(winding.wait(), 20)  # stepping down: its leader task winds down
        running.cancel()
        done, _ = await asyncio.wait({running}, timeout=10)
        assert running in done, "the manager went on (campaigning again) after it was cancelled"
        assert running.cancelled()
