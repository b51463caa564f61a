"""Kubernetes objects as raw JSON dicts, their keys, and the resources they live in.

Objects stay plain ``dict`` values decoded with orjson (see ARCHITECTURE.md, "Measured here"):
nothing on a hot path goes through kubernetes-asyncio's generated models. :class:`Resource`
names an API resource and builds its URL paths; :class:`ObjectKey` is the ``namespace/name``
that queues, caches and logs use.
"""

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeVar

import orjson

__all__ = [
    "CLUSTERROLEBINDINGS",
    "CLUSTERROLES",
    "CONFIGMAPS",
    "CRDS",
    "CSRS",
    "DAEMONSETS",
    "DEPLOYMENTS",
    "DEVICECLASSES",
    "ENDPOINTSLICES",
    "EVENTS",
    "FOREIGNCLUSTERS",
    "GPUSLICES",
    "JOBS",
    "LEASES",
    "LIMITRANGES",
    "MUTATINGADMISSIONPOLICIES",
    "MUTATINGADMISSIONPOLICYBINDINGS",
    "NAMESPACEOFFLOADINGS",
    "NAMESPACES",
    "NODES",
    "PEERNETWORKS",
    "PODS",
    "RESOURCECLAIMS",
    "RESOURCECLAIMTEMPLATES",
    "RESOURCEQUOTAS",
    "RESOURCESLICES",
    "ROLEBINDINGS",
    "ROLES",
    "SECRETS",
    "SELFSUBJECTREVIEWS",
    "SERVICEACCOUNTS",
    "SERVICECIDRS",
    "SERVICES",
    "TENANTS",
    "VALIDATINGADMISSIONPOLICIES",
    "VALIDATINGADMISSIONPOLICYBINDINGS",
    "VIRTUALNODES",
    "ObjectKey",
    "RawObject",
    "Resource",
    "annotations",
    "copy_json",
    "labels",
    "meta",
    "resource_version",
    "uid",
]

RawObject = dict[str, Any]
"""A Kubernetes object (or list, or Status) exactly as decoded from the API server's JSON."""


class ObjectKey(NamedTuple):
    """Where an object lives: its namespace (``None`` for cluster-scoped objects) and name."""

    namespace: str | None
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}" if self.namespace else self.name

    @classmethod
    def of(cls, obj: Mapping[str, Any]) -> "ObjectKey":
        """The key of a raw object, read from its ``metadata``."""
        md = obj.get("metadata") or {}
        return cls(md.get("namespace") or None, md["name"])

    @classmethod
    def parse(cls, text: str) -> "ObjectKey":
        """The inverse of ``str(key)``: ``"ns/name"`` or ``"name"``."""
        namespace, sep, name = text.partition("/")
        return cls(namespace, name) if sep else cls(None, namespace)


