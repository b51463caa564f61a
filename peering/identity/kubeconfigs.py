"""A kubeconfig for the identity a provider issued to a consumer. Pure."""

from __future__ import annotations

from kube import goyaml

from .keys import b64

__all__ = ["build_kubeconfig"]


def build_kubeconfig(
    *,
    server: str,
    ca_pem: bytes | None,
    cert_pem: bytes,
    key_pem: bytes,
    cluster_name: str,
    user: str,
    tls_server_name: str | None = None,
) -> str:
    """A one-context kubeconfig (YAML) authenticating with a client certificate."""
    cluster: dict[str, str] = {"server": server}
    if ca_pem:
        cluster["certificate-authority-data"] = b64(ca_pem)
    if tls_server_name:
        cluster["tls-server-name"] = tls_server_name
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": cluster_name, "cluster": cluster}],
        "users": [
            {
                "name": user,
                "user": {"client-certificate-data": b64(cert_pem), "client-key-data": b64(key_pem)},
            }
        ],
        "contexts": [{"name": cluster_name, "context": {"cluster": cluster_name, "user": user}}],
        "current-context": cluster_name,
    }
    return goyaml.dump(config, sort_keys=False)
