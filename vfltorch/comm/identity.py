"""An organisation's long-term identity: a private key and a self-signed certificate.

``vfl keygen --name bank --out bank.pem`` writes ``bank.pem`` (the private key
followed by the certificate; mode 0600, never leaves the organisation) and
``bank.crt`` (the certificate alone: public, goes into the federation file).
The certificate is self-signed: no certificate authority is trusted. Peers
pin it by its SHA-256 fingerprint (over the DER bytes), which the federation
file lists next to the party's rank, role and address.

Keys are ECDSA P-256 (every TLS 1.3 stack signs with it) from
``cryptography``, a maintained library; key generation uses OS entropy.
"""

from __future__ import annotations

import datetime
import hashlib
import os
import ssl
from dataclasses import dataclass
from pathlib import Path

CERT_DAYS = 3650


def fingerprint_der(der: bytes) -> str:
    """``sha256:<hex>`` of a certificate's DER bytes: what the federation file pins."""
    return "sha256:" + hashlib.sha256(der).hexdigest()


def fingerprint_pem(pem: str) -> str:
    return fingerprint_der(ssl.PEM_cert_to_DER_cert(_first_cert(pem)))


def _first_cert(pem: str) -> str:
    begin, end = "-----BEGIN CERTIFICATE-----", "-----END CERTIFICATE-----"
    i = pem.find(begin)
    j = pem.find(end, i)
    if i < 0 or j < 0:
        raise ValueError("no PEM certificate found")
    return pem[i:j + len(end)] + "\n"


@dataclass(frozen=True)
class Identity:
    """Where a party's key + certificate live, and the certificate's fingerprint."""

    path: Path          # PEM file holding the private key and the certificate
    certificate: str    # PEM of the certificate (public)
    fingerprint: str

    @classmethod
    def load(cls, path) -> "Identity":
        path = Path(path)
        try:
            text = path.read_text()
        except OSError as exc:
            raise ValueError(f"cannot read the identity file {path}: {exc}") from None
        if "PRIVATE KEY-----" not in text:
            raise ValueError(f"{path} holds no private key: pass the file `vfl keygen` wrote (NAME.pem), "
                             "not the public NAME.crt")
        cert = _first_cert(text)
        return cls(path=path, certificate=cert, fingerprint=fingerprint_pem(cert))


def generate(name: str, out: str | os.PathLike, *, overwrite: bool = False) -> Identity:
    """Write ``out`` (private key + certificate, 0600) and ``out`` with suffix ``.crt`` (certificate)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    out = Path(out)
    crt = out.with_suffix(".crt")
    for p in (out, crt):
        if p.exists() and not overwrite:
            raise FileExistsError(f"{p} exists; refusing to overwrite an identity (pass --force to replace it)")
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder()
            .subject_name(subject).issuer_name(subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=CERT_DAYS))
            # A self-signed trust anchor: the federation file is the only authority.
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, content_commitment=False,
                                         key_encipherment=False, data_encipherment=False, key_agreement=False,
                                         crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
            .sign(key, hashes.SHA256()))
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    cert_pem = cert.public_bytes(serialization.Encoding.PEM)
    out.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(key_pem + cert_pem)
    crt.write_bytes(cert_pem)
    return Identity(path=out, certificate=cert_pem.decode(), fingerprint=fingerprint_der(
        cert.public_bytes(serialization.Encoding.DER)))
