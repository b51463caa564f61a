"""Dynamic Resource Allocation objects for simulated GPU nodes. Pure.

kwok runs no DRA driver, so the local provider publishes what NVIDIA's DRA driver
(``gpu.nvidia.com``) would: a ``DeviceClass`` selecting its GPUs, and per node a ``ResourceSlice``
whose devices carry the attributes and capacity the driver names (``productName``,
``architecture``, ``cudaComputeCapability``, ``index``, ``uuid``…, capacity ``memory``). The
scheduler then allocates those devices to ResourceClaims by CEL, exactly as it would with the
driver; nothing prepares them (kwok's pods run nothing).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

__all__ = ["DRA_DRIVER", "DraGpus", "device_class", "resource_slice"]

DRA_DRIVER = "gpu.nvidia.com"
"""NVIDIA's DRA driver, which also names its DeviceClass for whole GPUs."""
_UUIDS = uuid.UUID("0b8c6f4e-6d1f-4d0e-9a53-8f3a1c2b7d90")
_API = "resource.k8s.io/v1"


@dataclass(frozen=True)
class DraGpus:
    """The GPUs of one node as the DRA driver publishes them."""

    count: int
    product: str
    """``productName`` as nvidia-smi says it (``NVIDIA H100 80GB HBM3``)."""
    memory: str
    """Capacity ``memory`` of each (``80Gi``)."""
    architecture: str
    compute_capability: str
    """``cudaComputeCapability`` as a semantic version (``9.0.0``)."""


def device_class() -> dict[str, Any]:
    """The DeviceClass of whole GPUs, as the driver's chart installs it."""
    expression = f"device.driver == '{DRA_DRIVER}' && device.attributes['{DRA_DRIVER}'].type == 'gpu'"
    return {
        "apiVersion": _API,
        "kind": "DeviceClass",
        "metadata": {"name": DRA_DRIVER},
        "spec": {"selectors": [{"cel": {"expression": expression}}]},
    }


def resource_slice(node: str, gpus: DraGpus) -> dict[str, Any]:
    """The node's ResourceSlice: one pool named after the node, one device per GPU."""
    devices = [
        {
            "name": f"gpu-{index}",
            "attributes": {
                "type": {"string": "gpu"},
                "index": {"int": index},
                "minor": {"int": index},
                "uuid": {"string": f"GPU-{uuid.uuid5(_UUIDS, f'{node}/{index}')}"},
                "productName": {"string": gpus.product},
                "brand": {"string": "Nvidia"},
                "architecture": {"string": gpus.architecture},
                "cudaComputeCapability": {"version": gpus.compute_capability},
                "driverVersion": {"version": "580.159.4"},
                "cudaDriverVersion": {"version": "13.0.0"},
            },
            "capacity": {"memory": {"value": gpus.memory}},
        }
        for index in range(gpus.count)
    ]
    return {
        "apiVersion": _API,
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{DRA_DRIVER}"},
        "spec": {
            "driver": DRA_DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }
