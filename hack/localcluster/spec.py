"""What a local cluster is made of: ports, CIDRs and simulated nodes. Pure data, no I/O.

Two profiles exist so that the demo and the test suite can run side by side: ``demo`` and
``test`` use different port ranges and run folders.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from .dra import DraGpus

# GPU Feature Discovery labels as GFD derives them from `nvidia-smi` on a real H100 80GB HBM3
# node (driver 580.159.04, CUDA 13.0, compute capability 9.0; see shared/data).
H100_LABELS: dict[str, str] = {
    "nvidia.com/gpu.present": "true",
    "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
    "nvidia.com/gpu.memory": "81559",
    "nvidia.com/gpu.family": "hopper",
    "nvidia.com/gpu.compute.major": "9",
    "nvidia.com/gpu.compute.minor": "0",
    "nvidia.com/cuda.driver-version.major": "580",
    "nvidia.com/cuda.driver-version.minor": "159",
    "nvidia.com/cuda.driver-version.rev": "04",
    "nvidia.com/cuda.runtime-version.major": "13",
    "nvidia.com/cuda.runtime-version.minor": "0",
    "nvidia.com/mig.capable": "true",
    "nvidia.com/gpu.machine": "H100-SXM5-80GB",
}

# A smaller inference part, as GFD labels an NVIDIA L4 (24 GB, Ada Lovelace, compute 8.9).
L4_LABELS: dict[str, str] = {
    "nvidia.com/gpu.present": "true",
    "nvidia.com/gpu.product": "NVIDIA-L4",
    "nvidia.com/gpu.memory": "23034",
    "nvidia.com/gpu.family": "ada-lovelace",
    "nvidia.com/gpu.compute.major": "8",
    "nvidia.com/gpu.compute.minor": "9",
    "nvidia.com/cuda.driver-version.major": "580",
    "nvidia.com/cuda.driver-version.minor": "159",
    "nvidia.com/cuda.driver-version.rev": "04",
    "nvidia.com/cuda.runtime-version.major": "13",
    "nvidia.com/cuda.runtime-version.minor": "0",
    "nvidia.com/mig.capable": "false",
    "nvidia.com/gpu.machine": "g6.12xlarge",
}


@dataclass(frozen=True)
class NodeSpec:
    """One kwok-simulated node."""

    name: str
    cpu: str
    memory: str
    pods: str = "110"
    gpus: int = 0
    gpu_labels: dict[str, str] = field(default_factory=dict)
    pod_cidr: str | None = None
    devices: dict[str, str] = field(default_factory=dict)
    """Other accelerator resources on its status, verbatim (MIG instances, shared replicas,
    HAMi's memory and cores, MetaGPU units), as their device plugins advertise them."""
    taints: tuple[dict[str, str], ...] = ()
    dra: DraGpus | None = None
    """GPUs published as DRA devices (a ResourceSlice of ``gpu.nvidia.com``), not as an extended
    resource: a node's GPUs are handed out by a device plugin or by a DRA driver, never both."""


# An older inference part, as GFD labels an NVIDIA T4 (16 GB, Turing, compute 7.5): the product of
# the provider's real node, distinct from the kwok nodes' so that a slice can select it alone.
T4_LABELS: dict[str, str] = {
    "nvidia.com/gpu.present": "true",
    "nvidia.com/gpu.product": "Tesla-T4",
    "nvidia.com/gpu.memory": "15360",
    "nvidia.com/gpu.family": "turing",
    "nvidia.com/gpu.compute.major": "7",
    "nvidia.com/gpu.compute.minor": "5",
    "nvidia.com/cuda.driver-version.major": "580",
    "nvidia.com/cuda.driver-version.minor": "159",
    "nvidia.com/cuda.driver-version.rev": "04",
    "nvidia.com/cuda.runtime-version.major": "13",
    "nvidia.com/cuda.runtime-version.minor": "0",
    "nvidia.com/mig.capable": "false",
    "nvidia.com/gpu.machine": "g4dn.xlarge",
}

REAL_NODE_LABEL = "gpuferry.io/real-node"
"""Label and taint key of the local clusters' real nodes. The taint (NoSchedule) keeps the pods of
tests written for kwok's fake nodes (images that exist nowhere) off the one node that really
pulls and runs images; real workloads tolerate it and select the node by the label."""


@dataclass(frozen=True)
class RealNodeSpec:
    """The one node of a cluster that runs real containers (containerd + kubelet)."""

    name: str
    pod_cidr: str
    """Its pods' range (CNI host-local), a /24 of the cluster's pod CIDR no kwok node uses."""
    gpus: int = 0
    """``nvidia.com/gpu`` advertised as an extended resource on its status (no device plugin)."""
    gpu_labels: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Ports:
    """Loopback ports of one cluster's components."""

    apiserver: int
    etcd_client: int
    etcd_peer: int
    controller_manager: int
    scheduler: int
    kwok: int

    @classmethod
    def from_base(cls, base: int) -> Ports:
        return cls(
            apiserver=base,
            etcd_client=base + 1,
            etcd_peer=base + 2,
            controller_manager=base + 3,
            scheduler=base + 4,
            kwok=base + 5,
        )

    def all(self) -> dict[str, int]:
        return {
            "kube-apiserver": self.apiserver,
            "etcd (client)": self.etcd_client,
            "etcd (peer)": self.etcd_peer,
            "kube-controller-manager": self.controller_manager,
            "kube-scheduler": self.scheduler,
            "kwok": self.kwok,
        }


@dataclass(frozen=True)
class ClusterSpec:
    """Everything needed to start one cluster; paths derive from ``run_dir``."""

    name: str
    role: str
    ports: Ports
    service_cidr: str
    pod_cidr: str
    nodes: tuple[NodeSpec, ...]
    run_dir: Path
    real_node: RealNodeSpec | None = None
    # serve /debug/pprof on the API server (off as in production; GPUFERRY_APISERVER_PROFILING=1)
    profiling: bool = False

    @property
    def first_service_ip(self) -> str:
        net, _ = self.service_cidr.split("/")
        a, b, c, d = net.split(".")
        return f"{a}.{b}.{c}.{int(d) + 1}"

    @property
    def pki_dir(self) -> Path:
        return self.run_dir / "pki"

    @property
    def log_dir(self) -> Path:
        return self.run_dir / "logs"

    @property
    def pid_dir(self) -> Path:
        return self.run_dir / "pids"

    @property
    def kubeconfig(self) -> Path:
        """The admin kubeconfig (``system:masters``) for this cluster."""
        return self.run_dir / "admin.kubeconfig"

    @property
    def node_dir(self) -> Path:
        """The real node's state: containerd, kubelet, CNI, logs."""
        return self.run_dir / "node"

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.ports.apiserver}"


