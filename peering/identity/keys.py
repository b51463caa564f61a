"""Key pairs, certificate signing requests and the peering-token proof. Pure (no I/O).

The consumer makes an EC P-256 key and a CSR whose subject is exactly
``CN=gpuferry:consumer:<id>, O=gpuferry:consumers``. The provider approves it only when the
Tenant carries a *proof*: ``HMAC-SHA256(token, "gpuferry-csr-v1\\0" + consumer-id + "\\0" + DER(CSR))``
in hex, where ``token`` is the random peering token the provider generated and keeps in a
Secret of the tenant namespace. The proof binds the token to this consumer ID and this very
CSR: it cannot be replayed for another key or another tenant, and the token itself never
travels in an object anyone else can read.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from dataclasses import dataclass
from datetime import datetime

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

__all__ = [
    "CsrError",
    "CsrInfo",
    "certificate_validity",
    "csr_proof",
    "inspect_csr",
    "make_csr",
    "make_private_key",
    "make_token",
    "verify_csr_proof",
]

_PROOF_CONTEXT = b"gpuferry-csr-v1\0"
TOKEN_BYTES = 32


class CsrError(ValueError):
    """A CSR that is malformed or asks for an identity it may not have."""


def make_token() -> str:
    """A new peering token: 32 random bytes, URL-safe base64 (43 characters)."""
    return secrets.token_urlsafe(TOKEN_BYTES)


def make_private_key() -> bytes:
    """A new EC P-256 private key as unencrypted PKCS#8 PEM."""
    key = ec.generate_private_key(ec.SECP256R1())
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def make_csr(key_pem: bytes, username: str, groups: tuple[str, ...]) -> bytes:
    """A PEM CSR for ``CN=username`` and one ``O`` per group, signed with ``key_pem``."""
    key = serialization.load_pem_private_key(key_pem, password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey):
        raise CsrError("only EC and RSA keys are supported")
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, g) for g in groups]
    attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, username))
    csr = x509.CertificateSigningRequestBuilder().subject_name(x509.Name(attrs)).sign(key, hashes.SHA256())
    return csr.public_bytes(serialization.Encoding.PEM)


@dataclass(frozen=True)
class CsrInfo:
    """What a CSR asks for."""

    username: str
    groups: tuple[str, ...]
    der: bytes


def inspect_csr(csr_pem: bytes) -> CsrInfo:
    """Parse and check a PEM CSR (signature valid, one CN, no other subject fields than O)."""
    try:
        csr = x509.load_pem_x509_csr(csr_pem)
    except ValueError as exc:
        raise CsrError(f"not a PEM certificate signing request: {exc}") from exc
    if not csr.is_signature_valid:
        raise CsrError("the CSR's signature does not match its public key")
    cns = csr.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if len(cns) != 1:
        raise CsrError(f"the CSR must have exactly one CN, not {len(cns)}")
    allowed = {NameOID.COMMON_NAME, NameOID.ORGANIZATION_NAME}
    extra = [a.oid.dotted_string for a in csr.subject if a.oid not in allowed]
    if extra:
        raise CsrError(f"the CSR subject has fields other than CN and O: {', '.join(extra)}")
    groups = tuple(str(a.value) for a in csr.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME))
    return CsrInfo(str(cns[0].value), groups, csr.public_bytes(serialization.Encoding.DER))


def csr_proof(token: str, consumer_id: str, csr_pem: bytes) -> str:
    """The proof the consumer attaches to its CSR: hex HMAC-SHA256 keyed with the token."""
    der = inspect_csr(csr_pem).der
    message = _PROOF_CONTEXT + consumer_id.encode() + b"\0" + der
    return hmac.new(token.encode(), message, hashlib.sha256).hexdigest()


def verify_csr_proof(token: str, consumer_id: str, csr_pem: bytes, proof: str) -> bool:
    """Whether ``proof`` is :func:`csr_proof` of this token, consumer and CSR (constant time)."""
    if not token or not proof:
        return False
    try:
        expected = csr_proof(token, consumer_id, csr_pem)
    except CsrError:
        return False
    return hmac.compare_digest(expected, proof.strip().lower())


def certificate_validity(cert_pem: bytes) -> tuple[datetime, datetime]:
    """(notBefore, notAfter) of a PEM certificate, in UTC."""
    cert = x509.load_pem_x509_certificate(cert_pem)
    return cert.not_valid_before_utc, cert.not_valid_after_utc


def b64(data: bytes) -> str:
    """Standard base64 as the API server expects for ``[]byte`` fields."""
    return base64.b64encode(data).decode()


def unb64(text: str) -> bytes:
    """The inverse of :func:`b64`; ValueError when ``text`` is not base64."""
    try:
        return base64.b64decode(text, validate=True)
    except ValueError as exc:
        raise ValueError(f"not base64: {exc}") from exc
