"""Keys, CSRs and the peering-token proof; the issued kubeconfig."""

from __future__ import annotations

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID

from kube.kubeconfigs import load_kubeconfig
from peering.identity.keys import (
    CsrError,
    csr_proof,
    inspect_csr,
    make_csr,
    make_private_key,
    make_token,
    verify_csr_proof,
)
from peering.identity.kubeconfigs import build_kubeconfig


def test_csr_subject_and_proof_roundtrip() -> None:
    key = make_private_key()
    csr = make_csr(key, "gpuferry:consumer:c1", ("gpuferry:consumers",))
    info = inspect_csr(csr)
    assert info.username == "gpuferry:consumer:c1" and info.groups == ("gpuferry:consumers",)
    token = make_token()
    assert len(token) >= 43 and token != make_token()
    proof = csr_proof(token, "c1", csr)
    assert verify_csr_proof(token, "c1", csr, proof)
    assert verify_csr_proof(token, "c1", csr, proof.upper())


def test_proof_binds_token_consumer_and_csr() -> None:
    token = make_token()
    csr = make_csr(make_private_key(), "gpuferry:consumer:c1", ("gpuferry:consumers",))
    other_csr = make_csr(make_private_key(), "gpuferry:consumer:c1", ("gpuferry:consumers",))
    proof = csr_proof(token, "c1", csr)
    assert not verify_csr_proof(make_token(), "c1", csr, proof)
    assert not verify_csr_proof(token, "c2", csr, proof)
    assert not verify_csr_proof(token, "c1", other_csr, proof)
    assert not verify_csr_proof(token, "c1", csr, "")
    assert not verify_csr_proof("", "c1", csr, proof)
    assert not verify_csr_proof(token, "c1", b"garbage", proof)


def test_inspect_refuses_bad_csrs() -> None:
    with pytest.raises(CsrError, match="not a PEM"):
        inspect_csr(b"nope")
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpuferry:consumer:c1"),
                         x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, "x")])
    csr = x509.CertificateSigningRequestBuilder().subject_name(subject).sign(key, hashes.SHA256())
    with pytest.raises(CsrError, match="other than CN and O"):
        inspect_csr(csr.public_bytes(serialization.Encoding.PEM))
    two_cn = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "a"),
                        x509.NameAttribute(NameOID.COMMON_NAME, "b")])
    csr = x509.CertificateSigningRequestBuilder().subject_name(two_cn).sign(key, hashes.SHA256())
    with pytest.raises(CsrError, match="exactly one CN"):
        inspect_csr(csr.public_bytes(serialization.Encoding.PEM))


def test_kubeconfig_loads_with_the_shared_loader(tmp_path: object) -> None:
    from pathlib import Path

    path = Path(str(tmp_path)) / "kc"
    text = build_kubeconfig(server="https://127.0.0.1:1", ca_pem=b"CA", cert_pem=b"CERT", key_pem=b"KEY",
                            cluster_name="gpuferry-p", user="gpuferry:consumer:c")
    path.write_text(text)
    conn = load_kubeconfig(path)
    assert conn.server == "https://127.0.0.1:1"
    assert (conn.ca_pem, conn.client_cert_pem, conn.client_key_pem) == (b"CA", b"CERT", b"KEY")
    assert yaml.safe_load(text)["current-context"] == "gpuferry-p"
