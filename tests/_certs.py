"""Certificates the tests make themselves: a CA, a server certificate for 127.0.0.1 and
localhost, a client certificate, an expired server certificate, and a second CA whose
certificates no one trusts. EC P-256 keys: each takes ~1 ms to make."""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_DAY = dt.timedelta(days=1)


@dataclass(frozen=True)
class Issuer:
    """A CA: its key, its certificate, and the certificate's PEM path."""

    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate
    pem: str


@dataclass(frozen=True)
class Pair:
    """A certificate and its key, as PEM files."""

    cert: str
    key: str


@dataclass(frozen=True)
class Pki:
    """Every file the TLS tests use (paths)."""

    ca: str  # trusted by clients and (for client certificates) by the broker
    server: Pair  # CN localhost, SAN 127.0.0.1, ::1, localhost; signed by ca
    client: Pair  # client certificate signed by ca
    expired_server: Pair  # like server, but expired yesterday
    wrong_ca: str  # a CA nobody trusts
    wrong_server: Pair  # server certificate signed by wrong_ca
    wrong_client: Pair  # client certificate signed by wrong_ca


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def make_ca(directory: Path, name: str) -> Issuer:
    """A self-signed CA certificate, valid from yesterday for a year."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(name))
        .issuer_name(_name(name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _DAY)
        .not_valid_after(now + 365 * _DAY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    path = directory / f"{name}.pem"
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return Issuer(key, cert, str(path))


def issue(
    directory: Path,
    issuer: Issuer,
    name: str,
    *,
    client: bool = False,
    peer: bool = False,
    not_before: dt.datetime | None = None,
    not_after: dt.datetime | None = None,
) -> Pair:
    """A leaf certificate signed by ``issuer``: a server one for 127.0.0.1, ::1 and
    localhost, or a ``client`` one, or with ``peer`` a broker's that is both (it calls
    the other brokers with it under mutual TLS). Written as ``name.pem`` and ``name.key``."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    usage = ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH
    usages = [usage, ExtendedKeyUsageOID.CLIENT_AUTH] if peer else [usage]
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(name if client else "localhost"))
        .issuer_name(issuer.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before or now - _DAY)
        .not_valid_after(not_after or now + 30 * _DAY)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
    )
    if not client:
        sans: list[x509.GeneralName] = [
            x509.DNSName("localhost"),
            x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
            x509.IPAddress(ipaddress.ip_address("::1")),
        ]
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    cert = builder.sign(issuer.key, hashes.SHA256())
    cert_path, key_path = directory / f"{name}.pem", directory / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return Pair(str(cert_path), str(key_path))


def make_pki(directory: Path) -> Pki:
    """Every certificate of :class:`Pki`, written under ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    ca, wrong = make_ca(directory, "test-ca"), make_ca(directory, "wrong-ca")
    now = dt.datetime.now(dt.UTC)
    return Pki(
        ca=ca.pem,
        server=issue(directory, ca, "server"),
        client=issue(directory, ca, "client", client=True),
        expired_server=issue(
            directory, ca, "expired", not_before=now - 30 * _DAY, not_after=now - _DAY
        ),
        wrong_ca=wrong.pem,
        wrong_server=issue(directory, wrong, "wrong-server"),
        wrong_client=issue(directory, wrong, "wrong-client", client=True),
    )
