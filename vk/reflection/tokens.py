"""Service-account tokens of offloaded pods: the consumer's token, in the twin namespace, fresh.

For each consumer pod on the node that has a projected token volume, the reflector asks the
consumer's TokenRequest API for a token of the pod's service account, bound to the pod (so it
stops working when the pod goes), and writes it with the consumer's CA and namespace into the
pod's token Secret in the twin namespace (:mod:`vk.forge.tokens`). It renews the token when 80%
of its lifetime has passed, as the kubelet does, and deletes the Secret when the pod is gone,
or, for a pod deleted while no virtual kubelet ran, when its orphan twin is found (the
assembly's ``PodSync.orphan_found``). A pod without a token volume costs no request at all.
The pod reflector calls :meth:`ensure_for` before creating a twin, so the Secret exists first.
A namespace's CA (``kube-root-ca.crt``, published by the controller-manager) must be there: until
it is, no Secret is written and no twin created (:class:`~vk.reflection.pods.PrerequisiteNotReady`,
retried; the consumer pod says why, as a kubelet's ``FailedMount`` does).

A pod's token is asked for and written once: the queue's pass and the pod reflector's
:meth:`ensure_for` share one write in flight, and find a fresh one done (issue 15: both wrote,
two TokenRequests and two Secret writes per pod). The consumer's CA (``kube-root-ca.crt``) is
read once a minute per namespace, not once per pod.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from kube.clients import KubeClient
from kube.errors import AlreadyExists, Conflict, KubeError, NotFound
from kube.informers import Informer
from kube.logs import object_logger
from kube.metrics import counter
from kube.objects import CONFIGMAPS, SECRETS, SERVICEACCOUNTS, ObjectKey, RawObject
from kube.queueing import KeyedQueue
from kube.reconciling import Requeue
from kube.settings import QueueSettings
from kube.times import unix_seconds

from ..forge.accessories import ROOT_CA_CONFIGMAP
from ..forge.tokens import has_token_volume, token_request, token_secret, token_secret_name
from .pods import REASON_MOUNT, PrerequisiteNotReady

__all__ = ["TokenReflector"]

logger = logging.getLogger(__name__)

_ISSUED = counter("vk_tokens_issued", "Consumer service-account tokens issued for twins.")
RENEW_AT = 0.8
CA_SECONDS = 60.0
"""How long a namespace's ``kube-root-ca.crt`` is taken as read."""
CA_RETRY_SECONDS = 1.0
"""How soon a pod whose namespace has no ``kube-root-ca.crt`` yet is looked at again (the
controller-manager publishes it in every new namespace, within a second or so)."""



