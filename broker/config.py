"""Broker configuration: a frozen, validated value built from TOML, then flags.

Role: one place that knows every setting, its unit and its default, and turns bad input into
:class:`ConfigError` naming the setting and what is allowed. Precedence: defaults < TOML
file < ``HEADRACE_*`` environment variables < command-line flags. Each key's kind, unit and
range are msgspec Structs in :mod:`broker.config_schema`: :meth:`BrokerConfig.from_mapping`
converts the parsed file into them with :func:`msgspec.convert` (unknown keys, types and
ranges checked there, the error put in words by :mod:`broker.config_errors`), then
:func:`_from_file` builds the frozen domain values; the ``__post_init__`` checks of values
built in code go through the same Structs. ``python -m broker.config_reference`` renders
the Structs as ``docs/operations/configuration.md``.

TOML layout (every key optional)::

    [broker]
    data_dir = "./data"              # where topics live
    listen = "127.0.0.1:50051"       # gRPC, host:port
    metrics_listen = "127.0.0.1:9464"  # Prometheus /metrics, host:port
    auto_create_topics = false       # create a topic on its first publish
    default_partitions = 1           # partitions of an auto-created topic
    max_request_bytes = 17825792     # largest gRPC message accepted, bytes (17 MiB)
    grace_seconds = 5.0              # how long shutdown lets calls finish, seconds
    max_unacked = 1000               # records in flight per subscription, at most
    cursor_flush_interval_ms = 100   # how often consumer acks are saved, milliseconds
    retention_check_interval_ms = 5000  # how often retention and the backlog quota run, ms
    producer_expiry_ms = 604800000   # idempotent producer ids idle this long are forgotten, ms
    producer_snapshot_bytes = 33554432  # snapshot dedup state after this many bytes (32 MiB)
    log_format = "text"              # text | json: how serve writes its log to stderr

    [wal]                            # every wal.LogConfig field, same names and units
    segment_bytes = 134217728
    fsync = "always"                 # always | interval | never
    [wal.topics.metrics]             # overrides for one topic's partitions ("metrics"):
    fsync = "interval"               # any [wal] key; the rest comes from [wal]
    retention_ms = 86400000

    [heartbeat]                      # the lag monitor behind the notifier
    interval_ms = 500                # how often each subscription is checked, milliseconds
    stall_timeout_ms = 10000         # backlog + room + no progress this long: STALLED
    [heartbeat.topics]               # interval overrides per topic, milliseconds
    orders = 100
    [heartbeat.subscriptions]        # per "topic/subscription"; wins over the topic's
    "orders/billing" = 50

    [backlog]                        # quota per topic partition on the records between the
                                     # subscriptions' lowest saved cursor and the head
    quota_messages = 0               # most records of backlog; 0 = no quota
    policy = "reject_producer"       # reject_producer | block_producer | evict_oldest_backlog
    block_timeout_ms = 30000         # block_producer: how long a publish waits, milliseconds

    [dispatch]                       # redelivery rules of every subscription
    ack_timeout_ms = 30000           # unacked this long after sending: sent again; 0 = never
    backoff_initial_ms = 1000        # delay before the first redelivery (timeout, plain nack)
    backoff_max_ms = 60000           # the delay doubles per failure up to this
    backoff_multiplier = 2.0
    backoff_jitter = 0.2             # each delay moves by up to this fraction, up or down
    max_deliveries = 10              # then the record is poison; 0 = unlimited
    poison_policy = "dead_letter"    # dead_letter | drop | block
    [dispatch.subscriptions."orders/billing"]  # overrides per "topic/subscription"
    max_deliveries = 3

    [dlq]                            # the dead-letter queue of every subscription
    max_entries = 100000
    max_age_ms = 604800000           # older entries are dropped; 0 = keep forever
    overflow = "drop_oldest"         # drop_oldest | reject | block
    max_event_bytes = 1048576        # longer values are cut and flagged
    max_replays = 3                  # replay loop guard: x-replay-count at most this

    [limits]                         # what one client may ask; see broker.limits
    max_headers_per_record = 64      # headers of one record
    max_header_bytes = 16384         # header names + values of one record, bytes
    max_header_name_bytes = 256      # one header name, bytes
    max_partitions_per_topic = 10000
    max_subscriptions_per_topic = 1000
    max_consumers_per_subscription = 1000
    max_streams_per_connection = 100 # open Subscribe + PublishStream per client connection
    max_credit_per_consumer = 100000 # records of credit a consumer holds at once
    max_publish_stream_in_flight = 256  # publishes processed at once per PublishStream
    max_producers_per_partition = 10000  # idempotent producer ids one partition remembers
    [subscriptions]                  # the subscription lifecycle
    inactive_expiry_ms = 604800000   # delete a subscription with no consumer and no ack,
                                     # commit or seek for this long, ms; absent = never
    [security]                       # TLS, tokens, safe default (docs/operations/security.md)
    tls_cert = "server.pem"          # PEM server certificate chain; with tls_key: TLS only
    tls_key = "server.key"           # PEM private key of tls_cert (unencrypted)
    tls_client_ca = "clients-ca.pem" # PEM CAs of client certificates: mutual TLS
    tokens_file = "tokens.json"      # every RPC then needs a bearer token
    insecure = false                 # serve on a non-loopback address unprotected
    [cluster]                        # cluster mode (broker.config_cluster); absent: one broker
    etcd = ["127.0.0.1:2379"]        # etcd endpoints, host:port; turns cluster mode on
    node_id = "b1"                   # this broker's unique, stable name
    advertise = "10.0.0.1:50051"     # where others call it; default: listen
    session_ttl_s = 10               # etcd lease TTL, seconds, 2..60
    etcd_ca = "etcd-ca.pem"          # TLS toward etcd: all three or none
    etcd_cert = "broker.pem"
    etcd_key = "broker.key"
    prefix = "/headrace/"            # etcd key prefix
    replica_lag_time_max_ms = 10000  # a follower this far behind leaves the in-sync set
    controlled_shutdown_timeout_s = 10.0  # most a stop spends handing over led topics
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec

from broker.backlog import BacklogConfig, BacklogPolicy
from broker.config_cluster import ClusterConfig
from broker.config_errors import explain, shown
from broker.config_schema import (
    TEN_YEARS_MS,
    BacklogTable,
    BrokerTable,
    ConfigFile,
    DlqTable,
    HeartbeatTable,
    PolicyTable,
    SecurityTable,
    SubscriptionsTable,
    WalTopicTable,
    set_fields,
)
from broker.errors import ConfigError
from broker.limits import LimitsConfig
from broker.logs import LogFormat
from dispatcher import (
    DispatchConfig,
    DispatchPolicy,
    DlqConfigError,
    HeartbeatConfig,
    InvalidSubscriptionError,
)
from dispatcher.dead_letter_config import DlqConfig
from dispatcher.names import NAME_RULE, is_valid_name
from wal import LogConfig, WalConfigError
from wal.config import HEADER_LIMITS

MIB = 1 << 20
DAY_MS = 86_400_000


@dataclass(frozen=True, slots=True)
class SecurityConfig:
    """``[security]``: TLS, bearer tokens and the safe default. Paths are relative to the
    working directory, as ``data_dir`` is. Files are checked at start (:mod:`broker.tls`).

    Attributes:
        tls_cert: PEM file with the server's certificate chain, leaf first. With
            ``tls_key`` the broker serves TLS only, on the same port (health and reflection
            too). Default unset: plain TCP.
        tls_key: PEM file with the unencrypted private key of ``tls_cert``. Set both or
            neither.
        tls_client_ca: PEM file with the CA certificates that sign client certificates.
            When set, every client must present a certificate signed by one (mutual TLS).
            Needs ``tls_cert``. Default unset.
        tokens_file: The tokens file (``headrace tokens``). When set, every RPC needs a
            valid bearer token. Default unset: tokens are not checked.
        insecure: Serve on an address other hosts can reach without the protection that
            :mod:`broker.exposure` requires (TLS plus tokens or client certificates);
            the reason is logged as a warning. Default false: the broker refuses to start.
    """

    tls_cert: str | None = None
    tls_key: str | None = None
    tls_client_ca: str | None = None
    tokens_file: str | None = None
    insecure: bool = False

    def __post_init__(self) -> None:
        _check(SecurityTable, self, "security")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ConfigError(
                "[security] tls_cert and tls_key go together: set both (TLS) or neither"
            )
        if self.tls_client_ca is not None and self.tls_cert is None:
            raise ConfigError(
                "[security] tls_client_ca needs tls_cert and tls_key: mutual TLS is TLS with "
                "client certificates"
            )

    @property
    def tls(self) -> bool:
        """Whether the broker serves TLS."""
        return self.tls_cert is not None

    def replace(self, **changes: Any) -> SecurityConfig:
        """A copy with ``changes`` applied (``None`` values are ignored)."""
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})


#: The longest inactive_expiry_ms accepted: ten years, milliseconds.
MAX_EXPIRY_MS = TEN_YEARS_MS


@dataclass(frozen=True, slots=True)
class SubscriptionsConfig:
    """``[subscriptions]``: the subscription lifecycle.

    Attributes:
        inactive_expiry_ms: Delete a subscription that has had no consumer attached and no
            ack, ``AckUpTo`` commit or seek for this long, milliseconds (from 1 to ten
            years). The delete is the ``DeleteSubscription`` one: state and dead-letter
            queue go, and retention stops keeping records for it. Idle time is measured on
            the monotonic clock since the broker started (a restart counts as activity, so
            it never deletes a subscription at once). Default ``None``: never.
    """

    inactive_expiry_ms: int | None = None

    def __post_init__(self) -> None:
        _check(SubscriptionsTable, self, "subscriptions")

    @property
    def inactive_expiry_s(self) -> float | None:
        """``inactive_expiry_ms`` in seconds, or ``None``."""
        ms = self.inactive_expiry_ms
        return None if ms is None else ms / 1000


@dataclass(frozen=True, slots=True)
class BrokerConfig:
    """Settings of one broker.

    Attributes:
        data_dir: Directory holding every topic. Default ``./data``.
        listen: gRPC address, ``host:port``. Default ``127.0.0.1:50051``; port 0 picks one.
        metrics_listen: Prometheus address, ``host:port``. Default ``127.0.0.1:9464``;
            empty disables the metrics listener.
        auto_create_topics: Create a topic on its first publish. Default off.
        default_partitions: Partitions of an auto-created topic. Default 1.
        max_request_bytes: Largest gRPC message accepted, bytes. Default 17 MiB (a 16 MiB
            batch plus framing).
        grace_seconds: How long shutdown lets in-flight calls finish, seconds. Default 5.
        max_unacked: Records sent to a subscription's consumers and not yet acknowledged,
            at most; the broker stops sending at this cap. Default 1,000. Raise it for
            throughput: a consumer acking in bulk needs a few batches in flight.
        cursor_flush_interval_ms: How often consumer acks are saved, milliseconds. Acks not
            yet saved when the broker dies are redelivered (never skipped). Seeks and
            ``AckUpTo`` commits are saved before they are answered. Default 100.
        retention_check_interval_ms: How often retention runs on every partition and the
            backlog quota's floors are refreshed, milliseconds. Retention deletes what
            ``wal.retention_ms`` / ``retention_bytes`` allow, never at or past the lowest
            cursor the topic's subscriptions saved. Default 5,000.
        producer_expiry_ms: How long a partition remembers an idempotent producer id after
            its last append, milliseconds; checked at each retention pass. A retry that
            arrives later is appended again. From 60,000 (1 minute) to 10 years; there is no
            "never" (the table would grow without bound). Default 604,800,000 (7 days).
        producer_snapshot_bytes: Each partition snapshots its idempotent-producer state
            after this many bytes appended since the last snapshot (and at every segment
            roll), bytes. After a crash the broker rescans at most about this much per
            partition to rebuild it; smaller means a faster restart and more small
            (fsynced) writes. From 1 KiB to 64 GiB. Default 33,554,432 (32 MiB).
        log_format: How ``serve`` writes its log to stderr (:mod:`broker.logs`): ``text``
            (the default) or ``json``, one JSON object per line. Flag ``--log-format``.
        wal: Settings of every partition's log (:class:`wal.LogConfig`).
        wal_topics: The log settings of named topics' partitions, where they differ from
            ``wal`` (``[wal.topics.<name>]`` in the file): a topic's own fsync policy,
            segment size or retention. Applied when the topic's partitions open (at start,
            or when the topic is created). Default: none.
        heartbeat: The heartbeat lag monitor (:class:`dispatcher.HeartbeatConfig`): interval
            500 ms, per topic and per subscription; stall timeout 10 s.
        backlog: The backlog quota per partition (:class:`broker.backlog.BacklogConfig`):
            ``quota_messages`` records (0, the default, disables it), the ``policy`` over it
            (default ``reject_producer``) and ``block_timeout_ms`` (default 30,000).
        dispatch: Redelivery, poison and dead-letter settings
            (:class:`dispatcher.DispatchConfig`): ack timeout 30 s, backoff 1 s doubling to
            60 s with 20 % jitter, 10 deliveries then ``dead_letter``; overrides per
            subscription; dead-letter queues of at most 100,000 entries, 7 days.
        limits: What one client may ask of the broker (:class:`broker.limits.LimitsConfig`):
            headers per record, streams per connection, credit, partitions, subscriptions
            and consumers; each key's default and range are documented there.
        security: TLS, tokens and the safe default (:class:`SecurityConfig`). Default: none
            of them, which is allowed on a loopback ``listen`` address only.
        subscriptions: The subscription lifecycle (:class:`SubscriptionsConfig`): inactivity
            expiry, off by default.
        cluster: Cluster mode (:class:`broker.config_cluster.ClusterConfig`). Default: no
            etcd, a single broker.
    """

    data_dir: str = "./data"
    listen: str = "127.0.0.1:50051"
    metrics_listen: str = "127.0.0.1:9464"
    auto_create_topics: bool = False
    default_partitions: int = 1
    max_request_bytes: int = 17 * MIB
    grace_seconds: float = 5.0
    max_unacked: int = 1_000
    cursor_flush_interval_ms: int = 100
    retention_check_interval_ms: int = 5_000
    producer_expiry_ms: int = 7 * DAY_MS
    producer_snapshot_bytes: int = 32 * MIB
    log_format: LogFormat = LogFormat.TEXT
    wal: LogConfig = field(default_factory=LogConfig)
    wal_topics: Mapping[str, LogConfig] = field(default_factory=dict)
    heartbeat: HeartbeatConfig = field(default_factory=HeartbeatConfig)
    backlog: BacklogConfig = field(default_factory=BacklogConfig)
    dispatch: DispatchConfig = field(default_factory=DispatchConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    security: SecurityConfig = field(default_factory=SecurityConfig)
    subscriptions: SubscriptionsConfig = field(default_factory=SubscriptionsConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)

    def __post_init__(self) -> None:
        _check(BrokerTable, self, "broker")
        _address("listen", self.listen, allow_empty=False)
        _address("metrics_listen", self.metrics_listen, allow_empty=True)
        _check_backlog(self.backlog)
        _check_limits(self.limits, self.default_partitions)
        for topic, config in self.wal_topics.items():
            if not is_valid_name(topic):
                raise ConfigError(f"wal_topics: {topic!r} is not a valid topic name: {NAME_RULE}")
            if not isinstance(config, LogConfig):
                raise ConfigError(f"wal_topics[{topic!r}] must be a wal.LogConfig")
        if not isinstance(self.security, SecurityConfig):
            raise ConfigError("security must be a broker.config.SecurityConfig")
        if not isinstance(self.subscriptions, SubscriptionsConfig):
            raise ConfigError("subscriptions must be a broker.config.SubscriptionsConfig")
        if not isinstance(self.cluster, ClusterConfig):
            raise ConfigError("cluster must be a broker.config_cluster.ClusterConfig")

    @property
    def log_config(self) -> LogConfig:
        """Every partition's log settings: ``[wal]`` with the header limits of ``[limits]``."""
        return self._with_limits(self.wal)

    @property
    def topic_log_configs(self) -> dict[str, LogConfig]:
        """The log settings of the topics in ``wal_topics``, with the header limits of
        ``[limits]`` (the same for every topic)."""
        return {topic: self._with_limits(wal) for topic, wal in self.wal_topics.items()}

    def _with_limits(self, wal: LogConfig) -> LogConfig:
        return dataclasses.replace(
            wal, **{name: getattr(self.limits, name) for name in HEADER_LIMITS}
        )

    def replace(self, **changes: Any) -> BrokerConfig:
        """A copy with ``changes`` applied (``None`` values are ignored)."""
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})

    @classmethod
    def load(
        cls,
        path: str | None = None,
        *,
        env: Mapping[str, str] | None = None,
        **flags: Any,
    ) -> BrokerConfig:
        """Build the config: defaults, then the TOML file, then env, then ``flags``.

        Raises:
            ConfigError: the file is unreadable or invalid, or a value is out of range.
        """
        config = cls.from_toml(path) if path else cls()
        env = os.environ if env is None else env
        from_env = {
            key: env[var]
            for key, var in (
                ("data_dir", "HEADRACE_DATA_DIR"),
                ("listen", "HEADRACE_LISTEN"),
                ("metrics_listen", "HEADRACE_METRICS_LISTEN"),
            )
            if var in env
        }
        return config.replace(**from_env).replace(**flags)

    @classmethod
    def from_toml(cls, path: str) -> BrokerConfig:
        """Parse a TOML config file.

        Raises:
            ConfigError: the file is missing, not TOML, or holds an invalid setting.
        """
        try:
            with open(path, "rb") as f:
                doc = tomllib.load(f)
        except OSError as exc:
            raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {path} is not valid TOML: {exc}") from exc
        except UnicodeDecodeError as exc:
            raise ConfigError(
                f"config file {path} is not UTF-8 text (byte {exc.start}); save it as UTF-8"
            ) from exc
        return cls.from_mapping(doc, source=path)

    @classmethod
    def from_mapping(cls, doc: Mapping[str, Any], *, source: str = "config") -> BrokerConfig:
        """Build from a parsed document with ``[broker]``, ``[wal]``, ``[heartbeat]``,
        ``[backlog]``, ``[dispatch]``, ``[dlq]``, ``[limits]``, ``[security]``,
        ``[subscriptions]`` and ``[cluster]`` tables (:class:`broker.config_schema.ConfigFile`)."""
        try:
            file = msgspec.convert(doc, ConfigFile)
        except msgspec.ValidationError as exc:
            raise ConfigError(explain(exc, doc, ConfigFile, source)) from exc
        return _from_file(file, source)


def _from_file(file: ConfigFile, source: str) -> BrokerConfig:
    """The domain config of a converted file: milliseconds to seconds where the domain
    holds seconds, and each table of overrides over the table it refines."""
    wal = _log_config(file.wal, LogConfig(), f"{source} [wal]")
    wal_topics: dict[str, LogConfig] = {}
    for topic, table in file.wal.topics.items():
        where = f"{source} [wal.topics.{shown(topic)}]"
        if not is_valid_name(topic):
            raise ConfigError(f"{where}: not a valid topic name: {NAME_RULE}")
        wal_topics[topic] = _log_config(table, wal, where)
    where = f"{source} [dispatch]"
    defaults = _policy(file.dispatch, DispatchPolicy(), where)
    overrides: dict[str, DispatchPolicy] = {}
    for name, override in file.dispatch.subscriptions.items():
        if name.count("/") != 1:
            raise ConfigError(f'{where}.subscriptions: {name!r} must be "topic/subscription"')
        overrides[name] = _policy(override, defaults, f"{where}.subscriptions.{name!r}")
    return BrokerConfig(
        **set_fields(file.broker),
        wal=wal,
        wal_topics=wal_topics,
        heartbeat=_heartbeat(file.heartbeat, f"{source} [heartbeat]"),
        backlog=BacklogConfig(**set_fields(file.backlog)),
        dispatch=DispatchConfig(defaults, overrides, _dlq(file.dlq, f"{source} [dlq]")),
        limits=LimitsConfig(**set_fields(file.limits)),
        security=SecurityConfig(**set_fields(file.security)),
        subscriptions=SubscriptionsConfig(**set_fields(file.subscriptions)),
        cluster=ClusterConfig(**set_fields(file.cluster)),
    )


def _check(schema: type[msgspec.Struct], value: object, table: str) -> None:
    """Check a value built in code against its table's Struct (the file's own rules).

    Raises:
        ConfigError: a field of the wrong type or out of range, named as in the file.
    """
    fields = {n: getattr(value, n) for n in schema.__struct_fields__ if hasattr(value, n)}
    fields = {n: v for n, v in fields.items() if v is not None}  # None: unset in code
    try:
        msgspec.convert(fields, schema)
    except msgspec.ValidationError as exc:
        raise ConfigError(explain(exc, fields, schema, "", (table,))) from exc


def _log_config(table: WalTopicTable, base: LogConfig, where: str) -> LogConfig:
    """``base`` with the ``[wal]`` keys ``table`` sets."""
    changes = {k: v for k, v in set_fields(table).items() if k != "topics"}
    try:
        return dataclasses.replace(base, **changes)
    except WalConfigError as exc:  # wal.LogConfig has the last word on its own values
        raise ConfigError(f"{where}: {exc}") from exc


def _heartbeat(table: HeartbeatTable, where: str) -> HeartbeatConfig:
    """``[heartbeat]`` (milliseconds in the file) as a :class:`HeartbeatConfig` (seconds)."""
    seconds = {k.removesuffix("_ms") + "_s": v / 1000 for k, v in set_fields(table).items()
               if k.endswith("_ms")}  # fmt: skip
    try:
        return HeartbeatConfig(
            **seconds,
            topics={name: ms / 1000 for name, ms in table.topics.items()},
            subscriptions={name: ms / 1000 for name, ms in table.subscriptions.items()},
        )
    except InvalidSubscriptionError as exc:
        raise ConfigError(f"{where}: {exc}") from exc


