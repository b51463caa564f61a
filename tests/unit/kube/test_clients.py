"""KubeClient against the fake API server: auth, verbs, pagination, errors, rate limit, TLS."""

from __future__ import annotations

import asyncio
import base64
import datetime
import ipaddress
import ssl
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from kube.clients import KubeClient, resource_of, served_of
from kube.errors import (
    AlreadyExists,
    Invalid,
    NotFound,
    ResourceNotServed,
    ServerError,
    Timeout,
    TooManyRequests,
    Unreachable,
)
from kube.kubeconfigs import ConfigError, in_cluster, load_kubeconfig
from kube.objects import CONFIGMAPS, NODES
from kube.settings import ClientSettings

from .conftest import TOKEN, write_kubeconfig
from .fakeapi import LIST_PATH, NS, FakeApi, Fault


async def test_token_user_agent_and_get(fake: FakeApi, client: KubeClient) -> None:
    answer = await client.get(CONFIGMAPS, "a", namespace=NS)
    assert answer["method"] == "GET" and answer["path"] == f"{LIST_PATH}/a"
    (req,) = fake.requests
    assert req.headers["Authorization"] == f"Bearer {TOKEN}"
    assert req.headers["User-Agent"] == "gpuferry"
    assert req.headers["Accept"] == "application/json"


async def test_verbs_send_the_right_paths_params_and_bodies(fake: FakeApi, client: KubeClient) -> None:
    created = await client.create(
        CONFIGMAPS, {"metadata": {"name": "a", "namespace": NS}}, field_manager="me"
    )
    assert created["method"] == "POST" and created["path"] == LIST_PATH  # namespace taken from the body
    assert created["query"] == {"fieldManager": "me"}
    assert created["body"]["metadata"]["name"] == "a"

    replaced = await client.replace(NODES, "n1", {"metadata": {"name": "n1"}}, subresource="status")
    assert (replaced["method"], replaced["path"]) == ("PUT", "/api/v1/nodes/n1/status")

    patched = await client.patch(CONFIGMAPS, "a", {"data": {"k": "v"}}, NS)
    assert patched["contentType"] == "application/merge-patch+json"
    applied = await client.patch(
        CONFIGMAPS, "a", {"data": {}}, NS, patch_type="apply", field_manager="gpuferry", force=True
    )
    assert applied["contentType"] == "application/apply-patch+yaml"
    assert applied["query"] == {"fieldManager": "gpuferry", "force": "true"}
    json_patch = await client.patch(
        NODES, "n1", [{"op": "add", "path": "/x", "value": 1}], patch_type="json", subresource="status"
    )
    assert json_patch["path"] == "/api/v1/nodes/n1/status"
    assert json_patch["contentType"] == "application/json-patch+json"
    with pytest.raises(ValueError, match="field_manager"):
        await client.patch(CONFIGMAPS, "a", {}, NS, patch_type="apply")

    deleted = await client.delete(
        CONFIGMAPS, "a", NS, grace_period_seconds=0, preconditions_uid="u-1", propagation_policy="Foreground"
    )
    assert deleted["method"] == "DELETE"
    assert deleted["body"] == {
        "apiVersion": "v1",
        "kind": "DeleteOptions",
        "gracePeriodSeconds": 0,
        "propagationPolicy": "Foreground",
        "preconditions": {"uid": "u-1"},
    }
    assert (await client.server_version())["gitVersion"] == "v1.34.1"


async def test_list_follows_continue_tokens(fake: FakeApi, client: KubeClient) -> None:
    fake.put(*(f"cm-{i}" for i in range(5)))
    listing = await client.list(CONFIGMAPS, NS, label_selector="app=x", limit=2)
    assert [i["metadata"]["name"] for i in listing["items"]] == [f"cm-{i}" for i in range(5)]
    assert listing["metadata"]["resourceVersion"] == "105"
    assert listing["kind"] == "ConfigMapList"
    assert all(i["kind"] == "ConfigMap" and i["apiVersion"] == "v1" for i in listing["items"])
    assert [r.query.get("continue") for r in fake.lists] == [None, "2", "4"]
    assert all(r.query["labelSelector"] == "app=x" for r in fake.lists)


@pytest.mark.parametrize(
    ("fault", "error"),
    [
        (Fault(404, "NotFound"), NotFound),
        (Fault(409, "AlreadyExists"), AlreadyExists),
        (Fault(422, "Invalid"), Invalid),
        (Fault(503, "ServiceUnavailable"), ServerError),
    ],
)
async def test_non_2xx_is_raised_classified(
    fake: FakeApi, client: KubeClient, fault: Fault, error: type[Exception]
) -> None:
    fake.faults = [fault]
    with pytest.raises(error) as raised:
        await client.get(CONFIGMAPS, "a", NS)
    assert getattr(raised.value, "object_key", None) is not None
    assert str(raised.value.object_key) == f"{NS}/a"  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "fault",
    [  # the API server's answers for a path it serves nothing at
        Fault(404, "NotFound", message="the server could not find the requested resource"),  # known group
        Fault(404, text="404 page not found"),  # a group it does not know: plain text, no Status
    ],
)
async def test_a_404_for_a_type_the_server_does_not_serve_names_the_type_and_the_server(
    fake: FakeApi, client: KubeClient, fault: Fault
) -> None:
    fake.faults = [fault]
    with pytest.raises(ResourceNotServed) as raised:
        await client.get(CONFIGMAPS, "a", NS)
    assert (
        f"the API server at {client.base_url} does not serve configmaps (v1): "
        "is its CustomResourceDefinition installed?"
    ) in str(raised.value)


async def test_a_404_page_from_a_kubelet_through_the_node_proxy_is_only_not_found(
    fake: FakeApi, client: KubeClient
) -> None:
    fake.faults = [Fault(404, text="404 page not found")]  # the kubelet's, not the API server's
    with pytest.raises(NotFound) as proxied:
        await client.request("GET", "/api/v1/nodes/n/proxy/no/such/path")
    assert not isinstance(proxied.value, ResourceNotServed)
    assert "404 page not found" in str(proxied.value)
    # an object that is missing is only NotFound (still caught as one by every caller)
    fake.faults = [Fault(404, "NotFound", message='configmaps "a" not found')]
    with pytest.raises(NotFound) as missing:
        await client.get(CONFIGMAPS, "a", NS)
    assert not isinstance(missing.value, ResourceNotServed)


@pytest.mark.parametrize(
    ("path", "served"),
    [
        ("/apis/offloading.gpuferry.io/v1alpha1/namespaces/ml/namespaceoffloadings/offloading",
         "namespaceoffloadings.offloading.gpuferry.io (offloading.gpuferry.io/v1alpha1)"),
        ("/apis/core.gpuferry.io/v1alpha1/foreignclusters?limit=5",
         "foreignclusters.core.gpuferry.io (core.gpuferry.io/v1alpha1)"),
        ("/api/v1/namespaces/ml/pods/p/log", "pods (v1)"),
        ("/api/v1/namespaces/ml", "namespaces (v1)"),
        ("/api/v1/nodes/vk/proxy/containerLogs/ml/p/c", ""),
        ("/version", ""),
    ],
)  # fmt: skip
def test_served_of_names_the_resource_of_a_path(path: str, served: str) -> None:
    assert served_of(path) == served


async def test_429_carries_retry_after(fake: FakeApi, kubeconfig: Path) -> None:
    fake.faults = [Fault(429, "TooManyRequests", headers={"Retry-After": "3"})]
    settings = ClientSettings(qps=0, throttle_retries=0)
    async with KubeClient.from_kubeconfig(kubeconfig, settings=settings) as client:
        with pytest.raises(TooManyRequests) as raised:
            await client.list(CONFIGMAPS, NS)
    assert raised.value.retry_after == 3.0


