"""A wait for a deletion that gives up says what holds the object, as the API server reports it."""

from __future__ import annotations

import uuid

import pytest

from kube.clients import KubeClient
from kube.objects import CONFIGMAPS, NAMESPACES
from peering.waits import StillThere, wait_gone

pytestmark = pytest.mark.integration


async def test_a_namespace_held_by_content_with_a_finalizer_says_so(consumer_client: KubeClient) -> None:
    name = f"held-{uuid.uuid4().hex[:6]}"
    await consumer_client.create(
        NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
    )
    held = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "held", "finalizers": ["example.com/hold"]},
    }
    await consumer_client.create(CONFIGMAPS, held, name)
    await consumer_client.delete(NAMESPACES, name)
    try:
        # the namespace controller's first pass comes 5 s after the deletion
        with pytest.raises(StillThere) as stuck:
            await wait_gone(consumer_client, NAMESPACES, name, None, timeout=15)
        assert stuck.value.held.startswith("; held by: finalizers kubernetes; ")
        assert (
            "NamespaceFinalizersRemaining: Some content in the namespace has finalizers remaining: "
            in str(stuck.value)
        )
        assert "example.com/hold" in stuck.value.held
    finally:
        await consumer_client.patch(CONFIGMAPS, "held", {"metadata": {"finalizers": None}}, name)
    await wait_gone(consumer_client, NAMESPACES, name, None, timeout=60)
