"""Shared and partitioned GPUs across the peering (issue 18 §1), through the ``gpuferry`` CLI on
the real control planes: the provider's pools advertise MIG instances (``gpu-a100-mig-*``),
time-sliced replicas (``gpu-l4-shared-0``), HAMi's split GPUs with memory and cores
(``gpu-hami-0``) and MetaGPU units (``gpu-metagpu-0``). One slice asks for some of each; pods that
ask in those units land on the right pool; a pod larger than any one node's block, a MIG profile
the provider does not have and a typo get reasons a user can act on; and the consumer's own
identity cannot take a kind of GPU its grant does not cover."""

from __future__ import annotations

import base64
import json

import pytest

from kube.clients import KubeClient
from kube.errors import Forbidden
from kube.objects import NODES, PODS, RESOURCEQUOTAS, SECRETS, RawObject
from kube.quantities import parse_quantity, parse_resource_list
from peering.resources import GPUSLICES

from .clirunner import Cli
from .conftest import NamespaceFactory
from .waiting import wait_for

pytestmark = pytest.mark.integration

SLICE = {
    "nvidia.com/mig-1g.10gb": "4",
    "nvidia.com/mig-3g.40gb": "10",
    "nvidia.com/gpu.shared": "4",
    "nvidia.com/gpumem": "20000",
    "nvidia.com/gpucores": "100",
    "cnvrg.io/metagpu": "100",
}
VIRTUAL_NODE = "gpuferry-gpu-farm"


def peer(cli: Cli) -> list[str]:
    """``gpuferry peer`` ml-eu with gpu-farm, tolerating the HAMi pool's taint (which nodes a slice
    covers is chosen when it is first asked for: a change needs the provider's approval)."""
    return cli.peer_args("--timeout", "60", "--tolerate", "hami.io/vgpu")


def resources(values: dict[str, str]) -> list[str]:
    return [arg for key, value in values.items() for arg in ("--resource", f"{key}={value}")]


def pod(name: str, limits: dict[str, str]) -> RawObject:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "c", "image": "nvcr.io/nvidia/cuda:13.0.0-base-ubuntu24.04",
                                 "resources": {"limits": limits}}]},
    }  # fmt: skip


def running(p: RawObject) -> bool:
    return (p.get("status") or {}).get("phase") == "Running"