PROFILE_INDEX = {"test": 0, "demo": 1, "scratch": 2, "dev1": 3, "dev2": 4}
"""Each profile's number: its WAN is 172.31.<n>.0/24 and its real nodes' pod ranges are
10.244.<10 h + 50 n>.0/24 (h: consumer 1, provider 2, provider-b 3). The host joins every
profile's WAN and routes each real node's range to it, so two profiles up at once (the demo and
the tests, or dev1 and dev2 side by side) must not share either."""


def real_node_cidr(profile: str, host: int) -> str:
    """The pod range of the real node of a profile's cluster (``host``: consumer 1, provider 2,
    provider-b 3): inside the clusters' 10.244.0.0/16, apart from the kwok nodes' (10.244.1 to
    10.244.17) and from every other profile's real nodes. Pure."""
    return f"10.244.{10 * host + 50 * PROFILE_INDEX[profile]}.0/24"


PROFILE_PORT_BASES: dict[str, dict[str, int]] = {
    "demo": {"consumer": 16100, "provider": 16200},
    "test": {"consumer": 17100, "provider": 17200},
    # throwaway clusters that tests of the cluster lifecycle itself start and tear down
    "scratch": {"consumer": 18100, "provider": 18200},
    # side-by-side test clusters for developers running suites in parallel
    # (GPUFERRY_TEST_PROFILE=dev1 make test)
    "dev1": {"consumer": 19100, "provider": 19200},
    "dev2": {"consumer": 20100, "provider": 20200},
}


def _gpu_nodes(prefix: str, count: int, gpus: int, labels: dict[str, str], first_cidr: int) -> list[NodeSpec]:
    nodes = []
    for i in range(count):
        node_labels = dict(labels)
        node_labels["nvidia.com/gpu.count"] = str(gpus)
        nodes.append(
            NodeSpec(
                name=f"{prefix}-{i}",
                cpu="96",
                memory="1536Gi" if gpus >= 8 else "192Gi",
                gpus=gpus,
                gpu_labels=node_labels,
                pod_cidr=f"10.244.{first_cidr + i}.0/24",
            )
        )
    return nodes


def provider_nodes() -> tuple[NodeSpec, ...]:
    """4 nodes x 8 H100, 2 nodes x 2 L4, one CPU-only node, and the shared and partitioned GPU
    pools of :func:`sharing_nodes`."""
    nodes = _gpu_nodes("gpu-h100", 4, 8, H100_LABELS, first_cidr=1)
    nodes += _gpu_nodes("gpu-l4", 2, 2, L4_LABELS, first_cidr=5)
    nodes.append(NodeSpec(name="cpu-0", cpu="32", memory="128Gi", pod_cidr="10.244.7.0/24"))
    nodes += sharing_nodes(first_cidr=11)
    nodes += dra_nodes(first_cidr=16)
    return tuple(nodes)


def dra_nodes(first_cidr: int) -> list[NodeSpec]:
    """GPUs under NVIDIA's DRA driver (issue 18 §2): ``gpu-dra-h100-0`` with 4 x H100 80GB and
    ``gpu-dra-l4-0`` with 4 x L4 24GB, published as ResourceSlices (:mod:`.dra`)."""
    h100 = DraGpus(4, "NVIDIA H100 80GB HBM3", "80Gi", "Hopper", "9.0.0")
    l4 = DraGpus(4, "NVIDIA L4", "24Gi", "Ada Lovelace", "8.9.0")
    return [
        NodeSpec(name=f"gpu-dra-{kind}-0", cpu="96", memory="768Gi", pod_cidr=f"10.244.{first_cidr + i}.0/24",
                 dra=gpus)
        for i, (kind, gpus) in enumerate((("h100", h100), ("l4", l4)))
    ]


A100_LABELS: dict[str, str] = {
    **{k: v for k, v in H100_LABELS.items() if not k.startswith("nvidia.com/gpu.")},
    "nvidia.com/gpu.present": "true",
    "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
    "nvidia.com/gpu.memory": "81920",
    "nvidia.com/gpu.family": "ampere",
    "nvidia.com/gpu.compute.major": "8",
    "nvidia.com/gpu.compute.minor": "0",
}

# MIG profiles of an A100 80GB as GFD labels them under the mixed strategy: memory (MiB),
# multiprocessors, and the GPU/compute instance slices each takes.
_A100_MIG_PROFILES: dict[str, tuple[str, str, str]] = {
    "1g.10gb": ("9728", "14", "1"),
    "2g.20gb": ("19968", "28", "2"),
    "3g.40gb": ("40192", "42", "3"),
}
A100_MIG_BALANCED: dict[str, int] = {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}
"""mig-parted's ``all-balanced`` layout of one A100 80GB: instances per profile."""


def _mig_labels(per_gpu: dict[str, int], gpus: int) -> dict[str, str]:
    labels = {
        **A100_LABELS,
        "nvidia.com/mig.strategy": "mixed",
        "nvidia.com/mig.config": "all-balanced",
        "nvidia.com/mig.config.state": "success",
    }
    for profile, count in per_gpu.items():
        memory, multiprocessors, slices = _A100_MIG_PROFILES[profile]
        prefix = f"nvidia.com/mig-{profile}"
        labels |= {
            f"{prefix}.count": str(count * gpus),
            f"{prefix}.memory": memory,
            f"{prefix}.multiprocessors": multiprocessors,
            f"{prefix}.slices.gi": slices,
            f"{prefix}.slices.ci": slices,
        }
    return labels


