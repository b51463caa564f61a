"""gpuferry install's pure parts: the values it sets, when an installation counts as available or
as stuck, where it finds helm, what it decides about its helm release (peering.helmrelease); and
its refusals of bad input, through the real command line."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from peering import helmrelease as release
from peering.cli.common import UserError
from peering.cli.install_cmds import (
    chart_dir,
    find_helm,
    helm_values,
    installation_state,
    keep_manifest,
    user_network_values,
)


def test_values_enable_the_roles_asked_for_and_split_the_image() -> None:
    values = helm_values(
        cluster_id="ml-eu",
        roles=["consumer"],
        replicas=2,
        image="registry.local:5000/gpuferry:abc",
        pull_policy="Never",
    )
    assert values == {
        "clusterID": "ml-eu",
        "provider": {"enabled": False},
        "consumer": {"enabled": True, "replicas": 2},
        "image": {"repository": "registry.local:5000/gpuferry", "tag": "abc", "pullPolicy": "Never"},
    }
    untagged = helm_values(
        cluster_id="x", roles=["provider"], replicas=None, image="registry.local:5000/gf", pull_policy=None
    )
    assert untagged["image"] == {"repository": "registry.local:5000/gf"}
    assert "image" not in helm_values(cluster_id="x", roles=[], replicas=None, image=None, pull_policy=None)


def deploy(
    name: str, want: int, have: int, generation: int = 1, observed: int = 1, old: int = 0
) -> dict[str, Any]:
    status = {"availableReplicas": have + old, "updatedReplicas": have, "replicas": have + old,
              "observedGeneration": observed}  # fmt: skip
    meta = {"name": name, "generation": generation}
    return {"metadata": meta, "spec": {"replicas": want}, "status": status}


def stuck(reason: str, **more: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "gpuferry-consumer-1"},
        "status": {
            "containerStatuses": [
                {
                    "name": "consumer",
                    "image": "gpuferry.local/gpuferry:nope",
                    "state": {"waiting": {"reason": reason, "message": "not there"}},
                    **more,
                }
            ]
        },
    }


def test_available_only_when_every_deployment_has_its_replicas_of_the_current_generation() -> None:
    assert installation_state([deploy("a", 2, 2), deploy("b", 1, 1)], []) == (["a", "b"], [], None)
    assert installation_state([deploy("a", 2, 1)], [])[1] == ["a"]
    assert installation_state([deploy("a", 1, 1, generation=2, observed=1)], [])[1] == ["a"]  # rolling
    # new pods there, old ones still available and not yet gone: not done
    assert installation_state([deploy("a", 2, 2, old=1)], [])[1] == ["a"]
    rolling = deploy("a", 2, 2)
    rolling["status"]["availableReplicas"] = 1  # updated, not all available yet
    assert installation_state([rolling], [])[1] == ["a"]


def daemonset(name: str, desired: int, updated: int, available: int, observed: int = 1) -> dict[str, Any]:
    status = {"desiredNumberScheduled": desired, "updatedNumberScheduled": updated,
              "numberAvailable": available, "numberReady": available,
              "observedGeneration": observed}  # fmt: skip
    return {"metadata": {"name": name, "generation": 1}, "spec": {}, "status": status}


def test_a_daemonset_is_rolled_out_when_every_node_runs_an_available_updated_pod() -> None:
    assert installation_state([daemonset("agent", 2, 2, 2)], []) == (["agent"], [], None)
    assert installation_state([daemonset("agent", 2, 1, 2)], [])[1] == ["agent"]  # one node still old
    assert installation_state([daemonset("agent", 2, 2, 1)], [])[1] == ["agent"]  # one not available
    assert installation_state([daemonset("agent", 2, 2, 2, observed=0)], [])[1] == ["agent"]
    # no node to run on (every node simulated, say) is rolled out: nothing to wait for
    assert installation_state([daemonset("agent", 0, 0, 0)], [])[0] == ["agent"]


def test_networking_the_user_gave_is_not_discovered(tmp_path: Path) -> None:
    values = tmp_path / "v.yaml"
    values.write_text("networking:\n  podCIDRs: [10.1.0.0/16]\n  endpoint: {address: gw.example.org}\n")
    said = user_network_values([str(values)], ["networking.enabled=true", "image.tag=x"])
    assert said == {"podCIDRs": ["10.1.0.0/16"], "endpoint.address": "gw.example.org", "enabled": "true"}
    assert helm_values(cluster_id="x", roles=["provider"], replicas=None, image=None, pull_policy=None,
                       networking={"enabled": False})["networking"] == {"enabled": False}  # fmt: skip
    broken = tmp_path / "broken.yaml"
    broken.write_text("networking: [\n")
    with pytest.raises(UserError, match="cannot read the values file"):
        user_network_values([str(broken)], None)


def test_a_pod_that_will_not_start_stops_the_wait_with_why() -> None:
    _, _, trouble = installation_state([deploy("a", 1, 0)], [stuck("ErrImageNeverPull")])
    assert trouble is not None and "image gpuferry.local/gpuferry:nope: not there" in trouble
    crashed = stuck(
        "CrashLoopBackOff", restartCount=3, lastState={"terminated": {"exitCode": 1, "message": "boom"}}
    )
    assert "exited 1 (3 restarts): boom" in str(installation_state([], [crashed])[2])
    assert installation_state([], [stuck("ContainerCreating")])[2] is None  # just starting


def test_helm_is_found_or_the_error_says_how_to_get_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setenv("GPUFERRY_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("GPUFERRY_HELM", raising=False)
    with pytest.raises(UserError, match=r"no helm binary.*make build-k8s"):
        find_helm(None)
    with pytest.raises(UserError, match="is not an executable file"):
        find_helm(str(tmp_path / "nope"))
    for version in ("v3.9.0", "v3.21.4", "v3.10.2"):
        built = tmp_path / "cache" / f"helm-{version}" / "bin" / "helm"
        built.parent.mkdir(parents=True)
        built.write_text("#!/bin/sh\n")
        built.chmod(built.stat().st_mode | stat.S_IXUSR)
    # the newest build wins (a text sort would take v3.9.0)
    assert find_helm(None) == str(tmp_path / "cache" / "helm-v3.21.4" / "bin" / "helm")


def gpuferry(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "peering.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
        check=False,
    )


def test_bad_input_is_one_line_and_no_traceback(tmp_path: Path) -> None:
    no_role = gpuferry("install", "--kubeconfig", str(tmp_path / "none"))
    assert (
        no_role.returncode == 1
        and no_role.stderr.strip() == "error: gpuferry install needs --role provider, consumer or both"
    )
    no_helm = gpuferry("install", "--role", "consumer", "--helm", str(tmp_path / "helm"))
    assert no_helm.returncode == 1 and "is not an executable file" in no_helm.stderr
    bad_policy = gpuferry("install", "--role", "consumer", "--pull-policy", "Sometimes")
    assert bad_policy.returncode == 2 and "invalid choice" in bad_policy.stderr
    for proc in (no_role, no_helm, bad_policy):
        assert "Traceback" not in proc.stderr


def test_the_wheel_carries_every_file_of_the_chart() -> None:
    """peering/chart links to charts/gpuferry; pyproject's package-data must name every file."""
    import fnmatch
    import tomllib

    root = Path(__file__).resolve().parents[3]
    setuptools = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    globs = setuptools["package-data"]["peering"]
    chart = chart_dir()
    assert chart.resolve() == (root / "charts" / "gpuferry").resolve()
    files = [p.relative_to(chart).as_posix() for p in chart.rglob("*") if p.is_file()]
    assert "Chart.yaml" in files and any(f.startswith("crds/") for f in files)
    missed = [f for f in files if not any(fnmatch.fnmatch(f"chart/{f}", g) for g in globs)]
    assert missed == [], f"add these to [tool.setuptools.package-data] in pyproject.toml: {missed}"


def test_peer_relies_on_installed_controllers_and_runs_local_ones_only_when_asked() -> None:
    from peering.cli.peering_cmds import choose_agents

    assert choose_agents("auto", {"consumer": True, "provider": True}) == "none"
    # local processes are development mode: asked for by name, never a fallback
    with pytest.raises(UserError, match=r"runs in neither cluster.*--agents local"):
        choose_agents("auto", {"consumer": False, "provider": False})
    assert choose_agents("local", {"consumer": False, "provider": False}) == "local"
    assert choose_agents("local", {"consumer": True, "provider": True}) == "local"  # said: done
    half = r"installed in the consumer cluster but not in the provider.*--role provider"
    with pytest.raises(UserError, match=half):
        choose_agents("auto", {"consumer": True, "provider": False})


@pytest.mark.parametrize(
    "text,toleration",
    [
        ("nvidia.com/gpu", {"key": "nvidia.com/gpu", "operator": "Exists"}),
        (
            "nvidia.com/gpu:NoSchedule",
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        ),
        ("pool=lent:NoExecute", {"key": "pool", "operator": "Equal", "value": "lent", "effect": "NoExecute"}),
    ],
)
def test_tolerate_reads_as_a_pod_toleration(text: str, toleration: dict[str, str]) -> None:
    from peering.cli.peering_cmds import parse_tolerations

    assert parse_tolerations([text]) == [toleration]


