"""A private certificate authority for one job: `local train --tls`, `job submit`, the tests.

`LocalCA.create()` makes a CA key and self-signed certificate; `issue()` signs a
server (or client) certificate for given DNS names and IP addresses. PEM files are
written mode 0600. Keys are ECDSA P-256; certificates last `days` (default 30).

`issue_master_certificate()` is what `job submit` (and the operator, and the job
server) use on Kubernetes: a CA made for one job signs that job's master certificate
for the master Service's names, and its private key is dropped right there, never
written anywhere — nobody can sign another certificate that the job's clients
trust. The CA certificate is public (clients trust it); the master's key goes into
the job's Secret only.

What this does NOT do: revocation, rotation or anything a production PKI does — a
job's master certificate lasts `MASTER_CERT_DAYS` and is not renewed (a job running
longer needs a new submit, or certificates from your cluster's issuer, e.g.
cert-manager).
"""

from __future__ import annotations

import datetime
import ipaddress
import logging
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

logger = logging.getLogger(__name__)


def _write_private(path: Path, data: bytes) -> Path:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    return path


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


@dataclass(frozen=True)
class Issued:
    """A certificate and its key, as PEM files."""

    cert: Path
    key: Path


@dataclass(frozen=True)
class LocalCA:
    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate

    @classmethod
    def create(cls, name: str = "paddlecloud local CA", *, days: int = 30) -> LocalCA:
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = datetime.datetime.now(datetime.timezone.utc)
        cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
                .public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(minutes=5))
                .not_valid_after(now + datetime.timedelta(days=days))
                .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
                .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                             content_commitment=False, key_encipherment=False,
                                             data_encipherment=False, key_agreement=False,
                                             encipher_only=False, decipher_only=False), critical=True)
                .sign(key, hashes.SHA256()))
        return cls(key, cert)

    @property
    def pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    def write_cert(self, path: Path) -> Path:
        path.write_bytes(self.pem)
        return path

    def sign(self, name: str, *, hosts: Sequence[str] = ("127.0.0.1", "localhost"),
             client: bool = False, days: int = 30) -> tuple[bytes, bytes]:
        """A new key and its certificate for `hosts` (DNS names or IP addresses), signed by
        this CA: (certificate chain PEM — the certificate, then the CA's —, private key PEM)."""
        names = [subject_name(host) for host in hosts]  # a bad one fails before any key is made
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.timezone.utc)
        usage = ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH
        builder = (x509.CertificateBuilder()
                   .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
                   .issuer_name(self.cert.subject).public_key(key.public_key())
                   .serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5))
                   .not_valid_after(now + datetime.timedelta(days=days))
                   .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                   .add_extension(x509.ExtendedKeyUsage([usage, ExtendedKeyUsageOID.CLIENT_AUTH]
                                                        if not client else [usage]), critical=False))
        if names:
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        return cert.public_bytes(serialization.Encoding.PEM) + self.pem, _pem_key(key)

    def issue(self, directory: Path, name: str, *, hosts: Sequence[str] = ("127.0.0.1", "localhost"),
              client: bool = False, days: int = 30) -> Issued:
        """Signs `name.crt`/`name.key` in `directory` for `hosts` (DNS names or IP addresses)."""
        cert, key = self.sign(name, hosts=hosts, client=client, days=days)
        directory.mkdir(parents=True, exist_ok=True)
        cert_path = directory / f"{name}.crt"
        cert_path.write_bytes(cert)
        return Issued(cert_path, _write_private(directory / f"{name}.key", key))


# A DNS name a certificate may name (RFC 1123 labels; a leading "*." wildcard).
_DNS_NAME = re.compile(r"(\*\.)?([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*",
                       re.IGNORECASE)


def subject_name(host: str) -> x509.GeneralName:
    """`host` as a certificate's subject alternative name: an IP address or a DNS name.
    Anything else no client would match, so it is refused here, named."""
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        pass
    if len(host) > 253 or not _DNS_NAME.fullmatch(host):
        raise ValueError(f"host {host[:64]!r} is neither an IP address nor a DNS name")
    return x509.DNSName(host)


MASTER_CERT_DAYS = 366


@dataclass(frozen=True)
class MasterCertificate:
    """A job's master certificate: `ca` and `cert` are public, `key` is the secret."""

    ca: bytes    # the job's CA certificate (PEM): what the job's clients trust
    cert: bytes  # the master's certificate chain (PEM)
    key: bytes   # its private key (PEM)


def issue_master_certificate(hosts: Sequence[str], *, job: str,
                             days: int = MASTER_CERT_DAYS) -> MasterCertificate:
    """A certificate for a job's master at `hosts`, signed by a CA made for this one job,
    whose private key is forgotten when this returns (see the module doc)."""
    if not hosts:
        raise ValueError(f"no host names for the master certificate of job {job!r}")
    ca = LocalCA.create(f"paddlecloud CA of job {job}", days=days)
    cert, key = ca.sign("master", hosts=hosts, days=days)
    return MasterCertificate(ca=ca.pem, cert=cert, key=key)
