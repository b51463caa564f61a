"""The real node's configuration (hack/localcluster/nodeconfig.py, network.py, addons.py) and the
machine check of realnode.py: pure, no cluster."""

from __future__ import annotations

import ipaddress
import os
import shutil
import subprocess
import tomllib
import uuid
from pathlib import Path

import pytest

from hack.localcluster import addons
from hack.localcluster.network import host_nft_script, host_nft_table, local_network, node_nft_script
from hack.localcluster.nodeconfig import (
    NodePaths,
    cgroup_root,
    cluster_dns_ip,
    cni_config,
    containerd_config,
    kube_proxy_config,
    kubelet_config,
    node_labels,
)
from hack.localcluster.nodes import node_manifest
from hack.localcluster.realnode import missing_prerequisites
from hack.localcluster.spec import (
    PROFILE_PORT_BASES,
    REAL_NODE_LABEL,
    ClusterSpec,
    NodeSpec,
    cluster_specs,
    second_provider_spec,
)


def _all_specs(tmp_path: Path) -> list[ClusterSpec]:
    specs = []
    for profile in PROFILE_PORT_BASES:
        specs += [*cluster_specs(profile, tmp_path).values(), second_provider_spec(profile, tmp_path)]
    return specs


def test_every_cluster_has_a_real_node_on_a_range_no_simulated_node_uses(tmp_path: Path) -> None:
    for spec in _all_specs(tmp_path):
        assert spec.real_node is not None
        real = ipaddress.ip_network(spec.real_node.pod_cidr)
        assert real.subnet_of(ipaddress.ip_network(spec.pod_cidr))
        for node in spec.nodes:
            assert node.pod_cidr is None or not real.overlaps(ipaddress.ip_network(node.pod_cidr))
        assert ipaddress.ip_address("10.244.0.2") not in real  # the gateway's pod IP


def test_no_two_real_nodes_of_any_profiles_share_a_pod_range(tmp_path: Path) -> None:
    """The host routes each real node's pod range to it (a control plane reaches its node's
    pods: a kubelet API, a webhook served from a pod); two profiles up at once, the demo and the
    tests, each reach their own only if no range is routed twice (2026-11-28: with the demo up,
    the tests' kubectl logs through a virtual kubelet's pod hung until the test timed out)."""
    ranges = [ipaddress.ip_network(s.real_node.pod_cidr) for s in _all_specs(tmp_path) if s.real_node]
    assert len(ranges) == 3 * len(PROFILE_PORT_BASES)
    for i, one in enumerate(ranges):
        assert not any(one.overlaps(other) for other in ranges[i + 1 :]), one


def test_profiles_have_their_own_wan_and_names_fit_the_kernel(tmp_path: Path) -> None:
    specs = _all_specs(tmp_path)
    wans: dict[str, str] = {}
    for spec in specs:
        net = local_network(spec)
        profile = spec.run_dir.parent.name
        assert wans.setdefault(profile, net.wan_cidr) == net.wan_cidr
        wan = ipaddress.ip_network(net.wan_cidr)
        addresses = [net.host_address, net.node_address, net.wan_address]
        assert all(ipaddress.ip_address(a) in wan for a in addresses), addresses
        assert len(set(addresses)) == 3
        for interface in (net.host_link, net.node_wan_port):
            assert len(interface) <= 15, interface  # IFNAMSIZ
    assert len(set(wans.values())) == len(wans), "two profiles share a WAN: the host would route both"
    nodes = [local_network(s).node_address for s in specs]
    assert len(set(nodes)) == len(nodes)
    roots = [cgroup_root(s) for s in specs]
    assert len(set(roots)) == len(roots), "two nodes would share a cgroup subtree"


def test_containerd_keeps_everything_under_the_node_folder(tmp_path: Path) -> None:
    paths = NodePaths(tmp_path / "node")
    config = tomllib.loads(
        containerd_config(paths, cni_bin_dir=Path("/cni"), sandbox_image="gpuferry.local/pause:1")
    )
    assert config["version"] == 3 and config["imports"] == []
    for key in ("root", "state"):
        assert config[key].startswith(str(paths.root))
    assert config["grpc"]["address"] == str(paths.containerd_socket)
    plugins = config["plugins"]
    assert plugins["io.containerd.cri.v1.images"]["pinned_images"]["sandbox"] == "gpuferry.local/pause:1"
    runtime = plugins["io.containerd.cri.v1.runtime"]
    assert runtime["restrict_oom_score_adj"] is True  # root here lacks CAP_SYS_RESOURCE
    assert runtime["netns_mounts_under_state_dir"] is True
    assert runtime["containerd"]["runtimes"]["runc"]["options"]["Root"].startswith(str(paths.root))
    assert runtime["cni"] == {"bin_dirs": ["/cni"], "conf_dir": str(paths.cni_conf_dir)}
    assert plugins["io.containerd.nri.v1.nri"]["disable"] is True


