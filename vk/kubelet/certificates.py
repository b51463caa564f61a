"""The kubelet API's serving certificate, issued through the consumer's CSR API, and the client
CA its callers' certificates are verified against.

Like a real kubelet with ``serverTLSBootstrap``: a P-256 key, a CSR for the signer
``kubernetes.io/kubelet-serving`` with subject ``CN=system:node:<node>, O=system:nodes`` and the
node address as IP SAN; the consumer's controller-manager signs it once it is approved. Approval is
a separate step (:func:`approve_csr`): in production an approver (e.g. the platform's kubelet CSR
approver) does it; locally and in tests the virtual kubelet's own admin identity may approve its
own request (``kubelet_csr_self_approve``), which a real cluster should not allow.

The certificate is renewed at 80 % of its lifetime by loading the new pair into the *same*
``ssl.SSLContext``: new TLS handshakes get the new certificate, open streams are untouched.
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import logging
import os
import secrets
import ssl
import tempfile
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from kube.api import KUBELET_SERVING_SIGNER
from kube.clients import KubeClient
from kube.errors import KubeError, NotFound
from kube.objects import CONFIGMAPS, CSRS, RawObject

logger = logging.getLogger(__name__)

SIGNER = KUBELET_SERVING_SIGNER
USAGES = ("digital signature", "server auth")
RENEW_AT = 0.8
"""Fraction of the certificate's lifetime after which it is renewed."""
CLIENT_CA_CONFIGMAP = ("kube-system", "extension-apiserver-authentication")
"""Where every kube-apiserver publishes its ``--client-ca-file`` (key ``client-ca-file``)."""


class CertificateError(RuntimeError):
    """The serving certificate could not be obtained (denied, failed, or not signed in time)."""


@dataclass(frozen=True)
class KeyAndCsr:
    key_pem: bytes
    csr_pem: bytes


def make_key_and_csr(node_name: str, addresses: tuple[str, ...]) -> KeyAndCsr:
    """A new key and the CSR a kubelet sends for its serving certificate. IP-looking addresses
    become IP SANs, others DNS SANs."""
    key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = []
    for address in addresses:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(address)))
        except ValueError:
            sans.append(x509.DNSName(address))
    subject = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:nodes"),
            x509.NameAttribute(NameOID.COMMON_NAME, f"system:node:{node_name}"),
        ]
    )
    builder = x509.CertificateSigningRequestBuilder().subject_name(subject)
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    csr = builder.sign(key, hashes.SHA256())
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return KeyAndCsr(key_pem=key_pem, csr_pem=csr.public_bytes(serialization.Encoding.PEM))


def csr_object(name: str, csr_pem: bytes, *, expiration_seconds: int) -> RawObject:
    import base64

    return {
        "apiVersion": "certificates.k8s.io/v1",
        "kind": "CertificateSigningRequest",
        "metadata": {"name": name, "labels": {"gpuferry.io/component": "virtual-kubelet"}},
        "spec": {
            "request": base64.b64encode(csr_pem).decode(),
            "signerName": SIGNER,
            "usages": list(USAGES),
            "expirationSeconds": expiration_seconds,
        },
    }


async def submit_csr(consumer: KubeClient, node_name: str, csr_pem: bytes, *, expiration_seconds: int) -> str:
    """Create the CertificateSigningRequest; returns its name."""
    name = f"{node_name}-serving-{secrets.token_hex(4)}"
    await consumer.create(CSRS, csr_object(name, csr_pem, expiration_seconds=expiration_seconds))
    logger.info("CSR %s submitted (signer %s)", name, SIGNER)
    return name


async def approve_csr(
    consumer: KubeClient, name: str, *, reason: str = "GpuferryVirtualKubeletSelfApproved"
) -> None:
    """Approve the CSR ``name`` with the consumer client's identity (needs ``approve`` on the
    signer ``kubernetes.io/kubelet-serving``). Only for local/dev clusters: in production an
    approver that checks the request against the Node does this."""
    csr = await consumer.get(CSRS, name)
    status = csr.setdefault("status", {})
    status["conditions"] = [
        *(status.get("conditions") or []),
        {
            "type": "Approved",
            "status": "True",
            "reason": reason,
            "message": "approved by the virtual kubelet's own identity (local/dev mode)",
        },
    ]
    await consumer.request(
        "PUT", f"/apis/certificates.k8s.io/v1/certificatesigningrequests/{name}/approval", json=csr
    )
    logger.info("CSR %s approved by the virtual kubelet itself (local/dev mode)", name)


