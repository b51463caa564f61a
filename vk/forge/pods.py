"""The twin pod: a consumer pod bound to the virtual node, forged for the provider.

:func:`remote_pod` builds the twin to create; :func:`remote_pod_update` the strategic merge patch
that brings an existing twin in line with a changed consumer pod; :func:`twin_projection` what
is kept of a watched twin. All are pure.

What the twin keeps, drops and changes (each for a reason an operator can check):

* **metadata**: same name; namespace = the twin namespace (:func:`vk.forge.names.twin_namespace`);
  the consumer's labels and annotations, plus ownership labels and origin annotations
  (:mod:`vk.forge.labels`) that win over same-named consumer keys. Dropped: uid, resourceVersion,
  creationTimestamp, generation, managedFields, ownerReferences (they name consumer objects),
  finalizers (nobody on the provider would remove them), deletion*, generateName, selfLink, and
  the ``kubectl.kubernetes.io/last-applied-configuration`` annotation (a consumer-side record
  that would mislead ``kubectl apply`` on the provider).
* **placement**: ``nodeName`` dropped (the provider scheduler picks a node); node selectors,
  node-affinity expressions and the toleration that target the virtual node dropped, the rest
  kept (:mod:`vk.forge.placement`); ``schedulerName`` set to the provider scheduler when one is
  configured, else dropped (the provider's default scheduler); ``priorityClassName`` dropped
  unless configured to keep it; ``priority`` and ``preemptionPolicy`` always dropped, because the
  provider's Priority admission recomputes them from the class and refuses a pod whose values
  differ; ``overhead`` dropped for the same reason (RuntimeClass admission).
* **resources**: containers are copied verbatim, requests and limits included, so
  ``nvidia.com/gpu``, ``nvidia.com/gpu.shared``, ``nvidia.com/mig-1g.10gb``, ``cnvrg.io/metagpu``
  reach the provider's device plugins untouched.
* **service account**: the consumer's service account does not exist on the provider. The twin
  runs as the twin namespace's ``default`` service account with
  ``automountServiceAccountToken: false``, and the projected ``kube-api-access-*`` volume the
  consumer's admission added (with its mounts) is removed, unless
  ``ForgeOptions.keep_service_account_volumes`` is set — the seam where accessory reflection puts
  back a consumer token.
* **readinessGates** dropped: their conditions are set by consumer-side controllers and would
  never become true on the twin. **ephemeralContainers** dropped from the twin created: the API
  refuses them on create. Those added later (``kubectl debug``) are added to the twin one by one
  through its ``ephemeralcontainers`` subresource (:func:`new_ephemeral_containers`), as the
  consumer's API server added them to the pod.
* **in-place resize**: a consumer pod's cpu and memory changed through its ``resize``
  subresource are sent to the twin's (:func:`resize_patch`); the provider's kubelet actuates
  them, and the twin's status (the resources it runs with, ``PodResizePending`` or
  ``PodResizeInProgress``) comes back. Only the values the consumer's pod names are compared:
  a default the provider's LimitRange filled in is not a change.
* status is not part of a twin.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kube.objects import copy_json
from kube.quantities import parse_quantity
from vk.forge import labels as lbl
from vk.forge.names import NamespaceStrategy, node_name, twin_namespace
from vk.forge.placement import forge_affinity, forge_node_selector, forge_tolerations
from vk.forge.tokens import rewrite_token_volumes

__all__ = [
    "DROPPED_ANNOTATIONS",
    "SERVICE_ACCOUNT_VOLUME_PREFIX",
    "ForgeOptions",
    "is_service_account_volume",
    "matters_to_twin_sync",
    "new_ephemeral_containers",
    "remote_pod",
    "remote_pod_update",
    "resize_patch",
    "twin_projection",
]

DROPPED_ANNOTATIONS = frozenset({"kubectl.kubernetes.io/last-applied-configuration"})
SERVICE_ACCOUNT_VOLUME_PREFIX = "kube-api-access-"
_OWN_KEYS = frozenset(
    {
        lbl.MANAGED_BY,
        lbl.ORIGIN_CLUSTER_ID,
        lbl.ORIGIN_NAMESPACE,
        lbl.ORIGIN_NAME,
        lbl.ORIGIN_UID,
        lbl.REFLECTED_LABELS,
        lbl.REFLECTED_ANNOTATIONS,
    }
)
_CONTAINER_LISTS = ("initContainers", "containers")
_DROPPED_SPEC_FIELDS = (
    "nodeName",
    "priority",
    "preemptionPolicy",
    "overhead",
    "readinessGates",
    "ephemeralContainers",
    "serviceAccount",
    "serviceAccountName",
)


@dataclass(frozen=True, kw_only=True)
class ForgeOptions:
    """How consumer pods become twins for one virtual node."""

    consumer_cluster_id: str
    """ID of the consumer cluster: twin namespace suffix and ownership label value."""
    provider_cluster_id: str
    """ID of the provider cluster the virtual node stands for."""
    virtual_node_name: str = ""
    """Name of the virtual node; empty for the default ``gpuferry-<provider-id>``."""
    namespace_strategy: NamespaceStrategy = "default"
    """Twin namespace rule: ``<namespace>-<consumer-id>`` or the same name."""
    provider_scheduler: str | None = None
    """``schedulerName`` for twins; ``None`` leaves them to the provider's default scheduler."""
    keep_priority_class: bool = False
    """Keep ``priorityClassName`` (the class must exist on the provider, or creation fails)."""
    keep_service_account_volumes: bool = False
    """Keep the projected ``kube-api-access-*`` volumes and mounts as they are."""
    service_account_tokens: bool = False
    """Keep them, reading the consumer's token, CA and namespace from the pod's token Secret
    (:mod:`vk.forge.tokens`), which the token reflector writes in the twin namespace."""
    grant_node_selector: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """The provider nodes the grant covers (e.g. one GPU product): added to every twin's
    ``nodeSelector`` so that twins never land outside the slice they were granted."""
    grant_tolerations: tuple[Mapping[str, Any], ...] = ()
    """The provider taints the grant tolerates (its GPU nodes' ``nvidia.com/gpu:NoSchedule``,
    say): added to every twin's tolerations, since the consumer's pods cannot know them."""

    @property
    def node(self) -> str:
        """The virtual node's name."""
        return self.virtual_node_name or node_name(self.provider_cluster_id)

    @property
    def identity(self) -> dict[str, str]:
        """The virtual node's identity labels (see :func:`vk.forge.labels.virtual_node_identity`)."""
        return lbl.virtual_node_identity(self.provider_cluster_id, self.node)


