from __future__ import annotations

from vk.forge.accessories import copy_differs, is_copyable, references, remote_copy


def test_every_way_a_pod_names_configmaps_and_secrets() -> None:
    pod = {
        "spec": {
            "volumes": [
                {"name": "cfg", "configMap": {"name": "train-config"}},
                {"name": "creds", "secret": {"secretName": "s3-creds"}},
                {"name": "api", "projected": {"sources": [
                    {"configMap": {"name": "kube-root-ca.crt"}},
                    {"configMap": {"name": "extra"}},
                    {"secret": {"name": "tls"}},
                    {"serviceAccountToken": {"path": "token"}},
                ]}},
                {"name": "scratch", "emptyDir": {}},
            ],
            "initContainers": [{"name": "fetch", "envFrom": [{"secretRef": {"name": "hf-token"}}]}],
            "containers": [
                {
                    "name": "main",
                    "env": [
                        {"name": "A", "valueFrom": {"configMapKeyRef": {"name": "hyper", "key": "lr"}}},
                        {"name": "B", "valueFrom": {"secretKeyRef": {"name": "wandb", "key": "key"}}},
                        {"name": "C", "value": "plain"},
                        {"name": "D", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                    ],
                    "envFrom": [{"configMapRef": {"name": "defaults"}}],
                }
            ],
            "imagePullSecrets": [{"name": "nvcr"}],
        }
    }  # fmt: skip
    refs = references(pod)
    assert refs["configmaps"] == {"train-config", "extra", "hyper", "defaults"}
    assert refs["secrets"] == {"s3-creds", "tls", "hf-token", "wandb", "nvcr"}


def test_the_copy_keeps_data_and_marks_its_origin() -> None:
    source = {
        "metadata": {"name": "s3-creds", "namespace": "ml", "uid": "u-1", "resourceVersion": "9",
                     "labels": {"team": "a"}, "managedFields": [{}],
                     "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{}"}},
        "type": "Opaque",
        "data": {"key": "c2VjcmV0"},
        "immutable": True,
    }  # fmt: skip
    copy = remote_copy(source, "secrets", namespace="ml-c1", consumer_id="c1")
    assert copy["metadata"]["namespace"] == "ml-c1" and copy["metadata"]["name"] == "s3-creds"
    assert copy["metadata"]["labels"]["team"] == "a"
    assert copy["metadata"]["labels"]["gpuferry.io/origin-cluster-id"] == "c1"
    assert copy["metadata"]["annotations"]["gpuferry.io/origin-uid"] == "u-1"
    assert "resourceVersion" not in copy["metadata"] and "managedFields" not in copy["metadata"]
    assert (copy["type"], copy["data"], copy["immutable"]) == ("Opaque", {"key": "c2VjcmV0"}, True)
    assert not copy_differs(copy, copy)
    assert copy_differs({**copy, "data": {"key": "b3RoZXI="}}, copy)


def test_service_account_token_secrets_are_not_copied() -> None:
    assert not is_copyable({"type": "kubernetes.io/service-account-token"}, "secrets")
    assert is_copyable({"type": "Opaque"}, "secrets") and is_copyable({}, "configmaps")