async def test_429_is_retried_after_retry_after_then_raised(fake: FakeApi, client: KubeClient) -> None:
    fake.faults = [Fault(429, "TooManyRequests", headers={"Retry-After": "0"})] * 2
    answer = await client.get(CONFIGMAPS, "a", NS)  # third try answers
    assert answer["method"] == "GET" and len(fake.requests) == 3
    fake.faults = [Fault(429, "TooManyRequests", headers={"Retry-After": "0"})] * 4
    with pytest.raises(TooManyRequests):
        await client.get(CONFIGMAPS, "a", NS)  # 1 + 3 retries, all throttled


async def test_request_timeout(fake: FakeApi, kubeconfig: Path) -> None:
    fake.faults = [Fault(500, delay=1.0)]
    async with KubeClient.from_kubeconfig(kubeconfig, settings=ClientSettings(request_timeout=0.1)) as client:
        with pytest.raises(Timeout):
            await client.get(CONFIGMAPS, "a", NS)


async def test_connection_refused_is_unreachable(tmp_path: Path, unused_tcp_port: int) -> None:
    path = write_kubeconfig(tmp_path / "kc", f"http://127.0.0.1:{unused_tcp_port}")
    async with KubeClient.from_kubeconfig(path) as client:
        with pytest.raises(Unreachable):
            await client.server_version()


async def test_requests_pass_the_rate_limiter(fake: FakeApi, kubeconfig: Path) -> None:
    # 10/s, not 100/s: a busy machine's scheduling delays (a few ms) would refill tokens and
    # shorten the waits it measures; at 100 ms a token they are noise
    settings = ClientSettings(qps=10, burst=2)
    async with KubeClient.from_kubeconfig(kubeconfig, settings=settings) as client:
        await asyncio.gather(*(client.server_version() for _ in range(4)))
        # two requests went at once, the third waited 100 ms, the fourth 200 ms
        assert client.limiter.waited == pytest.approx(0.3, abs=0.05)
    assert len(fake.requests) == 4