@pytest.mark.parametrize("text", ["", "=x", "pool=", "pool:Sometimes", "a b", "pool=(x"])
def test_a_bad_tolerate_is_refused_before_anything_is_sent(text: str) -> None:
    from peering.cli.peering_cmds import parse_tolerations

    with pytest.raises(UserError, match="--tolerate"):
        parse_tolerations([text])


@pytest.mark.parametrize(
    ("url", "loopback"),
    [
        ("https://127.0.0.1:6443", True), ("https://127.3.2.1", True), ("https://[::1]:6443", True),
        ("https://localhost:6443", True), ("https://api.localhost", True),
        ("https://10.0.0.5:6443", False), ("https://172.31.0.12:17200", False),
        ("https://api.gpu-farm.example:6443", False), ("https://[fd00::1]:6443", False),
    ],
)  # fmt: skip
def test_the_installed_agent_cannot_reach_a_loopback_api_server(url: str, loopback: bool) -> None:
    from peering.cli.peering_cmds import check_reachable_from_pods, is_loopback_url

    assert is_loopback_url(url) is loopback
    if not loopback:
        check_reachable_from_pods(url, given=False)
        return
    said = r"the server of --remote-kubeconfig is .* a loopback address"
    with pytest.raises(UserError, match=said) as told:
        check_reachable_from_pods(url, given=False)
    assert "give --remote-server URL" in str(told.value) and "nothing was changed" in str(told.value)
    with pytest.raises(UserError, match=r"^--remote-server is "):
        check_reachable_from_pods(url, given=True)


def test_install_crds_takes_the_kubeconfig_before_or_after_crds() -> None:
    from peering.cli.main import build_parser

    for argv in (["install", "--kubeconfig", "k", "crds"], ["install", "crds", "--kubeconfig", "k"]):
        assert build_parser().parse_args(argv).kubeconfig == "k", argv
    assert build_parser().parse_args(["install", "crds"]).kubeconfig is None


ADOPTED = {
    "apiVersion": "v1",
    "kind": "ConfigMap",
    "metadata": {
        "name": "gpuferry-network", "namespace": "kube-system", "uid": "u-1", "resourceVersion": "42",
        "creationTimestamp": "2026-12-08T00:00:00Z", "labels": {"a": "b"},
        "annotations": {"meta.helm.sh/release-name": "gpuferry"}, "managedFields": [{"manager": "x"}],
    },
    "data": {"podCIDRs": "10.244.0.0/16", "gatewayIP": "0e5363800296"},
}  # fmt: skip


def test_a_configmap_made_again_keeps_what_it_held_and_nothing_the_server_set() -> None:
    again = release.configmap_as_was(ADOPTED)
    assert again == {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "gpuferry-network", "namespace": "kube-system", "labels": {"a": "b"},
                     "annotations": {"meta.helm.sh/release-name": "gpuferry"}},
        "data": {"podCIDRs": "10.244.0.0/16", "gatewayIP": "0e5363800296"},
    }  # fmt: skip
    bare = release.configmap_as_was({"metadata": {"name": "n", "namespace": "s"}})
    assert bare["metadata"] == {"name": "n", "namespace": "s"} and bare["data"] == {}


