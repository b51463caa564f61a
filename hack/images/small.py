"""The one-layer images: ``pause`` (the pod sandbox), ``testbox`` (busybox for test workloads) and
images of one static binary (CoreDNS, metrics-server)."""

from __future__ import annotations

import hashlib
import struct
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from .cache import BuiltImage, InputHash, cached_image, source_date_epoch
from .oci import Dir, Entry, File, ImageConfig, Symlink, write_image, write_layer
from .tools import SYSTEM_PATH, BuildError, Progress, apt_download, deb_version, ensure_debs, run, step

HERE = Path(__file__).resolve().parent
PAUSE_C = HERE / "pause.c"
PAUSE_RECIPE = "pause/1"
TESTBOX_RECIPE = "testbox/1"
BINARY_RECIPE = "binary/1"
CFLAGS = ("-static", "-Os", "-s", "-Wall", "-Wextra", "-Werror")
LIBC_A = "/usr/lib/x86_64-linux-gnu/libc.a"  # gcc -static needs it
BUSYBOX_DEB = "busybox-static"
# what test workloads use: a shell, an HTTP server and client, DNS look-ups, and tar (kubectl cp).
# Mind that Debian's busybox 1.35 has no `wget -T` (the option crashes it): use `timeout N wget`.
TESTBOX_APPLETS = ("sh", "httpd", "wget", "nslookup", "tar", "cat", "sleep", "hostname")
NONROOT = 65532  # as in distroless' nonroot images

PASSWD = "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
GROUP = "root:x:0:\nnobody:x:65534:\n"
NONROOT_PASSWD = (
    "root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n"
)
NONROOT_GROUP = "root:x:0:\nnonroot:x:65532:\n"
# /etc/hosts first (the kubelet writes it), then DNS; static glibc has both built in
NSSWITCH = "passwd: files\ngroup: files\nhosts: files dns\n"


def build_pause_binary(dest: Path) -> Path:
    """Compile hack/images/pause.c into ``dest/pause`` (static, stripped)."""
    out = dest / "pause"
    run(["gcc", *CFLAGS, "-o", out, PAUSE_C], what="compiling pause.c")
    return out


def pause_image(progress: Progress) -> BuiltImage:
    """The pod sandbox image: /pause, compiled here from pause.c (gcc and libc6-dev are installed
    when missing)."""
    ensure_debs({"gcc": "gcc", LIBC_A: "libc6-dev"}, progress)
    gcc = run(["gcc", "--version"], what="gcc --version").splitlines()[0]
    mtime = source_date_epoch()
    key = InputHash(PAUSE_RECIPE).add("pause.c", PAUSE_C).add("gcc", gcc).add_all("cflags", CFLAGS)
    key.add("epoch", str(mtime))

    def make(out: Path, ref: str) -> None:
        with tempfile.TemporaryDirectory(prefix="gpuferry-pause-") as tmp:
            binary = build_pause_binary(Path(tmp))
            layer = write_layer({"pause": File(binary, mode=0o755)}, Path(tmp) / "layer.tar", mtime=mtime)
            # as the Kubernetes pause image: it runs as 65535, not as root
            config = ImageConfig(entrypoint=("/pause",), user="65535:65535", env={"PATH": SYSTEM_PATH})
            write_image([layer], config, ref, out, mtime=mtime)

    return cached_image("pause", key.hexdigest(), make)


def busybox_entries(busybox: Path, applets: Sequence[str]) -> dict[str, Entry]:
    """The testbox's files: busybox, a symlink per applet (``busybox --list-full`` paths), users,
    name service order, a sticky /tmp and /www for httpd."""
    entries: dict[str, Entry] = {
        "bin/busybox": File(busybox, mode=0o755),
        "etc/passwd": File(PASSWD.encode()),
        "etc/group": File(GROUP.encode()),
        "etc/nsswitch.conf": File(NSSWITCH.encode()),
        "root": Dir(mode=0o700),
        "tmp": Dir(mode=0o1777),
        "www": Dir(),
        "www/index.html": File(b"testbox\n"),
    }
    for applet in applets:
        if applet.strip("/") != "bin/busybox":
            entries[applet] = Symlink("/bin/busybox")
    return entries


def _check_applets(applets: Sequence[str]) -> None:
    names = {a.rsplit("/", 1)[-1] for a in applets}
    if missing := [a for a in TESTBOX_APPLETS if a not in names]:
        raise BuildError(f"Debian's {BUSYBOX_DEB} lacks the applets {', '.join(missing)}")


