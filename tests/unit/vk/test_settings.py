from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest

from vk.__main__ import parse_settings
from vk.forge.events import ProviderEvents, event_selector
from vk.settings import VirtualKubeletSettings, VirtualNodeError, from_virtual_node

BASE = VirtualKubeletSettings(
    consumer_kubeconfig=Path("/etc/consumer.kubeconfig"),
    provider_kubeconfig=None,
    consumer_cluster_id="",
    provider_cluster_id="",
    workers=4,
)
KUBECONFIG = b"apiVersion: v1\nkind: Config\n"


def virtual_node(**spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "farm-a", "namespace": "gpuferry-system", "generation": 1},
        "spec": {
            "providerClusterID": "farm-a",
            "consumerClusterID": "ml-eu1",
            "nodeName": "gpuferry-farm-a",
            "resources": {"nvidia.com/gpu": 8, "cpu": "64", "memory": "512Gi"},
            "labels": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
            "providerNodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
            "kubeconfigSecretRef": {"name": "farm-a-kubeconfig"},
            **spec,
        },
    }


def secret(data: bytes = KUBECONFIG, key: str = "kubeconfig") -> dict[str, Any]:
    return {"data": {key: base64.b64encode(data).decode()}}


def test_settings_come_from_the_virtual_node_and_its_secret() -> None:
    settings = from_virtual_node(virtual_node(), secret(), BASE)
    assert settings.virtual_node == "gpuferry-system/farm-a"
    assert (settings.provider_cluster_id, settings.consumer_cluster_id) == ("farm-a", "ml-eu1")
    assert settings.effective_node_name == "gpuferry-farm-a"
    assert settings.resources == {"nvidia.com/gpu": "8", "cpu": "64", "memory": "512Gi"}
    assert settings.node_labels == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert settings.provider_node_selector == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert settings.provider_kubeconfig_data == KUBECONFIG
    assert settings.provider_kubeconfig is None
    # tuning stays the entry point's
    assert settings.workers == 4 and settings.consumer_kubeconfig == BASE.consumer_kubeconfig
    assert "apiVersion" not in repr(settings), "the kubeconfig (a credential) is never printed"


def test_a_custom_secret_key_is_honoured() -> None:
    vn = virtual_node(kubeconfigSecretRef={"name": "s", "key": "provider.yaml"})
    assert from_virtual_node(vn, secret(key="provider.yaml"), BASE).provider_kubeconfig_data == KUBECONFIG


@pytest.mark.parametrize(
    "vn,sec,message",
    [
        (virtual_node(consumerClusterID=""), secret(), "spec.consumerClusterID is missing"),
        (virtual_node(), secret(key="other"), "Secret farm-a-kubeconfig has no key 'kubeconfig'"),
        (virtual_node(), {"data": {"kubeconfig": "%%%"}}, "is not base64"),
        (virtual_node(resources={"nvidia.com/gpu": "eight"}), secret(),
         "spec.resources: resource nvidia.com/gpu"),
    ],
)
def test_unusable_virtual_nodes_are_named_in_the_error(vn: Any, sec: Any, message: str) -> None:
    with pytest.raises(VirtualNodeError, match="VirtualNode gpuferry-system/farm-a") as err:
        from_virtual_node(vn, sec, BASE)
    assert message in str(err.value)


def test_flags_need_a_provider_unless_a_virtual_node_is_given(capsys: pytest.CaptureFixture[str]) -> None:
    settings = parse_settings(["--virtual-node", "gpuferry-system/farm-a"])
    assert settings.virtual_node == "gpuferry-system/farm-a"
    with pytest.raises(SystemExit) as exit_:
        parse_settings(["--consumer-id", "c"])
    assert exit_.value.code == 2
    assert "--provider-kubeconfig, --provider-id" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_settings(["--virtual-node", "no-slash"])
    assert "NAMESPACE/NAME" in capsys.readouterr().err


def test_the_grants_tolerations_come_from_the_virtual_node() -> None:
    gpu = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    assert from_virtual_node(virtual_node(), secret(), BASE).provider_tolerations == ()
    assert from_virtual_node(
        virtual_node(providerTolerations=[gpu]), secret(), BASE
    ).provider_tolerations == (gpu,)


def test_the_resync_period_is_a_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert parse_settings(["--virtual-node", "ns/vn"]).resync_seconds == 300.0
    assert parse_settings(["--virtual-node", "ns/vn", "--resync-seconds", "60"]).resync_seconds == 60.0
    with pytest.raises(SystemExit):
        parse_settings(["--virtual-node", "ns/vn", "--resync-seconds", "0"])
    assert "--resync-seconds must be at least 1" in capsys.readouterr().err


def test_how_long_a_cut_log_follow_goes_on_is_a_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert parse_settings(["--virtual-node", "ns/vn"]).log_resume_seconds == 30.0
    assert parse_settings(["--virtual-node", "ns/vn", "--log-resume-seconds", "0"]).log_resume_seconds == 0.0
    with pytest.raises(SystemExit):
        parse_settings(["--virtual-node", "ns/vn", "--log-resume-seconds", "-1"])
    assert "--log-resume-seconds must not be negative" in capsys.readouterr().err


def test_which_provider_events_are_copied_is_a_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert parse_settings(["--virtual-node", "ns/vn"]).provider_events == "all"
    flag = ["--virtual-node", "ns/vn", "--provider-events", "warnings"]
    assert parse_settings(flag).provider_events == "warnings"
    with pytest.raises(SystemExit):
        parse_settings(["--virtual-node", "ns/vn", "--provider-events", "errors"])
    assert "invalid choice: 'errors'" in capsys.readouterr().err


@pytest.mark.parametrize(
    "which,selector",
    [
        ("all", "involvedObject.kind=Pod"),
        ("warnings", "involvedObject.kind=Pod,type=Warning"),  # the API server drops the Normal ones
        ("none", None),  # no watch at all
    ],
)
def test_the_provider_events_watched_are_those_to_copy(which: ProviderEvents, selector: str | None) -> None:
    assert event_selector(which) == selector
