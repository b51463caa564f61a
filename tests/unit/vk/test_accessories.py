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


# ---- DRA claims (issue 18 §2) ------------------------------------------------------------------

TEMPLATE = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "ResourceClaimTemplate",
    "metadata": {"name": "big-gpu", "namespace": "ml", "uid": "u1", "resourceVersion": "7",
                 "labels": {"team": "vision"}},
    "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
        "deviceClassName": "gpu.nvidia.com",
        "selectors": [{"cel": {"expression":
            "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('40Gi')) >= 0"}}],
    }}]}}},
}  # fmt: skip


def test_a_pods_claims_are_referenced_by_template_or_by_name() -> None:
    pod = {"spec": {"resourceClaims": [
        {"name": "gpu", "resourceClaimTemplateName": "big-gpu"},
        {"name": "shared", "resourceClaimName": "team-fpga"},
    ], "containers": [{"name": "c", "resources": {"claims": [{"name": "gpu"}]}}]}}  # fmt: skip
    refs = references(pod)
    assert refs["resourceclaimtemplates"] == {"big-gpu"} and refs["resourceclaims"] == {"team-fpga"}
    assert refs["configmaps"] == refs["secrets"] == set()


def test_a_claim_template_is_copied_with_its_spec_and_compared_by_what_it_was_made_from() -> None:
    copy = remote_copy(TEMPLATE, "resourceclaimtemplates", namespace="ml-eu", consumer_id="eu")
    assert copy["apiVersion"] == "resource.k8s.io/v1" and copy["kind"] == "ResourceClaimTemplate"
    assert copy["metadata"]["namespace"] == "ml-eu" and copy["metadata"]["labels"]["team"] == "vision"
    assert copy["spec"] == TEMPLATE["spec"]
    assert "uid" not in copy["metadata"] and "resourceVersion" not in copy["metadata"]
    # what the API server defaults in the copy does not make it differ; a changed source does
    served = {**copy, "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
        **TEMPLATE["spec"]["spec"]["devices"]["requests"][0]["exactly"],  # type: ignore[index]
        "allocationMode": "ExactCount", "count": 1}}]}}}}  # fmt: skip
    assert not copy_differs(served, copy)
    changed = {**TEMPLATE, "spec": {"spec": {"devices": {"requests": []}}}}
    again = remote_copy(changed, "resourceclaimtemplates", namespace="ml-eu", consumer_id="eu")
    assert copy_differs(served, again)


def test_a_shared_claim_is_copied_without_its_allocation() -> None:
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
             "metadata": {"name": "team-fpga", "namespace": "ml"},
             "spec": {"devices": {"requests": []}},
             "status": {"allocation": {"devices": {"results": [{"device": "gpu-0"}]}}}}  # fmt: skip
    copy = remote_copy(claim, "resourceclaims", namespace="ml-eu", consumer_id="eu")
    assert copy["kind"] == "ResourceClaim" and "status" not in copy and copy["spec"] == claim["spec"]


async def test_a_namespace_is_watched_for_a_kind_only_while_its_pods_name_one() -> None:
    from kube.clients import KubeClient
    from kube.kubeconfigs import Connection
    from kube.objects import ObjectKey
    from vk.reflection.accessories import AccessoryReflector

    pods = {
        ObjectKey("plain", "p"): {"metadata": {"namespace": "plain", "name": "p"}, "spec": {}},
        ObjectKey("dra", "q"): {"metadata": {"namespace": "dra", "name": "q"}, "spec": {
            "resourceClaims": [{"name": "g", "resourceClaimTemplateName": "t"}]}},
    }  # fmt: skip

    nowhere = KubeClient(Connection(server="https://127.0.0.1:1"))
    reflector = AccessoryReflector("resourceclaimtemplates", consumer=nowhere, provider=nowhere,
                                   twin_namespace_for=lambda ns: None,
                                   consumer_id="eu")  # fmt: skip
    try:
        reflector.pod_changed(ObjectKey("plain", "p"), pods[ObjectKey("plain", "p")])
        assert "plain" not in reflector._watches and len(reflector._watches) == 0
        reflector.pod_changed(ObjectKey("dra", "q"), pods[ObjectKey("dra", "q")])
        assert "dra" in reflector._watches and len(reflector._watches) == 1
    finally:
        reflector.release("dra")
        await nowhere.close()