class TokenReflector:
    """Keys are consumer pod keys; see the module docstring."""

    kind = "tokens"

    def __init__(
        self,
        *,
        consumer: KubeClient,
        provider: KubeClient,
        pods: Informer,
        twin_namespace_for: Callable[[str], str | None],
        consumer_id: str,
        queue_settings: QueueSettings | None = None,
    ) -> None:
        self.consumer = consumer
        self.provider = provider
        self.pods = pods
        self.twin_namespace_for = twin_namespace_for
        self.consumer_id = consumer_id
        self.queue: KeyedQueue[ObjectKey] = KeyedQueue("sync_tokens_to_remote", settings=queue_settings)
        self._renew_at: dict[ObjectKey, float] = {}
        self._written: dict[ObjectKey, tuple[str, str]] = {}  # pod key -> (twin namespace, pod uid)
        self._writing: dict[ObjectKey, asyncio.Future[Requeue]] = {}
        self._cas: dict[str, tuple[float, str]] = {}  # namespace -> (read at, CA)
        self._ca_reads: dict[str, asyncio.Future[str]] = {}
        self._removed: set[ObjectKey] = set()
        """Pods with no Secret of ours left (terminating or finished ones whose Secret was
        deleted, those without a token volume): their deletion deletes none."""

    def pod_changed(self, key: ObjectKey) -> None:
        self.queue.add(key)

    def resync(self) -> None:
        """Look again at every pod whose token is not fresh. A fresh token's renewal is queued
        for its time already: looking at it now only re-arms that timer (issue 15: ten
        thousand tokens made ten thousand queue passes every resync)."""
        now = time.time()
        for key in {*self._written, *self._renew_at}:
            due = self._renew_at.get(key)
            if due is None or due <= now or key not in self._written:
                self.queue.add(key)

    async def _ca(self, namespace: str) -> str:
        read = self._cas.get(namespace)
        if read is not None and time.monotonic() - read[0] < CA_SECONDS:
            return read[1]
        reading = self._ca_reads.get(namespace)
        if reading is None:  # one read at a time per namespace: a burst of pods shares it
            reading = asyncio.ensure_future(self._read_ca(namespace))
            self._ca_reads[namespace] = reading
            reading.add_done_callback(lambda _: self._ca_reads.pop(namespace, None))
        return await asyncio.shield(reading)

    async def _read_ca(self, namespace: str) -> str:
        try:
            cm = await self.consumer.get(CONFIGMAPS, ROOT_CA_CONFIGMAP, namespace)
        except NotFound:
            return ""
        ca = str((cm.get("data") or {}).get("ca.crt") or "")
        self._cas[namespace] = (time.monotonic(), ca)
        return ca

    def _fresh(self, key: ObjectKey, twin_ns: str, uid: str) -> float | None:
        """Seconds until the written token of this pod is due for renewal; None if not fresh."""
        due = self._renew_at.get(key)
        if due is not None and time.time() < due and self._written.get(key) == (twin_ns, uid):
            return due - time.time()
        return None

    async def _write_once(self, pod: RawObject, twin_ns: str, log: object) -> Requeue:
        """One write per pod at a time: a second caller waits for the first's (and a fresh
        token is not written again)."""
        meta = pod["metadata"]
        key = ObjectKey(meta["namespace"], meta["name"])
        while (running := self._writing.get(key)) is not None:
            # its outcome, not its exceptions: only this caller's own cancellation raises here
            await asyncio.wait({running})
            if not running.cancelled() and not isinstance(running.exception(), KubeError):
                return running.result()  # its Requeue, or its TemporaryError (no CA yet)
            # that write failed (its twin namespace was not there yet) or its caller was
            # cancelled (a leader stepping down): this caller writes, or waits on the next one
        left = self._fresh(key, twin_ns, meta["uid"])
        if left is not None:
            return Requeue(max(1.0, left))
        future: asyncio.Future[Requeue] = asyncio.get_running_loop().create_future()
        self._writing[key] = future
        try:
            result = await self._write(pod, twin_ns, log)
        except asyncio.CancelledError:
            future.cancel()  # a waiter writes itself rather than take this caller's cancellation
            raise
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: a waiter, if any, gets it too
            raise
        else:
            future.set_result(result)
            return result
        finally:
            del self._writing[key]

    def clear_namespace(self, namespace: str) -> None:
        """Forget the CA read in ``namespace`` (no pod of the node left there)."""
        self._cas.pop(namespace, None)

    async def reconcile(self, key: ObjectKey) -> Requeue | None:
        log = object_logger(logger, "Pod", key)
        pod = self.pods.get(key)
        if pod is None:
            if key in self._removed:  # deleted when it began terminating (or finished)
                self._removed.discard(key)
                return None
            await self._remove(key, log)
            return None
        if not has_token_volume(pod):
            # a pod's volumes never change: a pod without a token volume never had a token
            # Secret, unless another pod of its name had one here (issue 15: each such pod cost
            # the provider a DELETE of a Secret that was never there)
            if key in self._written:
                await self._remove(key, log, final=False)
            else:
                self._removed.add(key)
            return None
        if pod["metadata"].get("deletionTimestamp"):
            await self._remove(key, log, final=False)
            return None
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            await self._remove(key, log, final=False)
            return None
        self._removed.discard(key)
        twin_ns = self.twin_namespace_for(key.namespace or "")
        if twin_ns is None:
            return None
        try:
            return await self._write_once(pod, twin_ns, log)
        except NotFound:  # its twin namespace is not there yet: the twin's creation makes it
            return Requeue(1.0)

    async def _write(self, pod: RawObject, twin_ns: str, log: object) -> Requeue:
        meta = pod["metadata"]
        key = ObjectKey(meta["namespace"], meta["name"])
        account = (pod.get("spec") or {}).get("serviceAccountName") or "default"
        ca = await self._ca(meta["namespace"])
        if not ca:
            # a namespace made a moment ago: its CA is not published yet. A token Secret without
            # it would leave the twin unable to trust the API server until the token's renewal,
            # 48 minutes on; a kubelet likewise waits to start a pod until it can build the volume
            raise PrerequisiteNotReady(
                REASON_MOUNT,
                f"the twin's service account token waits for the consumer's CA (ConfigMap "
                f"{ROOT_CA_CONFIGMAP} in {meta['namespace']}), not published yet",
                delay=CA_RETRY_SECONDS,
            )
        answer = await self.consumer.create(
            SERVICEACCOUNTS, token_request(pod), meta["namespace"], name=account, subresource="token"
        )
        status = answer.get("status") or {}
        expires = str(status.get("expirationTimestamp") or "")
        body = token_secret(
            pod,
            token=str(status.get("token") or ""),
            ca_pem=ca,
            namespace=twin_ns,
            consumer_id=self.consumer_id,
            expires=expires,
        )
        name = body["metadata"]["name"]
        try:
            await self.provider.create(SECRETS, body, twin_ns)
        except AlreadyExists:
            current = await self.provider.get(SECRETS, name, twin_ns)
            body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
            await self.provider.replace(SECRETS, name, body, twin_ns)
        _ISSUED.inc()
        issued, until = time.time(), unix_seconds(expires) if expires else time.time() + 3600
        self._renew_at[key] = issued + RENEW_AT * max(60.0, until - issued)
        self._written[key] = (twin_ns, meta["uid"])
        # debug, as the kubelet logs its token refreshes: two lines per pod were ~1 % of the
        # virtual kubelet's CPU in a burst (issue 15); the vk_tokens_issued counter counts them
        object_logger(logger, "Pod", key).debug(
            "token for %s written to %s/%s, valid until %s", account, twin_ns, name, expires
        )
        return Requeue(max(1.0, self._renew_at[key] - time.time()))

    async def _remove(self, key: ObjectKey, log: object, *, final: bool = True) -> None:
        """Delete the pod's token Secret. Not ``final``: the pod is still there (terminating,
        finished, or another pod of its name without a token volume), and is remembered so
        that its going deletes nothing again; a pod gone that this process never saw is looked
        for all the same (a restart)."""
        self._renew_at.pop(key, None)
        written = self._written.pop(key, None)
        twin_ns = written[0] if written else self.twin_namespace_for(key.namespace or "")
        if twin_ns is None or (key in self._removed and written is None):
            return
        try:
            await self.provider.delete(SECRETS, token_secret_name(key.name), twin_ns)
        except (NotFound, Conflict):
            pass
        else:
            object_logger(logger, "Pod", key).debug("token Secret in %s deleted", twin_ns)
        if not final:
            self._removed.add(key)

    async def ensure_for(self, pod: RawObject) -> None:
        """Write the token Secret ``pod`` needs now (before its twin is created), and have the
        queue renew it in time: a pod whose namespace was offloaded after the queue last looked
        at it is not looked at again for its status changes (:func:`vk.forge.tokens.matters_to_token`)."""
        if not has_token_volume(pod):
            return
        meta = pod["metadata"]
        twin_ns = self.twin_namespace_for(meta["namespace"])
        if twin_ns is not None:
            renew = await self._write_once(pod, twin_ns, logger)
            self.queue.add_after(ObjectKey(meta["namespace"], meta["name"]), renew.after)
