"""Accelerator resources: which extended resources are GPUs, slices of GPUs or shares of them. Pure.

The GPUs people lend are rarely whole ``nvidia.com/gpu`` only. What a node advertises depends on
how its GPUs are shared:

========================  ==========================================  ==========================
resource                  who advertises it                           one unit is
========================  ==========================================  ==========================
``nvidia.com/gpu``        NVIDIA's device plugin (also time-sliced    a GPU (or a replica of one
                          with ``renameByDefault: false``, and HAMi)  when shared)
``nvidia.com/gpu.shared`` the device plugin, time-slicing or MPS with  a replica of a GPU
                          ``renameByDefault: true``
``nvidia.com/mig-<p>``    the device plugin, MIG ``mixed`` strategy   a MIG instance of profile
                          (``mig-1g.10gb``, ``mig-3g.40gb``…)         ``<p>`` (``<g>``/7 of a GPU)
``cnvrg.io/metagpu``      MetaGPU                                     1/100 of a GPU
``nvidia.com/gpumem``,    HAMi, beside ``nvidia.com/gpu``             MiB of GPU memory, % of
``nvidia.com/gpucores``                                               a GPU's cores
========================  ==========================================  ==========================

GPUs handed out by a DRA driver are not an extended resource: a slice asks for a number of devices
of a ``DeviceClass``, under the name ResourceQuota gives them,
``<class>.deviceclass.resource.k8s.io/devices`` (:func:`dra_resource`; one unit is a device,
counted as a GPU).

*Devices* (:func:`is_device`) are what a slice's placement is led by: a grant puts the CPU, memory
and pod slots that go with them on the same provider nodes. *Shares* (:func:`is_share`) are
amounts of a device a pod asks for beside it (HAMi's memory and cores). Both are *accelerator*
resources (:func:`is_accelerator`): ``info`` shows them, and a provider limits every one it offers
by quota, to 0 when not granted.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping
from decimal import Decimal

from .api import GPU_RESOURCE

__all__ = [
    "DEFAULT_REPLICAS",
    "DRA_SUFFIX",
    "GPU_SHARED",
    "HAMI_CORES",
    "HAMI_MEMORY",
    "HAMI_MEMORY_PERCENTAGE",
    "METAGPU",
    "closest",
    "dra_class",
    "dra_resource",
    "gpu_equivalent",
    "is_accelerator",
    "is_device",
    "is_share",
    "lead_resource",
    "mig_profile",
    "short_name",
]

GPU_SHARED = "nvidia.com/gpu.shared"
METAGPU = "cnvrg.io/metagpu"
HAMI_MEMORY = "nvidia.com/gpumem"
HAMI_MEMORY_PERCENTAGE = "nvidia.com/gpumem-percentage"
HAMI_CORES = "nvidia.com/gpucores"

_MIG = re.compile(r"^nvidia\.com/mig-(?P<profile>(?P<slices>[1-7])g\.(?P<memory>[0-9]+)gb(?:\+me)?)$")
_WHOLE_DEVICES = frozenset({GPU_RESOURCE, "amd.com/gpu", "gpu.intel.com/i915", "gpu.intel.com/xe"})
_SHARES = frozenset({HAMI_MEMORY, HAMI_MEMORY_PERCENTAGE, HAMI_CORES})
_MIG_SLICES_PER_GPU = Decimal(7)
_METAGPU_UNITS_PER_GPU = Decimal(100)
DEFAULT_REPLICAS = Decimal(4)
"""Replicas per GPU assumed for ``nvidia.com/gpu.shared`` when sizing defaults (the provider's
``nvidia.com/gpu.replicas`` label says how many it really has)."""


DRA_SUFFIX = ".deviceclass.resource.k8s.io/devices"


def dra_resource(device_class: str) -> str:
    """``gpu.nvidia.com`` → ``gpu.nvidia.com.deviceclass.resource.k8s.io/devices``: devices of a
    DeviceClass, as ResourceQuota counts them (and a GPUSlice asks for them)."""
    return device_class + DRA_SUFFIX


def dra_class(resource: str) -> str | None:
    """The DeviceClass of a :func:`dra_resource` name; None for any other resource."""
    if resource.endswith(DRA_SUFFIX) and len(resource) > len(DRA_SUFFIX):
        return resource[: -len(DRA_SUFFIX)]
    return None


def mig_profile(resource: str) -> str | None:
    """``nvidia.com/mig-3g.40gb`` → ``3g.40gb``; None for anything that is not a MIG instance."""
    match = _MIG.match(resource)
    return match["profile"] if match else None


def is_device(resource: str) -> bool:
    """A resource whose unit is a GPU, a slice or a replica of one (see the module docstring)."""
    return (
        resource in _WHOLE_DEVICES
        or resource in (GPU_SHARED, METAGPU)
        or _MIG.match(resource) is not None
        or dra_class(resource) is not None
    )


def is_share(resource: str) -> bool:
    """An amount of a device a pod asks for beside it (HAMi's ``gpumem``, ``gpucores``)."""
    return resource in _SHARES


def is_accelerator(resource: str) -> bool:
    return is_device(resource) or is_share(resource)


def gpu_equivalent(resource: str, amount: Decimal) -> Decimal:
    """How many whole GPUs ``amount`` of ``resource`` stands for, to size what goes with it
    (a MIG ``3g.40gb`` is 3/7 of a GPU, a MetaGPU unit 1/100); 0 for what is not a device."""
    if resource in _WHOLE_DEVICES or dra_class(resource) is not None:
        return amount
    if resource == GPU_SHARED:
        return amount / DEFAULT_REPLICAS
    if resource == METAGPU:
        return amount / _METAGPU_UNITS_PER_GPU
    match = _MIG.match(resource)
    if match:
        return amount * Decimal(match["slices"]) / _MIG_SLICES_PER_GPU
    return Decimal(0)


def lead_resource(resources: Iterable[str]) -> str | None:
    """The device a placement is led by: ``nvidia.com/gpu`` when asked for, else the first other
    device by name; None when nothing asked for is a device."""
    devices = sorted(r for r in resources if is_device(r))
    if GPU_RESOURCE in devices:
        return GPU_RESOURCE
    return devices[0] if devices else None


def short_name(resource: str) -> str:
    """``nvidia.com/mig-1g.10gb`` → ``mig-1g.10gb``, ``cnvrg.io/metagpu`` → ``metagpu``: for tables."""
    device_class = dra_class(resource)
    if device_class is not None:
        return f"{device_class} (DRA)"
    return resource.rsplit("/", 1)[-1]


def closest(resource: str, offered: Mapping[str, object] | Iterable[str]) -> str | None:
    """The offered resource name ``resource`` was most likely meant to be (a typo), if any."""
    names = sorted(offered)
    found = difflib.get_close_matches(resource, names, n=1, cutoff=0.9)
    return found[0] if found else None