def _policy(table: PolicyTable, base: DispatchPolicy, where: str) -> DispatchPolicy:
    """``[dispatch]`` or one override in it (milliseconds in the file) over ``base``."""
    changes: dict[str, Any] = {}
    for key, value in set_fields(table).items():
        if key.endswith("_ms"):
            name = key.removesuffix("_ms") + "_s"
            changes[name] = None if key == "ack_timeout_ms" and value == 0 else value / 1000
        elif key == "poison_policy":
            changes["poison"] = value
        elif key != "subscriptions":
            changes[key] = value
    try:
        return dataclasses.replace(base, **changes)
    except InvalidSubscriptionError as exc:  # backoff_max_ms under backoff_initial_ms
        raise ConfigError(f"{where}: {exc}") from exc


def _dlq(table: DlqTable, where: str) -> DlqConfig:
    """``[dlq]`` (milliseconds in the file; 0 = keep forever) as a :class:`DlqConfig`."""
    values = set_fields(table)
    if "max_age_ms" in values:
        age = values.pop("max_age_ms")
        values["max_age_s"] = age / 1000 if age else None
    try:
        return DlqConfig(**values)
    except DlqConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from exc


def _check_limits(limits: object, default_partitions: int) -> None:
    if not isinstance(limits, LimitsConfig):
        raise ConfigError("limits must be a broker.limits.LimitsConfig")
    if default_partitions > limits.max_partitions_per_topic:
        raise ConfigError(
            f"default_partitions = {default_partitions} is over [limits] "
            f"max_partitions_per_topic = {limits.max_partitions_per_topic}"
        )


