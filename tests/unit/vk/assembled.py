"""A virtual kubelet assembled for real, without API servers: its informers are fed by hand as
their watches would be, and its writes are answered by stand-ins that record them."""

from __future__ import annotations

import copy
from typing import Any

from kube.clients import KubeClient
from kube.informers import Informer
from kube.kubeconfigs import Connection
from kube.objects import ObjectKey, Resource
from kube.patching import apply_merge_patch
from kube.queueing import KeyedQueue
from kube.watching import Listed
from vk.assembly import assemble_virtual_kubelet
from vk.reflection.pods import PodReflector
from vk.reflection.podstatus import PodStatusReflector
from vk.reflection.tokens import TokenReflector
from vk.settings import VirtualKubeletSettings

from .builders import CONSUMER_ID, VIRTUAL_NODE

SETTINGS = VirtualKubeletSettings(
    consumer_kubeconfig=None,
    provider_kubeconfig=None,
    consumer_cluster_id=CONSUMER_ID,
    provider_cluster_id="farm-a",
    node_name=VIRTUAL_NODE,
    resources={"nvidia.com/gpu": "8"},
)
KEY = ObjectKey("ml-team", "finetune-llama-x9q2z")


class ApiServer:
    """Answers writes as an API server would (the object, with the next resource version), and
    records them and its answers: a watch event brings an answer back as it is."""

    def __init__(self, first_version: int) -> None:
        self.version = first_version
        self.writes: list[tuple[str, str, str | None]] = []
        self.answers: list[dict[str, Any]] = []
        self.objects: dict[str, dict[str, Any]] = {}
        self.deleted: list[str] = []

    def _answer(self, body: dict[str, Any]) -> dict[str, Any]:
        self.version += 1
        out = copy.deepcopy(body)
        out.setdefault("metadata", {})["resourceVersion"] = str(self.version)
        out["metadata"].setdefault("uid", f"uid-{self.version}")
        self.answers.append(out)
        return copy.deepcopy(out)

    async def create(self, resource: Resource, body: dict[str, Any], namespace: str | None = None,
                     **options: Any) -> dict[str, Any]:  # fmt: skip
        self.writes.append(("create", resource.plural, options.get("subresource")))
        if options.get("subresource") == "token":
            return {"status": {"token": "t", "expirationTimestamp": "2099-01-01T00:00:00Z"}}
        return self._answer(body)

    async def patch(self, resource: Resource, name: str, body: dict[str, Any], namespace: str | None = None,
                    **options: Any) -> dict[str, Any]:  # fmt: skip
        self.writes.append(("patch", resource.plural, options.get("subresource")))
        answer = self._answer(apply_merge_patch(self.objects[name], body))  # RFC 7386, as sent
        self.objects[name] = copy.deepcopy(answer)  # the next write merges into this one
        return answer

    async def get(self, resource: Resource, name: str, namespace: str | None = None) -> dict[str, Any]:
        return {"data": {"ca.crt": "PEM"}}

    async def delete(self, resource: Resource, name: str, namespace: str | None = None,
                     **options: Any) -> dict[str, Any]:  # fmt: skip
        self.writes.append(("delete", resource.plural, None))
        self.deleted.append(name)
        return {}


class VirtualKubelet:
    """The assembled controllers, their informers, and the two stand-in API servers."""

    def __init__(self, settings: VirtualKubeletSettings = SETTINGS) -> None:
        never = KubeClient(Connection(server="https://127.0.0.1:1"))  # never called
        manager, node = assemble_virtual_kubelet(settings, never, never)
        self.manager, self.node = manager, node
        by_name = {c.name: c for c in manager.controllers}
        self.to_remote: KeyedQueue[ObjectKey] = by_name["sync_pods_to_remote"].queue
        self.back: KeyedQueue[ObjectKey] = by_name["sync_status_from_remote"].queue
        self.tokens: KeyedQueue[ObjectKey] = by_name["sync_tokens_to_remote"].queue
        pods = by_name["sync_pods_to_remote"].reconciler
        status = by_name["sync_status_from_remote"].reconciler
        token = by_name["sync_tokens_to_remote"].reconciler
        assert isinstance(pods, PodReflector) and isinstance(status, PodStatusReflector)
        assert isinstance(token, TokenReflector)
        self.pods, self.status, self.token = pods, status, token
        self.consumer, self.provider = ApiServer(48213), ApiServer(40)
        for reflector in (self.pods, self.status, self.token):
            reflector.consumer = self.consumer  # type: ignore[assignment]
            reflector.provider = self.provider  # type: ignore[assignment]
        self.pods.remote.provider = self.provider  # type: ignore[attr-defined]
        self.local: Informer = self.pods.local
        self.twins: Informer = self.pods.remote.twins  # type: ignore[attr-defined]
        self.twins.receive(Listed("0", frozenset()))  # no twins yet: what the first list says

    def drain(self) -> None:
        for queue in (self.to_remote, self.back, self.tokens):
            for key in queue.pending:
                queue.discard(key)

    def pending(self) -> tuple[frozenset[ObjectKey], ...]:
        """Keys waiting now (not those put off until later: a token's renewal) in (twin sync,
        status back, tokens)."""
        queues = (self.to_remote, self.back, self.tokens)
        return tuple(q.pending - frozenset(q._delayed) for q in queues)


NONE: frozenset[ObjectKey] = frozenset()
