"""Where hack/build-k8s.sh puts the binaries, and building them when they are missing."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

from .spec import cache_dir

HACK_DIR = Path(__file__).resolve().parent.parent


class BinariesMissing(RuntimeError):
    """The control-plane binaries are not built (run hack/build-k8s.sh)."""


def versions() -> dict[str, str]:
    """The pins in hack/versions.env."""
    pins: dict[str, str] = {}
    for line in (HACK_DIR / "versions.env").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, value = line.split("=", 1)
            pins[key.strip()] = value.strip()
    return pins


@dataclass(frozen=True)
class Binaries:
    """Absolute paths of every binary a local cluster runs."""

    etcd: Path
    kube_apiserver: Path
    kube_controller_manager: Path
    kube_scheduler: Path
    kubectl: Path
    kwok: Path
    kwok_stages: Path
    helm: Path
    # the real node
    kubelet: Path
    kube_proxy: Path
    containerd: Path
    containerd_shim: Path
    ctr: Path
    cni_plugins: Path
    """The folder of the CNI plugins (ptp, bridge, host-local, loopback, portmap)."""
    coredns: Path
    metrics_server: Path
    kueue: Path
    """Kueue's manager (hack/kueue.py runs it against a cluster); its CRDs are in ``kueue_crds``."""
    kueue_crds: Path

    @classmethod
    def locate(cls, cache: Path | None = None) -> Binaries:
        pins = versions()
        root = cache or cache_dir()
        k8s = root / f"k8s-{pins['K8S_VERSION']}"
        kwok = root / f"kwok-{pins['KWOK_VERSION']}"
        containerd = root / f"containerd-{pins['CONTAINERD_VERSION']}" / "bin"
        node = root / f"kubelet-{pins['K8S_VERSION']}" / "bin"
        return cls(
            etcd=root / f"etcd-{pins['ETCD_VERSION']}" / "bin" / "etcd",
            kube_apiserver=k8s / "bin" / "kube-apiserver",
            kube_controller_manager=k8s / "bin" / "kube-controller-manager",
            kube_scheduler=k8s / "bin" / "kube-scheduler",
            kubectl=k8s / "bin" / "kubectl",
            kwok=kwok / "bin" / "kwok",
            kwok_stages=kwok / "stage",
            helm=root / f"helm-{pins['HELM_VERSION']}" / "bin" / "helm",
            kubelet=node / "kubelet",
            kube_proxy=node / "kube-proxy",
            containerd=containerd / "containerd",
            containerd_shim=containerd / "containerd-shim-runc-v2",
            ctr=containerd / "ctr",
            cni_plugins=root / f"cni-plugins-{pins['CNI_PLUGINS_VERSION']}" / "bin",
            coredns=root / f"coredns-{pins['COREDNS_VERSION']}" / "bin" / "coredns",
            metrics_server=root
            / f"metrics-server-{pins['METRICS_SERVER_VERSION']}"
            / "bin"
            / "metrics-server",
            kueue=root / f"kueue-{pins['KUEUE_VERSION']}" / "bin" / "kueue",
            kueue_crds=root / f"kueue-{pins['KUEUE_VERSION']}" / "crds",
        )

    def missing(self) -> list[Path]:
        return [p for p in vars(self).values() if not Path(p).exists()]


def ensure_built(*, build: bool = True) -> Binaries:
    """Return the binaries, running hack/build-k8s.sh first when any is missing and ``build``."""
    binaries = Binaries.locate()
    if binaries.missing() and build:
        subprocess.run(["bash", str(HACK_DIR / "build-k8s.sh")], check=True)
    if missing := binaries.missing():
        listed = ", ".join(str(p) for p in missing)
        raise BinariesMissing(f"missing binaries: {listed}; run hack/build-k8s.sh")
    return binaries
