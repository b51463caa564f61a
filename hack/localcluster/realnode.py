"""A local cluster's real node: containerd, kubelet and kube-proxy in the node's network namespace.

The node is a "machine" on the profile's WAN (hack/localcluster/network.py): its processes run on
the host with only their network namespace entered (``nsenter --net``), so that the kubelet's
volume mounts are seen by containerd and by ``down``, and everything it writes lives under the
node's folder (nodeconfig.NodePaths) and its own cgroup subtree. Images come from hack/images and
are imported into its containerd (there is no registry).

``teardown`` removes every process, mount, cgroup and file the node made, in the order that
leaves nothing busy: kubelet and kube-proxy, the pods' processes (by cgroup), containerd's tasks
and shims, containerd, then the mounts under the node's folder.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from pathlib import Path

from kube import goyaml

from .binaries import Binaries
from .network import local_network
from .nodeconfig import (
    KUBE_PROXY_HEALTHZ_PORT,
    KUBELET_HEALTHZ_PORT,
    NodePaths,
    cgroup_root,
    cni_config,
    containerd_config,
    kube_proxy_config,
    kubelet_config,
    node_labels,
)
from .pki import ClientIdentity, ensure_client_cert, ensure_server_cert
from .processes import Component, ProcessTable
from .spec import ClusterSpec, RealNodeSpec

NODE_COMPONENTS = ("containerd", "kubelet", "kube-proxy")
"""Start order of the real node's processes; stop goes in reverse."""

CRI_NAMESPACE = "k8s.io"
CGROUP_FS = Path("/sys/fs/cgroup")
SHIM_SOCKETS = Path("/run/containerd/s")
CONTAINER_LOG_LINKS = Path("/var/log/containers")  # the kubelet's, not configurable
GPU_RESOURCE = "nvidia.com/gpu"


class NodeFailed(RuntimeError):
    """The real node could not be brought up or torn down; the message says what and where."""


# what the real node needs of the machine, and what to do when it lacks it
TOOLS = {
    "runc": "install Debian's runc (make setup does)",
    "nsenter": "install util-linux (make setup does)",
    "nft": "install nftables (make setup does)",
    "ip": "install iproute2 (make setup does)",
}


def missing_prerequisites(*, filesystems: str, found: dict[str, bool], cgroups: list[Path]) -> list[str]:
    """What this machine lacks to run a real node, each with what to do about it. Pure:
    ``filesystems`` is /proc/filesystems, ``found`` whether each of TOOLS is on PATH,
    ``cgroups`` the mounted hierarchies."""
    problems = [f"{tool} is not installed: {fix}" for tool, fix in TOOLS.items() if not found.get(tool)]
    kinds = {line.split()[-1] for line in filesystems.splitlines() if line.strip()}
    if "overlay" not in kinds:
        problems.append(
            "the kernel has no overlay filesystem, which containerd's snapshotter needs: "
            "load the overlay module (modprobe overlay) or use a kernel built with it"
        )
    if not cgroups:
        problems.append(f"no cgroup hierarchy is mounted under {CGROUP_FS}: the kubelet and runc need one")
    elif not any(h.name in ("memory", "unified") or h == CGROUP_FS for h in cgroups):
        problems.append("no memory cgroup controller is mounted: the kubelet needs it")
    return problems


def check_prerequisites() -> None:
    """Raise NodeFailed naming everything the machine lacks for a real node."""
    import shutil

    problems = missing_prerequisites(
        filesystems=Path("/proc/filesystems").read_text(),
        found={tool: shutil.which(tool) is not None for tool in TOOLS},
        cgroups=_hierarchies(),
    )
    if problems:
        raise NodeFailed("this machine cannot run the real node: " + "; ".join(problems))


