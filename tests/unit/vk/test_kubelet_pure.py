"""The kubelet API's pure parts: request attributes as the kubelet maps them, users from client
certificates, the provider query for streams, close codes, and the serving certificate's CSR and
renewal time."""

from __future__ import annotations

import datetime

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from multidict import MultiDict

from vk.kubelet.auth import UserInfo, request_attributes, user_from_peercert
from vk.kubelet.certificates import RENEW_AT, csr_object, make_key_and_csr, renew_delay
from vk.kubelet.server import waiting_to_start
from vk.kubelet.streams import _sendable, provider_stream_query


@pytest.mark.parametrize(
    ("method", "path", "verb", "subresources"),
    [
        ("GET", "/containerLogs/ns/pod/c", "get", ("proxy",)),
        ("POST", "/exec/ns/pod/c", "create", ("proxy",)),
        ("GET", "/exec/ns/pod/uid/c", "get", ("proxy",)),
        ("GET", "/attach/ns/pod/c", "get", ("proxy",)),
        ("POST", "/portForward/ns/pod", "create", ("proxy",)),
        ("GET", "/pods", "get", ("pods", "proxy")),
        ("GET", "/pods/", "get", ("pods", "proxy")),
        ("GET", "/runningpods/", "get", ("pods", "proxy")),
        ("GET", "/healthz", "get", ("healthz", "proxy")),
        ("GET", "/stats/summary", "get", ("stats",)),
        ("GET", "/metrics/resource", "get", ("metrics",)),
        ("GET", "/logs/syslog", "get", ("log",)),
        ("DELETE", "/whatever", "delete", ("proxy",)),
        # a prefix is a path segment, not a string prefix
        ("GET", "/podsx", "get", ("proxy",)),
        ("GET", "/statsx", "get", ("proxy",)),
    ],
)
def test_request_attributes_follow_the_kubelet(
    method: str, path: str, verb: str, subresources: tuple[str, ...]
) -> None:
    assert request_attributes(method, path) == (verb, subresources)


def test_user_from_a_verified_client_certificate() -> None:
    peercert = {
        "subject": (
            (("organizationName", "system:masters"),),
            (("organizationName", "ops"),),
            (("commonName", "kube-apiserver-kubelet-client"),),
        )
    }
    assert user_from_peercert(peercert) == UserInfo(
        "kube-apiserver-kubelet-client", ("system:masters", "ops")
    )
    assert user_from_peercert(None) is None
    assert user_from_peercert({}) is None
    assert user_from_peercert({"subject": ((("organizationName", "only-a-group"),),)}) is None


def test_exec_query_is_translated_to_the_pods_exec_api() -> None:
    query = MultiDict(
        [
            ("command", "sh"),
            ("command", "-c"),
            ("command", "echo hi"),
            ("input", "1"),
            ("output", "1"),
            ("error", "1"),
            ("tty", "0"),
        ]
    )
    assert list(provider_stream_query("exec", query, "main").items()) == [
        ("container", "main"),
        ("stdin", "true"),
        ("stdout", "true"),
        ("stderr", "true"),
        ("command", "sh"),
        ("command", "-c"),
        ("command", "echo hi"),
    ]


def test_attach_query_carries_no_command() -> None:
    query = MultiDict([("command", "ignored"), ("output", "1"), ("tty", "1")])
    assert list(provider_stream_query("attach", query, "main").items()) == [
        ("container", "main"),
        ("stdout", "true"),
        ("tty", "true"),
    ]


def test_port_forward_ports_become_the_apis_ports() -> None:
    query = MultiDict([("port", "8080"), ("port", "9090")])
    assert list(provider_stream_query("portforward", query, None).items()) == [
        ("ports", "8080"),
        ("ports", "9090"),
    ]
    assert list(provider_stream_query("portforward", MultiDict(), None).items()) == []


@pytest.mark.parametrize(
    ("code", "sent"),
    [(None, 1000), (1000, 1000), (1011, 1011), (1006, 1000), (1005, 1000), (4000, 4000), (0, 1000)],
)
def test_only_sendable_close_codes_are_passed_on(code: int | None, sent: int) -> None:
    assert _sendable(code) == sent


def test_serving_csr_is_what_the_kubelet_serving_signer_accepts() -> None:
    pair = make_key_and_csr("gpuferry-p1", ("127.0.0.1", "node.example"))
    csr = x509.load_pem_x509_csr(pair.csr_pem)
    assert csr.is_signature_valid
    assert csr.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "system:node:gpuferry-p1"
    assert csr.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)[0].value == "system:nodes"
    sans = csr.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert sans.get_values_for_type(x509.DNSName) == ["node.example"]
    body = csr_object("n", pair.csr_pem, expiration_seconds=3600)
    assert body["spec"]["signerName"] == "kubernetes.io/kubelet-serving"
    assert body["spec"]["usages"] == ["digital signature", "server auth"]
    assert body["spec"]["expirationSeconds"] == 3600


def _cert(not_before: datetime.datetime, not_after: datetime.datetime) -> bytes:
    from cryptography.hazmat.primitives import serialization

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "x")])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .sign(key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM)


def test_renewal_comes_at_eighty_percent_of_the_lifetime() -> None:
    start = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
    pem = _cert(start, start + datetime.timedelta(seconds=1000))
    assert RENEW_AT == 0.8
    assert renew_delay(pem, now=start) == pytest.approx(800)
    assert renew_delay(pem, now=start + datetime.timedelta(seconds=700)) == pytest.approx(100)
    assert renew_delay(pem, now=start + datetime.timedelta(seconds=900)) == 0.0


def test_the_providers_upgrade_answer_is_parsed() -> None:
    from vk.kubelet.spdy import _parse_head

    head = (
        b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\n"
        b"X-Stream-Protocol-Version: v4.channel.k8s.io"
    )
    status, reason, headers = _parse_head(head)
    assert (status, reason) == (101, "Switching Protocols")
    assert headers["upgrade"] == "SPDY/3.1"
    assert headers["x-stream-protocol-version"] == "v4.channel.k8s.io"
    assert _parse_head(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 12")[:2] == (403, "Forbidden")


NOT_YET = "its twin on the provider is not created yet"
HELD = {"phase": "Pending", "reason": "NamespaceNotOffloaded", "message": "namespace ml is not offloaded"}


@pytest.mark.parametrize(
    ("status", "container", "said"),
    [
        (
            HELD,
            "main",
            f'container "main" in pod "p" is waiting to start: {HELD["reason"]}: {HELD["message"]}',
        ),
        ({"phase": "Pending"}, "main", f'container "main" in pod "p" is waiting to start: {NOT_YET}'),
        ({}, None, f'pod "p" is waiting to start: {NOT_YET}'),
        (
            {"phase": "Failed", "reason": "ProviderRejected", "message": "provider gpu-farm refused the pod"},
            "main",
            'container "main" in pod "p" is terminated: ProviderRejected: provider gpu-farm refused the pod',
        ),
        ({"phase": "Succeeded"}, None, 'pod "p" is terminated'),
    ],
)
def test_a_pod_without_a_twin_says_what_it_waits_for(
    status: dict[str, str], container: str | None, said: str
) -> None:
    pod = {"metadata": {"name": "p", "namespace": "ml"}, "status": status}
    assert waiting_to_start(pod, container) == said
