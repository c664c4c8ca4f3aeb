"""Every key of the broker's TOML file as data: its table, kind, unit, allowed range and
meaning.

Role: the one table of facts about the config file. :mod:`broker.config` checks the ranges
of the keys it owns (``[broker]``, ``[backlog]``, ``[heartbeat]``, ``[subscriptions]``)
from it, ``[wal]`` and ``[limits]`` come from the range tables their own validators use
(:data:`wal.config.RANGES`, :data:`broker.limits.RANGES`), and
:mod:`broker.config_reference` renders the whole table as the configuration reference page.
Defaults are not copied here: the reference reads them from a default
:class:`~broker.config.BrokerConfig` through each key's ``attr``. A test probes every
range at its ends through the real parser, so a validator that moves fails it.

Worked example: ``[dispatch] ack_timeout_ms`` is ``Key("dispatch", "ack_timeout_ms",
Kind.INTEGER, "ms", ..., low=1, high=86_400_000, zero="never",
attr="dispatch.defaults.ack_timeout_s", scale=1000)``: the file holds milliseconds, the
config holds seconds (``30.0``), so its default renders as ``30000``.

Pure module: imports neither ``asyncio``, ``os`` nor ``time``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from broker.backlog import BacklogPolicy
from broker.limits import RANGES as LIMIT_RANGES
from broker.logs import LogFormat
from dispatcher import PoisonPolicy
from dispatcher.dead_letter_config import MAX_EVENT_BYTES_LIMIT, OverflowPolicy
from dispatcher.dead_letter_records import MAX_REPLAY_COUNT
from wal.config import OPTIONAL as WAL_OPTIONAL
from wal.config import RANGES as WAL_RANGES
from wal.config import FsyncPolicy

DAY_MS = 86_400_000
HOUR_MS = 3_600_000


class Kind(enum.Enum):
    """The TOML type of a key's value."""

    INTEGER = "integer"
    NUMBER = "number"  # integer or float
    BOOLEAN = "boolean"
    STRING = "string"
    ADDRESS = "string host:port"
    CHOICE = "string, one of"
    TABLE = "table"


@dataclass(frozen=True, slots=True)
class Key:
    """One key of the config file.

    Attributes:
        table: The TOML table that holds it (``broker``, ``wal``, ``dispatch``, ...).
        name: The key.
        kind: Its TOML type.
        unit: What a number counts (``bytes``, ``ms``, ``records``); ``""`` for none.
        meaning: One sentence or two: what it does.
        low: Smallest value allowed (inclusive), or ``None``.
        high: Largest value allowed (inclusive), or ``None`` for no upper bound.
        choices: The enum whose values a ``CHOICE`` key takes.
        zero: What 0 means when 0 is special (``"no quota"``), else ``""``.
        unset: What leaving the key out means when there is no default value (``"never"``).
        attr: Where a :class:`~broker.config.BrokerConfig` holds its value, dotted
            (``"wal.segment_bytes"``); ``""`` when the key is a table of overrides.
        scale: The file's value is the held value times this (1000: ms in the file,
            seconds held).
    """

    table: str
    name: str
    kind: Kind
    unit: str
    meaning: str
    low: float | None = None
    high: float | None = None
    choices: type[enum.Enum] | None = None
    zero: str = ""
    unset: str = ""
    attr: str = ""
    scale: float = 1


def _broker(
    name: str,
    kind: Kind,
    unit: str,
    meaning: str,
    *,
    low: float | None = None,
    high: float | None = None,
) -> Key:
    return Key("broker", name, kind, unit, meaning, low=low, high=high, attr=name)


BROKER = (
    _broker(
        "data_dir",
        Kind.STRING,
        "path",
        "Where topics, cursors and dead letters live "
        "(relative to the working directory). Env `HEADRACE_DATA_DIR`, flag `--data-dir`.",
    ),
    _broker(
        "listen",
        Kind.ADDRESS,
        "",
        "The gRPC address; port 0 picks a free one. Env "
        "`HEADRACE_LISTEN`, flag `--listen`. A non-loopback address needs `[security]`.",
    ),
    _broker(
        "metrics_listen",
        Kind.ADDRESS,
        "",
        'The Prometheus `/metrics` address; `""` '
        "turns the listener off. Env `HEADRACE_METRICS_LISTEN`, flag `--metrics-listen`.",
    ),
    _broker("auto_create_topics", Kind.BOOLEAN, "", "Create a topic on its first publish."),
    _broker(
        "default_partitions",
        Kind.INTEGER,
        "partitions",
        "Partitions of an auto-created topic (at most `[limits] max_partitions_per_topic`).",
        low=1,
        high=10_000,
    ),
    _broker(
        "max_request_bytes",
        Kind.INTEGER,
        "bytes",
        "Largest gRPC request the broker "
        "accepts; a larger one is refused with `RESOURCE_EXHAUSTED` naming this key.",
        low=1024,
        high=1 << 30,
    ),
    _broker(
        "grace_seconds",
        Kind.NUMBER,
        "s",
        "How long shutdown lets in-flight calls finish.",
        low=0,
        high=600,
    ),
    _broker(
        "max_unacked",
        Kind.INTEGER,
        "records",
        "Records sent to a subscription's "
        "consumers and not yet acknowledged, at most; sending stops at this cap.",
        low=1,
        high=10_000_000,
    ),
    _broker(
        "cursor_flush_interval_ms",
        Kind.INTEGER,
        "ms",
        "How often consumer acks are "
        "saved; acks not yet saved when the broker dies are redelivered.",
        low=1,
        high=60_000,
    ),
    _broker(
        "retention_check_interval_ms",
        Kind.INTEGER,
        "ms",
        "How often retention and the backlog quota run on every partition.",
        low=1,
        high=HOUR_MS,
    ),
    _broker(
        "producer_expiry_ms",
        Kind.INTEGER,
        "ms",
        "Idempotent producer ids idle this "
        "long are forgotten (a later retry of theirs is appended again).",
        low=60_000,
        high=3_650 * DAY_MS,
    ),
    _broker(
        "producer_snapshot_bytes",
        Kind.INTEGER,
        "bytes",
        "Snapshot a partition's "
        "idempotent-producer state after this many bytes appended; bounds the rescan "
        "after a crash.",
        low=1024,
        high=64 << 30,
    ),
    Key(
        "broker",
        "log_format",
        Kind.CHOICE,
        "",
        "How `serve` writes its log to stderr: `text` (timestamp, level, logger, message; "
        "control characters escaped) or `json` (one JSON object per line: time, level, "
        "logger, message, exception). Flag `--log-format`.",
        choices=LogFormat,
        attr="log_format",
    ),
)

_WAL_MEANING = {
    "segment_bytes": ("bytes", "Roll the active segment before it would exceed this size."),
    "segment_ms": ("ms", "Roll the active segment once it is this old."),
    "index_interval_bytes": ("bytes", "Bytes between sparse index entries."),
    "max_record_bytes": ("bytes", "Largest key + value + headers of one record."),
    "max_batch_bytes": ("bytes", "Largest encoded batch."),
    "retention_ms": (
        "ms",
        "Delete sealed segments whose newest record is older than this "
        "(never at or past a subscription's saved cursor).",
    ),
    "retention_bytes": (
        "bytes",
        "Delete the oldest sealed segments while the log without "
        "them still holds at least this many bytes.",
    ),
    "fsync_interval_ms": ("ms", "Period of the `interval` fsync policy."),
    "max_group_bytes": ("bytes", "Most bytes one group commit writes with one fdatasync."),
    "tail_cache_bytes": (
        "bytes",
        "Newest batches kept in memory per partition, shared by "
        "every reader near the head; each batch counts as its size plus "
        "768 bytes.",
    ),
}


def _wal(table: str, attr: str) -> tuple[Key, ...]:
    keys = [
        Key(
            table,
            name,
            Kind.INTEGER,
            unit,
            meaning,
            low=WAL_RANGES[name][0] if name in WAL_RANGES else 1,
            high=WAL_RANGES[name][1] if name in WAL_RANGES else None,
            zero="off" if name == "tail_cache_bytes" else "",
            unset="off" if name in WAL_OPTIONAL else "",
            attr=f"{attr}.{name}",
        )
        for name, (unit, meaning) in _WAL_MEANING.items()
    ]
    keys.insert(
        7,
        Key(
            table,
            "fsync",
            Kind.CHOICE,
            "",
            "When an append is acknowledged: "
            "after fdatasync (`always`), after the write with a sync every "
            "`fsync_interval_ms` (`interval`), or when the OS likes (`never`).",
            choices=FsyncPolicy,
            attr=f"{attr}.fsync",
        ),
    )
    return tuple(keys)


WAL = (
    *_wal("wal", "wal"),
    Key(
        "wal",
        "topics",
        Kind.TABLE,
        "",
        "`[wal.topics.<name>]`: any `[wal]` key for one "
        "topic's partitions, over `[wal]`; applied when the topic opens or is created.",
    ),
)

