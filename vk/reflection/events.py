"""Provider Events about twins, reported on the consumer pods (deduplicated).

One watch per twin namespace that holds twins of pods on this node (started as pods appear,
held by :meth:`EventReflector.run`).
Each provider Event about a twin pod becomes one consumer Event about the consumer pod, named
after the provider Event's UID, so that a repeat (the provider bumping ``count``) updates the
same consumer Event instead of adding one, and a relist or a restart adds nothing twice.
The source says where it came from: ``gpuferry/provider <component>`` (e.g. the provider's
scheduler: ``Successfully assigned … to gpu-h100-2``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from kube.clients import KubeClient
from kube.errors import AlreadyExists, KubeError, NotFound, namespace_terminating
from kube.informers import Informer
from kube.metrics import counter
from kube.objects import EVENTS, ObjectKey, RawObject
from kube.settings import WatchSettings
from kube.watching import Listed, watch_objects

from .namespaced import NamespaceTasks

__all__ = ["EventReflector", "consumer_event"]

logger = logging.getLogger(__name__)

_REFLECTED = counter("vk_events_reflected", "Provider Events about twins written on the consumer.", ["op"])


def consumer_event(event: RawObject, pod: RawObject, node: str) -> dict[str, Any]:
    """The consumer Event for the provider ``event`` about the twin of ``pod``. Pure."""
    meta = pod["metadata"]
    source = event.get("source") or {}
    component = source.get("component") or event.get("reportingComponent") or "provider"
    uid = (event.get("metadata") or {}).get("uid", "")
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{meta['name']}.gpuferry-{uid[:13]}", "namespace": meta["namespace"]},
        "involvedObject": {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": meta["name"],
            "namespace": meta["namespace"],
            "uid": meta["uid"],
        },
        "type": event.get("type") or "Normal",
        "reason": event.get("reason") or "",
        "message": event.get("message") or "",
        "source": {"component": f"gpuferry/provider {component}", "host": node},
        "reportingComponent": "gpuferry.io/virtual-kubelet",
        "reportingInstance": node,
        "count": int(event.get("count") or 1),
    }
    first = (
        event.get("firstTimestamp")
        or event.get("eventTime")
        or (event.get("metadata") or {}).get("creationTimestamp")
    )
    last = event.get("lastTimestamp") or (event.get("series") or {}).get("lastObservedTime") or first
    if first:
        body["firstTimestamp"] = str(first)[:19] + "Z" if "." in str(first) else first
    if last:
        body["lastTimestamp"] = str(last)[:19] + "Z" if "." in str(last) else last
    return body


class EventReflector:
    """Provider Events about twins, onto their consumer pods (see the module docstring)."""

    def __init__(
        self,
        *,
        consumer: KubeClient,
        provider: KubeClient,
        pods: Informer,
        twin_namespace_for: Callable[[str], str | None],
        node: str,
        settings: WatchSettings | None = None,
        field_selector: str = "involvedObject.kind=Pod",
    ) -> None:
        self.consumer = consumer
        self.provider = provider
        self.pods = pods
        self.twin_namespace_for = twin_namespace_for
        self.node = node
        self.settings = settings or WatchSettings()
        self.field_selector = field_selector
        """Which Events of a twin namespace are copied (:func:`vk.forge.events.event_selector`)."""
        self._origin: dict[str, str] = {}  # twin namespace -> consumer namespace
        self._watches = NamespaceTasks("watch-provider-events")
        self._written: dict[str, dict[str, int]] = {}  # twin namespace -> provider event uid -> count

    def pod_changed(self, key: ObjectKey) -> None:
        namespace = key.namespace or ""
        twin = self.twin_namespace_for(namespace)
        if twin is None or twin in self._watches:
            return
        self._origin[twin] = namespace
        self._watches.start(twin, lambda: self._watch(twin))

    def release(self, namespace: str) -> None:
        """No pod of the node is left in the consumer ``namespace``: stop watching its twin
        namespace's Events, and forget what was written from there."""
        for twin in [t for t, origin in self._origin.items() if origin == namespace]:
            self._watches.cancel(twin)
            del self._origin[twin]
            self._written.pop(twin, None)

    async def run(self) -> None:
        """Hold the per-namespace watches until cancelled."""
        await self._watches.run()

    async def _watch(self, twin_ns: str) -> None:
        async for item in watch_objects(
            self.provider,
            EVENTS,
            namespace=twin_ns,
            field_selector=self.field_selector,
            settings=self.settings,
            retry_permanent=True,
        ):
            if isinstance(item, Listed):
                continue
            if item.type == "DELETED":  # expired on the provider: it comes no more
                self._written.get(twin_ns, {}).pop((item.object.get("metadata") or {}).get("uid", ""), None)
                continue
            await self._reflect(twin_ns, item.object)

    async def _reflect(self, twin_ns: str, event: RawObject) -> None:
        involved = event.get("involvedObject") or {}
        origin = self._origin.get(twin_ns)
        pod = self.pods.get(ObjectKey(origin, involved.get("name", ""))) if origin else None
        if pod is None:
            return  # not (or no longer) one of ours
        uid = (event.get("metadata") or {}).get("uid", "")
        count = int(event.get("count") or 1)
        written = self._written.setdefault(twin_ns, {})
        if written.get(uid, 0) >= count:
            return
        body = consumer_event(event, pod, self.node)
        name, namespace = body["metadata"]["name"], body["metadata"]["namespace"]
        try:
            await self.consumer.create(EVENTS, body, namespace)
            _REFLECTED.labels("create").inc()
        except AlreadyExists:  # seen before (a relist, a restart): bring it up to date
            patch = {k: body[k] for k in ("count", "message", "lastTimestamp") if k in body}
            try:
                await self.consumer.patch(EVENTS, name, patch, namespace)
                _REFLECTED.labels("update").inc()
            except NotFound:
                return
        except KubeError as exc:
            # a consumer namespace being deleted takes no new Events: nothing is lost, as its pods
            # and their Events go with it (a bench burst's teardown logged 30 warnings)
            log = logger.debug if namespace_terminating(exc) else logger.warning
            log("provider event %s not reflected on %s/%s: %s", uid, namespace, pod["metadata"]["name"], exc)
            return
        written[uid] = count