def test_kubelet_is_configured_like_a_production_kubelet_for_this_machine(tmp_path: Path) -> None:
    spec = cluster_specs("test", tmp_path)["provider"]
    paths = NodePaths(spec.node_dir)
    config = kubelet_config(
        spec, paths, node_address="172.31.0.12", serving_cert=Path("s.crt"), serving_key=Path("s.key")
    )
    assert config["authentication"]["anonymous"] == {"enabled": False}
    assert config["authentication"]["webhook"] == {"enabled": True}
    assert config["authorization"] == {"mode": "Webhook"}
    assert config["readOnlyPort"] == 0
    assert (config["failCgroupV1"], config["cgroupDriver"]) == (False, "cgroupfs")
    assert config["cgroupRoot"] == cgroup_root(spec)
    assert config["clusterDNS"] == [cluster_dns_ip(spec)] == ["10.96.0.10"]
    assert config["containerRuntimeEndpoint"] == f"unix://{paths.containerd_socket}"
    assert config["podLogsDir"].startswith(str(spec.node_dir))
    assert config["imageGCHighThresholdPercent"] == 100  # imported images cannot be pulled again
    assert config["registerWithTaints"] == [{"key": REAL_NODE_LABEL, "value": "true", "effect": "NoSchedule"}]
    # the chart's gateway pod sets these in its own network namespace
    assert config["allowedUnsafeSysctls"] == ["net.ipv4.ip_forward", "net.ipv4.conf.*"]
    assert spec.real_node is not None
    labels = node_labels(spec.real_node)
    assert labels[REAL_NODE_LABEL] == "true" and labels["nvidia.com/gpu.count"] == "2"
    assert not [k for k in labels if k.split("/")[0].endswith(("kubernetes.io", "k8s.io"))], "NodeRestriction"


def test_pods_get_a_32_each_from_the_node_range(tmp_path: Path) -> None:
    spec = cluster_specs("test", tmp_path)["consumer"]
    assert spec.real_node is not None
    paths = NodePaths(spec.node_dir)
    plugins = cni_config(paths, spec.real_node)["plugins"]
    assert [p["type"] for p in plugins] == ["ptp", "portmap"]
    assert plugins[0]["ipam"]["ranges"] == [[{"subnet": spec.real_node.pod_cidr}]]
    assert plugins[0]["ipam"]["dataDir"] == str(paths.cni_ipam_dir)
    assert plugins[1]["backend"] == "nftables"
    proxy = kube_proxy_config(spec, paths, spec.real_node, node_address="172.31.0.11")
    assert proxy["mode"] == "nftables" and proxy["clusterCIDR"] == spec.pod_cidr
    assert proxy["conntrack"]["maxPerCore"] == 0  # nf_conntrack_max is not writable from a netns


def test_dns_service_is_where_the_kubelet_sends_pods(tmp_path: Path) -> None:
    spec = cluster_specs("test", tmp_path)["consumer"]
    objects = addons.coredns(spec, "gpuferry.local/coredns:1") + addons.metrics_server("gpuferry.local/ms:1")
    by_kind = {(o["kind"], o["metadata"]["name"]): o for o in objects}
    assert by_kind[("Service", "kube-dns")]["spec"]["clusterIP"] == cluster_dns_ip(spec)
    for name, image in (("coredns", "gpuferry.local/coredns:1"), ("metrics-server", "gpuferry.local/ms:1")):
        pod = by_kind[("Deployment", name)]["spec"]["template"]["spec"]
        assert pod["nodeSelector"] == {REAL_NODE_LABEL: "true"}
        assert pod["containers"][0]["image"] == image
        assert pod["containers"][0]["imagePullPolicy"] == "Never"
    ms = by_kind[("Deployment", "metrics-server")]["spec"]["template"]["spec"]
    assert ms["hostNetwork"] is True  # the API server on the host reaches it at the node's address
    assert by_kind[("Deployment", "metrics-server")]["spec"]["strategy"]["rollingUpdate"]["maxSurge"] == 0
    # every node but kwok's (127.0.0.1 there is the real kubelet): virtual nodes give kubectl top
    assert "--node-selector=type!=kwok" in ms["containers"][0]["args"]
    assert node_manifest(NodeSpec("gpu-0", cpu="8", memory="64Gi"))["metadata"]["labels"]["type"] == "kwok"
    assert "forward" not in by_kind[("ConfigMap", "coredns")]["data"]["Corefile"]