HEARTBEAT = (
    Key(
        "heartbeat",
        "interval_ms",
        Kind.NUMBER,
        "ms",
        "How often the lag monitor checks each subscription against the log's head.",
        low=1,
        high=HOUR_MS,
        attr="heartbeat.interval_s",
        scale=1000,
    ),
    Key(
        "heartbeat",
        "stall_timeout_ms",
        Kind.NUMBER,
        "ms",
        "A backlog with room and no progress for this long is STALLED.",
        low=1,
        high=DAY_MS,
        attr="heartbeat.stall_timeout_s",
        scale=1000,
    ),
    Key(
        "heartbeat",
        "topics",
        Kind.TABLE,
        "ms",
        "`[heartbeat.topics]`: `name = interval_ms` per topic, from 1 to 3,600,000.",
    ),
    Key(
        "heartbeat",
        "subscriptions",
        Kind.TABLE,
        "ms",
        "`[heartbeat.subscriptions]`: "
        '`"topic/subscription" = interval_ms`; wins over the topic\'s.',
    ),
)

BACKLOG = (
    Key(
        "backlog",
        "quota_messages",
        Kind.INTEGER,
        "records",
        "Most records per partition between the subscriptions' lowest saved cursor and the head.",
        low=0,
        high=1 << 62,
        zero="no quota",
        attr="backlog.quota_messages",
    ),
    Key(
        "backlog",
        "policy",
        Kind.CHOICE,
        "",
        "What a publish over the quota gets: refused "
        "(`RESOURCE_EXHAUSTED`), held, or accepted while the oldest sealed segments go.",
        choices=BacklogPolicy,
        attr="backlog.policy",
    ),
    Key(
        "backlog",
        "block_timeout_ms",
        Kind.INTEGER,
        "ms",
        "`block_producer`: how long a publish waits for room before it fails.",
        low=1,
        high=HOUR_MS,
        attr="backlog.block_timeout_ms",
    ),
)

_POLICY = "dispatch.defaults"
DISPATCH = (
    Key(
        "dispatch",
        "ack_timeout_ms",
        Kind.INTEGER,
        "ms",
        "A record unacknowledged this long after it was sent is sent again.",
        low=0,
        high=DAY_MS,
        zero="never",
        attr=f"{_POLICY}.ack_timeout_s",
        scale=1000,
    ),
    Key(
        "dispatch",
        "backoff_initial_ms",
        Kind.INTEGER,
        "ms",
        "Delay before the first redelivery after a timeout or a nack without a delay.",
        low=0,
        high=DAY_MS,
        attr=f"{_POLICY}.backoff_initial_s",
        scale=1000,
    ),
    Key(
        "dispatch",
        "backoff_max_ms",
        Kind.INTEGER,
        "ms",
        "The delay grows per failure up to this (at least `backoff_initial_ms`).",
        low=0,
        high=DAY_MS,
        attr=f"{_POLICY}.backoff_max_s",
        scale=1000,
    ),
    Key(
        "dispatch",
        "backoff_multiplier",
        Kind.NUMBER,
        "factor",
        "Growth of the delay per failed delivery.",
        low=1,
        high=100,
        attr=f"{_POLICY}.backoff_multiplier",
    ),
    Key(
        "dispatch",
        "backoff_jitter",
        Kind.NUMBER,
        "fraction",
        "Each delay moves by up to this fraction either way.",
        low=0,
        high=1,
        attr=f"{_POLICY}.backoff_jitter",
    ),
    Key(
        "dispatch",
        "max_deliveries",
        Kind.INTEGER,
        "deliveries",
        "After this many deliveries a record is poison and `poison_policy` applies.",
        low=0,
        high=1_000_000,
        zero="unlimited",
        attr=f"{_POLICY}.max_deliveries",
    ),
    Key(
        "dispatch",
        "poison_policy",
        Kind.CHOICE,
        "",
        "What happens to a poison record: "
        "moved to the dead-letter queue, acknowledged with a warning, or its partition "
        "BLOCKED.",
        choices=PoisonPolicy,
        attr=f"{_POLICY}.poison",
    ),
    Key(
        "dispatch",
        "subscriptions",
        Kind.TABLE,
        "",
        '`[dispatch.subscriptions."topic/'
        'subscription"]`: any `[dispatch]` key above for one subscription.',
    ),
)