def _check_backlog(backlog: object) -> None:
    if not isinstance(backlog, BacklogConfig):
        raise ConfigError("backlog must be a broker.backlog.BacklogConfig")
    _check(BacklogTable, backlog, "backlog")
    if not isinstance(backlog.policy, BacklogPolicy):
        choices = ", ".join(p.value for p in BacklogPolicy)
        raise ConfigError(
            f"[backlog] policy = {backlog.policy!r}: must be a BacklogPolicy ({choices})"
        )


def parse_address(value: str) -> tuple[str, int]:
    """Split ``host:port`` (IPv6 hosts in brackets).

    Raises:
        ConfigError: not ``host:port`` with a port from 0 to 65535.
    """
    host, sep, port = value.rpartition(":")
    # isascii: str.isdigit() also holds for superscript and Arabic-Indic digits.
    if not sep or not host or not (port.isascii() and port.isdigit()) or int(port) > 65535:
        raise ConfigError(f"{value!r} is not host:port (for example 127.0.0.1:50051)")
    return host.strip("[]"), int(port)


def _address(name: str, value: str, *, allow_empty: bool) -> None:
    if allow_empty and value == "":
        return
    try:
        parse_address(value)
    except ConfigError as exc:
        raise ConfigError(f"{name}: {exc}") from exc