PROC_FILESYSTEMS = "nodev\tsysfs\nnodev\ttmpfs\n\text4\nnodev\toverlay\n"
ALL_TOOLS = {"runc": True, "nsenter": True, "nft": True, "ip": True}


def test_a_machine_with_everything_lacks_nothing() -> None:
    hierarchies = [Path("/sys/fs/cgroup/memory"), Path("/sys/fs/cgroup/cpu")]
    assert missing_prerequisites(filesystems=PROC_FILESYSTEMS, found=ALL_TOOLS, cgroups=hierarchies) == []


def test_what_a_machine_lacks_is_named_with_what_to_do() -> None:
    problems = missing_prerequisites(
        filesystems=PROC_FILESYSTEMS.replace("overlay", "fuse"),
        found={**ALL_TOOLS, "runc": False},
        cgroups=[],
    )
    assert problems == [
        "runc is not installed: install Debian's runc (make setup does)",
        "the kernel has no overlay filesystem, which containerd's snapshotter needs: "
        "load the overlay module (modprobe overlay) or use a kernel built with it",
        "no cgroup hierarchy is mounted under /sys/fs/cgroup: the kubelet and runc need one",
    ]
    assert missing_prerequisites(
        filesystems=PROC_FILESYSTEMS, found=ALL_TOOLS, cgroups=[Path("/sys/fs/cgroup/cpu")]
    ) == ["no memory cgroup controller is mounted: the kubelet needs it"]


@pytest.mark.skipif(
    not (os.geteuid() == 0 and shutil.which("nft") and shutil.which("ip")) and not os.environ.get("CI"),
    reason="needs root, ip and nft (runs in CI)",
)
def test_node_masquerade_table_loads_in_real_nftables(tmp_path: Path) -> None:
    spec = cluster_specs("test", tmp_path)["consumer"]
    assert spec.real_node is not None
    script = node_nft_script(local_network(spec), spec.real_node.pod_cidr)
    netns = f"gfunit-{uuid.uuid4().hex[:6]}"
    subprocess.run(["ip", "netns", "add", netns], check=True)
    try:
        for _ in range(2):  # applying it again replaces the table: one chain, one rule
            subprocess.run(
                ["ip", "netns", "exec", netns, "nft", "-f", "-"], input=script, text=True, check=True
            )
        listed = subprocess.run(
            ["ip", "netns", "exec", netns, "nft", "list", "table", "ip", "gpuferry-node"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert listed.count("masquerade") == 1
        assert (
            f'oifname "wan" ip saddr {spec.real_node.pod_cidr} ip daddr != {spec.real_node.pod_cidr}'
            in listed
        )
    finally:
        subprocess.run(["ip", "netns", "del", netns], check=False)


@pytest.mark.skipif(
    not (os.geteuid() == 0 and shutil.which("nft") and shutil.which("ip")) and not os.environ.get("CI"),
    reason="needs root, ip and nft (runs in CI)",
)
def test_host_guard_table_drops_wan_to_wan_forwarding(tmp_path: Path) -> None:
    """The host routes each node's pods (the control plane reaches them) but never forwards from
    the WAN back to it: no path from one cluster's pods to another's."""
    net = local_network(cluster_specs("test", tmp_path)["consumer"])
    netns = f"gfunit-{uuid.uuid4().hex[:6]}"
    subprocess.run(["ip", "netns", "add", netns], check=True)
    try:
        for _ in range(2):  # applied again: replaced, not doubled
            subprocess.run(
                ["ip", "netns", "exec", netns, "nft", "-f", "-"],
                input=host_nft_script(net),
                text=True,
                check=True,
            )
        listed = subprocess.run(
            ["ip", "netns", "exec", netns, "nft", "list", "table", "inet", host_nft_table(net)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert listed.count(" drop") == 1
        assert f'iifname "{net.host_link}" oifname "{net.host_link}" drop' in listed
        assert "hook forward" in listed
    finally:
        subprocess.run(["ip", "netns", "del", netns], check=False)