def is_service_account_volume(volume: Mapping[str, Any]) -> bool:
    """Whether ``volume`` is the projected API-access volume that admission adds for a token."""
    sources = (volume.get("projected") or {}).get("sources") or ()
    return str(volume.get("name", "")).startswith(SERVICE_ACCOUNT_VOLUME_PREFIX) and any(
        "serviceAccountToken" in source for source in sources
    )


def _drop_service_account_volumes(spec: dict[str, Any]) -> None:
    volumes = spec.get("volumes") or []
    dropped = {v.get("name") for v in volumes if is_service_account_volume(v)}
    if not dropped:
        return
    kept = [v for v in volumes if v.get("name") not in dropped]
    if kept:
        spec["volumes"] = kept
    else:
        spec.pop("volumes", None)
    for field in _CONTAINER_LISTS:
        for container in spec.get(field) or ():
            mounts = [m for m in container.get("volumeMounts") or () if m.get("name") not in dropped]
            if mounts:
                container["volumeMounts"] = mounts
            else:
                container.pop("volumeMounts", None)


def _set_or_drop(mapping: dict[str, Any], key: str, value: Any) -> None:
    if value is None:
        mapping.pop(key, None)
    else:
        mapping[key] = value


def _forge_spec(local_spec: Mapping[str, Any], opts: ForgeOptions, pod_name: str = "") -> dict[str, Any]:
    spec = copy_json(dict(local_spec))
    for field in _DROPPED_SPEC_FIELDS:
        spec.pop(field, None)
    if not opts.keep_priority_class:
        spec.pop("priorityClassName", None)
    _set_or_drop(spec, "schedulerName", opts.provider_scheduler)
    identity = opts.identity
    selector = {**(forge_node_selector(spec.get("nodeSelector"), identity) or {}), **opts.grant_node_selector}
    _set_or_drop(spec, "nodeSelector", selector or None)
    _set_or_drop(spec, "affinity", forge_affinity(spec.get("affinity"), identity, opts.node))
    tolerations = forge_tolerations(spec.get("tolerations")) or []
    tolerations += [dict(t) for t in opts.grant_tolerations if dict(t) not in tolerations]
    _set_or_drop(spec, "tolerations", tolerations or None)
    spec["automountServiceAccountToken"] = False
    if opts.service_account_tokens:
        rewrite_token_volumes(spec, pod_name)
    elif not opts.keep_service_account_volumes:
        _drop_service_account_volumes(spec)
    return spec


