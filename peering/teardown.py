"""Undoing a peering on both sides: the provider's tenant and everything issued to it, the
consumer's identity Secret."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

from kube.clients import KubeClient
from kube.errors import Conflict, NotFound
from kube.objects import (
    CONFIGMAPS,
    CSRS,
    ENDPOINTSLICES,
    FOREIGNCLUSTERS,
    NAMESPACES,
    PODS,
    SECRETS,
    SERVICES,
    RawObject,
    Resource,
    meta,
)

from .provider.tenants import FINALIZER, revoke
from .resources import (
    CONSUMER_NAMESPACE,
    GPUSLICES,
    LABEL_ORIGIN_NAMESPACE,
    LABEL_TENANT,
    NAMESPACEOFFLOADINGS,
    TENANTS,
    identity_secret_name,
    tenant_namespace,
)
from .waits import Progress, quiet, wait_all_gone

__all__ = ["Revoked", "finish_teardown", "start_teardown", "teardown"]

# what a consumer can write in a twin namespace (and so put finalizers on)
_TWIN_KINDS = (PODS, CONFIGMAPS, SECRETS, SERVICES, ENDPOINTSLICES)


@dataclass
class Revoked:
    """What :func:`start_teardown` did: what it removed, and the provider namespaces it deleted,
    which are gone only once the provider's namespace controller has emptied them."""

    removed: list[str] = field(default_factory=list)
    namespaces: list[str] = field(default_factory=list)


async def teardown(
    consumer: KubeClient,
    provider: KubeClient,
    *,
    consumer_id: str,
    provider_id: str,
    namespace: str = CONSUMER_NAMESPACE,
    timeout: float = 120.0,
    progress: Progress = quiet,
) -> list[str]:
    """Remove everything peering made on both sides; returns what was removed. Idempotent.

    :func:`start_teardown`, its namespaces gone, then :func:`finish_teardown`: see them.
    """
    revoked = await start_teardown(
        consumer, provider, consumer_id=consumer_id, provider_id=provider_id, namespace=namespace,
        progress=progress,
    )  # fmt: skip
    await wait_all_gone(NAMESPACES, [(provider, name) for name in revoked.namespaces], timeout)
    return revoked.removed + await finish_teardown(provider, consumer_id=consumer_id, progress=progress)


async def start_teardown(
    consumer: KubeClient,
    provider: KubeClient,
    *,
    consumer_id: str,
    provider_id: str,
    namespace: str = CONSUMER_NAMESPACE,
    progress: Progress = quiet,
) -> Revoked:
    """Everything peering made, deleted, without waiting for the namespaces to go. Idempotent.

    The Tenant is deleted first: the provider controller's finalizer revokes its RBAC, twin
    namespaces and CSRs. The same revocation is also done here (so teardown completes when the
    controller is not running), then the tenant namespace and the consumer's identity Secret go.
    The namespaces deleted are in the answer: the provider's namespace controller takes 5 s before
    it looks at a deleted namespace, so a caller that has more to delete waits for them all at
    once (:func:`.waits.wait_all_gone`), then calls :func:`finish_teardown`.
    """
    removed: list[str] = []
    ns = tenant_namespace(consumer_id)
    try:
        await provider.delete(TENANTS, consumer_id, ns)
        removed.append(f"provider: tenant {ns}/{consumer_id}")
    except NotFound:
        pass
    for item in await revoke(provider, consumer_id):
        removed.append(f"provider: {item}")
    # finalizers are only there for the controller; what they guard has just been done. Any other
    # finalizer on the consumer's objects (it may write its own) would keep the namespaces forever.
    with contextlib.suppress(NotFound):
        await _drop_finalizer(provider, TENANTS, await provider.get(TENANTS, consumer_id, ns), FINALIZER)
    twins = [
        meta(n)["name"]
        for n in (
            await provider.list(
                NAMESPACES, label_selector=f"{LABEL_TENANT}={consumer_id},{LABEL_ORIGIN_NAMESPACE}"
            )
        )["items"]
    ]
    await _drop_all_finalizers(provider, ns, (GPUSLICES, NAMESPACEOFFLOADINGS))
    for twin in twins:
        await _drop_all_finalizers(provider, twin, _TWIN_KINDS)
    try:
        await provider.delete(NAMESPACES, ns)
        removed.append(f"provider: namespace/{ns}")
    except NotFound:
        pass
    for csr in (await provider.list(CSRS, label_selector=f"{LABEL_TENANT}={consumer_id}"))["items"]:
        with contextlib.suppress(NotFound):
            await provider.delete(CSRS, meta(csr)["name"])
            removed.append(f"provider: csr/{meta(csr)['name']}")
    try:
        await consumer.delete(SECRETS, identity_secret_name(provider_id), namespace)
        removed.append(f"consumer: secret/{namespace}/{identity_secret_name(provider_id)}")
    except NotFound:
        pass
    for what in removed:
        progress(f"removed {what}")
    return Revoked(removed, [*twins, ns])


async def finish_teardown(provider: KubeClient, *, consumer_id: str, progress: Progress = quiet) -> list[str]:
    """After :func:`start_teardown`'s namespaces are gone: the provider's ForeignCluster for the
    consumer (role Consumer), which its controller removes when the Tenant goes. Last, so that a
    pass of that controller already under way when the Tenant went cannot make it again
    afterwards. Returns what was removed."""
    with contextlib.suppress(NotFound):
        found = await provider.get(FOREIGNCLUSTERS, consumer_id)
        if (found.get("spec") or {}).get("role") == "Consumer":
            await provider.delete(FOREIGNCLUSTERS, consumer_id)
            progress(f"removed provider: foreigncluster/{consumer_id}")
            return [f"provider: foreigncluster/{consumer_id}"]
    return []


async def _drop_all_finalizers(client: KubeClient, namespace: str, resources: tuple[Resource, ...]) -> None:
    for resource in resources:
        try:
            items = (await client.list(resource, namespace))["items"]
        except NotFound:
            continue
        for obj in items:
            for finalizer in list(meta(obj).get("finalizers") or []):
                await _drop_finalizer(client, resource, obj, finalizer)
                with contextlib.suppress(NotFound):
                    obj = await client.get(resource, meta(obj)["name"], namespace)


async def _drop_finalizer(client: KubeClient, resource: Resource, obj: RawObject, finalizer: str) -> None:
    md = meta(obj)
    finalizers = md.get("finalizers") or []
    if finalizer not in finalizers:
        return
    with contextlib.suppress(Conflict, NotFound):
        await client.patch(
            resource,
            md["name"],
            {
                "metadata": {
                    "finalizers": [f for f in finalizers if f != finalizer],
                    "resourceVersion": md["resourceVersion"],
                }
            },
            md.get("namespace"),
        )
