"""JSON merge patches (RFC 7386): computing them, applying them, and sending the common ones.

:func:`diff_merge_patch` and :func:`apply_merge_patch` are pure. A merge patch replaces lists
as a whole and deletes a key by setting it to ``null``; so ``apply_merge_patch(old,
diff_merge_patch(old, new)) == new`` for any ``new`` without ``null`` values.
:func:`patch_status` and :func:`patch_changes` send patches through a :class:`KubeClient`.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from .clients import KubeClient
from .objects import ObjectKey, RawObject, Resource, resource_version

__all__ = ["apply_merge_patch", "diff_merge_patch", "patch_changes", "patch_status"]


def diff_merge_patch(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """The smallest merge patch turning ``old`` into ``new`` (``{}`` when they are equal)."""
    patch: dict[str, Any] = {}
    for key in old:
        if key not in new:
            patch[key] = None
    for key, value in new.items():
        if key not in old:
            if value is not None:  # null removes a key: for one that is not there, a no-op write
                patch[key] = copy.deepcopy(value)
            continue
        before = old[key]
        if isinstance(before, Mapping) and isinstance(value, Mapping):
            nested = diff_merge_patch(before, value)
            if nested:
                patch[key] = nested
        elif before != value or type(before) is not type(value):
            patch[key] = copy.deepcopy(value)
    return patch


def apply_merge_patch(target: Any, patch: Any) -> Any:
    """``target`` with ``patch`` merged in (RFC 7386 ``MergePatch``); the inputs are not changed."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    result: dict[str, Any] = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = apply_merge_patch(result.get(key), value)
    return result


async def patch_status(
    client: KubeClient,
    resource: Resource,
    key: ObjectKey,
    status: Mapping[str, Any],
    *,
    resource_version: str | None = None,
) -> RawObject:
    """Merge ``status`` into the object's ``status`` through the status subresource.

    With ``resource_version``, the patch fails with Conflict if the object changed since.
    """
    body: dict[str, Any] = {"status": dict(status)}
    if resource_version is not None:
        body["metadata"] = {"resourceVersion": resource_version}
    return await client.patch(resource, key.name, body, key.namespace, subresource="status")


async def patch_changes(
    client: KubeClient,
    resource: Resource,
    old: RawObject,
    new: RawObject,
    *,
    subresource: str | None = None,
    guard: bool = False,
) -> RawObject:
    """Send the merge patch from ``old`` to ``new``; nothing (and ``old`` returned) if equal.

    Where ``resource`` has a status subresource, the API server ignores ``status`` changes
    sent to the main resource: send those with ``subresource="status"``.
    With ``guard``, ``old``'s ``resourceVersion`` goes with the patch, so that it fails with
    Conflict if the object changed after ``old`` was read.
    """
    patch = diff_merge_patch(old, new)
    if not patch:
        return old
    if guard:
        rv = resource_version(old)
        if rv is not None:
            patch.setdefault("metadata", {})["resourceVersion"] = rv
    key = ObjectKey.of(old)
    return await client.patch(resource, key.name, patch, key.namespace, subresource=subresource)
