"""A wait for a deletion that gives up says what holds the object, as the API server reports it."""

from __future__ import annotations

import uuid

import pytest

from kube.clients import KubeClient
from kube.errors import NotFound
from kube.objects import CONFIGMAPS, NAMESPACES
from peering.waits import StillThere, wait_all_gone

pytestmark = pytest.mark.integration


async def _held_namespace(client: KubeClient) -> str:
    """A namespace, deleted, that a ConfigMap's finalizer holds (:func:`_release` lets it go)."""
    name = f"held-{uuid.uuid4().hex[:6]}"
    await client.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    held = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "held", "finalizers": ["example.com/hold"]},
    }
    await client.create(CONFIGMAPS, held, name)
    await client.delete(NAMESPACES, name)
    return name


async def _release(client: KubeClient, name: str) -> None:
    await client.patch(CONFIGMAPS, "held", {"metadata": {"finalizers": None}}, name)


async def test_waiting_for_several_to_go_names_the_one_still_held_and_what_holds_it(
    consumer_client: KubeClient,
) -> None:
    """The waits run together: a namespace that goes does not hide one held after it in the list;
    the error says what holds it, as the API server reports it; the wait ends once both are gone."""
    free = f"free-{uuid.uuid4().hex[:6]}"
    await consumer_client.create(
        NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": free}}
    )
    await consumer_client.delete(NAMESPACES, free)
    held = await _held_namespace(consumer_client)
    targets = [(consumer_client, free), (consumer_client, held)]
    try:
        # the namespace controller's first pass comes 5 s after the deletion
        with pytest.raises(StillThere) as stuck:
            await wait_all_gone(NAMESPACES, targets, timeout=15)
        assert str(stuck.value).startswith(f"Namespace {held} still there after 15s; held by: "), stuck.value
        assert stuck.value.held.startswith("; held by: finalizers kubernetes; ")
        assert (
            "NamespaceFinalizersRemaining: Some content in the namespace has finalizers remaining: "
            in str(stuck.value)
        )
        assert "example.com/hold" in stuck.value.held
    finally:
        await _release(consumer_client, held)
    await wait_all_gone(NAMESPACES, targets, timeout=60)
    for name in (free, held):
        with pytest.raises(NotFound):
            await consumer_client.get(NAMESPACES, name)