# Time-slicing with renameByDefault: GFD appends -SHARED to the product and says how.
L4_SHARED_LABELS: dict[str, str] = {
    **L4_LABELS,
    "nvidia.com/gpu.product": "NVIDIA-L4-SHARED",
    "nvidia.com/gpu.replicas": "4",
    "nvidia.com/gpu.sharing-strategy": "time-slicing",
}

A10_LABELS: dict[str, str] = {
    **L4_LABELS,
    "nvidia.com/gpu.product": "NVIDIA-A10",
    "nvidia.com/gpu.memory": "23028",
    "nvidia.com/gpu.family": "ampere",
    "nvidia.com/gpu.compute.major": "8",
    "nvidia.com/gpu.compute.minor": "6",
    "nvidia.com/gpu.machine": "g5.12xlarge",
}
HAMI_NODE_LABEL = "gpu"
"""HAMi's device plugin runs on nodes labelled ``gpu=on``."""
HAMI_TAINT: dict[str, str] = {"key": "hami.io/vgpu", "value": "true", "effect": "NoSchedule"}
"""The HAMi pool's own taint: a pod asking for ``nvidia.com/gpu`` alone would get a tenth of a
GPU there (HAMi splits each into 10), so only what tolerates it lands there."""

L40S_LABELS: dict[str, str] = {
    **L4_LABELS,
    "nvidia.com/gpu.product": "NVIDIA-L40S",
    "nvidia.com/gpu.memory": "46068",
    "nvidia.com/gpu.machine": "g6e.12xlarge",
}


def sharing_nodes(first_cidr: int) -> list[NodeSpec]:
    """GPUs as the sharing and partitioning schemes advertise them (issue 18), one pool each:

    * ``gpu-a100-mig-0``, ``-1``: 8 x A100 80GB each, MIG mixed strategy, all-balanced
      (``nvidia.com/mig-1g.10gb`` 16, ``mig-2g.20gb`` 8, ``mig-3g.40gb`` 8; no whole GPU left);
    * ``gpu-l4-shared-0``: 4 x L4 time-sliced, 4 replicas, renameByDefault
      (``nvidia.com/gpu.shared`` 16);
    * ``gpu-hami-0``: 4 x A10 under HAMi, split 10 ways (``nvidia.com/gpu`` 40, with
      ``nvidia.com/gpumem`` in MiB and ``nvidia.com/gpucores`` in percent of a GPU). HAMi's own
      scheduler extender checks memory and cores per GPU; kwok's nodes have no extender, so they
      are extended resources here, which kube-scheduler counts per node. Tainted
      :data:`HAMI_TAINT`: whole-GPU pods and slices stay off it unless they tolerate it;
    * ``gpu-metagpu-0``: 2 x L40S under MetaGPU, 100 units each (``cnvrg.io/metagpu`` 200).
    """
    mig = [
        NodeSpec(
            name=f"gpu-a100-mig-{i}",
            cpu="96",
            memory="1536Gi",
            gpu_labels={**_mig_labels(A100_MIG_BALANCED, 8), "nvidia.com/gpu.count": "8"},
            pod_cidr=f"10.244.{first_cidr + i}.0/24",
            devices={f"nvidia.com/mig-{p}": str(n * 8) for p, n in A100_MIG_BALANCED.items()},
        )
        for i in range(2)
    ]
    return [
        *mig,
        NodeSpec(
            name="gpu-l4-shared-0",
            cpu="48",
            memory="192Gi",
            gpu_labels={**L4_SHARED_LABELS, "nvidia.com/gpu.count": "4"},
            pod_cidr=f"10.244.{first_cidr + 2}.0/24",
            devices={"nvidia.com/gpu.shared": "16"},
        ),
        NodeSpec(
            name="gpu-hami-0",
            cpu="48",
            memory="192Gi",
            gpus=40,
            gpu_labels={**A10_LABELS, "nvidia.com/gpu.count": "4", HAMI_NODE_LABEL: "on"},
            pod_cidr=f"10.244.{first_cidr + 3}.0/24",
            devices={"nvidia.com/gpumem": str(4 * 23028), "nvidia.com/gpucores": "400"},
            taints=(HAMI_TAINT,),
        ),
        NodeSpec(
            name="gpu-metagpu-0",
            cpu="48",
            memory="384Gi",
            gpu_labels={**L40S_LABELS, "nvidia.com/gpu.count": "2"},
            pod_cidr=f"10.244.{first_cidr + 4}.0/24",
            devices={"cnvrg.io/metagpu": "200"},
        ),
    ]


