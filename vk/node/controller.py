"""The virtual node: registration, heartbeat, status, and what one provider node can take.

:class:`NodeController` has three named loops (:meth:`NodeController.tasks`, run by the virtual
kubelet's :class:`kube.manager.Manager`) and a :class:`~vk.node.provider.ProviderView` of what
the provider can place, from which the GPU labels and the largest free block per resource
follow. What keeps that view current depends on the identity held (:mod:`vk.remote`); run on
its own (:meth:`NodeController.run`), the controller watches the provider's Nodes and Pods.

``node-probe-provider``
    ``GET /readyz`` on the provider API server every ``provider_probe_seconds``;
``node-status``
    registers the Node (creates it, or adopts one of the same name left by an earlier run:
    labels, taint and status are brought to what they must be, labels of others are kept),
    then patches it when something it shows changed (at most once per
    :data:`MIN_UPDATE_INTERVAL`), and at least every ``status_seconds`` (a heartbeat of the
    conditions);
``node-lease``
    renews ``kube-node-lease/<node>`` every ``heartbeat_seconds``.

No loop dies on an API error: each is logged with the object and retried with backoff
(:class:`kube.backoff.Backoff`).

Provider outage: still Ready, tainted NoSchedule, the Lease kept alive
    When the provider's /readyz fails (:data:`PROBE_FAILURES` times in a row once it has
    answered), ``ProviderReachable`` turns False with the error, the Node gets the taint
    ``gpuferry.io/provider-unreachable:NoSchedule`` (new pods go elsewhere or wait), and Ready
    stays True with reason ``ProviderUnreachable`` and the same words in its message. An API
    server that does not answer says nothing of the provider's workloads: its kubelets keep
    running the twins. Ready=False would make the consumer's node lifecycle controller taint the
    node ``node.kubernetes.io/not-ready:NoExecute``, and its taint manager would evict every pod
    here once their toleration ran out (300 s by default): an outage of any length would cost
    running jobs (Liqo's issue #1194). The Lease keeps being renewed (the virtual kubelet itself
    is alive), so the node is never ``unreachable`` either. When the provider answers again the
    taint goes; the pod reflectors relist, a twin that finished meanwhile reports its final
    status, and a twin that vanished makes its pod Failed (``ProviderPodDeleted``); nothing is
    created twice (a pod that ran is never given a second twin).
    When the virtual kubelet itself stops, the Lease lapses and the node turns Unknown: a
    restarted one adopts the Node and makes it Ready again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Coroutine, Mapping
from decimal import Decimal
from typing import Any

import orjson

from kube.backoff import Backoff
from kube.clients import KubeClient
from kube.errors import Conflict, KubeError, NotFound
from kube.logs import object_logger
from kube.manager import Manager
from kube.metrics import gauge
from kube.objects import NODES, RawObject
from kube.quantities import ResourceList, parse_quantity, parse_resource_list
from kube.settings import ProbeSettings
from kube.tasks import wait_set
from kube.times import rfc3339

from ..forge.fit import FitResult
from ..forge.node import (
    GPU,
    GPU_COUNT_LABEL,
    KUBELET_VERSION,
    LARGEST_BLOCK_ANNOTATION,
    Condition,
    is_gfd_label,
    kubelet_version,
    node_conditions,
    node_metadata_patch,
    node_shape,
    node_status_patch,
    provider_gpu_labels,
    virtual_node,
)
from ..settings import VirtualKubeletSettings
from .lease import renew_lease
from .provider import ProviderView, identity_keys

__all__ = ["MIN_UPDATE_INTERVAL", "PROBE_FAILURES", "NodeController"]

logger = logging.getLogger(__name__)

DECLARED_FEATURES = ("ExtendWebSocketsToKubelet",)
"""Node features the virtual kubelet declares when it serves the kubelet API (sorted)."""


MIN_UPDATE_INTERVAL = 1.0
"""Seconds between two Node updates caused by provider changes (a burst makes one update)."""
PROBE_FAILURES = 2
"""Failed probes in a row that turn a Ready node NotReady (one blip does not)."""
REGISTRATION_WAIT = 10.0
"""Longest wait for the first probe and the provider listings before registering the Node."""
MAX_BACKOFF = 30.0

PROVIDER_REACHABLE = gauge("vk_node_provider_reachable", "1 when the provider API answers /readyz.", ["node"])
LARGEST_BLOCK = gauge(
    "vk_node_largest_block",
    "Largest amount of a resource placeable on one provider node.",
    ["node", "resource"],
)


def _now() -> str:
    return rfc3339()


def _retry_backoff() -> Backoff:
    """The backoff of a node loop's failed API calls: 0.5 s, doubled, at most 30 s."""
    return Backoff(base=0.5, cap=MAX_BACKOFF)


