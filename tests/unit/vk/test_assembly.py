"""The virtual kubelet's assembly, without an API server: which queues, informers and checks it
has, the identity it runs with chosen once, and where its probes are served."""

from __future__ import annotations

import dataclasses

import pytest

from kube.clients import KubeClient
from kube.kubeconfigs import Connection
from kube.manager import Manager
from kube.objects import ObjectKey
from kube.settings import ProbeSettings
from kube.watching import Listed, WatchEvent
from vk.__main__ import parse_settings
from vk.assembly import build_virtual_kubelet
from vk.forge.labels import ownership_labels
from vk.node.provider import ProviderView
from vk.remote import AdminSide, TenantSide, remote_side
from vk.settings import VirtualKubeletSettings

from .builders import gpu_pod, node

SETTINGS = VirtualKubeletSettings(
    consumer_kubeconfig=None,
    provider_kubeconfig=None,
    consumer_cluster_id="ml-eu1",
    provider_cluster_id="farm-a",
    resources={"nvidia.com/gpu": "8"},
)
TENANT = dataclasses.replace(SETTINGS, tenant_namespace="gpuferry-tenant-ml-eu1", slice_name="farm-a")


def _client() -> KubeClient:
    return KubeClient(Connection(server="https://127.0.0.1:1"))  # never called here


def _build(settings: VirtualKubeletSettings) -> Manager:
    return build_virtual_kubelet(settings, _client(), _client())


def test_pods_out_and_status_back_are_two_controllers_named_by_direction() -> None:
    manager = _build(SETTINGS)
    names = [c.name for c in manager.controllers]
    assert names.count("sync_pods_to_remote") == names.count("sync_status_from_remote") == 1
    assert set(names) == {
        "sync_pods_to_remote", "sync_status_from_remote", "sync_tokens_to_remote",
        "sync_configmaps_to_remote", "sync_secrets_to_remote", "sync_resourceclaimtemplates_to_remote",
        "sync_resourceclaims_to_remote", "sync_services_to_remote",
    }  # fmt: skip
    by_name = {c.name: c for c in manager.controllers}
    out, back = by_name["sync_pods_to_remote"], by_name["sync_status_from_remote"]
    assert out.queue is not back.queue and out.reconciler is not back.reconciler
    assert out.queue.name == "sync_pods_to_remote" and back.queue.name == "sync_status_from_remote"
    # both wait for both sides to be listed: a twin not seen is not a twin missing
    assert [i.name for i in out.informers] == [i.name for i in back.informers] == [
        "consumer-pods", "provider-twins",
    ]  # fmt: skip


def test_without_tokens_there_is_no_token_queue() -> None:
    manager = _build(dataclasses.replace(SETTINGS, service_account_tokens=False))
    assert "sync_tokens_to_remote" not in [c.name for c in manager.controllers]


@pytest.mark.parametrize(
    ("settings", "side", "informers"),
    [
        (SETTINGS, AdminSide, ["consumer-pods", "provider-twins"]),
        (TENANT, TenantSide, ["consumer-pods", "namespaceoffloadings"]),
    ],
)
def test_the_identity_is_chosen_once_from_the_settings(
    settings: VirtualKubeletSettings, side: type, informers: list[str]
) -> None:
    view = ProviderView(provider=_client(), selector={}, settings=settings.watch)
    assert isinstance(remote_side(settings, _client(), view), side)
    manager = _build(settings)
    assert [i.name for i in manager.informers] == informers
    assert {"node-registered", "twins-listed"} <= set(manager.probes.readiness)


def test_twin_namespaces_follow_the_identity() -> None:
    view = ProviderView(provider=_client(), selector={}, settings=SETTINGS.watch)
    admin = remote_side(SETTINGS, _client(), view)
    tenant = remote_side(TENANT, _client(), view)
    assert admin.twin_namespace_for("ml") == "ml-ml-eu1"  # by rule, made by the virtual kubelet
    assert tenant.twin_namespace_for("ml") is None  # until the provider made one on request
    assert not tenant.knows(ObjectKey("ml", "train-0"))  # not before its requests are listed


def test_an_admin_counts_its_twins_on_the_provider_nodes_from_the_twin_watch() -> None:
    """The twins' events reach the view through the twin informer, and the view's own pod watch
    leaves them out: the provider sends each twin event once (issue 15)."""
    view = ProviderView(provider=_client(), selector={}, settings=SETTINGS.watch)
    admin = remote_side(SETTINGS, _client(), view)
    assert isinstance(admin, AdminSide)
    assert view.pod_label_selector == "gpuferry.io/origin-cluster-id!=ml-eu1"
    view.handle_node(WatchEvent("ADDED", node("h100-0", gpus=8)))
    view.handle_node(Listed("1", frozenset({ObjectKey(None, "h100-0")})))
    view.handle_pod(Listed("1", frozenset()))  # the view's own watch: no other pods
    assert not view.synced, "the twins are not listed yet"
    twin = gpu_pod("train-0", "h100-0", gpus=3)
    twin["metadata"]["namespace"] = "ml-ml-eu1"
    twin["metadata"]["labels"] = ownership_labels("ml-eu1")
    admin.twins.receive(WatchEvent("ADDED", twin))
    admin.twins.receive(Listed("2", frozenset({ObjectKey.of(twin)})))
    assert view.synced
    assert view.per_node_free()["h100-0"]["nvidia.com/gpu"] == 5
    admin.twins.receive(WatchEvent("DELETED", twin))
    assert view.per_node_free()["h100-0"]["nvidia.com/gpu"] == 8


def test_probes_are_served_where_the_flags_say() -> None:
    base = ["--provider-kubeconfig", "/p", "--consumer-id", "c", "--provider-id", "p"]
    assert parse_settings(base).probe_settings == ProbeSettings(bind_address="127.0.0.1", port=0)
    flags = parse_settings([*base, "--probe-bind-address", "0.0.0.0", "--probe-port", "8081"])
    assert flags.probe_settings == ProbeSettings(bind_address="0.0.0.0", port=8081)
    # --metrics-port, the older flag, is the probe port when given
    older = parse_settings([*base, "--metrics-port", "9100", "--probe-port", "8081"])
    assert older.probe_settings == ProbeSettings(bind_address="127.0.0.1", port=9100)
    assert _build(dataclasses.replace(SETTINGS, metrics_port=9100)).probes_settings.port == 9100