def _reflected(mapping: Mapping[str, str] | None, dropped: frozenset[str] = frozenset()) -> dict[str, str]:
    return {k: v for k, v in (mapping or {}).items() if k not in _OWN_KEYS and k not in dropped}


def _forge_metadata(local: Mapping[str, Any], opts: ForgeOptions) -> dict[str, Any]:
    metadata = local.get("metadata") or {}
    name, namespace = metadata.get("name"), metadata.get("namespace")
    if not name or not namespace:
        raise ValueError("a pod to forge needs metadata.name and metadata.namespace")
    labels = _reflected(metadata.get("labels"))
    annotations = _reflected(metadata.get("annotations"), DROPPED_ANNOTATIONS)
    records = {
        lbl.REFLECTED_LABELS: ",".join(sorted(labels)),
        lbl.REFLECTED_ANNOTATIONS: ",".join(sorted(annotations)),
    }
    return {
        "name": name,
        "namespace": twin_namespace(namespace, opts.consumer_cluster_id, strategy=opts.namespace_strategy),
        "labels": {**labels, **lbl.ownership_labels(opts.consumer_cluster_id, local)},
        "annotations": {**annotations, **lbl.origin_annotations(opts.consumer_cluster_id, local), **records},
    }


def remote_pod(local: Mapping[str, Any], opts: ForgeOptions) -> dict[str, Any]:
    """The twin of the consumer pod ``local`` (a raw API dict), ready to create on the provider.

    ``local`` is not modified. Raises :class:`ValueError` when ``local`` has no name or namespace,
    or names that cannot make a twin namespace.
    """
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": _forge_metadata(local, opts),
        "spec": _forge_spec(local.get("spec") or {}, opts, local["metadata"]["name"]),
    }


def _map_patch(
    current: Mapping[str, str], desired: Mapping[str, str], previously_reflected: str
) -> dict[str, str | None]:
    """Merge patch of a labels/annotations map: set what differs, delete what the consumer
    dropped since the last sync (and only that: keys the provider added stay)."""
    patch: dict[str, str | None] = {k: v for k, v in desired.items() if current.get(k) != v}
    for key in filter(None, previously_reflected.split(",")):
        if key not in desired and key in current:
            patch[key] = None
    return patch


def _image_patch(current: list[dict[str, Any]], desired: list[dict[str, Any]]) -> list[dict[str, str]] | None:
    """The containers whose image the consumer changed, as ``{"name", "image"}`` entries of a
    strategic merge patch (merged into the twin's list by name, so what the provider's admission
    added stays), or ``None`` if none changed. ``image`` is the one container field the API lets
    change on a running pod."""
    images = {c.get("name"): c.get("image") for c in desired}
    changed = [
        {"name": str(c["name"]), "image": str(images[c["name"]])}
        for c in current
        if images.get(c.get("name")) is not None and images[c.get("name")] != c.get("image")
    ]
    return changed or None


