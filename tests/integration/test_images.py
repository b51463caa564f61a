"""The images of hack/images, built for real (root: mmdebstrap, overlayfs, chroot) and looked at
from the inside: each image tar is unpacked as a runtime would and its programs are run with
chroot. No cluster is needed. The first build takes about a minute (cached afterwards in
``<cache>/images``).

Like the other root-only tests, these skip only when not root *and* not in CI; in CI, which runs
as root, a missing tool fails them instead.
"""

from __future__ import annotations

import base64
import configparser
import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from hack.images import BuiltImage, build_images
from hack.images import containerfile as cf
from hack.images.cache import source_date_epoch
from hack.images.gpuferry import IMAGE_ENV, INSTALL_SCRIPT, MODULES, PACKAGES_FILE, VENV, read_packages
from hack.images.oci import open_layers, read_image
from hack.images.rootfs import unpack_image
from hack.images.small import build_pause_binary
from hack.images.wheels import (
    REPO,
    build_wheel,
    console_scripts,
    package_dirs,
    project_sources,
    runtime_requirements,
)
from peering.crds import load_crds

CAN_BUILD = os.geteuid() == 0 and all(
    shutil.which(t) for t in ("apt-get", "unshare", "nsenter", "chroot", "ip")
)

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(1800),  # the first build (mmdebstrap, the wheels) runs in the first test
    pytest.mark.skipif(
        not CAN_BUILD and not os.environ.get("CI"),
        reason="needs root, apt-get, unshare and chroot (mmdebstrap, overlayfs; runs in CI)",
    ),
]

SITE = f"{VENV}/lib/python3.11/site-packages"
BINARY = "statictest"  # a binary image of the (static) pause program, as CoreDNS's would be
Unpacked = Callable[[str], Path]


def progress(msg: str) -> None:
    print(msg, flush=True)


@pytest.fixture(scope="module")
def static_binary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_pause_binary(tmp_path_factory.mktemp("static"))


@pytest.fixture(scope="module")
def images(static_binary: Path) -> dict[str, BuiltImage]:
    return build_images(progress=progress, binaries={BINARY: (static_binary, "v1.2.3")})


@pytest.fixture(scope="module")
def rootfs(images: dict[str, BuiltImage], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Unpacked]:
    unpacked: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in unpacked:
            unpacked[name] = tmp_path_factory.mktemp(f"rootfs-{name}")
            unpack_image(images[name].tar, unpacked[name])
        return unpacked[name]

    yield get
    for path in unpacked.values():
        shutil.rmtree(path, ignore_errors=True)