async def wait_for_certificate(
    consumer: KubeClient, name: str, *, timeout: float, poll: float = 0.5
) -> bytes:
    """Wait until the CSR ``name`` carries its certificate; raises :class:`CertificateError` when
    it is denied or fails, or after ``timeout`` seconds (e.g. nobody approved it)."""
    import base64

    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        csr = await consumer.get(CSRS, name)
        status = csr.get("status") or {}
        for cond in status.get("conditions") or ():
            if cond.get("type") in ("Denied", "Failed") and cond.get("status") == "True":
                why = f"{cond.get('reason')} {cond.get('message', '')}"
                raise CertificateError(f"CSR {name} {cond['type']}: {why}")
        if status.get("certificate"):
            return base64.b64decode(status["certificate"])
        if loop.time() > deadline:
            raise CertificateError(f"CSR {name} not signed after {timeout:.0f}s (is it approved?)")
        await asyncio.sleep(poll)


async def read_client_ca(consumer: KubeClient) -> bytes:
    """The consumer API server's client CA bundle: what the certificates it presents to kubelets
    (``--kubelet-client-certificate``) are signed by."""
    ns, name = CLIENT_CA_CONFIGMAP
    try:
        cm = await consumer.get(CONFIGMAPS, name, ns)
    except NotFound:
        raise CertificateError(
            f"ConfigMap {ns}/{name} not found: cannot verify client certificates"
        ) from None
    ca = (cm.get("data") or {}).get("client-ca-file")
    if not ca:
        raise CertificateError(f"ConfigMap {ns}/{name} has no client-ca-file")
    return str(ca).encode()


def not_after(cert_pem: bytes) -> datetime.datetime:
    return x509.load_pem_x509_certificate(cert_pem).not_valid_after_utc


def renew_delay(cert_pem: bytes, now: datetime.datetime | None = None) -> float:
    """Seconds until the certificate should be renewed (``RENEW_AT`` of its lifetime)."""
    cert = x509.load_pem_x509_certificate(cert_pem)
    start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
    renew = start + (end - start) * RENEW_AT
    now = now or datetime.datetime.now(datetime.UTC)
    return max(0.0, (renew - now).total_seconds())


def load_pair(ctx: ssl.SSLContext, cert_pem: bytes, key_pem: bytes) -> None:
    """Load a certificate and key into ``ctx`` (ssl reads key pairs from files only: a private
    temporary directory, removed at once)."""
    with tempfile.TemporaryDirectory(prefix="gpuferry-kubelet-") as tmp:
        cert_path, key_path = Path(tmp, "tls.crt"), Path(tmp, "tls.key")
        for path, data in ((cert_path, cert_pem), (key_path, key_pem)):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
        ctx.load_cert_chain(cert_path, key_path)


class ServingCertificate:
    """The TLS context of the kubelet API: serving certificate from the CSR API, client
    certificates verified against the consumer's client CA (optional: token callers send none)."""

    def __init__(
        self,
        consumer: KubeClient,
        *,
        node_name: str,
        addresses: tuple[str, ...],
        self_approve: bool,
        expiration_seconds: int,
        sign_timeout: float,
    ) -> None:
        self.consumer = consumer
        self.node_name = node_name
        self.addresses = addresses
        self.self_approve = self_approve
        self.expiration_seconds = expiration_seconds
        self.sign_timeout = sign_timeout
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.verify_mode = ssl.CERT_OPTIONAL
        self.cert_pem: bytes | None = None

    async def setup(self) -> None:
        """Load the client CA and obtain the first certificate."""
        self.context.load_verify_locations(cadata=(await read_client_ca(self.consumer)).decode())
        await self.renew()

    async def renew(self) -> bytes:
        """Request, (self-)approve and load a new certificate; returns it (PEM)."""
        pair = make_key_and_csr(self.node_name, self.addresses)
        name = await submit_csr(
            self.consumer, self.node_name, pair.csr_pem, expiration_seconds=self.expiration_seconds
        )
        try:
            if self.self_approve:
                await approve_csr(self.consumer, name)
            else:
                logger.info("CSR %s waits for an approver (self-approval is off)", name)
            cert = await wait_for_certificate(self.consumer, name, timeout=self.sign_timeout)
        finally:
            # the certificate is in hand (or never will be): the request object has done its job
            try:
                await self.consumer.delete(CSRS, name)
            except KubeError as exc:
                logger.debug("CSR %s not deleted: %s", name, exc)
        load_pair(self.context, cert, pair.key_pem)
        self.cert_pem = cert
        logger.info("serving certificate for %s loaded, valid until %s", self.node_name, not_after(cert))
        return cert

    async def keep_renewed(self) -> None:
        """Renew at ``RENEW_AT`` of each certificate's lifetime; retry failures every 30 s."""
        while True:
            assert self.cert_pem is not None
            await asyncio.sleep(renew_delay(self.cert_pem))
            try:
                await self.renew()
            except (KubeError, CertificateError) as exc:
                logger.warning("serving certificate renewal failed (%s); retrying in 30s", exc)
                await asyncio.sleep(30)