def _http_ok(host: str, port: int, path: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://{host}:{port}{path}", timeout=2) as resp:
            return int(resp.status) == 200
    except (OSError, urllib.error.URLError):
        return False


def _unix_ok(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        try:
            s.connect(str(path))
        except OSError:
            return False
    return True


def _hierarchies() -> list[Path]:
    """Every mounted cgroup hierarchy: the v1 controllers, the named systemd one and the cgroup2
    'unified' mount of a hybrid host (or the one cgroup2 root of a unified host)."""
    if (CGROUP_FS / "cgroup.procs").exists():
        return [CGROUP_FS]
    if not CGROUP_FS.is_dir():
        return []
    return [h for h in sorted(CGROUP_FS.iterdir()) if (h / "cgroup.procs").exists()]


def _cgroup_dirs(relative: str) -> list[Path]:
    """The node's cgroup in every hierarchy."""
    return [h / relative.lstrip("/") for h in _hierarchies()]


def _cgroup_pids(roots: Iterable[Path]) -> set[int]:
    pids: set[int] = set()
    for root in roots:
        if not root.is_dir():
            continue
        for procs in root.rglob("cgroup.procs"):
            with contextlib.suppress(OSError, ValueError):
                pids.update(int(p) for p in procs.read_text().split())
    return pids


def _mounts_under(path: Path) -> list[str]:
    """Mount points at or under ``path``, deepest first (from /proc/self/mountinfo)."""
    prefix = str(path)
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].encode().decode("unicode_escape")  # \040 is a space
        if point == prefix or point.startswith(prefix + "/"):
            found.append(point)
    return sorted(found, key=lambda p: p.count("/"), reverse=True)


def _processes_mentioning(needle: str) -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if needle.encode() in (proc / "cmdline").read_bytes():
                pids.append(int(proc.name))
    return pids


def _write(path: Path, content: str, *, mode: int = 0o644) -> None:
    """Write ``content`` unless the file holds it already: kube-proxy exits when its configuration
    file changes, so a second ``up`` must not touch it."""
    if not path.exists() or path.read_text() != content:
        path.write_text(content)
    path.chmod(mode)


def _kill(pids: Iterable[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


class RealNode:
    """The real node of one cluster; every method is safe to call again."""

    def __init__(
        self, spec: ClusterSpec, node: RealNodeSpec, binaries: Binaries, procs: ProcessTable
    ) -> None:
        self.spec = spec
        self.node = node
        self.bin = binaries
        self.procs = procs
        self.paths = NodePaths(spec.node_dir)
        self.net = local_network(spec)

    # ---- configuration -------------------------------------------------------------------------

    @property
    def address(self) -> str:
        return self.net.node_address

    def _kubeconfig(self, path: Path, stem: str, user: str) -> None:
        pki = self.spec.pki_dir
        server = f"https://{self.net.host_address}:{self.spec.ports.apiserver}"
        cluster = {"server": server, "certificate-authority": str(pki / "ca.crt")}
        credentials = {"client-certificate": str(pki / f"{stem}.crt"), "client-key": str(pki / f"{stem}.key")}
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "local", "cluster": cluster}],
            "users": [{"name": user, "user": credentials}],
            "contexts": [{"name": "local", "context": {"cluster": "local", "user": user}}],
            "current-context": "local",
        }
        _write(path, goyaml.dump(config, sort_keys=False), mode=0o600)

    def prepare(self, *, sandbox_image: str) -> None:
        """Certificates, kubeconfigs, configuration files and the node's cgroups."""
        check_prerequisites()
        paths, pki, name = self.paths, self.spec.pki_dir, self.node.name
        for d in (paths.root, paths.cni_conf_dir, paths.cni_ipam_dir, paths.kubelet_dir, paths.pod_logs,
                  paths.volume_plugins, paths.runc_root):  # fmt: skip
            d.mkdir(parents=True, exist_ok=True)
        # a node identity as kubeadm gives the first node: signed by the cluster CA, in the group
        # the Node authorizer and NodeRestriction know
        kubelet_user = f"system:node:{name}"
        ensure_client_cert(pki, ClientIdentity(f"node-{name}", kubelet_user, ("system:nodes",)))
        ensure_server_cert(pki, f"node-{name}-serving", common_name=name, ips=(self.address,), dns=(name,))
        # bound to system:node-proxier by the API server's bootstrap policy
        ensure_client_cert(pki, ClientIdentity("kube-proxy", "system:kube-proxy"))
        self._kubeconfig(paths.kubelet_kubeconfig, f"node-{name}", kubelet_user)
        self._kubeconfig(paths.kube_proxy_kubeconfig, "kube-proxy", "system:kube-proxy")
        _write(
            paths.containerd_config,
            containerd_config(paths, cni_bin_dir=self.bin.cni_plugins, sandbox_image=sandbox_image),
        )
        _write(
            paths.cni_conf_dir / "10-gpuferry-local.conflist",
            json.dumps(cni_config(paths, self.node), indent=2),
        )
        kubelet = kubelet_config(self.spec, paths, node_address=self.address,
                                 serving_cert=pki / f"node-{name}-serving.crt",
                                 serving_key=pki / f"node-{name}-serving.key")  # fmt: skip
        _write(paths.kubelet_config, goyaml.dump(kubelet, sort_keys=False))
        proxy = kube_proxy_config(self.spec, paths, self.node, node_address=self.address)
        _write(paths.kube_proxy_config, goyaml.dump(proxy, sort_keys=False))
        self._ensure_cgroups()

    def _ensure_cgroups(self) -> None:
        """The kubelet wants its cgroupRoot to exist in every hierarchy; cpuset needs its cpus and
        mems filled in (from the parent) before anything can join it."""
        parts = Path(cgroup_root(self.spec).lstrip("/")).parts
        for hierarchy in _hierarchies():
            level = hierarchy
            for part in parts:
                level = level / part
                if level.exists():
                    continue
                level.mkdir()
                for knob in ("cpuset.cpus", "cpuset.mems"):
                    if (level / knob).exists() and not (level / knob).read_text().strip():
                        (level / knob).write_text((level.parent / knob).read_text())

    def _in_node(self, *argv: str) -> list[str]:
        return ["nsenter", f"--net=/run/netns/{self.net.node_netns}", "--", *argv]

    def components(self) -> dict[str, Component]:
        b, paths, node = self.bin, self.paths, self.node
        env = {"PATH": f"{b.containerd.parent}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
        labels = ",".join(f"{k}={v}" for k, v in sorted(node_labels(node).items()))
        return {
            "containerd": Component(
                name="containerd",
                argv=self._in_node(
                    str(b.containerd), f"--config={paths.containerd_config}", "--log-level=warn"
                ),
                healthy=lambda: _unix_ok(paths.containerd_socket),
                env=env,
            ),
            "kubelet": Component(
                name="kubelet",
                argv=self._in_node(
                    str(b.kubelet),
                    f"--config={paths.kubelet_config}",
                    f"--kubeconfig={paths.kubelet_kubeconfig}",
                    f"--root-dir={paths.kubelet_dir}",
                    f"--cert-dir={paths.kubelet_dir / 'pki'}",
                    f"--hostname-override={node.name}",
                    f"--node-ip={self.address}",
                    f"--node-labels={labels}",
                    "--v=1",
                ),
                healthy=lambda: _http_ok(self.address, KUBELET_HEALTHZ_PORT, "/healthz"),
                env=env,
            ),
            "kube-proxy": Component(
                name="kube-proxy",
                argv=self._in_node(str(b.kube_proxy), f"--config={paths.kube_proxy_config}", "--v=1"),
                healthy=lambda: _http_ok(self.address, KUBE_PROXY_HEALTHZ_PORT, "/livez"),
                env=env,
            ),
        }

    # ---- images --------------------------------------------------------------------------------

    def ctr(self, *args: str, check: bool = True, timeout: float = 300) -> str:
        argv = [str(self.bin.ctr), f"--address={self.paths.containerd_socket}", "-n", CRI_NAMESPACE, *args]
        result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        if check and result.returncode:
            raise NodeFailed(f"{self.spec.name}: ctr {' '.join(args)} exited {result.returncode}: "
                             f"{result.stderr.strip()}")  # fmt: skip
        return result.stdout

    def import_images(self, tars: dict[str, Path], *, progress: Callable[[str], None]) -> list[str]:
        """Import every ``ref -> OCI tar`` that containerd does not hold yet; returns those imported.
        Pinned, so that no image garbage collection ever removes what cannot be pulled again."""
        present = set(self.ctr("images", "ls", "-q").split())
        imported = []
        for ref, tar in sorted(tars.items()):
            if ref in present:
                continue
            started = time.monotonic()
            self.ctr("images", "import", "--label", "io.cri-containerd.pinned=pinned", str(tar))
            if ref not in self.ctr("images", "ls", "-q").split():
                raise NodeFailed(f"{self.spec.name}: importing {tar} did not give the image {ref}")
            progress(f"{self.spec.name}: image {ref} imported in {time.monotonic() - started:.1f}s")
            imported.append(ref)
        return imported

    # ---- after registration --------------------------------------------------------------------

    def node_patches(self) -> tuple[dict[str, object], dict[str, object] | None]:
        """The spec patch (its pod range, which no controller allocates here) and the status patch
        advertising its GPUs as an extended resource (None without GPUs)."""
        spec_patch: dict[str, object] = {
            "spec": {"podCIDR": self.node.pod_cidr, "podCIDRs": [self.node.pod_cidr]}
        }
        if not self.node.gpus:
            return spec_patch, None
        gpus = str(self.node.gpus)
        return spec_patch, {"status": {"capacity": {GPU_RESOURCE: gpus}}}

    # ---- teardown ------------------------------------------------------------------------------

    def shim_sockets(self) -> list[Path]:
        """The sockets of this node's runc shims. They live in /run/containerd/s whatever
        containerd's state folder, named (pkg/shim SocketAddress) by the sha256 of
        ``<containerd address>/<namespace>/<task id>`` (``/debug`` for a shim's debug socket);
        the task ids are the folders of containerd's task state, which is ours."""
        tasks = self.paths.containerd_state / "io.containerd.runtime.v2.task" / CRI_NAMESPACE
        ids = sorted(d.name for d in tasks.iterdir()) if tasks.is_dir() else []
        names = [
            f"{self.paths.containerd_socket}/{CRI_NAMESPACE}/{i}{debug}"
            for i in ids
            for debug in ("", "/debug")
        ]
        return [SHIM_SOCKETS / hashlib.sha256(name.encode()).hexdigest() for name in names]

    def container_pids(self) -> set[int]:
        """Every process of the node's pods (their cgroups), pause and shims' children included."""
        return _cgroup_pids(_cgroup_dirs(cgroup_root(self.spec)))

    def teardown(self) -> list[str]:
        """Stop the node and remove what it made but its folder; returns the processes stopped."""
        shim_sockets = self.shim_sockets()
        stopped = [name for name in ("kube-proxy", "kubelet") if self.procs.stop(name)]
        cgroups = _cgroup_dirs(cgroup_root(self.spec))
        _kill(self.container_pids())  # every container of every pod, pause included
        if self.procs.pid("containerd") is not None:
            self._delete_tasks()
        _kill(_processes_mentioning(f"-address {self.paths.containerd_socket}"))  # shims left
        _kill(_processes_mentioning(str(self.paths.containerd_socket)))
        if self.procs.stop("containerd"):
            stopped.append("containerd")
        self._remove_cgroups(cgroups)
        self._unmount()
        self._remove_log_links()
        self._remove_shim_sockets(shim_sockets)
        return stopped

    def _delete_tasks(self) -> None:
        with contextlib.suppress(NodeFailed, subprocess.TimeoutExpired):
            for line in self.ctr("tasks", "ls", check=False, timeout=30).splitlines()[1:]:
                task = line.split()[0]
                self.ctr("tasks", "delete", "--force", task, check=False, timeout=30)

    def _remove_cgroups(self, roots: list[Path]) -> None:
        deadline = time.monotonic() + 10
        for root in roots:
            if not root.exists():
                continue
            for d in sorted(
                (p for p in root.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True
            ):
                self._rmdir_cgroup(d, deadline)
            self._rmdir_cgroup(root, deadline)
            with contextlib.suppress(OSError):  # the shared /gpuferry parent, once empty
                root.parent.rmdir()

    @staticmethod
    def _rmdir_cgroup(d: Path, deadline: float) -> None:
        while True:
            try:
                d.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError as exc:
                if time.monotonic() > deadline:
                    raise NodeFailed(f"cannot remove cgroup {d}: {exc}") from exc
                _kill(_cgroup_pids([d]))
                time.sleep(0.1)

    def _unmount(self) -> None:
        for point in _mounts_under(self.paths.root):
            if subprocess.run(["umount", point], capture_output=True).returncode:
                subprocess.run(["umount", "-l", point], capture_output=True)
        if left := _mounts_under(self.paths.root):
            raise NodeFailed(f"{self.spec.name}: still mounted after teardown: {', '.join(left)}")

    def _remove_log_links(self) -> None:
        if not CONTAINER_LOG_LINKS.is_dir():
            return
        for link in CONTAINER_LOG_LINKS.iterdir():
            with contextlib.suppress(OSError):
                if link.is_symlink() and os.readlink(link).startswith(str(self.paths.pod_logs) + "/"):
                    link.unlink()

    @staticmethod
    def _remove_shim_sockets(sockets: list[Path]) -> None:
        """A shim that was killed leaves its socket: remove this node's, then the folders if that
        left them empty (another node's shims keep theirs)."""
        for sock in sockets:
            sock.unlink(missing_ok=True)
        for folder in (SHIM_SOCKETS, SHIM_SOCKETS.parent):
            with contextlib.suppress(OSError):
                folder.rmdir()
