"""The add-ons every real cluster has and the local clusters run on their real node: CoreDNS (cluster
DNS) and metrics-server (``kubectl top``). Manifests only; pure.

Both run from images built here (hack/images: the binaries of hack/build-k8s.sh in a one-layer
image), tolerate the real node's taint and select it. metrics-server runs in the node's network
(hostNetwork): the API server, a process on the host, reaches extension API servers through the
aggregation layer at their endpoint address (``--enable-aggregator-routing``), and the host can
route to a node's WAN address, never into its pod range (both clusters use the same one).
"""

from __future__ import annotations

from typing import Any

from .nodeconfig import CLUSTER_DOMAIN, cluster_dns_ip
from .nodes import KWOK_NODE_LABEL, KWOK_NODE_VALUE
from .spec import REAL_NODE_LABEL, ClusterSpec

Manifest = dict[str, Any]

METRICS_SERVER_PORT = 4443
ON_REAL_NODE: dict[str, Any] = {
    "nodeSelector": {REAL_NODE_LABEL: "true"},
    "tolerations": [{"key": REAL_NODE_LABEL, "operator": "Exists", "effect": "NoSchedule"}],
}
RESTRICTED: dict[str, Any] = {
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "runAsNonRoot": True,
    "runAsUser": 65532,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}
PART_OF = {"app.kubernetes.io/part-of": "gpuferry-localcluster"}


def _meta(name: str, namespace: str | None = "kube-system", **labels: str) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": {**PART_OF, **labels}}
    if namespace:
        meta["namespace"] = namespace
    return meta


def _cluster_role(name: str, rules: list[dict[str, Any]], **labels: str) -> Manifest:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": _meta(name, None, **labels),
        "rules": rules,
    }


def _binding(
    kind: str, name: str, role_kind: str, role: str, sa: str, namespace: str | None = None
) -> Manifest:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": kind,
        "metadata": _meta(name, namespace),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": role},
        "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": "kube-system"}],
    }


def _service_account(name: str) -> Manifest:
    return {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(name)}


COREFILE = """.:53 {{
    errors
    health {{
        lameduck 5s
    }}
    ready
    kubernetes {domain} in-addr.arpa ip6.arpa {{
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 30
    }}
    prometheus :9153
    cache 30
    reload
    loadbalance
}}
"""
"""No ``forward``: the local clusters have no upstream resolver (and no internet to reach)."""


def coredns(spec: ClusterSpec, image: str) -> list[Manifest]:
    """CoreDNS as kubeadm installs it: ``kube-system/coredns`` behind the Service ``kube-dns`` at
    the address the kubelet hands to pods (``clusterDNS``)."""
    app = {"k8s-app": "kube-dns"}
    probe_port = {"port": 8080, "scheme": "HTTP"}
    container = {
        "name": "coredns",
        "image": image,
        "imagePullPolicy": "Never",
        "args": ["-conf", "/etc/coredns/Corefile"],
        "ports": [
            {"name": "dns", "containerPort": 53, "protocol": "UDP"},
            {"name": "dns-tcp", "containerPort": 53, "protocol": "TCP"},
            {"name": "metrics", "containerPort": 9153, "protocol": "TCP"},
        ],
        "resources": {"requests": {"cpu": "50m", "memory": "40Mi"}, "limits": {"memory": "170Mi"}},
        "livenessProbe": {"httpGet": {"path": "/health", **probe_port}, "periodSeconds": 10},
        "readinessProbe": {"httpGet": {"path": "/ready", "port": 8181, "scheme": "HTTP"}, "periodSeconds": 2},
        "securityContext": RESTRICTED,
        "volumeMounts": [{"name": "config", "mountPath": "/etc/coredns", "readOnly": True}],
    }
    return [
        _service_account("coredns"),
        _cluster_role(
            "system:coredns",
            [
                {
                    "apiGroups": [""],
                    "resources": ["endpoints", "services", "pods", "namespaces"],
                    "verbs": ["list", "watch"],
                },
                {
                    "apiGroups": ["discovery.k8s.io"],
                    "resources": ["endpointslices"],
                    "verbs": ["list", "watch"],
                },
            ],
        ),
        _binding("ClusterRoleBinding", "system:coredns", "ClusterRole", "system:coredns", "coredns"),
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": _meta("coredns"),
            "data": {"Corefile": COREFILE.format(domain=CLUSTER_DOMAIN)},
        },
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": _meta("coredns", **app),
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": app},
                "template": {
                    "metadata": {"labels": app},
                    "spec": {
                        **ON_REAL_NODE,
                        "serviceAccountName": "coredns",
                        "priorityClassName": "system-cluster-critical",
                        "dnsPolicy": "Default",
                        "containers": [container],
                        "volumes": [{"name": "config", "configMap": {"name": "coredns"}}],
                    },
                },
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": _meta("kube-dns", **app, **{"kubernetes.io/name": "CoreDNS"}),
            "spec": {
                "selector": app,
                "clusterIP": cluster_dns_ip(spec),
                "ports": [
                    {"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 53},
                    {"name": "dns-tcp", "port": 53, "protocol": "TCP", "targetPort": 53},
                    {"name": "metrics", "port": 9153, "protocol": "TCP", "targetPort": 9153},
                ],
            },
        },
    ]


