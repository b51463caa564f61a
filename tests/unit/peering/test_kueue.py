"""Kueue objects for borrowed GPUs: a flavor per provider's virtual node, a queue over the grants."""

from __future__ import annotations

from peering.kueue import cluster_queue, resource_flavor


def test_a_flavor_selects_the_providers_virtual_node_and_tolerates_its_taint() -> None:
    flavor = resource_flavor("gpu-farm")
    assert flavor["kind"] == "ResourceFlavor" and flavor["metadata"]["name"] == "gpuferry-gpu-farm"
    assert flavor["spec"]["nodeLabels"] == {"type": "virtual-kubelet", "gpuferry.io/provider": "gpu-farm"}
    assert flavor["spec"]["tolerations"] == [
        {"key": "virtual-node.gpuferry.io/not-allowed", "operator": "Exists", "effect": "NoExecute"}]


def test_the_queue_has_each_grant_as_its_flavors_quota() -> None:
    queue = cluster_queue("gpuferry", {
        "gpu-farm": {"nvidia.com/gpu": "4", "cpu": "32", "memory": "256Gi", "pods": "110"},
        "mig-farm": {"nvidia.com/mig-1g.10gb": "7", "cpu": "8", "memory": "64Gi",
                     "gpu.nvidia.com.deviceclass.resource.k8s.io/devices": "2"},
    })  # fmt: skip
    (group,) = queue["spec"]["resourceGroups"]
    assert group["coveredResources"] == ["nvidia.com/gpu", "nvidia.com/mig-1g.10gb", "cpu", "memory"]
    farm, mig = group["flavors"]
    assert farm == {"name": "gpuferry-gpu-farm", "resources": [
        {"name": "nvidia.com/gpu", "nominalQuota": "4"},
        {"name": "nvidia.com/mig-1g.10gb", "nominalQuota": "0"},
        {"name": "cpu", "nominalQuota": "32"}, {"name": "memory", "nominalQuota": "256Gi"}]}  # fmt: skip
    assert mig["resources"][1] == {"name": "nvidia.com/mig-1g.10gb", "nominalQuota": "7"}
    assert queue["spec"]["namespaceSelector"] == {}
