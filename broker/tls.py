"""Server TLS: read and check the ``[security]`` PEM files, build gRPC server credentials.

Role: turn a bad certificate setup into one line at start, naming the setting and the file,
instead of a broker that starts and then fails every handshake. Checked, in order:

1. each file (``tls_cert``, ``tls_key``, ``tls_client_ca``) can be read;
2. ``tls_cert`` starts with a certificate that is valid now (not expired, not early);
3. ``tls_key`` is an unencrypted private key that matches ``tls_cert``;
4. ``tls_client_ca`` holds at least one CA certificate.

With ``tls_client_ca`` the server requires a client certificate signed by one of its CAs
(mutual TLS): a client without one fails the handshake. Health and reflection are served on
the same port, so they need TLS (and a client certificate) too.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from datetime import UTC, datetime

import grpc

from broker.certs import first_validity
from broker.config import SecurityConfig
from broker.errors import CertificateFormatError, TlsSetupError


@dataclass(frozen=True, slots=True)
class ServerTls:
    """The checked PEM bytes of a TLS server, and when its certificate expires."""

    chain: bytes
    key: bytes
    client_ca: bytes | None
    not_after: datetime

    def credentials(self) -> grpc.ServerCredentials:
        """gRPC credentials: this chain and key; client certificates required with a CA."""
        return grpc.ssl_server_credentials(
            [(self.key, self.chain)],
            root_certificates=self.client_ca,
            require_client_auth=self.client_ca is not None,
        )


def load_server_tls(security: SecurityConfig, now: datetime | None = None) -> ServerTls | None:
    """The checked TLS files of ``security``; None when TLS is off (no ``tls_cert``).

    Raises:
        TlsSetupError: A file is unreadable, not PEM, expired, or the key does not match.
    """
    if security.tls_cert is None or security.tls_key is None:
        return None
    chain = _read("tls_cert", security.tls_cert)
    key = _read("tls_key", security.tls_key)
    try:
        validity = first_validity(chain)
    except CertificateFormatError as exc:
        raise TlsSetupError("tls_cert", security.tls_cert, str(exc)) from exc
    problem = validity.problem(now or datetime.now(UTC))
    if problem:
        raise TlsSetupError("tls_cert", security.tls_cert, f"{problem}; renew it")
    _check_pair(security.tls_cert, security.tls_key)
    client_ca = None
    if security.tls_client_ca is not None:
        client_ca = _read("tls_client_ca", security.tls_client_ca)
        _check_ca(security.tls_client_ca)
    return ServerTls(chain, key, client_ca, validity.not_after)


def _read(setting: str, path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise TlsSetupError(setting, path, f"cannot read it: {exc.strerror or exc}") from exc


def _no_password() -> bytes:
    return b""  # an encrypted key then fails to load, and is reported as such


def _check_pair(cert: str, key: str) -> None:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(cert, key, password=_no_password)
    except ssl.SSLError as exc:
        raise TlsSetupError(
            "tls_key",
            key,
            f"not an unencrypted PEM private key matching tls_cert {cert} ({exc.reason})",
        ) from exc


def _check_ca(path: str) -> None:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    try:
        context.load_verify_locations(cafile=path)
    except ssl.SSLError as exc:
        raise TlsSetupError(
            "tls_client_ca", path, f"holds no readable CA certificate ({exc.reason})"
        ) from exc
    if not context.get_ca_certs():
        raise TlsSetupError("tls_client_ca", path, "holds no CA certificate")