async def test_in_cluster_reads_the_service_account(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("sa-token\n")
    (tmp_path / "ca.crt").write_bytes(b"")
    conn = in_cluster({"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}, tmp_path)
    assert conn.server == "https://10.96.0.1:443"
    assert await conn.authorization() == "Bearer sa-token"
    with pytest.raises(ConfigError):
        in_cluster({}, tmp_path)


async def test_exec_plugin_token(fake: FakeApi, server: TestServer, tmp_path: Path) -> None:
    credential = {
        "apiVersion": "client.authentication.k8s.io/v1",
        "kind": "ExecCredential",
        "status": {"token": "from-exec", "expirationTimestamp": "2999-01-01T00:00:00Z"},
    }
    script = tmp_path / "plugin.py"
    script.write_text(
        "import os\n"
        "assert 'KUBERNETES_EXEC_INFO' in os.environ\n"
        f"print({orjson.dumps(credential)!r}.decode())\n"
    )
    path = write_kubeconfig(
        tmp_path / "kc",
        str(server.make_url("")).rstrip("/"),
        user={
            "exec": {
                "command": sys.executable,
                "args": [str(script)],
                "apiVersion": "client.authentication.k8s.io/v1",
            }
        },
    )
    async with KubeClient.from_kubeconfig(path) as client:
        await client.server_version()
    assert fake.requests[0].headers["Authorization"] == "Bearer from-exec"


def test_kubeconfig_contexts_and_files(tmp_path: Path) -> None:
    (tmp_path / "ca.pem").write_bytes(b"CA")
    (tmp_path / "token").write_text("t")
    config = {
        "clusters": [
            {
                "name": "one",
                "cluster": {
                    "server": "https://one:6443/",
                    "certificate-authority": "ca.pem",
                    "tls-server-name": "kubernetes",
                },
            },
            {"name": "two", "cluster": {"server": "https://two", "insecure-skip-tls-verify": True}},
        ],
        "users": [
            {"name": "u1", "user": {"tokenFile": "token"}},
            {
                "name": "u2",
                "user": {
                    "client-certificate-data": base64.b64encode(b"CERT").decode(),
                    "client-key-data": base64.b64encode(b"KEY").decode(),
                },
            },
        ],
        "contexts": [
            {"name": "c1", "context": {"cluster": "one", "user": "u1"}},
            {"name": "c2", "context": {"cluster": "two", "user": "u2"}},
        ],
        "current-context": "c1",
    }
    (tmp_path / "kc.yaml").write_bytes(orjson.dumps(config))
    one = load_kubeconfig(tmp_path / "kc.yaml")
    assert (one.server, one.ca_pem, one.tls_server_name, one.token_file) == (
        "https://one:6443",
        b"CA",
        "kubernetes",
        tmp_path / "token",
    )
    two = load_kubeconfig(tmp_path / "kc.yaml", context="c2")
    assert (two.insecure, two.client_cert_pem, two.client_key_pem) == (True, b"CERT", b"KEY")
    with pytest.raises(ConfigError, match="no context named 'nope'"):
        load_kubeconfig(tmp_path / "kc.yaml", context="nope")


# -- TLS ---------------------------------------------------------------------------------------------


def _cert(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: x509.Certificate | None,
    issuer_key: ec.EllipticCurvePrivateKey | None,
    *,
    ca: bool = False,
    server: bool = False,
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer.subject if issuer else name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if server:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False
        )
        builder = builder.add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False
        )
    elif not ca:
        builder = builder.add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
        )
    return builder.sign(issuer_key or key, hashes.SHA256())


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


@pytest.fixture
async def tls_server(tmp_path: Path) -> AsyncIterator[tuple[str, dict[str, bytes]]]:
    """An HTTPS server that requires a client certificate and answers with its common name."""
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _cert("fake-ca", ca_key, None, None, ca=True)
    server_key = ec.generate_private_key(ec.SECP256R1())
    server_cert = _cert("kube-apiserver", server_key, ca, ca_key, server=True)
    client_key = ec.generate_private_key(ec.SECP256R1())
    client_cert = _cert("gpuferry-tester", client_key, ca, ca_key)
    (tmp_path / "srv.crt").write_bytes(_pem(server_cert))
    (tmp_path / "srv.key").write_bytes(_key_pem(server_key))
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cadata=_pem(ca).decode())
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.load_cert_chain(tmp_path / "srv.crt", tmp_path / "srv.key")

    async def whoami(request: web.Request) -> web.Response:
        assert request.transport is not None
        peer: Any = request.transport.get_extra_info("peercert")
        cn = dict(x[0] for x in peer["subject"])["commonName"]
        return web.json_response({"user": cn})

    app = web.Application()
    app.router.add_get("/whoami", whoami)
    srv = TestServer(app, host="127.0.0.1")
    await srv.start_server(ssl=ctx)
    yield (
        f"https://127.0.0.1:{srv.port}",
        {"ca": _pem(ca), "cert": _pem(client_cert), "key": _key_pem(client_key)},
    )
    await srv.close()


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


async def test_tls_with_ca_and_client_certificate_data(
    tls_server: tuple[str, dict[str, bytes]], tmp_path: Path
) -> None:
    url, pems = tls_server
    path = write_kubeconfig(
        tmp_path / "kc",
        url,
        cluster={"certificate-authority-data": _b64(pems["ca"])},
        user={"client-certificate-data": _b64(pems["cert"]), "client-key-data": _b64(pems["key"])},
    )
    async with KubeClient.from_kubeconfig(path) as client:
        assert (await client.request("GET", "/whoami")) == {"user": "gpuferry-tester"}


