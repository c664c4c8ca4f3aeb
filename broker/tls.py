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

The client side between brokers (:func:`load_peer_tls`): a cluster member that serves TLS
calls the other brokers (a follower's ``ReplicaFetch``) over TLS, as Kafka's
``inter.broker`` listener or Redpanda's ``rpc_server_tls`` do: it trusts ``[cluster]
peer_tls_ca``, else ``tls_client_ca`` (one CA signing every broker and client is the usual
setup), and presents its own ``tls_cert`` and ``tls_key`` as its client certificate, which
a peer asks for only under mutual TLS (the certificate then needs the ``clientAuth``
extended key usage, or none). ``[cluster] peer_server_name`` replaces the host of each
peer's advertised address as the name checked in its certificate. The files are read once,
at start: no reload (the server's own certificate is not reloaded either).
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from datetime import UTC, datetime

import grpc

from broker.certs import allows_client_auth, first_validity
from broker.config import SecurityConfig
from broker.config_cluster import ClusterConfig, peer_ca
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


@dataclass(frozen=True, slots=True)
class PeerTls:
    """How this broker calls the other brokers over TLS: the CAs it trusts for their
    certificates (read from ``ca_setting``), its own chain and key (its client certificate
    when a peer asks for one), and the name checked instead of each address's host."""

    root_ca: bytes
    chain: bytes
    key: bytes
    server_name: str | None
    ca_setting: str

    def credentials(self) -> grpc.ChannelCredentials:
        """gRPC channel credentials: these CAs, this chain and key."""
        return grpc.ssl_channel_credentials(
            root_certificates=self.root_ca, private_key=self.key, certificate_chain=self.chain
        )

    def options(self) -> list[tuple[str, str]]:
        """Channel options: the name to check in the peer's certificate, if set."""
        if self.server_name is None:
            return []
        return [("grpc.ssl_target_name_override", self.server_name)]


def load_peer_tls(
    cluster: ClusterConfig, security: SecurityConfig, server: ServerTls | None
) -> PeerTls | None:
    """How this broker calls its peers: None for plain text (it does not serve TLS, or is
    not in a cluster), else TLS with the CA of ``[cluster] peer_tls_ca`` or ``[security]
    tls_client_ca`` and ``server``'s chain and key (checked by :func:`load_server_tls`).

    Raises:
        TlsSetupError: ``peer_tls_ca`` is unreadable or holds no CA certificate, or
            there is no CA at all (``check_cluster`` refuses that first), or under mutual
            TLS ``tls_cert`` may not authenticate a client (its extended key usage lacks
            ``clientAuth``: the other brokers would refuse it).
    """
    if server is None or not cluster.enabled:
        return None
    found = peer_ca(cluster, security.tls_client_ca)
    if found is None:
        raise TlsSetupError(
            "tls_cert",
            security.tls_cert or "",
            "serving TLS in a cluster needs [cluster] peer_tls_ca (or tls_client_ca) to "
            "check the other brokers' certificates",
        )
    setting, path = found
    if security.tls_client_ca is not None and not _client_auth_ok(server.chain):
        raise TlsSetupError(
            "tls_cert",
            security.tls_cert or "",
            "with tls_client_ca (mutual TLS) the brokers require client certificates of "
            "each other too, and this certificate is this broker's, but its extended key "
            "usage lacks clientAuth: issue it with both serverAuth and clientAuth",
        )
    if server.client_ca is not None and cluster.peer_tls_ca is None:
        root_ca = server.client_ca  # tls_client_ca, read and checked already
    else:
        root_ca = _read("peer_tls_ca", path, table="cluster")
        _check_ca(path, setting="peer_tls_ca", table="cluster")
    return PeerTls(root_ca, server.chain, server.key, cluster.peer_server_name, setting)


def _client_auth_ok(chain: bytes) -> bool:
    try:
        return allows_client_auth(chain)
    except CertificateFormatError:
        return True  # load_server_tls read its dates: not expected; the handshake decides


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


def _read(setting: str, path: str, table: str = "security") -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        problem = f"cannot read it: {exc.strerror or exc}"
        raise TlsSetupError(setting, path, problem, table) from exc


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


def _check_ca(path: str, setting: str = "tls_client_ca", table: str = "security") -> None:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    try:
        context.load_verify_locations(cafile=path)
    except ssl.SSLError as exc:
        raise TlsSetupError(
            setting, path, f"holds no readable CA certificate ({exc.reason})", table
        ) from exc
    if not context.get_ca_certs():
        raise TlsSetupError(setting, path, "holds no CA certificate", table)