@dataclass(frozen=True)
class Resource:
    """An API resource: ``group`` is ``""`` for the core group."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool

    @property
    def api_version(self) -> str:
        """``v1`` for the core group, ``group/version`` otherwise."""
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def base(self) -> str:
        """The path of the group-version: ``/api/v1`` or ``/apis/group/version``."""
        return f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"

    def path(
        self, namespace: str | None = None, name: str | None = None, subresource: str | None = None
    ) -> str:
        """The URL path of the collection (no name) or of one object, optionally a subresource.

        A namespaced resource without a namespace addresses the collection across all namespaces.
        """
        if subresource is not None and name is None:
            raise ValueError(f"subresource {subresource!r} of {self.plural} needs an object name")
        if namespace is not None and not self.namespaced:
            raise ValueError(f"{self.plural} are cluster-scoped: no namespace ({namespace!r})")
        parts = [self.base]
        if namespace is not None:
            parts.append(f"namespaces/{namespace}")
        parts.append(self.plural)
        if name is not None:
            if not name:
                raise ValueError(f"empty name for {self.plural}")
            parts.append(name)
        if subresource is not None:
            parts.append(subresource)
        return "/".join(parts)

    def __str__(self) -> str:
        return f"{self.plural}.{self.group}" if self.group else self.plural


PODS = Resource("", "v1", "pods", "Pod", namespaced=True)
NODES = Resource("", "v1", "nodes", "Node", namespaced=False)
NAMESPACES = Resource("", "v1", "namespaces", "Namespace", namespaced=False)
EVENTS = Resource("", "v1", "events", "Event", namespaced=True)
CONFIGMAPS = Resource("", "v1", "configmaps", "ConfigMap", namespaced=True)
SECRETS = Resource("", "v1", "secrets", "Secret", namespaced=True)
SERVICES = Resource("", "v1", "services", "Service", namespaced=True)
SERVICEACCOUNTS = Resource("", "v1", "serviceaccounts", "ServiceAccount", namespaced=True)
RESOURCEQUOTAS = Resource("", "v1", "resourcequotas", "ResourceQuota", namespaced=True)
LEASES = Resource("coordination.k8s.io", "v1", "leases", "Lease", namespaced=True)
ENDPOINTSLICES = Resource("discovery.k8s.io", "v1", "endpointslices", "EndpointSlice", namespaced=True)
CSRS = Resource(
    "certificates.k8s.io", "v1", "certificatesigningrequests", "CertificateSigningRequest", namespaced=False
)
JOBS = Resource("batch", "v1", "jobs", "Job", namespaced=True)
CRDS = Resource(
    "apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition", namespaced=False
)

DEPLOYMENTS = Resource("apps", "v1", "deployments", "Deployment", namespaced=True)
DAEMONSETS = Resource("apps", "v1", "daemonsets", "DaemonSet", namespaced=True)
SERVICECIDRS = Resource("networking.k8s.io", "v1", "servicecidrs", "ServiceCIDR", namespaced=False)
LIMITRANGES = Resource("", "v1", "limitranges", "LimitRange", namespaced=True)
RESOURCESLICES = Resource("resource.k8s.io", "v1", "resourceslices", "ResourceSlice", namespaced=False)
RESOURCECLAIMS = Resource("resource.k8s.io", "v1", "resourceclaims", "ResourceClaim", namespaced=True)
RESOURCECLAIMTEMPLATES = Resource(
    "resource.k8s.io", "v1", "resourceclaimtemplates", "ResourceClaimTemplate", namespaced=True
)
DEVICECLASSES = Resource("resource.k8s.io", "v1", "deviceclasses", "DeviceClass", namespaced=False)
ROLES = Resource("rbac.authorization.k8s.io", "v1", "roles", "Role", namespaced=True)
ROLEBINDINGS = Resource("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding", namespaced=True)
CLUSTERROLES = Resource("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", namespaced=False)
CLUSTERROLEBINDINGS = Resource(
    "rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding", namespaced=False
)
SELFSUBJECTREVIEWS = Resource(
    "authentication.k8s.io", "v1", "selfsubjectreviews", "SelfSubjectReview", namespaced=False
)
MUTATINGADMISSIONPOLICIES = Resource(
    "admissionregistration.k8s.io",
    "v1",
    "mutatingadmissionpolicies",
    "MutatingAdmissionPolicy",
    namespaced=False,
)
MUTATINGADMISSIONPOLICYBINDINGS = Resource(
    "admissionregistration.k8s.io",
    "v1",
    "mutatingadmissionpolicybindings",
    "MutatingAdmissionPolicyBinding",
    namespaced=False,
)
VALIDATINGADMISSIONPOLICIES = Resource(
    "admissionregistration.k8s.io",
    "v1",
    "validatingadmissionpolicies",
    "ValidatingAdmissionPolicy",
    namespaced=False,
)
VALIDATINGADMISSIONPOLICYBINDINGS = Resource(
    "admissionregistration.k8s.io",
    "v1",
    "validatingadmissionpolicybindings",
    "ValidatingAdmissionPolicyBinding",
    namespaced=False,
)

# gpuferry's own kinds (charts/gpuferry/crds): one vocabulary that vk, peering and netfabric share
FOREIGNCLUSTERS = Resource(
    "core.gpuferry.io", "v1alpha1", "foreignclusters", "ForeignCluster", namespaced=False
)
TENANTS = Resource("core.gpuferry.io", "v1alpha1", "tenants", "Tenant", namespaced=True)
GPUSLICES = Resource("sharing.gpuferry.io", "v1alpha1", "gpuslices", "GPUSlice", namespaced=True)
VIRTUALNODES = Resource("offloading.gpuferry.io", "v1alpha1", "virtualnodes", "VirtualNode", namespaced=True)
NAMESPACEOFFLOADINGS = Resource(
    "offloading.gpuferry.io", "v1alpha1", "namespaceoffloadings", "NamespaceOffloading", namespaced=True
)
PEERNETWORKS = Resource("net.gpuferry.io", "v1alpha1", "peernetworks", "PeerNetwork", namespaced=True)


def meta(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The object's ``metadata`` (an empty dict when it has none)."""
    md = obj.get("metadata")
    return md if isinstance(md, dict) else {}


def uid(obj: Mapping[str, Any]) -> str | None:
    """``metadata.uid``, or ``None`` for an object not yet created."""
    value = meta(obj).get("uid")
    return str(value) if value else None


def resource_version(obj: Mapping[str, Any]) -> str | None:
    """``metadata.resourceVersion``: opaque, compare only for equality."""
    value = meta(obj).get("resourceVersion")
    return str(value) if value else None


def labels(obj: Mapping[str, Any]) -> dict[str, str]:
    """``metadata.labels`` (an empty dict when unset)."""
    return dict(meta(obj).get("labels") or {})


def annotations(obj: Mapping[str, Any]) -> dict[str, str]:
    """``metadata.annotations`` (an empty dict when unset)."""
    return dict(meta(obj).get("annotations") or {})


J = TypeVar("J")


def copy_json(value: J) -> J:
    """A deep copy of a JSON value (what the API server sends: dicts with string keys, lists,
    strings, numbers, booleans, None), through orjson: ~5 µs for a pod's spec against ~33 µs
    with ``copy.deepcopy``, which walks it in Python (issue 15). Tuples come back as lists."""
    copied: J = orjson.loads(orjson.dumps(value))
    return copied
