"""Settings of the provider controller."""

from __future__ import annotations

from dataclasses import dataclass, field

from kube.api import SYSTEM_NAMESPACE
from kube.settings import ProbeSettings, QueueSettings, WatchSettings

__all__ = ["ProviderSettings"]


@dataclass(frozen=True, kw_only=True)
class ProviderSettings:
    """Everything the provider controller is configured with (read from argv/env in ``__main__``)."""

    field_manager: str = "gpuferry-provider"
    """Server-side apply field manager of everything the controller writes."""
    certificate_seconds: int = 30 * 24 * 3600
    """Requested lifetime of issued client certificates (the signer may cap it)."""
    resync_seconds: float = 300.0
    """Every Tenant and the GPU pool are reconciled again after this long, changes or not."""
    pool_pace: float = 4.0
    """After a pass over the GPU pool (every node, the pods' kept sums), the next one waits this
    many times as long as it took (at most 2 s): the passes take at most 1/(1 + pool_pace) of a
    core in a burst (:mod:`kube.pacing`). 0: no wait beyond the batching of the changes."""
    pool_pod_batch: float = 1.0
    """A pod's or a ResourceClaim's change asks for a pass over the GPU pool this many seconds
    later, with the changes meanwhile (a node's, a GPUSlice's or a waiting block's after 0.1 s).
    A pod moves no grant, only the free room the next decision sees; in a burst of pods on the
    provider, passes ran every 0.1 s plus their pace, a tenth of a core at 1250 nodes (issue 15)."""
    quota_sync_retry: float = 0.5
    """How soon to look again while the quota controller has not synced a lowered quota."""
    leader_elect: bool = True
    """Act only while holding the Lease (off: a single replica that never waits)."""
    lease_namespace: str = SYSTEM_NAMESPACE
    """Namespace of the leader-election Lease (created when missing)."""
    lease_name: str = "gpuferry-provider"
    """Only the controller holding this Lease reconciles."""
    lease_seconds: int = 15
    """A Lease not renewed for this long may be taken over."""
    renew_seconds: float = 5.0
    """How often the leader renews the Lease."""
    queue: QueueSettings = field(default_factory=lambda: QueueSettings(workers=4))
    """Work queues (workers per queue, backoff)."""
    watch: WatchSettings = field(default_factory=WatchSettings)
    """Watches (timeouts, backoff)."""
    probes: ProbeSettings = field(default_factory=lambda: ProbeSettings(port=-1))
    """Where ``/healthz``, ``/readyz`` and ``/metrics`` are served (in-process: nowhere)."""