def chroot(
    root: Path, *argv: str, user: str | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    userspec = [f"--userspec={user}"] if user else []
    env = {**IMAGE_ENV, "HOME": "/root", "LANG": "C.UTF-8"}
    return subprocess.run(
        ["chroot", *userspec, str(root), *argv], env=env, capture_output=True, text=True, timeout=timeout
    )


def ok(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, f"{proc.args} exited {proc.returncode}:\n{proc.stdout}{proc.stderr}"
    return proc.stdout + proc.stderr


# ---- every image ---------------------------------------------------------------------------------


def test_second_build_finds_every_image_in_the_cache(
    images: dict[str, BuiltImage], static_binary: Path
) -> None:
    started = time.monotonic()
    again = build_images(progress=progress, binaries={BINARY: (static_binary, "v1.2.3")})
    assert time.monotonic() - started < 10
    assert list(again) == ["pause", "testbox", "gpuferry", BINARY]
    for name, image in again.items():
        assert image.cached, name
        assert (image.ref, image.tar, image.digest, image.size) == (
            images[name].ref,
            images[name].tar,
            images[name].digest,
            images[name].size,
        )


def test_image_tars_are_oci_layouts_naming_their_refs(images: dict[str, BuiltImage]) -> None:
    for name, image in images.items():
        tag = image.ref.rpartition(":")[2]
        assert re.fullmatch(rf"gpuferry\.local/{re.escape(name)}:[0-9a-f]{{12}}", image.ref)
        assert image.tar.name == f"{name}-{tag}.tar" and image.tar.stat().st_size == image.size
        meta = read_image(image.tar)
        assert (meta.ref, meta.digest) == (image.ref, image.digest)
        assert (meta.config["architecture"], meta.config["os"]) == ("amd64", "linux")
        with tarfile.open(image.tar) as tar:
            digests = []
            for blob in open_layers(tar, meta):
                h = hashlib.sha256()
                while chunk := blob.read(1 << 20):
                    h.update(chunk)
                digests.append("sha256:" + h.hexdigest())
        assert digests == [la["digest"] for la in meta.manifest["layers"]]
        assert meta.config["rootfs"]["diff_ids"] == digests  # uncompressed layers


# ---- gpuferry ------------------------------------------------------------------------------------


def record(text: str) -> dict[str, str]:
    """A wheel RECORD: path -> hash, for the package files (not dist-info, scripts or byte-code)."""
    rows = [line.split(",") for line in text.splitlines() if line]
    return {
        p: h
        for p, h, *_ in rows
        if h and not p.startswith("..") and ".dist-info/" not in p and not p.endswith(".pyc")
    }


def tree_hash(path: Path) -> str:
    digest = hashlib.sha256(path.read_bytes()).digest()
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


@pytest.fixture(scope="module")
def fresh_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel of this checkout, built here (as the recipe does, but not by it)."""
    work = tmp_path_factory.mktemp("wheel")
    return build_wheel(work / "out", work=work / "src", epoch=source_date_epoch(), log=work / "wheel.log")


def dist_info(root: Path) -> Path:
    [found] = (root / SITE.lstrip("/")).glob("gpuferry-*.dist-info")
    return found


def test_gpuferry_label_names_the_wheel_built_from_this_tree(
    images: dict[str, BuiltImage], rootfs: Unpacked, fresh_wheel: Path
) -> None:
    labels = read_image(images["gpuferry"].tar).config["config"]["Labels"]
    assert labels["io.gpuferry.wheel"] == fresh_wheel.name
    assert re.fullmatch(r"[0-9a-f]{64}", labels["io.gpuferry.wheel.sha256"])
    installed = record((dist_info(rootfs("gpuferry")) / "RECORD").read_text())
    # every file of the packages in this tree is installed, with this tree's content
    in_tree = {s: tree_hash(REPO / s) for s in project_sources() if s.split("/", 1)[0] in package_dirs()}
    assert installed == in_tree
    # and the wheel built here now holds the same files (its bytes may differ if setuptools did)
    with zipfile.ZipFile(fresh_wheel) as whl:
        [name] = [n for n in whl.namelist() if n.endswith(".dist-info/RECORD")]
        assert record(whl.read(name).decode()) == installed
    if hashlib.sha256(fresh_wheel.read_bytes()).hexdigest() != labels["io.gpuferry.wheel.sha256"]:
        print("note: the wheel built now differs in bytes, not in files, from the image's")


def test_console_scripts_and_modules_in_the_image_are_the_wheels(rootfs: Unpacked, fresh_wheel: Path) -> None:
    root = rootfs("gpuferry")
    with zipfile.ZipFile(fresh_wheel) as whl:
        [ep_name] = [n for n in whl.namelist() if n.endswith(".dist-info/entry_points.txt")]
        wheel_entry_points = whl.read(ep_name).decode()
        wheel_mains = {
            n.removesuffix("/__main__.py").replace("/", ".")
            for n in whl.namelist()
            if n.endswith("/__main__.py")
        }
    assert (dist_info(root) / "entry_points.txt").read_text() == wheel_entry_points
    parsed = configparser.ConfigParser()
    parsed.read_string(wheel_entry_points)
    scripts = dict(parsed["console_scripts"])
    assert scripts == console_scripts()  # pyproject's [project.scripts]
    for script in scripts:
        path = root / VENV.lstrip("/") / "bin" / script
        assert path.is_file() and os.access(path, os.X_OK), script
        assert path.read_text().splitlines()[0] == f"#!{VENV}/bin/python3", script
    installed_mains = {
        str(p.parent.relative_to(root / SITE.lstrip("/"))).replace("/", ".")
        for p in (root / SITE.lstrip("/")).rglob("__main__.py")
        if p.parent.relative_to(root / SITE.lstrip("/")).parts[0] in package_dirs()
    }
    assert installed_mains == wheel_mains == set(MODULES)


def test_tools_and_components_run_in_the_gpuferry_image(rootfs: Unpacked) -> None:
    root = rootfs("gpuferry")
    assert ok(chroot(root, f"{VENV}/bin/gpuferry", "--help")).startswith("usage: gpuferry")
    assert "nftables v" in ok(chroot(root, "nft", "--version"))
    assert "iproute2" in ok(chroot(root, "ip", "-V"))
    assert ok(chroot(root, "wireguard-go", "--version")).startswith("wireguard-go v")
    for module in MODULES:
        assert ok(chroot(root, "python", "-m", module, "--help")).startswith(f"usage: python -m {module}")
    assert ok(chroot(root, "python", "-c", "import sys; print(sys.prefix)")).strip() == VENV
    ok(chroot(root, "python", "-m", "pip", "check"))
    assert ok(chroot(root, "sh", "-c", "command -v gpuferry")).strip() == f"{VENV}/bin/gpuferry"
    # installed from the wheel, far from any source tree, the CLI finds its CRDs and chart
    # (issue 14: a wheel once lacked them, and peer failed with "set GPUFERRY_CRDS_DIR")
    script = ("from peering.crds import crd_dir, load_crds as l; print(crd_dir()); "
              "print(*[c['metadata']['name'] for c in l()])")
    where, names = ok(chroot(root, "python", "-c", script)).splitlines()
    assert where.startswith(VENV) and where.endswith("/peering/chart/crds"), where
    assert names.split() == [c["metadata"]["name"] for c in load_crds(REPO / "charts/gpuferry/crds")]
    assert "apiVersion" in ok(chroot(root, "sh", "-c", f"cat {where}/../Chart.yaml"))


def installed_debs(root: Path) -> set[str]:
    status = (root / "var/lib/dpkg/status").read_text()
    return {
        m.group(1)
        for block in status.split("\n\n")
        if (m := re.search(r"^Package: (\S+)$", block, re.MULTILINE))
        and "Status: install ok installed" in block
    }


def test_gpuferry_image_installs_what_the_containerfile_installs(rootfs: Unpacked) -> None:
    root = rootfs("gpuferry")
    # the Containerfile's last stage installs from the files the local recipe used
    final = cf.read()
    rel = [str(p.relative_to(REPO)) for p in (PACKAGES_FILE, INSTALL_SCRIPT)]
    assert cf.copied_sources(final, "final") == rel
    assert any(INSTALL_SCRIPT.name in i.args for i in cf.stage(final, "final") if i.keyword == "RUN")
    # every listed Debian package is in the image
    assert set(read_packages()) <= installed_debs(root)
    # every requirement of pyproject.toml is installed at a version it accepts
    listed = json.loads(ok(chroot(root, "python", "-m", "pip", "list", "--format=json")))
    versions = {canonicalize_name(d["name"]): d["version"] for d in listed}
    for spec in runtime_requirements():
        req = Requirement(spec)
        assert req.specifier.contains(versions[canonicalize_name(req.name)], prereleases=True), spec
    # nothing of the build is left behind
    assert not list((root / "var/lib/apt/lists").glob("*Packages*"))
    assert not (root / "root/.cache").exists() and not list((root / "tmp").iterdir())


def test_gpuferry_layers_base_wireguard_go_and_app(images: dict[str, BuiltImage]) -> None:
    meta = read_image(images["gpuferry"].tar)
    with tarfile.open(images["gpuferry"].tar) as tar:
        layers = open_layers(tar, meta)
        assert len(layers) == 3
        with tarfile.open(fileobj=layers[1], mode="r|") as wg:
            assert [m.name for m in wg if not m.isdir()] == ["usr/local/bin/wireguard-go"]
        with tarfile.open(fileobj=layers[2], mode="r|") as app:
            names = [m.name for m in app]
    assert names and all(n == "opt" or n.startswith(VENV.lstrip("/")) for n in names), names
    assert not [n for n in names if "/.wh." in n]
    assert f"{SITE.lstrip('/')}/vk/__main__.py" in names


# ---- testbox -------------------------------------------------------------------------------------

DNS_STUB = r"""
import socket, struct, sys
addr, ready, log, *records = sys.argv[1:]
answers = dict(r.split("=") for r in records)
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((addr, 53))
open(ready, "w").close()
while True:
    data, peer = s.recvfrom(512)
    i, labels = 12, []
    while data[i]:
        labels.append(data[i + 1 : i + 1 + data[i]].decode())
        i += 1 + data[i]
    qtype = struct.unpack(">H", data[i + 1 : i + 3])[0]
    name = ".".join(labels).lower()
    with open(log, "a") as f:
        f.write(f"{name} {qtype}\n")
    ip = answers.get(name)
    flags = 0x8180 if ip else 0x8183  # a response, recursion available; NXDOMAIN for unknown names
    answer = b""
    if ip and qtype == 1:  # A: one record, the name by pointer to the question
        answer = b"\xc0\x0c" + struct.pack(">HHIH", 1, 1, 30, 4) + socket.inet_aton(ip)
    header = struct.pack(">HHHHHH", data[0] << 8 | data[1], flags, 1, 1 if answer else 0, 0, 0)
    s.sendto(header + data[12 : i + 5] + answer, peer)
"""


def test_testbox_serves_http_and_resolves_names_over_dns(rootfs: Unpacked, tmp_path: Path) -> None:
    root = tmp_path / "root"
    shutil.copytree(rootfs("testbox"), root, symlinks=True)
    search = "testns.svc.cluster.local svc.cluster.local cluster.local"
    (root / "etc/resolv.conf").write_text(f"nameserver 127.0.0.1\nsearch {search}\noptions ndots:5\n")
    assert not (root / "etc/hosts").exists()  # every name below comes from the DNS server
    stub, ready, log = tmp_path / "dns.py", tmp_path / "ready", tmp_path / "queries.log"
    stub.write_text(DNS_STUB)
    # (not wget -T: Debian's busybox 1.35 is built without it, and the option crashes wget)
    inside = (
        "echo FETCH=$(timeout 5 wget -q -O - http://web:8080/); "
        "timeout 5 wget -q -O - http://nothing:8080/ >/dev/null 2>&1; echo MISSING=$?; "
        "echo NSLOOKUP=$(nslookup web.testns.svc.cluster.local 127.0.0.1 | grep -c '^Address: 127.0.0.1'); "
        "echo TAR=$(tar -cf - -C /www . | tar -tf - | grep index.html); "
        "echo HOSTNAME=$(hostname); sleep 0.1; echo CAT=$(cat /etc/passwd | head -1)"
    )
    script = f"""set -eu
mkdir {root}/dev
mount --bind /dev {root}/dev
ip link set lo up
{sys.executable} {stub} 127.0.0.1 {ready} {log} web.testns.svc.cluster.local=127.0.0.1 &
for i in $(seq 100); do [ -e {ready} ] && break; sleep 0.05; done
chroot {root} httpd -f -p 127.0.0.1:8080 -h /www &
for i in $(seq 100); do
  chroot {root} wget -q -O /dev/null http://127.0.0.1:8080/ 2>/dev/null && break; sleep 0.05
done
chroot {root} sh -c {shlex.quote(inside)}
"""
    # network, PID and mount namespaces of its own: the DNS server, httpd and /dev go with them
    proc = subprocess.run(
        [
            "unshare",
            "--net",
            "--pid",
            "--mount",
            "--propagation",
            "private",
            "--fork",
            "--kill-child",
            "sh",
            "-c",
            script,
        ],
        env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    out = dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert out["FETCH"] == "testbox", proc.stdout + proc.stderr  # search list, DNS, httpd, wget
    assert out["MISSING"] == "1"  # "bad address": the server said NXDOMAIN
    assert int(out["NSLOOKUP"]) >= 1
    assert out["TAR"] == "./index.html"
    assert out["HOSTNAME"] and out["CAT"].startswith("root:x:0:0:")
    queries = log.read_text().split()
    assert "web.testns.svc.cluster.local" in queries  # static glibc asked the server in resolv.conf


# ---- pause ---------------------------------------------------------------------------------------


def children_of(pid: int) -> list[tuple[int, str]]:
    """(pid, state) of the processes whose parent is ``pid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                status = (entry / "status").read_text()
            except OSError:
                continue
            fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
            if fields.get("PPid", "").strip() == str(pid):
                found.append((int(entry.name), fields["State"].split()[0]))
    return found


def test_pause_reaps_orphans_and_stops_on_sigterm(rootfs: Unpacked) -> None:
    root = rootfs("pause")
    assert ok(chroot(root, "/pause", "-v")).strip() == "gpuferry-pause 1"
    proc = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--kill-child", "chroot", str(root), "/pause"],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 10
        pause = 0
        while time.monotonic() < deadline:
            kids = [pid for pid, _ in children_of(proc.pid)]
            if kids and os.readlink(f"/proc/{kids[0]}/exe").endswith("/pause"):
                pause = kids[0]
                break
            time.sleep(0.05)
        assert pause, "pause did not start"
        # two orphans in its PID namespace: their parent shell exits, they become pause's children
        subprocess.run(
            ["nsenter", "--target", str(pause), "--pid", "--", "sh", "-c", "sleep 1 & sleep 1 & exit 0"],
            check=True,
            timeout=10,
        )
        time.sleep(0.3)
        assert len(children_of(pause)) == 2
        time.sleep(2)
        assert children_of(pause) == []  # reaped, no zombies left
        os.kill(pause, signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        assert proc.stderr is not None
        proc.stderr.close()


# ---- a binary image ------------------------------------------------------------------------------


def test_binary_image_runs_its_binary_as_nonroot(
    images: dict[str, BuiltImage], rootfs: Unpacked, static_binary: Path
) -> None:
    root = rootfs(BINARY)
    assert (root / BINARY).read_bytes() == static_binary.read_bytes()
    assert (root / BINARY).stat().st_mode & 0o7777 == 0o755
    assert (root / "tmp").stat().st_mode & 0o7777 == 0o1777
    assert "nonroot:x:65532:65532:" in (root / "etc/passwd").read_text()
    config = read_image(images[BINARY].tar).config["config"]
    assert config["Entrypoint"] == [f"/{BINARY}"] and config["User"] == "65532:65532"
    assert config["Labels"]["org.opencontainers.image.version"] == "v1.2.3"
    assert ok(chroot(root, f"/{BINARY}", "-v", user="65532:65532")).strip() == "gpuferry-pause 1"
