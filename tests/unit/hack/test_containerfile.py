"""The Containerfile and the local build (hack/images/gpuferry.py) install the same things: the
same package list and install script, the same wheel sources, wireguard-go version, environment
and component modules. Pure: the files are read, nothing is built."""

from __future__ import annotations

import re
import shlex

from hack.images import containerfile as cf
from hack.images.gpuferry import (
    IMAGE_ENV,
    INSTALL_SCRIPT,
    MODULES,
    PACKAGES_FILE,
    STAGED,
    VENV,
    WIREGUARD_SCRIPT,
)
from hack.images.wheels import REPO, console_scripts, package_dirs, project_sources, pyproject

INSTRUCTIONS = cf.read()


def rel(path: object) -> str:
    return str(path).removeprefix(str(REPO) + "/")


def runs(stage: str) -> list[str]:
    return [i.args for i in cf.stage(INSTRUCTIONS, stage) if i.keyword == "RUN"]


def test_parser_joins_continuations_and_names_stages() -> None:
    text = "# c\nARG A=1\nFROM x AS one\nRUN a \\\n  # inside\n  && b\nFROM y\nCOPY --from=one /a /b\n"
    got = cf.parse(text)
    assert [(i.keyword, i.args, i.stage) for i in got] == [
        ("ARG", "A=1", ""),
        ("FROM", "x AS one", "one"),
        ("RUN", "a && b", "one"),
        ("FROM", "y", "final"),
        ("COPY", "--from=one /a /b", "final"),
    ]
    assert cf.global_args(got) == {"A": "1"}
    assert cf.copied_sources(got, "final") == []


def test_base_is_debian_bookworm_slim() -> None:
    assert cf.global_args(INSTRUCTIONS)["BASE"] == "debian:bookworm-slim"
    froms = [i.args for i in INSTRUCTIONS if i.keyword == "FROM"]
    assert froms[-1] == "${BASE}"


def test_final_stage_copies_the_local_builds_package_list_and_install_script() -> None:
    copied = cf.copied_sources(INSTRUCTIONS, "final")
    assert copied == [rel(PACKAGES_FILE), rel(INSTALL_SCRIPT)]
    copy = next(i for i in cf.stage(INSTRUCTIONS, "final") if i.keyword == "COPY" and "--from" not in i.args)
    assert copy.args.split()[-1].rstrip("/") == STAGED  # where the local build puts them too


def test_final_stage_installs_every_listed_package_and_nothing_else() -> None:
    listed = f"{STAGED}/{PACKAGES_FILE.name}"
    [install] = [r for r in runs("final") if "apt-get install" in r]
    assert listed in install and "sed -e 's/#.*//'" in install  # comments stripped as read_packages does
    words = shlex.split(install.split("xargs", 1)[1].split("&&", 1)[0])
    assert words == ["apt-get", "install", "-y", "--no-install-recommends"]  # the names come from the file


def test_final_stage_runs_the_install_script_with_the_wheel_and_checks() -> None:
    [run] = [r for r in runs("final") if INSTALL_SCRIPT.name in r]
    words = shlex.split(run.split("&&", 1)[0])
    assert words[:2] == ["sh", f"{STAGED}/{INSTALL_SCRIPT.name}"]
    assert "--check" in words and words[-1] == f"{STAGED}/wheels/gpuferry-*.whl"
    assert "--find-links" not in words and "--no-deps" not in words  # dependencies from PyPI there


def test_wheel_stage_copies_exactly_the_wheels_sources() -> None:
    copied = cf.copied_sources(INSTRUCTIONS, "wheel")
    top_level = sorted({s.split("/", 1)[0] for s in project_sources()})
    assert sorted(copied) == top_level
    assert set(package_dirs()) <= set(copied)
    assert pyproject()["project"]["readme"] in copied


def test_wireguard_go_version_and_build_match_the_build_script() -> None:
    script = WIREGUARD_SCRIPT.read_text()
    pinned = re.search(r"WIREGUARD_GO_VERSION=\$\{WIREGUARD_GO_VERSION:-([^}]+)\}", script)
    assert pinned is not None
    assert cf.global_args(INSTRUCTIONS)["WIREGUARD_GO_VERSION"] == pinned.group(1)
    [build] = runs("wireguard-go")
    go_build = re.search(r"go build (.*?) -o ", build)
    script_build = re.search(r"go build (.*?) -o ", script)
    assert go_build is not None and script_build is not None
    assert go_build.group(1) == script_build.group(1)
    env = next(i.args for i in cf.stage(INSTRUCTIONS, "wireguard-go") if i.keyword == "ENV")
    assert "CGO_ENABLED=0" in env.split() and "CGO_ENABLED=0" in script
    copy = next(i.args for i in cf.stage(INSTRUCTIONS, "final") if "--from=wireguard-go" in i.args)
    assert copy.split()[-1] == "/usr/local/bin/wireguard-go"


def test_environment_and_command_match_the_local_image() -> None:
    env = next(i.args for i in cf.stage(INSTRUCTIONS, "final") if i.keyword == "ENV")
    assert dict(kv.split("=", 1) for kv in env.split()) == IMAGE_ENV
    assert IMAGE_ENV["PATH"].startswith(f"{VENV}/bin:")
    cmd = next(i.args for i in cf.stage(INSTRUCTIONS, "final") if i.keyword == "CMD")
    assert cmd == '["gpuferry"]' and "gpuferry" in console_scripts()


def test_install_script_checks_the_component_modules_of_the_local_build() -> None:
    script = INSTALL_SCRIPT.read_text()
    found = re.search(r'^modules="([^"]*)"', script, re.MULTILINE)
    assert found is not None and tuple(found.group(1).split()) == MODULES
    for module in MODULES:
        assert (REPO / module.replace(".", "/") / "__main__.py").is_file(), module
    assert re.search(r"^venv=\$\{GPUFERRY_VENV:-" + re.escape(VENV) + r"\}$", script, re.MULTILINE)
