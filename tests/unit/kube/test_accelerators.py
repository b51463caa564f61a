"""Which resources are devices, slices or shares of GPUs, and what they weigh in whole GPUs."""

from __future__ import annotations

from decimal import Decimal

from kube.accelerators import (
    closest,
    dra_class,
    dra_resource,
    gpu_equivalent,
    is_accelerator,
    is_device,
    is_share,
    lead_resource,
    mig_profile,
    short_name,
)


def test_devices_and_shares() -> None:
    for device in ("nvidia.com/gpu", "nvidia.com/gpu.shared", "nvidia.com/mig-1g.10gb",
                   "nvidia.com/mig-1g.10gb+me", "cnvrg.io/metagpu", "amd.com/gpu"):
        assert is_device(device) and is_accelerator(device) and not is_share(device), device
    for share in ("nvidia.com/gpumem", "nvidia.com/gpucores", "nvidia.com/gpumem-percentage"):
        assert is_share(share) and is_accelerator(share) and not is_device(share), share
    for other in ("cpu", "memory", "pods", "ephemeral-storage", "example.com/fpga", "nvidia.com/mig-8g.10gb",
                  "nvidia.com/gpus"):
        assert not is_accelerator(other), other


def test_mig_profiles() -> None:
    assert mig_profile("nvidia.com/mig-3g.40gb") == "3g.40gb"
    assert mig_profile("nvidia.com/mig-1g.10gb+me") == "1g.10gb+me"
    assert mig_profile("nvidia.com/gpu") is None


def test_gpu_equivalents() -> None:
    assert gpu_equivalent("nvidia.com/gpu", Decimal(3)) == 3
    assert gpu_equivalent("nvidia.com/mig-1g.10gb", Decimal(7)) == 1
    assert gpu_equivalent("nvidia.com/mig-3g.40gb", Decimal(7)) == 3
    assert gpu_equivalent("nvidia.com/gpu.shared", Decimal(8)) == 2
    assert gpu_equivalent("cnvrg.io/metagpu", Decimal(250)) == Decimal("2.5")
    assert gpu_equivalent("nvidia.com/gpumem", Decimal(10000)) == 0


def test_lead_resource_prefers_whole_gpus() -> None:
    assert lead_resource(["cpu", "nvidia.com/gpumem", "nvidia.com/gpu"]) == "nvidia.com/gpu"
    mig = ["nvidia.com/mig-3g.40gb", "nvidia.com/mig-1g.10gb", "cpu"]
    assert lead_resource(mig) == "nvidia.com/mig-1g.10gb"
    assert lead_resource(["cpu", "memory", "nvidia.com/gpumem"]) is None


def test_names_for_people() -> None:
    assert short_name("nvidia.com/mig-1g.10gb") == "mig-1g.10gb" and short_name("cpu") == "cpu"
    assert closest("nvidia.com/gpus", ["nvidia.com/gpu", "cpu"]) == "nvidia.com/gpu"
    assert closest("nvidia.com/tpu-v5", ["nvidia.com/gpu", "cpu"]) is None


def test_dra_devices_are_counted_per_device_class() -> None:
    key = dra_resource("gpu.nvidia.com")
    assert key == "gpu.nvidia.com.deviceclass.resource.k8s.io/devices"
    assert dra_class(key) == "gpu.nvidia.com" and dra_class("nvidia.com/gpu") is None
    assert dra_class(".deviceclass.resource.k8s.io/devices") is None
    assert is_device(key) and gpu_equivalent(key, Decimal(2)) == 2
    assert short_name(key) == "gpu.nvidia.com (DRA)"