def test_what_an_undo_could_not_put_back_is_kept_in_a_new_file_each_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUFERRY_CACHE", str(tmp_path))
    again = release.configmap_as_was(ADOPTED)
    first = keep_manifest(again, now=0.0)
    second = keep_manifest(again, now=1.0)
    assert first == tmp_path / "install" / "configmap-kube-system-gpuferry-network-19700101T000000.yaml"
    assert second != first and first.is_file()
    # kubectl gets back the very object: the number-like string quoted, so Go reads a string too
    text = first.read_text()
    assert yaml.safe_load(text) == again and "'0e5363800296'" in text, text


def test_values_are_named_by_their_dotted_keys_as_set_names_them() -> None:
    given = {"clusterID": "ml-eu", "consumer": {"enabled": True, "namespaceAdminsOffload": True},
             "networking": {"podCIDRs": ["10.244.0.0/16"], "endpoint": {}},
             "image": {"tag": "1"}}  # fmt: skip
    assert release.flat_keys(given) == [
        "clusterID", "consumer.enabled", "consumer.namespaceAdminsOffload", "networking.podCIDRs",
        "networking.endpoint", "image.tag",
    ]  # fmt: skip
    assert release.flat_keys({}) == []


def test_an_upgrade_gives_helm_the_last_values_first_and_set_last() -> None:
    assert release.values_arguments(last="last.yaml", files=["a.yaml", "b.yaml"], ours="ours.yaml",
                            sets=["x=1", "y=2"]) == [
        "-f", "last.yaml", "-f", "a.yaml", "-f", "b.yaml", "-f", "ours.yaml", "--set", "x=1", "--set", "y=2",
    ]  # fmt: skip
    # a first install, or --reset-values: from the chart's defaults
    assert release.values_arguments(last=None, files=[], ours="ours.yaml", sets=[]) == ["-f", "ours.yaml"]


@pytest.mark.parametrize(
    ("pairs", "keys"),
    [
        (["a.b=1"], {"a.b"}),
        (["a.b=1,c={x,y}", "d=e=f"], {"a.b", "c", "d"}),
        (["nodeSelector.gpuferry\\.io/real-node=", "x=a\\,b=c"], {"nodeSelector.gpuferry.io/real-node", "x"}),
        (["tolerations[0].key=k", "l[1]=v"], {"tolerations", "l"}),
    ],
)
def test_the_keys_a_set_names_are_those_helm_reads(pairs: list[str], keys: set[str]) -> None:
    assert release.set_keys(pairs) == keys


def test_an_upgrade_builds_on_the_deployed_revision_not_on_one_that_failed() -> None:
    history = [{"revision": 1, "status": "superseded"}, {"revision": 3, "status": "failed"},
               {"revision": 2, "status": "deployed"}]  # fmt: skip
    assert release.release_state(history) == release.ReleaseState(deployed=2, pending=None)
    assert release.release_state([{"revision": 1, "status": "failed"}]) == release.ReleaseState()
    assert release.release_state([]) == release.ReleaseState()
    said = release.upgrade_failed(
        "helm upgrade failed: why", release.release_state(history), "gpuferry-system"
    )
    assert said == ("helm upgrade failed: why; revision 2 is the release's last good one "
                    "(`helm rollback gpuferry 2 -n gpuferry-system` puts its objects back)")  # fmt: skip
    assert release.upgrade_failed("why", release.ReleaseState(), "ns") == "why"  # nothing to go back to


def test_an_operation_that_never_finished_is_named_with_what_force_does() -> None:
    interrupted = {"revision": 3, "status": "pending-upgrade", "updated": "2026-12-08T01:00:29Z"}
    state = release.release_state([{"revision": 2, "status": "deployed"}, interrupted])
    assert state == release.ReleaseState(deployed=2, pending=interrupted)
    said = release.pending_message(state, "gpuferry-system")
    assert said.startswith("helm release gpuferry in gpuferry-system is pending-upgrade since "
                           "2026-12-08T01:00:29Z (revision 3): an install that was "
                           "interrupted"), said  # fmt: skip
    assert said.endswith("--force goes back to revision 2 first (as `helm rollback gpuferry 2 -n "
                         "gpuferry-system`), then upgrades"), said  # fmt: skip
    first = release.release_state([{"revision": 1, "status": "pending-install", "updated": "t"}])
    assert first.deployed is None and first.pending is not None
    assert release.pending_message(first, "ns").endswith(
        "--force removes it first (nothing of it was deployed; as `helm uninstall gpuferry -n ns`)"
    )
    # a pending revision under a later one is history, not an operation under way
    later = [{"revision": 1, "status": "pending-install"}, {"revision": 2, "status": "deployed"}]
    assert release.release_state(later).pending is None