def _spec_patch(current: Mapping[str, Any], desired: Mapping[str, Any]) -> dict[str, Any]:
    patch: dict[str, Any] = {}
    for field in _CONTAINER_LISTS:
        containers = _image_patch(current.get(field) or [], desired.get(field) or [])
        if containers is not None:
            patch[field] = containers
    deadline = desired.get("activeDeadlineSeconds")
    if deadline is not None and deadline != current.get("activeDeadlineSeconds"):
        patch["activeDeadlineSeconds"] = deadline
    tolerations = current.get("tolerations") or []
    added = [t for t in desired.get("tolerations") or () if t not in tolerations]
    if added:
        patch["tolerations"] = [*tolerations, *added]  # no merge key: the list is replaced whole
    return patch


_TWIN_SPEC_READ = ("activeDeadlineSeconds", "tolerations", "resourceClaims", "nodeName")
_PROJECTED_CONTAINER_LISTS = (*_CONTAINER_LISTS, "ephemeralContainers")
_RESIZABLE = ("cpu", "memory")
"""What the ``resize`` subresource changes on a running pod."""


def twin_projection(twin: Mapping[str, Any]) -> dict[str, Any]:
    """What the virtual kubelet keeps of a twin it watches: metadata, the status, and of the spec
    only what :func:`remote_pod_update`, :func:`new_ephemeral_containers`, :func:`resize_patch`
    and the status and claim reflection read (container names, images, cpu and memory, the
    deadline, tolerations, claims, the node).
    The rest of the spec (other resources, env, mounts, probes, defaults the API server filled
    in) is about half of a twin's bytes, times ten thousand twins (issue 15)."""
    spec = twin.get("spec")
    if not isinstance(spec, dict):
        return dict(twin)
    kept: dict[str, Any] = {k: spec[k] for k in _TWIN_SPEC_READ if k in spec}
    for field in _PROJECTED_CONTAINER_LISTS:
        if field in spec:
            kept[field] = [_projected_container(c) for c in spec[field] or ()]
    return {**twin, "spec": kept}


def _projected_container(container: Mapping[str, Any]) -> dict[str, Any]:
    kept = {"name": container.get("name"), "image": container.get("image")}
    resources = _resizable(container.get("resources"))
    if resources:
        kept["resources"] = resources
    return kept


def _resizable(resources: Mapping[str, Any] | None) -> dict[str, dict[str, Any]]:
    """The cpu and memory of a container's requests and limits (what a resize may change)."""
    out: dict[str, dict[str, Any]] = {}
    for kind in ("requests", "limits"):
        values = {r: v for r, v in ((resources or {}).get(kind) or {}).items() if r in _RESIZABLE}
        if values:
            out[kind] = values
    return out