async def test_slices_of_gpus_in_every_unit_land_on_their_pool(
    cli: Cli,
    consumer_client: KubeClient,
    provider_client: KubeClient,
    make_namespace: NamespaceFactory,
) -> None:
    # bad input first, each refused by the provider with a reason, and nothing granted
    code, _, err = await cli(*peer(cli), "--resource", "nvidia.com/mig-4g.40gb=1")
    assert code == 3, err
    assert (
        "the provider denied the GPU slice: ResourceNotOffered: no usable node of this provider offers "
        "the MIG profile 4g.40gb (its MIG profiles: 1g.10gb, 2g.20gb, 3g.40gb)"
    ) in err, err
    code, _, err = await cli(*peer(cli), "--gpus", "1", "--resource", "cnvrg.io/metagpus=50")
    assert code == 3, err
    typo = "no usable node of this provider offers cnvrg.io/metagpus (did you mean cnvrg.io/metagpu?)"
    assert typo in err, err

    # one slice in every unit (HAMi's memory and cores go with whole GPUs)
    out = await cli.ok(*peer(cli), "--gpus", "2", *resources(SLICE), "-o", "json")
    result = json.loads(out)
    granted = result["slice"]["granted"]
    assert result["slice"]["phase"] == "Granted", result["slice"]
    # (quantities in canonical form, as Kubernetes writes them: 20000 MiB of gpumem is "20k")
    assert parse_resource_list({k: granted[k] for k in SLICE}) == parse_resource_list(SLICE)
    assert granted["nvidia.com/gpu"] == "2"
    # what goes with them is sized by the part of a GPU each is: 2 + 4/7 + 30/7 + 1 + 1 GPUs
    assert granted["cpu"] == "71" and granted["memory"] == "567Gi"
    gslice = await provider_client.get(GPUSLICES, "ml-eu", "gpuferry-tenant-ml-eu")
    nodes = {n["name"]: n["free"] for n in gslice["status"]["shape"]["nodes"]}
    # HAMi's GPUs with their memory and cores on one node: the node that offers all three
    split = ("nvidia.com/gpu", "nvidia.com/gpumem", "nvidia.com/gpucores")
    assert [parse_quantity(nodes["gpu-hami-0"][k]) for k in split] == [2, 20000, 100]
    assert nodes["gpu-a100-mig-0"]["nvidia.com/mig-3g.40gb"] == "8"
    assert nodes["gpu-l4-shared-0"]["nvidia.com/gpu.shared"] == "4"

    # the virtual node advertises every unit, and says where one pod can get how much
    node = await wait_for(
        consumer_client, NODES, VIRTUAL_NODE,
        lambda n: n["status"]["capacity"].get("nvidia.com/mig-3g.40gb") == "10",
    )  # fmt: skip
    advertised = {k: node["status"]["allocatable"][k] for k in SLICE}
    assert parse_resource_list(advertised) == parse_resource_list(SLICE)
    block = json.loads(node["metadata"]["annotations"]["gpuferry.io/largest-block"])
    assert block["nvidia.com/mig-3g.40gb"] == "8" and block["nvidia.com/gpu.shared"] == "4"

    # info shows each, granted and used
    info = json.loads(await cli.ok("info", "--kubeconfig", cli.c, "-o", "json"))
    (provider,) = info["providers"]
    assert provider["accelerators"]["nvidia.com/mig-1g.10gb"] == {"granted": 4, "used": 0, "free": 4}
    assert provider["accelerators"]["cnvrg.io/metagpu"] == {"granted": 100, "used": 0, "free": 100}
    table = await cli.ok("info", "--kubeconfig", cli.c)
    assert "mig-3g.40gb 0/10" in table and "gpu.shared 0/4" in table, table

    # the ML engineer's pods, each in the unit it needs, land on their pool
    ns = await make_namespace(consumer_client)
    await cli.ok("offload", "namespace", ns, "--kubeconfig", cli.c, "-q")
    wanted = {
        "mig": ({"nvidia.com/mig-1g.10gb": "1"}, "gpu-a100-mig-"),
        "timesliced": ({"nvidia.com/gpu.shared": "1"}, "gpu-l4-shared-0"),
        "hami": ({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "10000", "nvidia.com/gpucores": "50"},
                 "gpu-hami-0"),
        "metagpu": ({"cnvrg.io/metagpu": "50"}, "gpu-metagpu-0"),
    }  # fmt: skip
    for name, (limits, _) in wanted.items():
        await consumer_client.create(PODS, pod(name, limits), ns)
    twin_ns = f"{ns}-ml-eu"
    for name, (_, pool) in wanted.items():
        await wait_for(consumer_client, PODS, name, running, namespace=ns, timeout=60)
        twin = await provider_client.get(PODS, name, twin_ns)
        assert twin["spec"]["nodeName"].startswith(pool), (name, twin["spec"]["nodeName"])
    info = json.loads(await cli.ok("info", "--kubeconfig", cli.c, "-o", "json"))
    used = info["providers"][0]["accelerators"]
    assert used["nvidia.com/gpumem"] == {"granted": 20000, "used": 10000, "free": 10000}
    assert used["cnvrg.io/metagpu"]["used"] == 50

    # larger than any one node's block: the virtual node takes it (10 granted), the reason says why
    # it cannot run (no provider node has 9 free)
    await consumer_client.create(PODS, pod("too-big", {"nvidia.com/mig-3g.40gb": "9"}), ns)
    big = await wait_for(consumer_client, PODS, "too-big",
                         lambda p: "largest free block" in (p.get("status") or {}).get("message", ""),
                         namespace=ns, timeout=60)  # fmt: skip
    assert big["status"]["reason"] == "ProviderCapacity", big["status"]
    assert (
        "pod needs 9 nvidia.com/mig-3g.40gb but the largest free block on any provider node is 8"
        in big["status"]["message"]
    )

    # the consumer's own identity: the kinds of GPU its grant does not cover are limited to 0
    quota = await provider_client.get(RESOURCEQUOTAS, "gpuferry-grant", twin_ns)
    assert quota["spec"]["hard"]["requests.nvidia.com/mig-2g.20gb"] == "0"
    secret = await consumer_client.get(SECRETS, "gpuferry-identity-gpu-farm", "gpuferry-system")
    async with KubeClient.from_kubeconfig_data(base64.b64decode(secret["data"]["kubeconfig"])) as me:
        with pytest.raises(Forbidden, match=r"exceeded quota.*requests\.nvidia\.com/mig-2g\.20gb"):
            await me.create(PODS, pod("not-granted", {"nvidia.com/mig-2g.20gb": "1"}), twin_ns)
        with pytest.raises(Forbidden, match="exceeded quota"):
            await me.create(PODS, pod("more-than-granted", {"nvidia.com/gpu.shared": "4"}), twin_ns)

