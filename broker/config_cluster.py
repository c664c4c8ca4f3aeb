"""``[cluster]``: cluster mode's settings, as a frozen value checked when it is built.

Role: :class:`ClusterConfig`, the ``[cluster]`` table of the TOML file (keys, ranges and
meanings in :class:`broker.config_schema.ClusterTable`) and the ``headrace serve`` flags
``--cluster-etcd``, ``--node-id`` and ``--advertise``. No ``etcd`` endpoint: a single
broker, exactly as before cluster mode. The rules that need other tables (the advertised
address defaults to ``listen``; etcd without TLS off loopback needs ``insecure``) are in
:func:`check_cluster`, run once every setting is in (flags come last), and again at start.

Rules, each refused with one line naming the key:

- ``etcd``: at least one ``host:port`` (port 1-65535), no duplicates; it needs ``node_id``.
- ``node_id``: 1-64 characters from ``A-Z a-z 0-9 . _ -``, the first a letter or digit
  (:func:`proto.names.is_valid_node_id`: an etcd key's last segment, a metrics label).
- ``advertise``: ``host:port`` with a port from 1 and a host other hosts can call (not
  ``0.0.0.0`` or ``::``); unset, the ``listen`` address, which then must not be a wildcard.
- ``session_ttl_s``: whole seconds from 2 to 60 (default 10).
- ``controlled_shutdown_timeout_s``: seconds from 0 to 300 (default 10).
- ``etcd_ca``, ``etcd_cert``, ``etcd_key``: all three (TLS with a client certificate) or none.
- ``prefix``: starts and ends with ``/`` (default ``/headrace/``).
- ``tokens`` (``--cluster-tokens``): bearer tokens from etcd; needs ``etcd``, and is
  refused together with ``[security] tokens_file`` (one source of tokens).
- Off loopback (an etcd endpoint or the advertised host is not 127.0.0.0/8, ``::1`` or
  ``localhost``) without etcd TLS: refused unless ``insecure`` (``--insecure``).
- Brokers call each other (replication) over TLS when they serve it (``[security]
  tls_cert``), trusting ``peer_tls_ca``, else ``[security] tls_client_ca``: a cluster
  member serving TLS with neither is refused (it could not check its peers). ``peer_tls_ca``
  and ``peer_server_name`` need ``tls_cert``; ``peer_server_name`` is a host name or IP
  address, without a port.

Worked example: ``--cluster-etcd 127.0.0.1:2379 --node-id b1`` with ``listen =
"127.0.0.1:50051"`` is a cluster member advertising ``127.0.0.1:50051``; the same with
``listen = "0.0.0.0:50051"`` is refused: ``[cluster] advertise is required when listen is
0.0.0.0:50051 ...``.

Pure module: imports neither ``asyncio``, ``os`` nor ``time``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import msgspec

from broker.config_errors import explain
from broker.config_schema import ClusterTable
from broker.errors import ConfigError
from broker.exposure import is_loopback
from proto.names import NODE_ID_RULE, is_valid_node_id

_WILDCARDS = frozenset({"0.0.0.0", "::", ""})
_TLS_FILES = ("etcd_ca", "etcd_cert", "etcd_key")


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    """``[cluster]``: how this broker joins a cluster; the default is no cluster.

    Attributes:
        etcd: etcd client endpoints, ``host:port`` each. Default ``None``: a single
            broker (no etcd, no other key used).
        node_id: This broker's unique, stable name in the cluster (see the module's
            rules). Required with ``etcd``.
        advertise: ``host:port`` other brokers and clients call this broker at. Default
            ``None``: the ``listen`` address with the port it bound.
        session_ttl_s: TTL of the broker's etcd lease, whole seconds, 2 to 60. Default 10.
        etcd_ca: PEM CAs of the etcd servers' certificates (TLS toward etcd).
        etcd_cert: PEM client certificate presented to etcd.
        etcd_key: Unencrypted PEM key of ``etcd_cert``. The three go together.
        prefix: The etcd key prefix of this cluster's keys. Default ``/headrace/``.
        tokens: Every RPC needs a bearer token kept in etcd (``headrace tokens create
            --cluster-etcd``; :mod:`broker.auth.cluster_tokens`). Default ``False``.
        auto_rebalance: as controller, move leadership back to preferred leaders every
            ``rebalance_interval_s`` (``cluster.moves``). Default ``False``.
        rebalance_interval_s: seconds between those passes. Default 300.
        replica_lag_time_max_ms: a follower not caught up with its leader for this long
            leaves the in-sync set. Default 10,000.
        controlled_shutdown_timeout_s: the most a stopping broker spends handing over
            the replicated topics it leads, seconds, 0 (none) to 300. Default 10.
        peer_tls_ca: PEM CAs of the other brokers' server certificates, trusted when
            this broker calls them over TLS. Default ``None``: ``[security] tls_client_ca``.
        peer_server_name: The name checked in the other brokers' certificates instead of
            the host of their advertised address. Default ``None``: that host.
    """

    etcd: tuple[str, ...] | None = None
    node_id: str | None = None
    advertise: str | None = None
    session_ttl_s: int = 10
    etcd_ca: str | None = None
    etcd_cert: str | None = None
    etcd_key: str | None = None
    prefix: str = "/headrace/"
    tokens: bool = False
    auto_rebalance: bool = False
    rebalance_interval_s: int = 300
    replica_lag_time_max_ms: int = 10_000
    controlled_shutdown_timeout_s: float = 10.0
    peer_tls_ca: str | None = None
    peer_server_name: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.etcd, list):
            object.__setattr__(self, "etcd", tuple(self.etcd))
        _check_table(self)
        if self.etcd is not None:
            _check_endpoints(self.etcd)
            if self.node_id is None:
                raise ConfigError(
                    "[cluster] etcd needs node_id: name this broker (--node-id), unique in "
                    "the cluster and the same at every restart"
                )
        if self.node_id is not None and not is_valid_node_id(self.node_id):
            raise ConfigError(f"[cluster] node_id = {self.node_id!r}: {NODE_ID_RULE}")
        if self.advertise is not None:
            _check_advertise(self.advertise)
        tls = [name for name in _TLS_FILES if getattr(self, name) is not None]
        if tls and len(tls) != len(_TLS_FILES):
            raise ConfigError(
                "[cluster] etcd_ca, etcd_cert and etcd_key go together (TLS toward etcd with "
                f"a client certificate): set all three or none; only {', '.join(tls)} is set"
            )
        if self.tokens and self.etcd is None:
            raise ConfigError(
                "[cluster] tokens needs etcd: tokens are read from the cluster's etcd; set "
                "--cluster-etcd (or use [security] tokens_file on a single broker)"
            )
        if not (self.prefix.startswith("/") and self.prefix.endswith("/")):
            raise ConfigError(
                f'[cluster] prefix = {self.prefix!r}: must start and end with /, e.g. "/headrace/"'
            )
        if self.peer_server_name is not None:
            _check_server_name(self.peer_server_name)

    @property
    def enabled(self) -> bool:
        """Whether this broker runs in cluster mode (``etcd`` is set)."""
        return self.etcd is not None

    @property
    def etcd_tls(self) -> bool:
        """Whether the broker talks to etcd over TLS."""
        return self.etcd_ca is not None

    def advertised(self, listen: str, port: int | None = None) -> str:
        """The address to publish: ``advertise``, else ``listen`` with ``port`` (the bound
        one) when given.

        Raises:
            ConfigError: ``advertise`` is unset and ``listen`` is a wildcard address.
        """
        if self.advertise is not None:
            return self.advertise
        host, _, bound = listen.rpartition(":")
        if host.strip("[]") in _WILDCARDS:
            raise ConfigError(
                f"[cluster] advertise is required when listen is {listen} (every interface): "
                "set --advertise HOST:PORT to the address other brokers and clients can call"
            )
        return f"{host}:{port if port is not None else bound}"

    def replace(self, **changes: Any) -> ClusterConfig:
        """A copy with ``changes`` applied (``None`` values are ignored)."""
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})


def check_cluster(
    cluster: ClusterConfig,
    listen: str,
    *,
    insecure: bool,
    tokens_file: str | None = None,
    tls_cert: str | None = None,
    tls_client_ca: str | None = None,
) -> None:
    """The rules of ``[cluster]`` that need other settings; nothing for a single broker.
    ``tls_cert`` and ``tls_client_ca`` are ``[security]``'s: whether this broker serves
    TLS, and the CA it trusts for client certificates.

    Raises:
        ConfigError: no address to advertise, or etcd or the advertised address off
            loopback with no TLS toward etcd and no ``insecure``, or ``tokens`` together
            with ``[security] tokens_file``, or no CA to check the other brokers' TLS
            certificates with, or ``peer_*`` keys on a broker that does not serve TLS.
    """
    if not cluster.enabled:
        return
    _check_peer_tls(cluster, tls_cert, tls_client_ca)
    if cluster.tokens and tokens_file is not None:
        raise ConfigError(
            f"[cluster] tokens and [security] tokens_file = {tokens_file!r} are two sources "
            "of tokens; a broker reads one: drop tokens_file (--tokens-file) to use the "
            "cluster's tokens in etcd, or drop tokens (--cluster-tokens)"
        )
    advertised = cluster.advertised(listen)
    if cluster.etcd_tls or insecure:
        return
    exposed = [
        address
        for address in (*(cluster.etcd or ()), advertised)
        if not is_loopback(address.rpartition(":")[0])
    ]
    if exposed:
        raise ConfigError(
            f"[cluster] refusing plain TCP toward etcd with {', '.join(exposed)} off loopback: "
            "anyone on the network could read or rewrite the cluster's state (owners, "
            "tokens); set [cluster] etcd_ca, etcd_cert and etcd_key, or pass --insecure "
            "(or [security] insecure = true)"
        )


def peer_ca(cluster: ClusterConfig, tls_client_ca: str | None) -> tuple[str, str] | None:
    """The setting (``[cluster] peer_tls_ca`` or ``[security] tls_client_ca``) and path of
    the CAs this broker trusts when it calls the other brokers; None without either."""
    if cluster.peer_tls_ca is not None:
        return "[cluster] peer_tls_ca", cluster.peer_tls_ca
    if tls_client_ca is not None:
        return "[security] tls_client_ca", tls_client_ca
    return None


def _check_peer_tls(
    cluster: ClusterConfig, tls_cert: str | None, tls_client_ca: str | None
) -> None:
    """Brokers call each other with TLS exactly when they serve it: a broker serving TLS
    needs a CA for its peers' certificates, and ``peer_*`` keys need TLS."""
    if tls_cert is None:
        for key in ("peer_tls_ca", "peer_server_name"):
            if getattr(cluster, key) is not None:
                raise ConfigError(
                    f"[cluster] {key} needs [security] tls_cert and tls_key: brokers call "
                    "each other over TLS only when they serve TLS (the other brokers' port "
                    "serves what this one's does); set both or drop the key"
                )
        return
    if peer_ca(cluster, tls_client_ca) is None:
        raise ConfigError(
            "[security] tls_cert: this broker serves TLS, so the other brokers serve it too "
            "and it calls them (replication) over TLS, but it has no CA to check their "
            "certificates with: set [cluster] peer_tls_ca to the PEM CA that signs the "
            "brokers' certificates (or [security] tls_client_ca, mutual TLS, which is "
            "trusted for them too)"
        )