def test_a_configmap_taken_back_from_a_removed_release_is_no_longer_marked_as_its() -> None:
    given = release.configmap_as_was({"metadata": {
        "name": "gpuferry-cluster-id", "namespace": "gpuferry-system",
        "labels": {"app.kubernetes.io/managed-by": "Helm", "team": "gpu"},
        "annotations": {"meta.helm.sh/release-name": "gpuferry", "meta.helm.sh/release-namespace": "x"}},
        "data": {"clusterID": "gpu-farm"}})  # fmt: skip
    assert release.without_helm_ownership(given) == {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "gpuferry-cluster-id", "namespace": "gpuferry-system",
                     "labels": {"team": "gpu"}},
        "data": {"clusterID": "gpu-farm"}}  # fmt: skip


def test_helms_error_keeps_why_and_loses_the_object_it_quotes() -> None:
    refused = json.dumps(json.dumps({"kind": "Deployment", "spec": {"x": "y" * 5000}}))
    head = 'Error: UPGRADE FAILED: cannot patch "gpuferry-provider" with kind Deployment:  ""'
    why = "quantities must match the regular expression '^([+-]?[0-9.]+)$'"
    short = release.without_long_quotes(f"{head} is invalid: patch: Invalid value: {refused}: {why}")
    assert len(short) < 400, short
    assert short.startswith(head), short
    assert 'Invalid value: "{\\"kind\\": \\"Deployment\\"' in short, short
    assert short.endswith(why), short
    assert release.without_long_quotes('a "short" one') == 'a "short" one'


def test_the_roles_a_clusters_peerings_need() -> None:
    def fc(name: str, role: str) -> dict[str, Any]:
        return {"metadata": {"name": name}, "spec": {"clusterID": name, "role": role}}

    tenant = {"metadata": {"name": "t-ml-us"}, "spec": {"consumerClusterID": "ml-us"}}
    assert release.peers_by_role([fc("gpu-farm", "Provider"), fc("ml-eu", "Consumer")], [tenant]) == {
        "consumer": ["gpu-farm"], "provider": ["ml-eu", "ml-us"]}  # fmt: skip
    assert release.peers_by_role([], []) == {"provider": [], "consumer": []}


def test_an_upgrade_that_drops_a_role_its_peers_need_is_refused() -> None:
    in_use = {"provider": ["ml-eu"], "consumer": []}
    said = release.dropped_in_use(["provider"], ["consumer"], in_use)
    assert said.startswith("the provider role goes, but this cluster still lends GPUs to ml-eu: "), said
    assert "--force" in said and "gpuferry unpeer" in said
    both = release.dropped_in_use(["provider", "consumer"], [], {"provider": ["a"], "consumer": ["b", "c"]})
    assert "lends GPUs to a; the consumer role goes, but this cluster still borrows GPUs from b, c" in both
    assert release.dropped_in_use(["provider"], ["provider", "consumer"], in_use) == ""  # kept
    assert release.dropped_in_use(["consumer"], ["provider"], in_use) == ""  # dropped, with no peer on it


def test_taking_a_configmap_back_undoes_what_giving_it_to_the_release_added() -> None:
    made = release.configmap_as_was(
        {"metadata": {"name": "n", "namespace": "s", "labels": {"team": "gpu"}}, "data": {"k": "v"}}
    )
    owned = release.helm_ownership("gpuferry-system")
    given = {**made, "metadata": {**made["metadata"],
                                  "labels": {**made["metadata"]["labels"], **owned["labels"]},
                                  "annotations": owned["annotations"]}}  # fmt: skip
    assert given["metadata"]["annotations"][release.RELEASE_NAME] == "gpuferry"
    assert release.without_helm_ownership(given) == made