def testbox_image(progress: Progress) -> BuiltImage:
    """The test workloads' image: Debian's static busybox (its .deb fetched, not installed) with
    a link per applet. Keyed by the package's version, so the .deb is fetched only to build."""
    ensure_debs({"dpkg-deb": "dpkg", "apt-get": "apt"}, progress)
    version = deb_version(BUSYBOX_DEB)
    mtime = source_date_epoch()
    key = InputHash(TESTBOX_RECIPE).add("deb", f"{BUSYBOX_DEB}={version}").add("epoch", str(mtime))
    key.add_all("files", [PASSWD, GROUP, NSSWITCH]).add_all("applets", TESTBOX_APPLETS)

    def make(out: Path, ref: str) -> None:
        with tempfile.TemporaryDirectory(prefix="gpuferry-testbox-") as tmp:
            work = Path(tmp)
            with step(progress, f"testbox: fetching {BUSYBOX_DEB} {version}"):
                deb = apt_download(BUSYBOX_DEB, version, work)
            run(["dpkg-deb", "-x", deb, work / "deb"], what=f"unpacking {deb.name}")
            busybox = work / "deb" / "bin" / "busybox"
            applets = run([busybox, "--list-full"], what="busybox --list-full").split()
            _check_applets(applets)
            layer = write_layer(busybox_entries(busybox, applets), work / "layer.tar", mtime=mtime)
            config = ImageConfig(
                cmd=("sh",), env={"PATH": SYSTEM_PATH}, labels={"io.gpuferry.busybox": version}
            )
            write_image([layer], config, ref, out, mtime=mtime)

    return cached_image("testbox", key.hexdigest(), make)


def is_static_elf(path: Path) -> bool:
    """An x86-64 ELF executable with no program interpreter (so no dynamic loader, no libc.so)."""
    with path.open("rb") as f:
        header = f.read(64)
        if len(header) < 64 or header[:4] != b"\x7fELF" or header[4] != 2:  # 64-bit
            return False
        phoff, phentsize, phnum = (
            struct.unpack_from("<Q", header, 32)[0],
            *struct.unpack_from("<HH", header, 54),
        )
        f.seek(phoff)
        table = f.read(phentsize * phnum)
    pt_interp = 3
    return all(struct.unpack_from("<I", table, i * phentsize)[0] != pt_interp for i in range(phnum))


def binary_entries(name: str, binary: Path) -> dict[str, Entry]:
    return {
        name: File(binary, mode=0o755),
        "etc/passwd": File(NONROOT_PASSWD.encode()),
        "etc/group": File(NONROOT_GROUP.encode()),
        "home/nonroot": Dir(mode=0o700, uid=NONROOT, gid=NONROOT),
        "tmp": Dir(mode=0o1777),
    }


def binary_image(
    name: str,
    binary: Path,
    version: str,
    args: Sequence[str] = (),
    *,
    user: str = f"{NONROOT}:{NONROOT}",
    labels: Mapping[str, str] | None = None,
) -> BuiltImage:
    """A one-layer image of a static binary at ``/<name>``, run as ``/<name> ARGS...`` by the
    nonroot user (65532) unless ``user`` says otherwise."""
    if not binary.is_file():
        raise BuildError(f"{name}: no binary at {binary}")
    if not is_static_elf(binary):
        raise BuildError(f"{name}: {binary} is not a static x86-64 executable (it would need libraries)")
    digest = hashlib.sha256(binary.read_bytes()).hexdigest()
    mtime = source_date_epoch()
    all_labels = {"org.opencontainers.image.version": version, **(labels or {})}
    config = ImageConfig(
        entrypoint=(f"/{name}", *args), user=user, env={"PATH": SYSTEM_PATH}, labels=all_labels
    )
    key = InputHash(BINARY_RECIPE).add("name", name).add("version", version).add("binary", digest)
    key.add_all("entrypoint", config.entrypoint).add("user", user).add("epoch", str(mtime))
    key.add_all("labels", [f"{k}={v}" for k, v in sorted(all_labels.items())])
    key.add_all("files", [NONROOT_PASSWD, NONROOT_GROUP])

    def make(out: Path, ref: str) -> None:
        with tempfile.TemporaryDirectory(prefix=f"gpuferry-{name}-") as tmp:
            layer = write_layer(binary_entries(name, binary), Path(tmp) / "layer.tar", mtime=mtime)
            write_image([layer], config, ref, out, mtime=mtime)

    return cached_image(name, key.hexdigest(), make)
