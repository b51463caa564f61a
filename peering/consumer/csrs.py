"""The consumer agent approves its virtual kubelets' serving certificates (and nothing else).

A virtual kubelet asks the consumer's CSR API for its kubelet API's serving certificate, like a
real kubelet with ``serverTLSBootstrap``. This approver judges each pending
``kubernetes.io/kubelet-serving`` request with :func:`peering.csrapproval.decide` against the
Node it names and the VirtualNodes this agent runs, and approves or denies it through the
``approval`` subresource; requests of other identities are left to the cluster's own approver.
It needs ``approve`` on that signer, which the agent's identity has in embedded mode (admin) and
which the chart grants in a cluster. Virtual kubelets then never approve their own requests.
"""

from __future__ import annotations

import logging

from kube.api import NODE_TYPE_LABEL, NODE_TYPE_VIRTUAL_KUBELET
from kube.clients import KubeClient
from kube.errors import NotFound
from kube.objects import CSRS, NODES, SELFSUBJECTREVIEWS, ObjectKey, RawObject
from kube.queueing import KeyedQueue
from kube.reconciling import Requeue, run_workers
from kube.tasks import run_supervised
from kube.watching import Listed, watch_objects

from ..csrapproval import SIGNER, Decision, decide, node_of
from ..kubeletworkload import identity
from ..virtualnodes import VIRTUALNODES

__all__ = ["KubeletCsrApprover", "whoami"]

logger = logging.getLogger(__name__)

WAIT_SECONDS = 5.0
"""A request whose Node is not registered yet is looked at again when it is, or after this."""


async def whoami(client: KubeClient) -> str:
    review = await client.create(
        SELFSUBJECTREVIEWS, {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
    )
    return str(((review.get("status") or {}).get("userInfo") or {}).get("username") or "")


class KubeletCsrApprover:
    """``pods``: the virtual kubelets run as pods, each as its VirtualNode's ServiceAccount;
    otherwise as processes of this agent, with its identity."""

    def __init__(self, consumer: KubeClient, namespace: str | None, *, pods: bool = False) -> None:
        self.consumer = consumer
        self.namespace = namespace
        self.pods = pods
        self.queue: KeyedQueue[ObjectKey] = KeyedQueue("approve_kubelet_csrs")
        self.requester = ""
        self._waiting: dict[str, set[ObjectKey]] = {}  # node -> requests waiting for it

    async def run(self) -> None:
        self.requester = await whoami(self.consumer)
        who = "each VirtualNode's ServiceAccount" if self.pods else self.requester
        logger.info("approving kubelet-serving requests of %s for gpuferry's virtual nodes", who)
        try:
            await run_supervised({
                "watch_kubelet_csrs": self._watch_csrs(),
                "watch_virtual_nodes": self._watch_nodes(),
                "approve_kubelet_csrs": run_workers(self.queue, self, logger=logger,
                                                    kind="CertificateSigningRequest"),
            }, logger=logger)  # fmt: skip
        finally:
            self.queue.shutdown()

    async def _watch_csrs(self) -> None:
        async for item in watch_objects(
            self.consumer, CSRS, field_selector=f"spec.signerName={SIGNER}", retry_permanent=True
        ):
            if not isinstance(item, Listed) and item.type != "DELETED":
                self.queue.add(item.key)

    async def _watch_nodes(self) -> None:
        virtual = f"{NODE_TYPE_LABEL}={NODE_TYPE_VIRTUAL_KUBELET}"
        async for item in watch_objects(self.consumer, NODES, label_selector=virtual):
            if not isinstance(item, Listed):
                for key in self._waiting.pop(item.key.name, set()):
                    self.queue.add(key)

    def _kubelet_identity(self, vn: RawObject) -> str:
        if self.pods:
            return identity(vn["metadata"]["namespace"], vn["metadata"]["name"])
        return self.requester

    async def reconcile(self, key: ObjectKey) -> Requeue | None:
        try:
            csr = await self.consumer.get(CSRS, key.name)
        except NotFound:
            return None
        name = node_of(csr)
        node: RawObject | None = None
        if name is not None:
            try:
                node = await self.consumer.get(NODES, name)
            except NotFound:
                node = None
        vns = (await self.consumer.list(VIRTUALNODES, self.namespace))["items"]
        kubelets = {str((vn.get("spec") or {}).get("nodeName")): self._kubelet_identity(vn) for vn in vns}
        verdict = decide(csr, kubelets=kubelets, node=node)
        if verdict.decision is Decision.IGNORE:
            return None
        if verdict.decision is Decision.WAIT:
            self._waiting.setdefault(str(name), set()).add(key)
            return Requeue(WAIT_SECONDS)
        approved = verdict.decision is Decision.APPROVE
        await self._conclude(csr, approved, verdict.reason)
        log = logger.info if approved else logger.warning
        outcome = "approved" if approved else "denied"
        log("CertificateSigningRequest %s %s: %s", key.name, outcome, verdict.reason)
        return None

    async def _conclude(self, csr: RawObject, approved: bool, message: str) -> None:
        status = csr.setdefault("status", {})
        status["conditions"] = [
            *(status.get("conditions") or []),
            {
                "type": "Approved" if approved else "Denied",
                "status": "True",
                "reason": "GpuferryVirtualNodeVerified" if approved else "GpuferryVirtualNodeMismatch",
                "message": message,
            },
        ]
        name = csr["metadata"]["name"]
        await self.consumer.request(
            "PUT", f"/apis/certificates.k8s.io/v1/certificatesigningrequests/{name}/approval", json=csr
        )