def metrics_server(image: str) -> list[Manifest]:
    """metrics-server as its upstream manifest installs it, on the real node's network, verifying
    kubelets with the cluster CA. It scrapes every node but kwok's: their address, 127.0.0.1, is
    the real kubelet itself from the real node's network. Virtual nodes are scraped: the kubelet
    API of a virtual kubelet installed by the chart (a pod) gives its twins' usage (``kubectl
    top``); one running on the host may be out of reach, which metrics-server logs and skips."""
    app = {"k8s-app": "metrics-server"}
    args = [
        f"--secure-port={METRICS_SERVER_PORT}",
        "--cert-dir=/tmp",
        "--kubelet-preferred-address-types=InternalIP",
        "--kubelet-certificate-authority=/var/run/cluster-ca/ca.crt",
        f"--node-selector={KWOK_NODE_LABEL}!={KWOK_NODE_VALUE}",
        "--metric-resolution=15s",
    ]
    container = {
        "name": "metrics-server",
        "image": image,
        "imagePullPolicy": "Never",
        "args": args,
        "ports": [{"name": "https", "containerPort": METRICS_SERVER_PORT, "protocol": "TCP"}],
        "resources": {"requests": {"cpu": "50m", "memory": "50Mi"}, "limits": {"memory": "200Mi"}},
        "readinessProbe": {
            "httpGet": {"path": "/readyz", "port": METRICS_SERVER_PORT, "scheme": "HTTPS"},
            "periodSeconds": 5,
            "failureThreshold": 3,
        },
        "livenessProbe": {
            "httpGet": {"path": "/livez", "port": METRICS_SERVER_PORT, "scheme": "HTTPS"},
            "periodSeconds": 10,
        },
        "securityContext": RESTRICTED,
        "volumeMounts": [
            {"name": "tmp", "mountPath": "/tmp"},
            {"name": "cluster-ca", "mountPath": "/var/run/cluster-ca", "readOnly": True},
        ],
    }
    aggregated = {
        "rbac.authorization.k8s.io/aggregate-to-view": "true",
        "rbac.authorization.k8s.io/aggregate-to-edit": "true",
        "rbac.authorization.k8s.io/aggregate-to-admin": "true",
    }
    return [
        _service_account("metrics-server"),
        _cluster_role(
            "system:aggregated-metrics-reader",
            [
                {
                    "apiGroups": ["metrics.k8s.io"],
                    "resources": ["pods", "nodes"],
                    "verbs": ["get", "list", "watch"],
                },
            ],
            **aggregated,
        ),
        _cluster_role(
            "system:metrics-server",
            [
                {"apiGroups": [""], "resources": ["nodes/metrics"], "verbs": ["get"]},
                {"apiGroups": [""], "resources": ["pods", "nodes"], "verbs": ["get", "list", "watch"]},
            ],
        ),
        _binding(
            "ClusterRoleBinding",
            "system:metrics-server",
            "ClusterRole",
            "system:metrics-server",
            "metrics-server",
        ),
        _binding(
            "ClusterRoleBinding",
            "metrics-server:system:auth-delegator",
            "ClusterRole",
            "system:auth-delegator",
            "metrics-server",
        ),
        _binding(
            "RoleBinding",
            "metrics-server-auth-reader",
            "Role",
            "extension-apiserver-authentication-reader",
            "metrics-server",
            "kube-system",
        ),
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": _meta("metrics-server", **app),
            "spec": {
                "replicas": 1,
                # on the node's network, a new pod cannot start beside the old one (its port):
                # the old one goes first, or a changed manifest waits for room forever. (Not
                # Recreate: server-side apply keeps the rollingUpdate default of a Deployment
                # made before, which Recreate refuses.)
                "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}},
                "selector": {"matchLabels": app},
                "template": {
                    "metadata": {"labels": app},
                    "spec": {
                        **ON_REAL_NODE,
                        "hostNetwork": True,
                        "serviceAccountName": "metrics-server",
                        "priorityClassName": "system-cluster-critical",
                        "containers": [container],
                        "volumes": [
                            {"name": "tmp", "emptyDir": {}},
                            {"name": "cluster-ca", "configMap": {"name": "kube-root-ca.crt"}},
                        ],
                    },
                },
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": _meta("metrics-server", **app),
            "spec": {
                "selector": app,
                "ports": [{"name": "https", "port": 443, "protocol": "TCP", "targetPort": "https"}],
            },
        },
        {
            "apiVersion": "apiregistration.k8s.io/v1",
            "kind": "APIService",
            "metadata": _meta("v1beta1.metrics.k8s.io", None, **app),
            "spec": {
                "group": "metrics.k8s.io",
                "version": "v1beta1",
                "groupPriorityMinimum": 100,
                "versionPriority": 100,
                # its serving certificate is self-signed (upstream does so too)
                "insecureSkipTLSVerify": True,
                "service": {"name": "metrics-server", "namespace": "kube-system", "port": 443},
            },
        },
    ]