def second_provider_nodes() -> tuple[NodeSpec, ...]:
    """A second GPU farm for the federation tests: 2 nodes x 4 A100."""
    return tuple(_gpu_nodes("gpu-a100", 2, 4, A100_LABELS, first_cidr=1))


def second_provider_spec(profile: str, run_root: Path | None = None) -> ClusterSpec:
    """A second provider cluster of ``profile`` (ports: the provider's base + 50), started only
    by what needs one (the several-providers tests); same CIDRs as the others, as usual."""
    if profile not in PROFILE_PORT_BASES:
        raise ValueError(f"unknown profile {profile!r}; choose one of {sorted(PROFILE_PORT_BASES)}")
    root = (run_root or default_run_root()) / profile
    return ClusterSpec(
        name="provider-b",
        role="provider",
        ports=Ports.from_base(PROFILE_PORT_BASES[profile]["provider"] + 50),
        service_cidr="10.96.0.0/16",
        pod_cidr="10.244.0.0/16",
        nodes=second_provider_nodes(),
        run_dir=root / "provider-b",
        real_node=RealNodeSpec(name="real-0", pod_cidr=real_node_cidr(profile, 3)),
    )


def consumer_nodes() -> tuple[NodeSpec, ...]:
    """Two CPU-only worker nodes."""
    return tuple(
        NodeSpec(name=f"worker-{i}", cpu="16", memory="64Gi", pod_cidr=f"10.244.{i + 1}.0/24")
        for i in range(2)
    )


def default_run_root() -> Path:
    """Where clusters keep their state: ``$GPUFERRY_RUN_DIR`` or ``<cache>/run``."""
    if env := os.environ.get("GPUFERRY_RUN_DIR"):
        return Path(env)
    return cache_dir() / "run"


def cache_dir() -> Path:
    """The build cache shared with hack/build-k8s.sh: ``$GPUFERRY_CACHE`` or ``~/.cache/gpuferry``."""
    if env := os.environ.get("GPUFERRY_CACHE"):
        return Path(env)
    return Path.home() / ".cache" / "gpuferry"


def cluster_specs(profile: str, run_root: Path | None = None) -> dict[str, ClusterSpec]:
    """The consumer and provider clusters of a profile (``demo`` or ``test``)."""
    if profile not in PROFILE_PORT_BASES:
        raise ValueError(f"unknown profile {profile!r}; choose one of {sorted(PROFILE_PORT_BASES)}")
    root = (run_root or default_run_root()) / profile
    bases = PROFILE_PORT_BASES[profile]
    profiling = os.environ.get("GPUFERRY_APISERVER_PROFILING") == "1"
    return {
        "consumer": ClusterSpec(
            name="consumer",
            role="consumer",
            ports=Ports.from_base(bases["consumer"]),
            service_cidr="10.96.0.0/16",
            pod_cidr="10.244.0.0/16",
            nodes=consumer_nodes(),
            run_dir=root / "consumer",
            real_node=RealNodeSpec(name="real-0", pod_cidr=real_node_cidr(profile, 1)),
            profiling=profiling,
        ),
        "provider": ClusterSpec(
            name="provider",
            role="provider",
            ports=Ports.from_base(bases["provider"]),
            service_cidr="10.96.0.0/16",
            pod_cidr="10.244.0.0/16",
            nodes=provider_nodes(),
            run_dir=root / "provider",
            real_node=RealNodeSpec(
                name="real-0", pod_cidr=real_node_cidr(profile, 2), gpus=2,
                gpu_labels={**T4_LABELS, "nvidia.com/gpu.count": "2"},
            ),
            profiling=profiling,
        ),
    }
