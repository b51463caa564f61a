"""Certificates and keys for one local cluster, made with `cryptography`.

One CA per cluster plays three roles, as in kwokctl and kubeadm's single-CA mode: it signs the
API server's serving certificate, it is the API server's ``--client-ca-file`` (so client
certificates it signs authenticate), and it is the controller-manager's CSR signing CA (so
certificates issued through the CSR API for ``kubernetes.io/kube-apiserver-client`` authenticate
too). The service-account key pair is separate, and so is the front-proxy CA that the API server's
aggregation layer uses towards extension API servers (metrics-server), as kubeadm does.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALIDITY = datetime.timedelta(days=365)


@dataclass(frozen=True)
class ClientIdentity:
    """A client certificate to issue: its file stem, user name (CN) and groups (O)."""

    stem: str
    user: str
    groups: tuple[str, ...] = ()


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _load_ca(pki: Path, stem: str = "ca") -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    cert = x509.load_pem_x509_certificate((pki / f"{stem}.crt").read_bytes())
    key = serialization.load_pem_private_key((pki / f"{stem}.key").read_bytes(), password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    return cert, key


def _make_ca(pki: Path, cluster: str, stem: str = "ca") -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"gpuferry-{cluster}-{stem}")])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(_now() - datetime.timedelta(minutes=5))
        .not_valid_after(_now() + 10 * _VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    _write_key(pki / f"{stem}.key", key)
    _write_cert(pki / f"{stem}.crt", cert)


def _issue(
    pki: Path,
    stem: str,
    subject: x509.Name,
    *,
    server: bool,
    sans: list[x509.GeneralName] | None = None,
    ca: str = "ca",
) -> None:
    ca_cert, ca_key = _load_ca(pki, ca)
    key = ec.generate_private_key(ec.SECP256R1())
    usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(_now() - datetime.timedelta(minutes=5))
        .not_valid_after(_now() + _VALIDITY)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    _write_key(pki / f"{stem}.key", key)
    _write_cert(pki / f"{stem}.crt", cert)


def _client_subject(identity: ClientIdentity) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, g) for g in identity.groups]
    attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, identity.user))
    return x509.Name(attrs)


def _ip_sans(path: Path) -> set[str]:
    cert = x509.load_pem_x509_certificate(path.read_bytes())
    try:
        ext = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    except x509.ExtensionNotFound:
        return set()
    return {str(ip) for ip in ext.value.get_values_for_type(x509.IPAddress)}


def ensure_server_cert(
    pki: Path, stem: str, *, common_name: str, ips: tuple[str, ...], dns: tuple[str, ...] = ()
) -> None:
    """A serving certificate signed by the cluster CA (e.g. kwok's kubelet-like server or a real
    kubelet, which the API server verifies with ``--kubelet-certificate-authority``); kept when
    present with every address asked for, issued again otherwise."""
    if (pki / f"{stem}.crt").exists() and set(ips) <= _ip_sans(pki / f"{stem}.crt"):
        return
    sans: list[x509.GeneralName] = [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
    sans += [x509.DNSName(name) for name in dns]
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    _issue(pki, stem, subject, server=True, sans=sans)


def ensure_client_cert(pki: Path, identity: ClientIdentity, *, ca: str = "ca") -> None:
    """A client certificate for ``identity`` signed by the CA ``ca`` (file stem); kept when present."""
    if not (pki / f"{identity.stem}.crt").exists():
        _issue(pki, identity.stem, _client_subject(identity), server=False, ca=ca)


def ensure_pki(
    pki: Path,
    *,
    cluster: str,
    service_ip: str,
    clients: list[ClientIdentity],
    advertise_address: str = "127.0.0.1",
) -> None:
    """Create whatever is missing under ``pki``; existing files are kept (start is idempotent)."""
    pki.mkdir(parents=True, exist_ok=True)
    if not (pki / "ca.crt").exists():
        _make_ca(pki, cluster)
    if not (pki / "front-proxy-ca.crt").exists():
        _make_ca(pki, cluster, "front-proxy-ca")
    ensure_client_cert(pki, ClientIdentity("front-proxy-client", "front-proxy-client"), ca="front-proxy-ca")
    ips = {"127.0.0.1", service_ip, advertise_address}
    if not (pki / "apiserver.crt").exists() or not ips <= _ip_sans(pki / "apiserver.crt"):
        sans: list[x509.GeneralName] = [
            *(x509.IPAddress(ipaddress.ip_address(ip)) for ip in sorted(ips)),
            x509.DNSName("localhost"),
            x509.DNSName("kubernetes"),
            x509.DNSName("kubernetes.default"),
            x509.DNSName("kubernetes.default.svc"),
            x509.DNSName("kubernetes.default.svc.cluster.local"),
        ]
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")])
        _issue(pki, "apiserver", subject, server=True, sans=sans)
    for identity in clients:
        ensure_client_cert(pki, identity)
    if not (pki / "sa.key").exists():
        sa_key = ec.generate_private_key(ec.SECP256R1())
        _write_key(pki / "sa.key", sa_key)
        (pki / "sa.pub").write_bytes(
            sa_key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )
