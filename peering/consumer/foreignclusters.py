"""The consumer's ForeignCluster controller: a peering with a provider, driven by its ForeignCluster.

For a ForeignCluster with role Provider and a peering token (``spec.peeringTokenSecretRef``), keyed
by its name (the provider's cluster ID), each pass goes as far as it can and records where it
stands in the conditions, so that ``kubectl get fc`` tells:

1. **Authenticated**: a key and CSR are made here (the private key never leaves this cluster);
   the CSR goes to the provider in the consumer's Tenant, proven with the peering token; once
   the provider issued the certificate, the identity (certificate, and a kubeconfig for
   ``spec.apiServerURL`` and ``spec.caBundle``) is kept in ``gpuferry-identity-<provider>``.
   A certificate that expires within a week is renewed with a new key.
2. **SliceGranted**: with that identity, the GPUSlice ``<consumer-id>`` in the tenant namespace
   asks for ``spec.slice``; the provider's decision is mirrored in ``status.slice``.
3. **VirtualNodeReady**: the VirtualNode ``gpuferry-system/<provider-id>`` stands for the grant
   (resources, largest block, GPU labels) and follows it when the provider re-decides; the agent
   runs its virtual kubelet; True once its Node is Ready.
4. **NetworkReady** (``spec.networkingEnabled``): this cluster's network (its declaration) and its
   gateway's public key go into the Tenant (``spec.network``); what the provider publishes back
   (``status.network``) becomes the PeerNetwork ``gpuferry-system/<provider-id>`` that this
   cluster's gateway reconciles; True once that gateway has a handshake.

The provider's changes reach the controller through a watch of the Tenant and the GPUSlice with
the consumer's credentials (:class:`peering.consumer.providers.ProviderWatches`).

Deleting the ForeignCluster undoes it (finalizer ``core.gpuferry.io/peering``): the pods on the
virtual node (their twins go first), the VirtualNode and its Node, the PeerNetwork (its gateway
removes the tunnel and its key), the GPUSlice and the Tenant's network on the provider, and the
identity Secret. Revoking the tenant on the provider is the provider's admin's to do.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from kube.api import NETWORK_READY, SYSTEM_NAMESPACE, tenant_namespace, virtual_node_name
from kube.clients import KubeClient
from kube.errors import Forbidden, KubeError, NotFound, admission_refusal
from kube.informers import Informer
from kube.logs import object_logger
from kube.objects import (
    FOREIGNCLUSTERS,
    NODES,
    PEERNETWORKS,
    PODS,
    SECRETS,
    VIRTUALNODES,
    ObjectKey,
    RawObject,
    meta,
)
from kube.patching import patch_changes
from kube.reconciling import Requeue

from ..clusterid import read_cluster_id
from ..conditions import CHANGE_REFUSED, SLICE_REFUSED, find_condition, set_condition
from ..resources import GPUSLICES, TENANTS, identity_secret_name
from .builders import (
    FIELD_MANAGER,
    desired_slice_spec,
    gpuslice,
    same_slice_spec,
    slice_decided,
    virtual_node,
    virtual_node_spec_from_grant,
)
from .enrolment import Enrolment
from .fcnetwork import network_step
from .passes import Pass, Waiting, differs
from .providers import ProviderClients, ProviderWatches

__all__ = ["FINALIZER", "ForeignClusterReconciler"]

logger = logging.getLogger(__name__)

#: How often a slice change the provider's API server refused is tried again.
REFUSED_RETRY_SECONDS = 10.0

FINALIZER = "core.gpuferry.io/peering"
CONDITIONS = ("Authenticated", "SliceGranted", "VirtualNodeReady", NETWORK_READY)


class ForeignClusterReconciler:
    """Keyed by the ForeignCluster's name (the provider's ID); see the module docstring."""

    def __init__(
        self,
        consumer: KubeClient,
        *,
        foreign_clusters: Informer,
        virtual_nodes: Informer,
        nodes: Informer,
        peer_networks: Informer,
        clients: ProviderClients,
        watches: ProviderWatches,
        resync_seconds: float = 60.0,
    ) -> None:
        self.consumer = consumer
        self.foreign_clusters = foreign_clusters
        self.virtual_nodes = virtual_nodes
        self.nodes = nodes
        self.peer_networks = peer_networks
        self.clients = clients
        self.enrolment = Enrolment(consumer, clients)
        self.watches = watches
        self.resync_seconds = resync_seconds

    async def reconcile(self, key: ObjectKey) -> Requeue | None:
        provider_id = key.name
        try:
            fc = await self.consumer.get(FOREIGNCLUSTERS, provider_id)
        except NotFound:
            await self._forget(provider_id)
            return None
        spec = fc.get("spec") or {}
        if spec.get("role") != "Provider" or not spec.get("peeringTokenSecretRef"):
            return None  # a consumer of ours (the provider controller keeps it), or peered by other means
        if meta(fc).get("deletionTimestamp"):
            return await self._delete(fc)
        if FINALIZER not in (meta(fc).get("finalizers") or []):
            finalizers = [*(meta(fc).get("finalizers") or []), FINALIZER]
            fc = await self.consumer.patch(
                FOREIGNCLUSTERS,
                provider_id,
                {"metadata": {"finalizers": finalizers, "resourceVersion": meta(fc)["resourceVersion"]}},
            )
        result = Pass()
        retry: float | None = None
        try:
            await self._steps(fc, result)
        except Waiting as wait:
            result.set(wait.condition, False, wait.reason, wait.message)
            retry = wait.retry
        await self._write_status(fc, result)
        if result.slice_in_force:
            # the provider's operator may approve it any moment (an annotation we cannot watch)
            retry = min(retry or self.resync_seconds, REFUSED_RETRY_SECONDS)
        return Requeue(retry if retry is not None else self.resync_seconds)

    # ---- the steps -----------------------------------------------------------------------------

    async def _steps(self, fc: RawObject, result: Pass) -> None:
        provider_id = meta(fc)["name"]
        spec = fc["spec"]
        consumer_id = await read_cluster_id(self.consumer)
        if consumer_id is None:
            raise Waiting(
                "Authenticated",
                "NoClusterID",
                "this cluster has no gpuferry cluster ID yet "
                f"(the ConfigMap {SYSTEM_NAMESPACE}/gpuferry-cluster-id)",
                retry=5,
            )
        result.status["tenantNamespace"] = tenant_namespace(consumer_id)
        tenant = await self.enrolment.authenticate(fc, consumer_id, result)
        self.watches.ensure(
            provider_id,
            tenant,
            tenant_namespace(consumer_id),
            [(TENANTS, consumer_id), (GPUSLICES, consumer_id)],
        )
        decided = await self._slice(tenant, consumer_id, spec, result)
        await self._virtual_node(provider_id, consumer_id, spec, decided, result)
        await network_step(
            self.consumer,
            self.peer_networks,
            tenant,
            provider_id,
            consumer_id,
            bool(spec.get("networkingEnabled", True)),
            result,
        )

    async def _slice(
        self, tenant: KubeClient, consumer_id: str, spec: dict[str, Any], result: Pass
    ) -> RawObject | None:
        request = spec.get("slice")
        if not request:
            result.set("SliceGranted", False, "NoSliceRequested", "spec.slice asks for nothing")
            return None
        wanted = desired_slice_spec(consumer_id, request)
        ns = tenant_namespace(consumer_id)
        try:
            current: RawObject | None = await tenant.get(GPUSLICES, consumer_id, ns)
        except NotFound:
            current = None
        refused: dict[str, Any] | None = None
        try:
            if current is None:
                current = await tenant.create(GPUSLICES, gpuslice(consumer_id, wanted))
            elif not same_slice_spec(current.get("spec") or {}, wanted):
                body = {**gpuslice(consumer_id, wanted)}
                body["metadata"]["resourceVersion"] = meta(current)["resourceVersion"]
                current = await tenant.replace(GPUSLICES, consumer_id, body, ns)
        except Forbidden as e:
            # the provider's API server refuses what a consumer may not change by itself
            # (the nodes of a slice; more than the tenant's limit): the slice in force stays
            why = admission_refusal(e)
            if current is None:
                result.set("SliceGranted", False, SLICE_REFUSED, why)
                return None
            refused = {"reason": SLICE_REFUSED, "message": why}
            result.slice_in_force = True
        status = current.get("status") or {}
        if refused is None:
            refused = status.get("refusedChange")
            if refused and refused.get("generation") != meta(current).get("generation"):
                refused = None  # about an older spec
        if not slice_decided(current):
            raise Waiting("SliceGranted", "Pending", "the provider has not decided the slice yet", retry=2)
        result.status["slice"] = {
            k: v
            for k, v in {
                "phase": status.get("phase"),
                "granted": status.get("granted"),
                "largestBlock": (status.get("shape") or {}).get("largest"),
                "reason": status.get("reason"),
                "message": status.get("message"),
                "refusedChange": refused and {k: refused.get(k) for k in ("reason", "message")},
            }.items()
            if v is not None
        }
        if refused:
            granted = ", ".join(f"{k}={v}" for k, v in (status.get("granted") or {}).items()) or "nothing"
            result.set(
                "SliceGranted", False, CHANGE_REFUSED,
                f"the provider refused the change ({refused.get('reason')}: {refused.get('message')}); "
                f"the grant in force stays: {granted}",
            )  # fmt: skip
        elif status.get("phase") == "Denied":
            result.set(
                "SliceGranted", False, str(status.get("reason") or "Denied"), str(status.get("message") or "")
            )
        else:
            granted = ", ".join(f"{k}={v}" for k, v in (status.get("granted") or {}).items())
            result.set("SliceGranted", True, str(status.get("phase")), f"granted {granted}")
        return current

    async def _virtual_node(
        self,
        provider_id: str,
        consumer_id: str,
        spec: dict[str, Any],
        decided: RawObject | None,
        result: Pass,
    ) -> None:
        existing = self.virtual_nodes.get(ObjectKey(SYSTEM_NAMESPACE, provider_id))
        advertised = (existing or {}).get("spec")
        grant = virtual_node_spec_from_grant(decided, advertised) if decided is not None else None
        if grant is None and existing is None:
            raise Waiting("VirtualNodeReady", "NoGrant", "nothing is granted: no virtual node")
        if grant is not None:
            selector = dict(((spec.get("slice") or {}).get("nodeSelector")) or {})
            tolerations = (spec.get("slice") or {}).get("tolerations") or ()
            refused = ((decided or {}).get("status") or {}).get("refusedChange") or {}
            kept = result.slice_in_force or refused.get("generation") == meta(decided or {}).get("generation")
            if existing is not None and kept:
                # the change was refused: the twins go where the grant in force is, as before
                selector = dict(advertised.get("providerNodeSelector") or {}) if advertised else {}
                tolerations = (advertised or {}).get("providerTolerations") or ()
            body = virtual_node(
                provider_id=provider_id,
                consumer_id=consumer_id,
                grant=grant,
                selector=selector,
                secret=identity_secret_name(provider_id),
                tolerations=tolerations,
            )
            if existing is None or differs(existing.get("spec") or {}, body["spec"]):
                await self.consumer.patch(
                    VIRTUALNODES,
                    provider_id,
                    body,
                    SYSTEM_NAMESPACE,
                    patch_type="apply",
                    field_manager=FIELD_MANAGER,
                    force=True,
                )
        name = virtual_node_name(provider_id)
        result.status["virtualNode"] = name
        node = self.nodes.get(ObjectKey(None, name))
        ready = find_condition(((node or {}).get("status") or {}).get("conditions"), "Ready")
        if not ready or ready.get("status") != "True":
            raise Waiting(
                "VirtualNodeReady", "NodeNotReady", f"the virtual node {name} is not Ready yet", retry=None
            )
        result.set("VirtualNodeReady", True, "NodeReady", f"the virtual node {name} is Ready")

    # ---- status ----------------------------------------------------------------------------------

    async def _write_status(self, fc: RawObject, result: Pass) -> None:
        """This pass's findings: what an earlier pass learned of an older spec (a denied slice
        before the request changed) must not linger beside the new conditions."""
        old = fc.get("status") or {}
        status: dict[str, Any] = {**result.status, "observedGeneration": meta(fc).get("generation", 0)}
        conditions = old.get("conditions")
        for name in CONDITIONS:
            ok, reason, message = result.conditions.get(
                name, (False, "Pending", "an earlier step is not done")
            )
            conditions = set_condition(
                conditions, name, ok, reason, message, generation=meta(fc).get("generation")
            )
        status["conditions"] = conditions
        with contextlib.suppress(NotFound):  # a merge patch from old to new: stale fields become null
            await patch_changes(
                self.consumer, FOREIGNCLUSTERS, fc, {**fc, "status": status}, subresource="status"
            )

    # ---- undoing ---------------------------------------------------------------------------------

    async def _delete(self, fc: RawObject) -> Requeue | None:
        provider_id = meta(fc)["name"]
        log = object_logger(logger, "ForeignCluster", ObjectKey(None, provider_id))
        node = virtual_node_name(provider_id)
        pods = (await self.consumer.list(PODS, field_selector=f"spec.nodeName={node}"))["items"]
        for pod in pods:  # the virtual kubelet deletes their twins first
            with contextlib.suppress(NotFound):
                await self.consumer.delete(PODS, pod["metadata"]["name"], pod["metadata"]["namespace"])
        if pods:
            log.info("waiting for the %d pods on %s to go", len(pods), node)
            return Requeue(1.0)
        with contextlib.suppress(NotFound):
            await self.consumer.delete(VIRTUALNODES, provider_id, SYSTEM_NAMESPACE)
        if self.virtual_nodes.get(ObjectKey(SYSTEM_NAMESPACE, provider_id)) is not None:
            return Requeue(1.0)  # its kubelet removes the Node and goes
        with contextlib.suppress(NotFound):
            await self.consumer.delete(NODES, node)  # no kubelet left to do it
        with contextlib.suppress(NotFound):
            await self.consumer.delete(PEERNETWORKS, provider_id, SYSTEM_NAMESPACE)
        consumer_id = await read_cluster_id(self.consumer)
        identity = await self.enrolment.identity_secret(provider_id)
        data = (identity or {}).get("data") or {}
        if consumer_id is not None and data.get("kubeconfig"):
            try:
                tenant = await self.enrolment.tenant_client(provider_id, data)
                ns = tenant_namespace(consumer_id)
                with contextlib.suppress(NotFound):
                    await tenant.delete(GPUSLICES, consumer_id, ns)
                with contextlib.suppress(NotFound):
                    await tenant.patch(TENANTS, consumer_id, {"spec": {"network": None}}, ns)
            except KubeError as e:  # the provider is gone or revoked us already: nothing to release there
                log.info("could not release the slice on the provider: %s", e)
        with contextlib.suppress(NotFound):
            await self.consumer.delete(SECRETS, identity_secret_name(provider_id), SYSTEM_NAMESPACE)
        await self._forget(provider_id)
        finalizers = [f for f in meta(fc).get("finalizers") or [] if f != FINALIZER]
        with contextlib.suppress(NotFound):
            await self.consumer.patch(
                FOREIGNCLUSTERS,
                provider_id,
                {"metadata": {"finalizers": finalizers, "resourceVersion": meta(fc)["resourceVersion"]}},
            )
        log.info("peering undone on this cluster")
        return None

    async def _forget(self, provider_id: str) -> None:
        await self.watches.stop(provider_id)
        await self.clients.forget(provider_id)
