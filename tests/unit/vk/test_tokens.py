from __future__ import annotations

import asyncio
import base64
import time
from typing import Any

import pytest

from kube.informers import Informer
from kube.objects import PODS, ObjectKey
from kube.watching import WatchEvent
from vk.forge.pods import ForgeOptions, remote_pod
from vk.forge.tokens import has_token_volume, token_request, token_secret, token_secret_name
from vk.reflection.tokens import TokenReflector

KUBE_API_ACCESS: dict[str, Any] = {
    "name": "kube-api-access-x7k2p",
    "projected": {
        "defaultMode": 420,
        "sources": [
            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
            {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
            {
                "downwardAPI": {
                    "items": [
                        {
                            "path": "namespace",
                            "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"},
                        }
                    ]
                }
            },
        ],
    },
}


def consumer_pod() -> dict[str, Any]:
    return {
        "metadata": {"name": "train-0", "namespace": "ml", "uid": "uid-1"},
        "spec": {
            "serviceAccountName": "trainer",
            "containers": [
                {
                    "name": "c",
                    "image": "i",
                    "volumeMounts": [
                        {
                            "name": "kube-api-access-x7k2p",
                            "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
                        }
                    ],
                }
            ],
            "volumes": [KUBE_API_ACCESS],
        },
    }


def test_the_twin_reads_token_ca_and_namespace_from_its_token_secret() -> None:
    opts = ForgeOptions(consumer_cluster_id="c1", provider_cluster_id="p1", service_account_tokens=True)
    twin = remote_pod(consumer_pod(), opts)
    (volume,) = twin["spec"]["volumes"]
    secret = token_secret_name("train-0")
    assert volume["projected"]["sources"] == [
        {"secret": {"name": secret, "items": [{"key": "token", "path": "token"}]}},
        {"secret": {"name": secret, "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
        {"secret": {"name": secret, "items": [{"key": "namespace", "path": "namespace"}]}},
    ]
    assert twin["spec"]["containers"][0]["volumeMounts"][0]["mountPath"].endswith("serviceaccount")
    assert twin["spec"]["automountServiceAccountToken"] is False
    assert not has_token_volume(twin) and has_token_volume(consumer_pod())


def test_without_token_reflection_the_volume_is_dropped() -> None:
    twin = remote_pod(consumer_pod(), ForgeOptions(consumer_cluster_id="c1", provider_cluster_id="p1"))
    assert "volumes" not in twin["spec"] and "volumeMounts" not in twin["spec"]["containers"][0]


def test_the_token_request_is_bound_to_the_pod_and_the_secret_holds_what_the_volume_reads() -> None:
    pod = consumer_pod()
    assert token_request(pod)["spec"] == {
        "expirationSeconds": 3607,
        "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": "train-0", "uid": "uid-1"},
    }
    body = token_secret(
        pod, token="jwt", ca_pem="PEM", namespace="ml-c1", consumer_id="c1", expires="2030-01-01T00:00:00Z"
    )
    decoded = {k: base64.b64decode(v).decode() for k, v in body["data"].items()}
    assert decoded == {"token": "jwt", "ca.crt": "PEM", "namespace": "ml"}
    assert body["metadata"]["namespace"] == "ml-c1"
    assert body["metadata"]["labels"]["gpuferry.io/origin-uid"] == "uid-1"


def test_long_pod_names_still_make_valid_secret_names() -> None:
    name = token_secret_name("p" * 253)
    assert len(name) <= 253 and name.endswith("-gpuferry-token")
    assert name != token_secret_name("p" * 252)


class _Consumer:
    """Answers TokenRequests and the CA read (a stand-in for the consumer's API server)."""

    async def create(self, resource: Any, body: Any, namespace: str | None = None, **_: Any) -> Any:
        return {"status": {"token": "t", "expirationTimestamp": "2999-01-01T00:00:00Z"}}

    async def get(self, resource: Any, name: str, namespace: str | None = None) -> Any:
        return {"data": {"ca.crt": "CA"}}


class _Provider:
    """Records the Secrets written (a stand-in for the provider's API server)."""

    def __init__(self) -> None:
        self.created: list[str] = []

    async def create(self, resource: Any, body: Any, namespace: str | None = None, **_: Any) -> Any:
        self.created.append(body["metadata"]["name"])
        return body


def reflector_of(provider: _Provider) -> TokenReflector:
    """A token reflector over one consumer pod (``consumer_pod``), writing to ``provider``."""
    pods = Informer(None, PODS, compact=True)  # type: ignore[arg-type]
    pods._apply(WatchEvent("ADDED", consumer_pod()))
    return TokenReflector(consumer=_Consumer(), provider=provider, pods=pods,  # type: ignore[arg-type]
                          twin_namespace_for=lambda ns: f"{ns}-c1", consumer_id="c1")  # fmt: skip


async def test_a_resync_leaves_fresh_tokens_to_their_renewal_timer(monkeypatch: pytest.MonkeyPatch) -> None:
    provider = _Provider()
    reflector = reflector_of(provider)
    key = ObjectKey("ml", "train-0")
    again = await reflector.reconcile(key)
    assert provider.created == [token_secret_name("train-0")] and again is not None
    reflector.resync()
    assert len(reflector.queue) == 0  # fresh: its renewal is already due later, nothing to look at
    later = time.time() + again.after + 1
    monkeypatch.setattr(time, "time", lambda: later)
    reflector.resync()
    assert len(reflector.queue) == 1  # due: looked at now


class _SlowProvider(_Provider):
    """Holds each Secret write until ``release`` is set (a provider API server slow to answer)."""

    def __init__(self) -> None:
        super().__init__()
        self.release = asyncio.Event()
        self.started = asyncio.Event()

    async def create(self, resource: Any, body: Any, namespace: str | None = None, **_: Any) -> Any:
        self.started.set()
        await self.release.wait()
        return await super().create(resource, body, namespace)


async def test_a_write_waited_on_and_cancelled_leaves_its_waiter_to_write_rather_than_cancelled() -> None:
    """Two callers share one write in flight; when the writer is cancelled (a leader stepping
    down, a shutdown), the waiter is not: it writes itself instead of taking the writer's
    CancelledError, which would have ended a queue worker that nobody cancelled."""
    provider = _SlowProvider()
    reflector = reflector_of(provider)
    writer = asyncio.create_task(reflector.ensure_for(consumer_pod()))
    await asyncio.wait_for(provider.started.wait(), 5)
    waiter = asyncio.create_task(reflector.ensure_for(consumer_pod()))
    await asyncio.sleep(0.05)  # the waiter is waiting on the writer's write
    assert not waiter.done()
    writer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await writer
    provider.release.set()
    await asyncio.wait_for(waiter, 5)  # raised CancelledError before
    assert provider.created == [token_secret_name("train-0")]  # the waiter's own write


async def test_a_write_waited_on_shares_its_result_with_its_waiter() -> None:
    provider = _SlowProvider()
    reflector = reflector_of(provider)
    first = asyncio.create_task(reflector.ensure_for(consumer_pod()))
    await asyncio.wait_for(provider.started.wait(), 5)
    second = asyncio.create_task(reflector.ensure_for(consumer_pod()))
    await asyncio.sleep(0.05)
    provider.release.set()
    await asyncio.wait_for(asyncio.gather(first, second), 5)
    assert provider.created == [token_secret_name("train-0")]  # one write for both
