"""What a consumer asks for when it wants slices or shares of GPUs, and how they are shown."""

from __future__ import annotations

import argparse

from peering.cli.common import format_resources
from peering.cli.info_cmd import _accelerators, _claimed, _usage
from peering.cli.peering_cmds import requested_resources
from peering.consumer.builders import with_defaults


def args(**kw: object) -> argparse.Namespace:
    values: dict[str, object] = {"gpus": None, "cpu": None, "memory": None, "pods": 110, "resource": None,
                                 "devices": None}  # fmt: skip
    values.update(kw)
    return argparse.Namespace(**values)


def test_defaults_scale_with_the_part_of_a_gpu_each_slice_is() -> None:
    # 7 MIG 1g instances are one A100's worth: 8 CPUs and 64 GiB, as for one whole GPU
    assert with_defaults({"nvidia.com/mig-1g.10gb": "7"}) == {
        "nvidia.com/mig-1g.10gb": "7", "cpu": "8", "memory": "64Gi", "pods": "110"}
    # 2 x 3g.40gb = 6/7 of a GPU: rounded up
    assert with_defaults({"nvidia.com/mig-3g.40gb": "2"})["cpu"] == "7"
    assert with_defaults({"nvidia.com/gpu.shared": "8"})["memory"] == "128Gi"
    assert with_defaults({"cnvrg.io/metagpu": "50"})["cpu"] == "4"
    # HAMi's memory and cores are not GPUs: only its nvidia.com/gpu counts
    assert with_defaults({"nvidia.com/gpu": "2", "nvidia.com/gpumem": "20000"})["cpu"] == "16"
    assert "cpu" not in with_defaults({"example.com/fpga": "1"})
    assert with_defaults({"nvidia.com/mig-1g.10gb": "7", "cpu": "2"})["cpu"] == "2"  # what is named stays


def test_peer_asks_for_mig_instances_without_whole_gpus() -> None:
    got = requested_resources(args(resource=["nvidia.com/mig-1g.10gb=14"]))
    assert got == {"nvidia.com/mig-1g.10gb": "14", "cpu": "16", "memory": "128Gi", "pods": "110"}
    assert "nvidia.com/gpu" not in got
    hami = requested_resources(args(gpus=1, resource=["nvidia.com/gpumem=10000", "nvidia.com/gpucores=50"]))
    assert hami["nvidia.com/gpu"] == "1" and hami["nvidia.com/gpumem"] == "10000" and hami["cpu"] == "8"


def test_resources_are_shown_accelerators_first() -> None:
    shown = format_resources({"cpu": "8", "nvidia.com/mig-1g.10gb": "7", "pods": "110",
                              "nvidia.com/gpu": "1"})  # fmt: skip
    assert shown == "gpu=1, mig-1g.10gb=7, cpu=8, pods=110"
    assert format_resources({}) == "-" and format_resources(None) == "-"


def test_info_counts_each_accelerator_of_the_grant() -> None:
    granted = {"nvidia.com/mig-1g.10gb": "7", "nvidia.com/gpu.shared": "4", "cpu": "16", "pods": "110"}
    pods = [
        {"spec": {"containers": [{"resources": {"limits": {"nvidia.com/mig-1g.10gb": "2"}}}]},
         "status": {"phase": "Running"}},
        {"spec": {"containers": [{"resources": {"limits": {"nvidia.com/mig-1g.10gb": "3"}}}]},
         "status": {"phase": "Succeeded"}},  # finished: holds nothing
        {"spec": {"containers": [{"resources": {"limits": {"nvidia.com/gpu.shared": "1"}}}]},
         "status": {"phase": "Pending"}},
    ]
    got = _accelerators(granted, pods)
    assert got == {
        "nvidia.com/gpu.shared": {"granted": 4, "used": 1, "free": 3},
        "nvidia.com/mig-1g.10gb": {"granted": 7, "used": 2, "free": 5},
    }
    assert _usage(got) == "gpu.shared 1/4, mig-1g.10gb 2/7"


def test_peer_asks_for_dra_devices_by_device_class() -> None:
    got = requested_resources(args(devices=["gpu.nvidia.com=2"]))
    assert got == {"gpu.nvidia.com.deviceclass.resource.k8s.io/devices": "2", "cpu": "16", "memory": "128Gi",
                   "pods": "110"}  # fmt: skip


def test_info_counts_the_devices_allocated_to_claims() -> None:
    key = "gpu.nvidia.com.deviceclass.resource.k8s.io/devices"
    claims = [
        {"spec": {"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 2}},
            {"name": "any", "firstAvailable": [{"name": "big", "deviceClassName": "gpu.nvidia.com"}]}]}},
         "status": {"allocation": {"devices": {"results": [
             {"request": "gpu", "device": "gpu-0"}, {"request": "gpu", "device": "gpu-1"},
             {"request": "any/big", "device": "gpu-2"}]}}}},
        {"spec": {"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}},
    ]  # fmt: skip
    assert _claimed(claims) == {key: 3}  # the second is not allocated yet
    assert _accelerators({key: "6"}, [], claims) == {key: {"granted": 6, "used": 3, "free": 3}}