async def test_tls_with_files_and_insecure(tls_server: tuple[str, dict[str, bytes]], tmp_path: Path) -> None:
    url, pems = tls_server
    for name in ("ca", "cert", "key"):
        (tmp_path / f"{name}.pem").write_bytes(pems[name])
    user = {"client-certificate": "cert.pem", "client-key": "key.pem"}
    path = write_kubeconfig(tmp_path / "kc", url, cluster={"certificate-authority": "ca.pem"}, user=user)
    async with KubeClient.from_kubeconfig(path) as client:
        assert (await client.request("GET", "/whoami"))["user"] == "gpuferry-tester"
    insecure = write_kubeconfig(tmp_path / "kc2", url, cluster={"insecure-skip-tls-verify": True}, user=user)
    async with KubeClient.from_kubeconfig(insecure) as client:
        assert (await client.request("GET", "/whoami"))["user"] == "gpuferry-tester"


async def test_tls_server_not_trusted_is_unreachable(
    tls_server: tuple[str, dict[str, bytes]], tmp_path: Path
) -> None:
    url, pems = tls_server
    path = write_kubeconfig(
        tmp_path / "kc",
        url,
        user={"client-certificate-data": _b64(pems["cert"]), "client-key-data": _b64(pems["key"])},
    )
    async with KubeClient.from_kubeconfig(path) as client:
        with pytest.raises(Unreachable):
            await client.request("GET", "/whoami")


async def test_requests_and_errors_are_counted_by_verb(fake: FakeApi, client: KubeClient) -> None:
    from kube.metrics import REGISTRY

    def sample(name: str, **labels: str) -> float:
        return REGISTRY.get_sample_value(name, labels) or 0.0

    server = client.base_url.split("://", 1)[1]
    before_errors = sample("gpuferry_api_errors_total", verb="patch", error="ServerError")
    before_gets = sample("gpuferry_api_requests_total", verb="get", resource="configmaps", server=server)
    fake.faults = [Fault(503, "ServiceUnavailable")]
    with pytest.raises(ServerError):
        await client.patch(CONFIGMAPS, "a", {"data": {}}, NS)
    await client.get(CONFIGMAPS, "a", namespace=NS)
    assert sample("gpuferry_api_errors_total", verb="patch", error="ServerError") == before_errors + 1
    gets = sample("gpuferry_api_requests_total", verb="get", resource="configmaps", server=server)
    assert gets == before_gets + 1


@pytest.mark.parametrize(
    ("path", "resource"),
    [
        ("/api/v1/namespaces/ns/pods", "pods"),
        ("/api/v1/namespaces/ns/pods/p/status", "pods/status"),
        ("/api/v1/namespaces/ns/serviceaccounts/default/token", "serviceaccounts/token"),
        ("/api/v1/namespaces/ns", "namespaces"),
        ("/api/v1/namespaces/ns/status", "namespaces/status"),
        ("/api/v1/nodes/n", "nodes"),
        ("/apis/sharing.gpuferry.io/v1alpha1/namespaces/t/gpuslices/s", "gpuslices"),
        ("/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/n", "leases"),
        ("/version", ""),
    ],
)
def test_requests_are_counted_by_the_resource_their_path_names(path: str, resource: str) -> None:
    assert resource_of(path) == resource


async def test_a_kubeconfig_held_in_memory(fake: FakeApi, kubeconfig: Path) -> None:
    from kube.kubeconfigs import load_kubeconfig_data

    data = await asyncio.to_thread(kubeconfig.read_bytes)
    async with KubeClient.from_kubeconfig_data(data, source="secret ns/kc") as client:
        answer = await client.get(CONFIGMAPS, "a", namespace=NS)
    assert answer["method"] == "GET"
    assert fake.requests[-1].headers["Authorization"] == f"Bearer {TOKEN}"
    with pytest.raises(ConfigError, match="secret ns/kc"):
        load_kubeconfig_data(b"- just\n- a list\n", source="secret ns/kc")
    with pytest.raises(ConfigError, match="secret ns/kc: no context"):
        load_kubeconfig_data("apiVersion: v1\nkind: Config\n", source="secret ns/kc")
