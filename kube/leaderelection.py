"""Leader election through a coordination.k8s.io Lease: one replica of a controller acts at a time.

A Lease makes sure only one replica of a component runs its reconcilers, however many were
started (a Deployment with replicas, a second ``python -m peering.provider``, a CLI agent); the
others keep their caches warm and take over when the leader's Lease expires. The protocol is
client-go's: take the Lease when it is free or expired (``renewTime + leaseDurationSeconds`` in
the past), with the resourceVersion as precondition so two candidates cannot both win; renew it
every ``renew_seconds``; stop leading (raise) if it could not be renewed for
``lease_seconds``; release it on a clean stop so a successor need not wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from .clients import KubeClient
from .errors import AlreadyExists, Conflict, KubeError, NotFound
from .metrics import gauge
from .objects import LEASES, NAMESPACES, RawObject, meta
from .times import parse_time

__all__ = ["LeaderElector", "LostLeadership"]

logger = logging.getLogger(__name__)

_LEADING = gauge("leader", "1 while this process holds its component's leader Lease.", ["lease"])


class LostLeadership(Exception):
    """The Lease could not be renewed in time (or another holder took it)."""


def _now() -> datetime:
    return datetime.now(UTC)


def _micro(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse(text: str | None) -> datetime | None:
    if not text:
        return None
    return parse_time(text)


def _default_identity() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


@dataclass
class LeaderElector:
    """Holds the Lease ``namespace/name`` for ``identity`` while :meth:`keep` runs."""

    client: KubeClient
    namespace: str
    name: str = "gpuferry-provider"
    identity: str = field(default_factory=_default_identity)
    lease_seconds: int = 15
    renew_seconds: float = 5.0
    leading: bool = field(default=False, init=False)
    """Whether this identity holds the Lease (as of the last attempt)."""

    def _set_leading(self, value: bool) -> None:
        self.leading = value
        _LEADING.labels(f"{self.namespace}/{self.name}").set(1 if value else 0)

    def _body(self, lease: RawObject | None, now: datetime) -> RawObject:
        spec = dict((lease or {}).get("spec") or {})
        if spec.get("holderIdentity") != self.identity:
            spec["acquireTime"] = _micro(now)
            spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + (1 if lease else 0)
        spec.update(
            holderIdentity=self.identity, leaseDurationSeconds=self.lease_seconds, renewTime=_micro(now)
        )
        md: RawObject = {"name": self.name, "namespace": self.namespace}
        if lease is not None:
            md["resourceVersion"] = meta(lease)["resourceVersion"]
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": md, "spec": spec}

    async def try_acquire(self) -> bool:
        """One attempt: True when this identity holds the Lease afterwards."""
        now = _now()
        try:
            lease: RawObject | None = await self.client.get(LEASES, self.name, self.namespace)
        except NotFound:
            lease = None
        if lease is not None:
            spec = lease.get("spec") or {}
            holder = spec.get("holderIdentity")
            renewed = _parse(spec.get("renewTime"))
            duration = timedelta(seconds=int(spec.get("leaseDurationSeconds") or self.lease_seconds))
            if holder and holder != self.identity and renewed is not None and renewed + duration > now:
                return False
        try:
            if lease is None:
                await self._create(now)
            else:
                await self.client.replace(LEASES, self.name, self._body(lease, now), self.namespace)
        except (AlreadyExists, Conflict):
            return False
        return True

    async def _create(self, now: datetime) -> None:
        try:
            await self.client.create(LEASES, self._body(None, now))
        except NotFound:  # no namespace yet (a local run before any peering): make it, once. In a
            # cluster the chart made it, and the component's account may not create namespaces
            with contextlib.suppress(AlreadyExists):
                await self.client.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace",
                                                      "metadata": {"name": self.namespace}})  # fmt: skip
            await self.client.create(LEASES, self._body(None, now))

    async def acquire(self) -> None:
        """Wait until this identity holds the Lease."""
        self._set_leading(False)  # a standby says so in /metrics, not by a missing sample
        announced = False
        while True:
            try:
                if await self.try_acquire():
                    logger.info("Lease %s/%s: leading as %s", self.namespace, self.name, self.identity)
                    self._set_leading(True)
                    return
            except KubeError as exc:
                logger.warning("Lease %s/%s: cannot acquire (%s); retrying", self.namespace, self.name, exc)
            if not announced:
                logger.info("Lease %s/%s: held by another controller; waiting", self.namespace, self.name)
                announced = True
            await asyncio.sleep(self.renew_seconds)

    async def keep(self) -> None:
        """Renew the Lease until cancelled; raises LostLeadership when it cannot."""
        last = _now()
        try:
            while True:
                await asyncio.sleep(self.renew_seconds)
                try:
                    if await self.try_acquire():
                        last = _now()
                        continue
                    raise LostLeadership(f"Lease {self.namespace}/{self.name} was taken by another holder")
                except KubeError as exc:
                    logger.warning("Lease %s/%s: renewal failed: %s", self.namespace, self.name, exc)
                if _now() - last > timedelta(seconds=self.lease_seconds):
                    raise LostLeadership(
                        f"Lease {self.namespace}/{self.name} not renewed for {self.lease_seconds}s"
                    )
        finally:
            self._set_leading(False)
            with contextlib.suppress(Exception):
                await asyncio.shield(self.release())

    async def release(self) -> None:
        """Give the Lease up (if still held) so that a successor takes over at once."""
        try:
            lease = await self.client.get(LEASES, self.name, self.namespace)
        except NotFound:
            return
        spec = lease.get("spec") or {}
        if spec.get("holderIdentity") != self.identity:
            return
        body = self._body(lease, _now())
        body["spec"]["holderIdentity"] = None
        body["spec"]["leaseDurationSeconds"] = 1
        with contextlib.suppress(Conflict, NotFound):
            await self.client.replace(LEASES, self.name, body, self.namespace)
        logger.info("Lease %s/%s: released by %s", self.namespace, self.name, self.identity)