DLQ = (
    Key(
        "dlq",
        "max_entries",
        Kind.INTEGER,
        "entries",
        "Most dead letters one queue holds.",
        low=1,
        attr="dispatch.dlq.max_entries",
    ),
    Key(
        "dlq",
        "max_age_ms",
        Kind.INTEGER,
        "ms",
        "Older entries are dropped.",
        low=0,
        zero="keep forever",
        attr="dispatch.dlq.max_age_s",
        scale=1000,
    ),
    Key(
        "dlq",
        "overflow",
        Kind.CHOICE,
        "",
        "What a full queue does: evict the oldest, "
        "drop the new dead letter, or BLOCK the partition until there is room.",
        choices=OverflowPolicy,
        attr="dispatch.dlq.overflow",
    ),
    Key(
        "dlq",
        "max_event_bytes",
        Kind.INTEGER,
        "bytes",
        "Longer values are cut to this and flagged truncated.",
        low=1,
        high=MAX_EVENT_BYTES_LIMIT,
        attr="dispatch.dlq.max_event_bytes",
    ),
    Key(
        "dlq",
        "max_replays",
        Kind.INTEGER,
        "replays",
        "Replay loop guard: an entry whose `x-replay-count` reached this is not replayed again.",
        low=0,
        high=MAX_REPLAY_COUNT,
        zero="no replay",
        attr="dispatch.dlq.max_replays",
    ),
)

_LIMIT_MEANING = {
    "max_headers_per_record": ("headers", "Headers one record may carry."),
    "max_header_bytes": ("bytes", "Bytes of one record's header names and values."),
    "max_header_name_bytes": ("bytes", "Bytes of one header name."),
    "max_partitions_per_topic": ("partitions", "Partitions one topic may have."),
    "max_subscriptions_per_topic": ("subscriptions", "Subscriptions one topic may have."),
    "max_consumers_per_subscription": (
        "consumers",
        "Consumers attached to one subscription at once.",
    ),
    "max_streams_per_connection": (
        "streams",
        "Open Subscribe and PublishStream streams per client connection.",
    ),
    "max_credit_per_consumer": ("records", "Records of credit a consumer holds at once."),
    "max_publish_stream_in_flight": (
        "publishes",
        "Publishes of one PublishStream read and "
        "not yet answered; past it the broker stops reading "
        "(backpressure, not an error).",
    ),
    "max_producers_per_partition": (
        "producer ids",
        "Idempotent producer ids one partition "
        "remembers (about 2 KiB each); past it the least "
        "recently active idle one is forgotten.",
    ),
}
LIMITS = tuple(
    Key(
        "limits",
        name,
        Kind.INTEGER,
        unit,
        meaning,
        low=LIMIT_RANGES[name][0],
        high=LIMIT_RANGES[name][1],
        attr=f"limits.{name}",
    )
    for name, (unit, meaning) in _LIMIT_MEANING.items()
)

SECURITY = (
    Key(
        "security",
        "tls_cert",
        Kind.STRING,
        "path",
        "PEM certificate chain, leaf first; with `tls_key` the port serves TLS only.",
        unset="plain TCP",
        attr="security.tls_cert",
    ),
    Key(
        "security",
        "tls_key",
        Kind.STRING,
        "path",
        "Unencrypted PEM private key of `tls_cert`; set both or neither.",
        unset="plain TCP",
        attr="security.tls_key",
    ),
    Key(
        "security",
        "tls_client_ca",
        Kind.STRING,
        "path",
        "PEM CAs of client certificates: "
        "every client must present one they signed (mutual TLS). Needs `tls_cert`.",
        unset="no client certificates",
        attr="security.tls_client_ca",
    ),
    Key(
        "security",
        "tokens_file",
        Kind.STRING,
        "path",
        "The tokens file (`headrace tokens`): every RPC then needs a bearer token.",
        unset="no tokens",
        attr="security.tokens_file",
    ),
    Key(
        "security",
        "insecure",
        Kind.BOOLEAN,
        "",
        "Serve on an address other hosts can "
        "reach without TLS and tokens (or client certificates), logging a warning.",
        attr="security.insecure",
    ),
)

SUBSCRIPTIONS = (
    Key(
        "subscriptions",
        "inactive_expiry_ms",
        Kind.INTEGER,
        "ms",
        "Delete a subscription with no consumer and no ack, commit or seek for this long.",
        low=1,
        high=3_650 * DAY_MS,
        unset="never",
        attr="subscriptions.inactive_expiry_ms",
    ),
)

#: Every key, table by table, in the order of the reference page.
KEYS: tuple[Key, ...] = (
    *BROKER,
    *WAL,
    *HEARTBEAT,
    *BACKLOG,
    *DISPATCH,
    *DLQ,
    *LIMITS,
    *SECURITY,
    *SUBSCRIPTIONS,
)


def key(table: str, name: str) -> Key:
    """The key ``name`` of ``[table]``.

    Raises:
        KeyError: no such key.
    """
    for k in KEYS:
        if (k.table, k.name) == (table, name):
            return k
    raise KeyError(f"[{table}] {name}")