class NodeController:
    """The virtual Node of one provider grant (see the module docstring).

    For the pod reflector: :meth:`fit` (the :class:`vk.reflection.pods.FitOracle` protocol),
    :meth:`current_shape`, :meth:`per_node_free` and :attr:`largest_block`.
    """

    def __init__(
        self,
        *,
        consumer: KubeClient,
        provider: KubeClient,
        settings: VirtualKubeletSettings,
    ) -> None:
        self.consumer = consumer
        self.provider = provider
        self.settings = settings
        self.node_name = settings.effective_node_name
        self.log = object_logger(logger, "Node", self.node_name)
        self.view = ProviderView(
            provider=provider,
            selector=settings.provider_node_selector,
            settings=settings.watch,
            on_change=self._mark_dirty,
            ignored_selector_keys=identity_keys(settings.provider_cluster_id, self.node_name),
            tolerations=settings.provider_tolerations,
        )
        self.node: RawObject | None = None
        """The Node as last written or read (``None`` before registration)."""
        self.registered = asyncio.Event()
        self.reachable: bool | None = None
        """Whether the provider API server answers /readyz (``None``: not probed yet)."""
        self.probe_error = ""
        self.network: Condition | None = None
        """The NetworkReady condition (None until the PeerNetwork was looked at)."""
        self._probed = asyncio.Event()
        self._probe_failures = 0
        self._dirty = asyncio.Event()
        self._capacity_listeners: list[Callable[[], None]] = []
        self._back_listeners: list[Callable[[], None]] = []
        self._last_update = -MIN_UPDATE_INTERVAL
        self._last_heartbeat = 0.0
        self._version = KUBELET_VERSION
        self._boot_id = str(uuid.uuid4())
        self.retired = False
        """The VirtualNode is gone (:meth:`retire`): the Node and its Lease are written no more."""
        self._labels: tuple[int, dict[str, str]] | None = None
        """The provider GPU labels and the view's ``nodes_version`` they were read at: a burst
        of pods marks the Node dirty every second, and walking every provider node for labels
        that only nodes change was 3 % of the virtual kubelet's CPU at 3,000 pods (issue 15)."""
        parse_resource_list(settings.resources)  # a grant that is not quantities fails here, early
        self.resources: dict[str, str] = dict(settings.resources)
        """The grant the Node advertises: the settings', then each one :meth:`apply_grant` gives."""
        self.node_labels: dict[str, str] = dict(settings.node_labels)
        """The grant's labels, as :attr:`resources`."""

    # ---- for the pod reflector -----------------------------------------------------------------

    def fit(self, pod: Mapping[str, Any]) -> FitResult | None:
        """Whether ``pod`` fits on a single provider node now; ``None`` when not known (the
        provider was not listed yet, or is unreachable): do not gate on a guess."""
        if not self.view.synced or self.reachable is False:
            return None
        return self.view.fit(pod)

    def current_shape(self) -> dict[str, Decimal]:
        """Per granted resource, the largest block one pod can get now (capped by the grant)."""
        return parse_resource_list(node_shape(self.view.largest(), self.resources))

    def per_node_free(self) -> dict[str, ResourceList]:
        """Provider node → free resources, for the Ready, uncordoned, untainted picked nodes."""
        return self.view.per_node_free()

    @property
    def largest_block(self) -> Decimal:
        """GPUs one pod can get now (``nvidia.com/gpu`` of :meth:`current_shape`)."""
        return self.current_shape().get(GPU, Decimal(0))

    # ---- run -----------------------------------------------------------------------------------

    def tasks(self) -> dict[str, Callable[[], Coroutine[Any, Any, None]]]:
        """The node's loops, by name, for a manager to run (none ends on its own)."""
        return {
            "node-probe-provider": self._probe_loop,
            "node-status": self._status_loop,
            "node-lease": self._lease_loop,
        }

    async def run(self) -> None:
        """Run the loops on their own until cancelled, the view fed by watching the provider's
        Nodes and Pods (an identity that may list them)."""
        manager = Manager(f"node {self.node_name}", probes_settings=ProbeSettings(port=-1))
        for name, factory in {**self.tasks(), "watch-provider-nodes": self.view.watch_nodes,
                              "watch-provider-pods": self.view.watch_pods}.items():  # fmt: skip
            manager.add_task(name, factory)
        await manager.run(handle_signals=False)

    def on_capacity_change(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` whenever the provider's nodes or pods change what fits (the pod
        reflector re-examines gated pods then, instead of waiting for a timer)."""
        self._capacity_listeners.append(listener)

    def on_provider_back(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` when the provider answers again after it was found unreachable (the
        pod and copy queues retry then what failed meanwhile, instead of waiting out their
        backoff: up to a minute after an outage of a few)."""
        self._back_listeners.append(listener)

    def retire(self) -> None:
        """The node's VirtualNode is gone: write its Node and Lease no more, from now on.

        The peering's controller deletes the Node once the VirtualNode is gone, while this
        process still drains its queues on its way out: a status sync in that window found the
        Node missing and registered it again, which outlived the peering when the process was
        stopped before it removed the Node itself (CI, 2026-11-27: a leftover Node after
        ``gpuferry unpeer``)."""
        if not self.retired:
            self.log.info("retired: the Node and its Lease are written no more")
        self.retired = True

    def apply_grant(self, resources: Mapping[str, str], labels: Mapping[str, str]) -> None:
        """A new grant (its VirtualNode's ``resources`` and ``labels``): the Node advertises it at
        its next status write, and pods waiting for room are looked at again, without a restart
        (a restart relists every pod on both sides; a provider re-evaluates a grant as its own
        workloads come and go). A grant that is not quantities is refused, the last one kept."""
        resources, labels = dict(resources), dict(labels)
        if resources == self.resources and labels == self.node_labels:
            return
        try:
            parse_resource_list(resources)
        except ValueError as exc:
            self.log.error("new grant %s refused, %s kept: %s", resources, self.resources, exc)
            return
        self.log.info("grant %s (was %s)", resources, self.resources)
        self.resources, self.node_labels = resources, labels
        self._labels = None  # the GPU labels read are those of nodes with a granted resource
        self._mark_dirty()

    def set_network(self, condition: Condition) -> None:
        """The fabric's view of the tunnel changed: the Node says so at its next status write."""
        if condition != self.network:
            self.network = condition
            self._dirty.set()

    def _mark_dirty(self) -> None:
        self._dirty.set()
        self._tell(self._capacity_listeners, "capacity changed")

    def _tell(self, listeners: list[Callable[[], None]], what: str) -> None:
        """Call each of ``listeners``; one that raises is logged and the others are still called,
        and so is the rest of the caller's work (a probe's result recorded, the Node marked to
        be written): a listener's bug must not stop the loop that tells it."""
        for listener in listeners:
            try:
                listener()
            except Exception:
                self.log.exception("a listener of %r failed (%s); the others were told", what, listener)

    # ---- provider probe ------------------------------------------------------------------------

    async def probe(self) -> str | None:
        """One ``GET /readyz`` of the provider: ``None`` when it answered ok, else the error."""
        timeout = max(1.0, min(self.settings.provider_probe_seconds, 10.0))
        try:
            async with asyncio.timeout(timeout):
                async with self.provider.stream("GET", "/readyz", read_timeout=timeout) as resp:
                    await resp.read()
        except TimeoutError:
            return f"GET /readyz timed out after {timeout:g}s"
        except KubeError as exc:
            return f"GET /readyz: {exc}"
        return None

    def _record_probe(self, error: str | None) -> None:
        before = self.reachable
        if error is None:
            self._probe_failures = 0
            self.reachable, self.probe_error = True, ""
        else:
            self._probe_failures += 1
            if before is None or (before and self._probe_failures >= PROBE_FAILURES):
                self.reachable, self.probe_error = False, error
        if self.reachable != before:
            PROVIDER_REACHABLE.labels(self.node_name).set(1 if self.reachable else 0)
            if self.reachable:
                self.log.info("provider API server is reachable")
                if before is False:
                    self._tell(self._back_listeners, "provider back")
            else:
                self.log.warning("provider API server is unreachable: %s", self.probe_error)
            self._dirty.set()
        self._probed.set()

    async def _probe_loop(self) -> None:
        while True:
            self._record_probe(await self.probe())
            await asyncio.sleep(self.settings.provider_probe_seconds)

    # ---- the Node ------------------------------------------------------------------------------

    def desired(self, current: RawObject | None) -> RawObject:
        """The Node as it must be now, given the current one (``None``: not registered)."""
        settings = self.settings
        if self.view.nodes_synced.is_set():
            if self._labels is None or self._labels[0] != self.view.nodes_version:
                found = provider_gpu_labels(
                    self.view.nodes.values(), settings.provider_node_selector, self.resources
                )
                self._labels = (self.view.nodes_version, found)
            labels = dict(self._labels[1])
        else:  # not listed yet: keep what an earlier run found rather than flap
            old = ((current or {}).get("metadata") or {}).get("labels") or {}
            labels = {k: v for k, v in old.items() if is_gfd_label(k) or k == GPU_COUNT_LABEL}
        if self.view.synced:
            shape = node_shape(self.view.largest(), self.resources)
        else:
            old_shape = (((current or {}).get("metadata") or {}).get("annotations") or {}).get(
                LARGEST_BLOCK_ANNOTATION
            )
            shape = node_shape({}, self.resources)
            with contextlib.suppress(ValueError):
                loaded = orjson.loads(old_shape or "null")
                if isinstance(loaded, dict):
                    shape = {str(k): str(v) for k, v in loaded.items()}
        for resource, amount in shape.items():
            with contextlib.suppress(ValueError):
                LARGEST_BLOCK.labels(self.node_name, resource).set(float(parse_quantity(amount)))
        node = virtual_node(
            name=self.node_name,
            provider_id=settings.provider_cluster_id,
            resources=self.resources,
            node_address=settings.node_address,
            kubelet_port=settings.kubelet_port,
            provider_labels=labels,
            shape=shape,
            conditions=node_conditions(
                provider_reachable=self.reachable, provider_error=self.probe_error, network=self.network
            ),
            now=_now(),
            extra_labels=self.node_labels,
            previous_conditions=((current or {}).get("status") or {}).get("conditions") or (),
            version=self._version,
            boot_id=self._boot_id,
            provider_unreachable=self.reachable is False,
        )
        if settings.kubelet_api:
            # the API server then proxies WebSocket exec/attach/port-forward to our kubelet API
            # as they are, rather than translating them to SPDY/3.1 on the way
            node["status"]["declaredFeatures"] = list(DECLARED_FEATURES)
        return node

    async def sync(self, *, heartbeat: bool = False) -> RawObject | None:
        """Read the Node and bring it to :meth:`desired`; creates it when missing. Retired, it
        writes nothing (``None``)."""
        if self.retired:
            return None
        try:
            current: RawObject | None = await self.consumer.get(NODES, self.node_name)
        except NotFound:
            current = None
        if self.retired:  # retired while reading: a missing Node stays missing
            return None
        desired = self.desired(current)
        if current is None:
            current = await self.consumer.create(NODES, desired)  # with its status
            self.log.info("registered (capacity %s)", desired["status"]["capacity"])
            self._last_heartbeat = time.monotonic()
            heartbeat = False
        elif not self.registered.is_set():
            self.log.info("adopting the existing Node (uid %s)", current["metadata"].get("uid"))
        metadata_patch = node_metadata_patch(current, desired)
        if metadata_patch is not None:
            current = await self.consumer.patch(NODES, self.node_name, metadata_patch)
            self.log.debug("labels/annotations/taints updated: %s", metadata_patch)
        status_patch = node_status_patch(current, desired, heartbeat=heartbeat)
        want_features = desired["status"].get("declaredFeatures")
        if want_features and (current.get("status") or {}).get("declaredFeatures") != want_features:
            status_patch = status_patch or {"status": {}}
            status_patch["status"]["declaredFeatures"] = want_features
        if status_patch is not None:
            current = await self.consumer.patch(
                NODES, self.node_name, status_patch, patch_type="strategic", subresource="status"
            )
            self._last_heartbeat = time.monotonic()
        self.node = current
        self.registered.set()
        return current

    async def _consumer_version(self) -> None:
        try:
            version = await self.consumer.server_version()
        except KubeError as exc:
            self.log.warning("cannot read the consumer's version (%s); reporting %s", exc, self._version)
            return
        self._version = kubelet_version(str(version.get("gitVersion") or ""))

    async def _status_loop(self) -> None:
        # register with real readiness and labels when they come quickly, without them otherwise
        # (a provider found unreachable is not waited for: the Node says so at once)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(REGISTRATION_WAIT):
                await self._probed.wait()
                if self.reachable:
                    await self.view.nodes_synced.wait()
                    await self.view.pods_synced.wait()
        await self._consumer_version()
        backoff = _retry_backoff()
        while True:
            self._dirty.clear()
            heartbeat = time.monotonic() - self._last_heartbeat >= self.settings.status_seconds
            try:
                await self.sync(heartbeat=heartbeat)
                backoff.reset()
            except KubeError as exc:
                delay = backoff.next()
                if isinstance(exc, Conflict) and backoff.failures < 5:
                    delay = 0.2  # a write raced ours: read again and retry soon
                self.log.warning("update failed (%s); retrying in %.1fs", exc, delay)
                self._dirty.set()
                await asyncio.sleep(delay)
                continue
            self._last_update = time.monotonic()
            wait = self._last_heartbeat + self.settings.status_seconds - time.monotonic()
            await wait_set(self._dirty, max(wait, 0.0))
            # debounce: changes arriving together make one update
            await asyncio.sleep(max(0.0, self._last_update + MIN_UPDATE_INTERVAL - time.monotonic()))

    # ---- the Lease -----------------------------------------------------------------------------

    async def _lease_loop(self) -> None:
        await self.registered.wait()
        backoff = _retry_backoff()
        while True:
            node = self.node or {}
            uid = str((node.get("metadata") or {}).get("uid") or "")
            if self.retired:  # renews no more, and runs on: a root task that ends stops its manager
                await asyncio.sleep(self.settings.heartbeat_seconds)
                continue
            try:
                await renew_lease(self.consumer, self.node_name, uid)
                backoff.reset()
                delay = self.settings.heartbeat_seconds
            except KubeError as exc:
                delay = min(backoff.next(), self.settings.heartbeat_seconds)
                self.log.warning("lease renewal failed (%s); retrying in %.1fs", exc, delay)
            await asyncio.sleep(delay)