def _same_quantity(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is b
    try:
        return parse_quantity(a) == parse_quantity(b)
    except ValueError:
        return bool(a == b)


def resize_patch(local: Mapping[str, Any], remote: Mapping[str, Any]) -> dict[str, Any] | None:
    """The strategic merge patch for the twin's ``resize`` subresource that gives its containers
    the cpu and memory the consumer pod ``local`` now asks for, or ``None`` when they have them.
    ``remote`` may be a :func:`twin_projection`. Only the values ``local`` names are compared
    (a request the provider's LimitRange defaulted on the twin is left alone), as quantities
    (``0.5`` is ``500m``); a container that changed sends all of them. Pure."""
    patch: dict[str, Any] = {}
    twin_spec = remote.get("spec") or {}
    for field in _CONTAINER_LISTS:
        twins = {c.get("name"): c for c in twin_spec.get(field) or ()}
        changed = []
        for container in (local.get("spec") or {}).get(field) or ():
            twin = twins.get(container.get("name"))
            if twin is None:
                continue
            want, have = _resizable(container.get("resources")), _resizable(twin.get("resources"))
            if any(
                not _same_quantity(value, (have.get(kind) or {}).get(name))
                for kind, values in want.items()
                for name, value in values.items()
            ):
                changed.append({"name": container["name"], "resources": want})
        if changed:
            patch[field] = changed
    return {"spec": patch} if patch else None


def new_ephemeral_containers(
    local: Mapping[str, Any],
    remote: Mapping[str, Any],
    opts: ForgeOptions,
    skip: frozenset[str] = frozenset(),
) -> list[dict[str, Any]]:
    """The ephemeral containers of the consumer pod ``local`` (``kubectl debug``) that its twin
    ``remote`` (may be a :func:`twin_projection`) lacks, in the consumer's order, less those named
    in ``skip`` (the provider refused them), forged for the twin: each to be added through the
    twin's ``ephemeralcontainers`` subresource. Ephemeral containers can be added, never changed
    or removed, so what the twin has stays. A mount of a volume the twin does not have (the
    consumer's API-access volume, dropped) is dropped. Pure."""
    wanted = (local.get("spec") or {}).get("ephemeralContainers") or ()
    if not wanted:
        return []
    have = {c.get("name") for c in (remote.get("spec") or {}).get("ephemeralContainers") or ()}
    missing = [c for c in wanted if c.get("name") not in have and c.get("name") not in skip]
    if not missing:
        return []
    twin_spec = _forge_spec(local.get("spec") or {}, opts, local["metadata"]["name"])
    volumes = {v.get("name") for v in twin_spec.get("volumes") or ()}
    forged = []
    for container in missing:
        twin_container = copy_json(dict(container))
        mounts = [m for m in twin_container.get("volumeMounts") or () if m.get("name") in volumes]
        _set_or_drop(twin_container, "volumeMounts", mounts or None)
        forged.append(twin_container)
    return forged


def remote_pod_update(
    local: Mapping[str, Any], remote: Mapping[str, Any], opts: ForgeOptions
) -> dict[str, Any] | None:
    """The strategic merge patch that brings the twin ``remote`` in line with ``local``, or
    ``None``. ``remote`` may be a :func:`twin_projection`.

    Only what Kubernetes lets change on an existing pod is patched: container and init-container
    images, ``activeDeadlineSeconds`` (set or lowered, as the consumer's API server already
    validated), tolerations added, labels and annotations. Ownership labels and origin
    annotations are always ours; labels and annotations added on the provider are kept.
    """
    desired = remote_pod(local, opts)
    current_meta = remote.get("metadata") or {}
    current_annotations = current_meta.get("annotations") or {}
    metadata: dict[str, Any] = {}
    labels = _map_patch(
        current_meta.get("labels") or {},
        desired["metadata"]["labels"],
        current_annotations.get(lbl.REFLECTED_LABELS, ""),
    )
    if labels:
        metadata["labels"] = labels
    annotations = _map_patch(
        current_annotations,
        desired["metadata"]["annotations"],
        current_annotations.get(lbl.REFLECTED_ANNOTATIONS, ""),
    )
    if annotations:
        metadata["annotations"] = annotations
    patch: dict[str, Any] = {}
    if metadata:
        patch["metadata"] = metadata
    spec = _spec_patch(remote.get("spec") or {}, desired["spec"])
    if spec:
        patch["spec"] = spec
    return patch or None


_UNREAD_METADATA = frozenset({"resourceVersion", "managedFields"})


def matters_to_twin_sync(
    change_type: str,
    old: Mapping[str, Any] | None,
    new: Mapping[str, Any] | None,
    *,
    unread_spec: frozenset[str] = frozenset(),
) -> bool:
    """Whether a change of a consumer pod or of its twin can change what the twin sync
    (:func:`remote_pod`, :func:`remote_pod_update`, deleting) does: an addition, a deletion, or a
    change of the metadata (its resource version aside) or of the spec outside ``unread_spec``.
    A change of the status alone cannot: the twin sync never reads a twin's status, and a consumer
    pod's only while its twin is missing, which the twin's own addition or deletion wakes it for.
    A pod's way to Running is four such changes (the twin bound and Running, the consumer pod's
    status written back): each forged the twin again only to find nothing to patch (issue 15).
    Pure."""
    if change_type != "MODIFIED" or old is None or new is None:
        return True
    old_meta, new_meta = old.get("metadata") or {}, new.get("metadata") or {}
    for key in old_meta.keys() | new_meta.keys():
        if key not in _UNREAD_METADATA and old_meta.get(key) != new_meta.get(key):
            return True
    old_spec, new_spec = old.get("spec") or {}, new.get("spec") or {}
    for key in old_spec.keys() | new_spec.keys():
        if key not in unread_spec and old_spec.get(key) != new_spec.get(key):
            return True
    return False