def _check_server_name(name: str) -> None:
    """``peer_server_name``: a host name or an IP address, no port, no spaces."""
    ok = (
        name.isascii()
        and name.isprintable()
        and not any(c in name for c in " /[]")
        and name.count(":") != 1  # host:port; an IPv6 address has several
        and not name.startswith(".")
    )
    if not ok:
        raise ConfigError(
            f"[cluster] peer_server_name = {name!r}: must be the host name (or IP address) "
            "in the brokers' certificates, without a port, e.g. broker.internal"
        )


def _check_table(value: ClusterConfig) -> None:
    """``value``'s fields against :class:`ClusterTable` (types and ranges, as the file)."""
    fields = {n: getattr(value, n) for n in ClusterTable.__struct_fields__}
    fields = {n: list(v) if isinstance(v, tuple) else v for n, v in fields.items() if v is not None}
    try:
        msgspec.convert(fields, ClusterTable)
    except msgspec.ValidationError as exc:
        raise ConfigError(explain(exc, fields, ClusterTable, "", ("cluster",))) from exc


def _check_endpoints(endpoints: tuple[str, ...]) -> None:
    for i, endpoint in enumerate(endpoints):
        _host_port(f"etcd[{i}]", endpoint)
    seen: set[str] = set()
    for endpoint in endpoints:
        if endpoint in seen:
            raise ConfigError(f"[cluster] etcd lists {endpoint} twice; list each endpoint once")
        seen.add(endpoint)


def _check_advertise(address: str) -> None:
    host = _host_port("advertise", address)
    if host in _WILDCARDS:
        raise ConfigError(
            f"[cluster] advertise = {address!r}: {host} is not an address others can call; "
            "give this host's name or IP"
        )


def _host_port(key: str, value: str) -> str:
    """The host of ``value``, which must be ASCII ``host:port`` with a port from 1."""
    host, sep, port = value.rpartition(":")
    ok = (
        value.isascii()
        and value.isprintable()
        and " " not in value
        and sep
        and host
        and port.isdigit()
        and 1 <= int(port) <= 65535
    )
    if not ok:
        raise ConfigError(
            f"[cluster] {key} = {value!r}: must be host:port with a port from 1 to 65535 "
            "(for example 10.0.0.1:2379)"
        )
    return host.strip("[]")
