from __future__ import annotations

import base64
from typing import Any

from vk.forge.pods import ForgeOptions, remote_pod
from vk.forge.tokens import has_token_volume, token_request, token_secret, token_secret_name

KUBE_API_ACCESS: dict[str, Any] = {
    "name": "kube-api-access-x7k2p",
    "projected": {
        "defaultMode": 420,
        "sources": [
            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
            {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
            {
                "downwardAPI": {
                    "items": [
                        {
                            "path": "namespace",
                            "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"},
                        }
                    ]
                }
            },
        ],
    },
}


def consumer_pod() -> dict[str, Any]:
    return {
        "metadata": {"name": "train-0", "namespace": "ml", "uid": "uid-1"},
        "spec": {
            "serviceAccountName": "trainer",
            "containers": [
                {
                    "name": "c",
                    "image": "i",
                    "volumeMounts": [
                        {
                            "name": "kube-api-access-x7k2p",
                            "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
                        }
                    ],
                }
            ],
            "volumes": [KUBE_API_ACCESS],
        },
    }


def test_the_twin_reads_token_ca_and_namespace_from_its_token_secret() -> None:
    opts = ForgeOptions(consumer_cluster_id="c1", provider_cluster_id="p1", service_account_tokens=True)
    twin = remote_pod(consumer_pod(), opts)
    (volume,) = twin["spec"]["volumes"]
    secret = token_secret_name("train-0")
    assert volume["projected"]["sources"] == [
        {"secret": {"name": secret, "items": [{"key": "token", "path": "token"}]}},
        {"secret": {"name": secret, "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
        {"secret": {"name": secret, "items": [{"key": "namespace", "path": "namespace"}]}},
    ]
    assert twin["spec"]["containers"][0]["volumeMounts"][0]["mountPath"].endswith("serviceaccount")
    assert twin["spec"]["automountServiceAccountToken"] is False
    assert not has_token_volume(twin) and has_token_volume(consumer_pod())


def test_without_token_reflection_the_volume_is_dropped() -> None:
    twin = remote_pod(consumer_pod(), ForgeOptions(consumer_cluster_id="c1", provider_cluster_id="p1"))
    assert "volumes" not in twin["spec"] and "volumeMounts" not in twin["spec"]["containers"][0]


def test_the_token_request_is_bound_to_the_pod_and_the_secret_holds_what_the_volume_reads() -> None:
    pod = consumer_pod()
    assert token_request(pod)["spec"] == {
        "expirationSeconds": 3607,
        "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": "train-0", "uid": "uid-1"},
    }
    body = token_secret(
        pod, token="jwt", ca_pem="PEM", namespace="ml-c1", consumer_id="c1", expires="2030-01-01T00:00:00Z"
    )
    decoded = {k: base64.b64decode(v).decode() for k, v in body["data"].items()}
    assert decoded == {"token": "jwt", "ca.crt": "PEM", "namespace": "ml"}
    assert body["metadata"]["namespace"] == "ml-c1"
    assert body["metadata"]["labels"]["gpuferry.io/origin-uid"] == "uid-1"


def test_long_pod_names_still_make_valid_secret_names() -> None:
    name = token_secret_name("p" * 253)
    assert len(name) <= 253 and name.endswith("-gpuferry-token")
    assert name != token_secret_name("p" * 252)
