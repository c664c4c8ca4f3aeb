"""The broker's TOML file as msgspec Structs: every table, key, type, range, unit and meaning.

Role: the one statement of what the config file may hold. :mod:`broker.config` converts a
parsed document into these Structs with :func:`msgspec.convert` (unknown keys, wrong types
and out-of-range values are refused there, with the failing path) and then into the frozen
domain values; :mod:`broker.config_keys` reads the Structs back as rows, and
:mod:`broker.config_reference` renders them as ``docs/operations/configuration.md``.
A key left out of the file is :data:`msgspec.UNSET`, so a table of overrides
(``[wal.topics.<name>]``, ``[dispatch.subscriptions."t/s"]``) inherits what it does not set.

Each key's :class:`msgspec.Meta` holds its range (``ge`` / ``le``), its meaning
(``description``) and, in ``extra``: ``unit`` (what a number counts), ``zero`` (what 0
means when it is special), ``unset`` (what leaving it out means when it has no default),
``attr`` (where :class:`~broker.config.BrokerConfig` holds it, dotted), ``scale`` (the
file's value is the held value times this: 1000 for ms in the file, seconds held),
``kind`` (``"address"`` for ``host:port`` strings) and, where the error for a key has its
own words, ``must`` (what is allowed), ``above`` (what to say over the top) and ``form``
(the message's shape; see :mod:`broker.config_errors`).

Worked example: ``[dispatch] ack_timeout_ms`` is ``Annotated[int, Meta(ge=0, le=86_400_000,
extra={"unit": "ms", "zero": "never", "attr": "dispatch.defaults.ack_timeout_s",
"scale": 1000, ...})]``: the file holds milliseconds, the config holds seconds (``30.0``),
so its default renders as ``30000`` and ``-5`` is refused with ``[dispatch]
ack_timeout_ms = -5: must be milliseconds from 0 to 86400000``.

One piece, though past 600 lines (about 970): it is one table of facts, key by key (the
``config_keys.py`` rows it replaces took 621 lines), with next to no code; a reader looks
a key up here as on the reference page it renders, and split by table it would scatter
what that page shows as one. The seam to cut should it grow: ``[cluster]``
(:class:`ClusterTable`, about 200 lines, whose checks across keys are
:mod:`broker.config_cluster`'s) into a module of its own, with :func:`meta` and ``Opt``
moved to one that both import (so no import runs back), :class:`ConfigFile` importing it.

Pure module: imports neither ``asyncio``, ``os`` nor ``time``; no validation code lives here.
"""

from __future__ import annotations

from typing import Annotated, Any, TypeVar, Union

import msgspec
from msgspec import UNSET, Meta, UnsetType

from broker.backlog import BacklogPolicy
from broker.config_errors import DISPATCHER, NAMED, WAL
from broker.limits import RANGES as LIMIT_RANGES
from broker.logs import LogFormat
from dispatcher import PoisonPolicy
from dispatcher.dead_letter_config import MAX_EVENT_BYTES_LIMIT, OverflowPolicy
from dispatcher.dead_letter_records import MAX_REPLAY_COUNT
from wal.config import RANGES as WAL_RANGES
from wal.config import FsyncPolicy

DAY_MS = 86_400_000
HOUR_MS = 3_600_000
TEN_YEARS_MS = 3_650 * DAY_MS


def meta(
    meaning: str,
    *,
    ge: float | None = None,
    le: float | None = None,
    min_length: int | None = None,
    **extra: Any,
) -> Meta:
    """The :class:`msgspec.Meta` of one key: range, meaning and the ``extra`` facts."""
    bounds = {"ge": ge, "le": le, "min_length": min_length}
    given: dict[str, Any] = {k: v for k, v in bounds.items() if v is not None}
    return Meta(description=meaning, extra=extra, **given)


def _wal(name: str, meaning: str, unit: str = "bytes", **extra: Any) -> Meta:
    """A ``[wal]`` integer key, its range from :data:`wal.config.RANGES` (optional keys:
    1 or more, off when left out)."""
    lo, hi = WAL_RANGES.get(name, (1, None))
    if name not in WAL_RANGES:
        extra["unset"] = "off"
    return meta(meaning, ge=lo, le=hi, unit=unit, form=WAL, **extra)


def _limit(name: str, unit: str, meaning: str) -> Meta:
    """A ``[limits]`` key, its range from :data:`broker.limits.RANGES`."""
    lo, hi = LIMIT_RANGES[name]
    return meta(meaning, ge=lo, le=hi, unit=unit)


T = TypeVar("T")
#: A key the file may leave out: :data:`msgspec.UNSET` when it does.
Opt = Union[T, UnsetType]  # noqa: UP007 - a generic alias; ``T | UnsetType`` is not one at runtime

_PATH = "a non-empty path"


class BrokerTable(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``[broker]``: the broker process: addresses, data directory, subscription caps, saves."""

    data_dir: Opt[
        Annotated[
            str,
            meta(
                "Where topics, cursors and dead letters live (relative to the working directory). "
                "Env `HEADRACE_DATA_DIR`, flag `--data-dir`.",
                min_length=1,
                unit="path",
                must=_PATH,
            ),
        ]
    ] = UNSET
    listen: Opt[
        Annotated[
            str,
            meta(
                "The gRPC address; port 0 picks a free one. Env `HEADRACE_LISTEN`, flag "
                "`--listen`. A non-loopback address needs `[security]`.",
                kind="address",
                must="a string host:port",
            ),
        ]
    ] = UNSET
    metrics_listen: Opt[
        Annotated[
            str,
            meta(
                'The Prometheus `/metrics` address; `""` turns the listener off. Env '
                "`HEADRACE_METRICS_LISTEN`, flag `--metrics-listen`.",
                kind="address",
                must="a string host:port",
            ),
        ]
    ] = UNSET
    auto_create_topics: Opt[
        Annotated[bool, meta("Create a topic on its first publish.", attr="auto_create_topics")]
    ] = UNSET
    default_partitions: Opt[
        Annotated[
            int,
            meta(
                "Partitions of an auto-created topic (at most `[limits] "
                "max_partitions_per_topic`).",
                ge=1,
                le=10_000,
                unit="partitions",
            ),
        ]
    ] = UNSET
    max_request_bytes: Opt[
        Annotated[
            int,
            meta(
                "Largest gRPC request the broker accepts, in serialized bytes (gRPC's "
                "receive limit); a larger one is refused with `RESOURCE_EXHAUSTED` naming "
                "its size and this limit, which the client and CLI restate naming this key.",
                ge=1024,
                le=1 << 30,
                unit="bytes",
            ),
        ]
    ] = UNSET
    grace_seconds: Opt[
        Annotated[
            float,
            meta(
                "How long shutdown lets in-flight calls finish.",
                ge=0,
                le=600,
                unit="s",
                must="a number of seconds from {lo} to {hi}",
                form=NAMED,
            ),
        ]
    ] = UNSET
    max_unacked: Opt[
        Annotated[
            int,
            meta(
                "Records sent to a subscription's consumers and not yet acknowledged, at most; "
                "sending stops at this cap.",
                ge=1,
                le=10_000_000,
                unit="records",
            ),
        ]
    ] = UNSET
    cursor_flush_interval_ms: Opt[
        Annotated[
            int,
            meta(
                "How often consumer acks are saved; acks not yet saved when the broker dies are "
                "redelivered.",
                ge=1,
                le=60_000,
                unit="ms",
            ),
        ]
    ] = UNSET
    retention_check_interval_ms: Opt[
        Annotated[
            int,
            meta(
                "How often retention and the backlog quota run on every partition.",
                ge=1,
                le=HOUR_MS,
                unit="ms",
            ),
        ]
    ] = UNSET
    producer_expiry_ms: Opt[
        Annotated[
            int,
            meta(
                "Idempotent producer ids idle this long are forgotten (a later retry of theirs is "
                "appended again).",
                ge=60_000,
                le=TEN_YEARS_MS,
                unit="ms",
            ),
        ]
    ] = UNSET
    producer_snapshot_bytes: Opt[
        Annotated[
            int,
            meta(
                "Snapshot a partition's idempotent-producer state after this many bytes "
                "appended; bounds the rescan after a crash.",
                ge=1024,
                le=64 << 30,
                unit="bytes",
            ),
        ]
    ] = UNSET
    log_format: Opt[
        Annotated[
            LogFormat,
            meta(
                "How `serve` writes its log to stderr: `text` (timestamp, level, logger, message; "
                "control characters escaped) or `json` (one JSON object per line: time, level, "
                "logger, message, exception). Flag `--log-format`.",
            ),
        ]
    ] = UNSET


class WalTopicTable(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``[wal.topics.<name>]``: any ``[wal]`` key, for one topic's partitions."""

    segment_bytes: Opt[
        Annotated[
            int, _wal("segment_bytes", "Roll the active segment before it would exceed this size.")
        ]
    ] = UNSET
    segment_ms: Opt[
        Annotated[int, _wal("segment_ms", "Roll the active segment once it is this old.", "ms")]
    ] = UNSET
    index_interval_bytes: Opt[
        Annotated[int, _wal("index_interval_bytes", "Bytes between sparse index entries.")]
    ] = UNSET
    max_record_bytes: Opt[
        Annotated[int, _wal("max_record_bytes", "Largest key + value + headers of one record.")]
    ] = UNSET
    max_batch_bytes: Opt[Annotated[int, _wal("max_batch_bytes", "Largest encoded batch.")]] = UNSET
    retention_ms: Opt[
        Annotated[
            int,
            _wal(
                "retention_ms",
                "Delete sealed segments whose newest record is older than this (never at or "
                "past a subscription's saved cursor).",
                "ms",
            ),
        ]
    ] = UNSET
    retention_bytes: Opt[
        Annotated[
            int,
            _wal(
                "retention_bytes",
                "Delete the oldest sealed segments while the log without them still holds at "
                "least this many bytes.",
            ),
        ]
    ] = UNSET
    fsync: Opt[
        Annotated[
            FsyncPolicy,
            meta(
                "When an append is acknowledged: after fdatasync (`always`), after the write with "
                "a sync every `fsync_interval_ms` (`interval`), or when the OS likes (`never`).",
            ),
        ]
    ] = UNSET
    fsync_interval_ms: Opt[
        Annotated[int, _wal("fsync_interval_ms", "Period of the `interval` fsync policy.", "ms")]
    ] = UNSET
    max_group_bytes: Opt[
        Annotated[
            int, _wal("max_group_bytes", "Most bytes one group commit writes with one fdatasync.")
        ]
    ] = UNSET
    tail_cache_bytes: Opt[
        Annotated[
            int,
            _wal(
                "tail_cache_bytes",
                "Newest batches kept in memory per partition, shared by every reader near the "
                "head; each batch counts as its size plus 768 bytes.",
                zero="off",
            ),
        ]
    ] = UNSET


class WalTable(WalTopicTable, forbid_unknown_fields=True, kw_only=True):
    """``[wal]``: every partition's write-ahead log (``wal.LogConfig``)."""

    topics: Annotated[
        dict[str, WalTopicTable],
        meta(
            "`[wal.topics.<name>]`: any `[wal]` key for one topic's partitions, over `[wal]`; "
            "applied when the topic opens or is created."
        ),
    ] = msgspec.field(default_factory=dict)


_INTERVAL = Annotated[float, meta("", ge=1, le=HOUR_MS, unit="ms")]


class HeartbeatTable(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``[heartbeat]``: the lag monitor behind the notifier (milliseconds in the file)."""

    interval_ms: Opt[
        Annotated[
            float,
            meta(
                "How often the lag monitor checks each subscription against the log's head.",
                ge=1,
                le=HOUR_MS,
                unit="ms",
                attr="heartbeat.interval_s",
                scale=1000,
            ),
        ]
    ] = UNSET
    stall_timeout_ms: Opt[
        Annotated[
            float,
            meta(
                "A backlog with room and no progress for this long is STALLED.",
                ge=1,
                le=DAY_MS,
                unit="ms",
                attr="heartbeat.stall_timeout_s",
                scale=1000,
            ),
        ]
    ] = UNSET
    topics: Annotated[
        dict[str, _INTERVAL],
        meta(
            "`[heartbeat.topics]`: `name = interval_ms` per topic, from 1 to 3,600,000.",
            unit="ms",
            must="a table of name = milliseconds",
        ),
    ] = msgspec.field(default_factory=dict)
    subscriptions: Annotated[
        dict[str, _INTERVAL],
        meta(
            '`[heartbeat.subscriptions]`: `"topic/subscription" = interval_ms`; wins over '
            "the topic's.",
            unit="ms",
            must="a table of name = milliseconds",
        ),
    ] = msgspec.field(default_factory=dict)


class BacklogTable(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``[backlog]``: a quota per partition on the records no subscription has consumed."""

    quota_messages: Opt[
        Annotated[
            int,
            meta(
                "Most records per partition between the subscriptions' lowest saved cursor and "
                "the head.",
                ge=0,
                le=1 << 62,
                unit="records",
                zero="no quota",
            ),
        ]
    ] = UNSET
    policy: Opt[
        Annotated[
            BacklogPolicy,
            meta(
                "What a publish over the quota gets: refused (`RESOURCE_EXHAUSTED`), held, or "
                "accepted while the oldest sealed segments go.",
            ),
        ]
    ] = UNSET
    block_timeout_ms: Opt[
        Annotated[
            int,
            meta(
                "`block_producer`: how long a publish waits for room before it fails.",
                ge=1,
                le=HOUR_MS,
                unit="ms",
            ),
        ]
    ] = UNSET


_POLICY = "dispatch.defaults"
_MS = "milliseconds from {lo} to {hi}"


class PolicyTable(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``[dispatch.subscriptions."topic/subscription"]``: any ``[dispatch]`` key, for one
    subscription, over ``[dispatch]``."""

    ack_timeout_ms: Opt[
        Annotated[
            int,
            meta(
                "A record unacknowledged this long after it was sent is sent again.",
                ge=0,
                le=DAY_MS,
                unit="ms",
                zero="never",
                attr=f"{_POLICY}.ack_timeout_s",
                scale=1000,
                must=_MS,
            ),
        ]
    ] = UNSET
    backoff_initial_ms: Opt[
        Annotated[
            int,
            meta(
                "Delay before the first redelivery after a timeout or a nack without a delay.",
                ge=0,
                le=DAY_MS,
                unit="ms",
                attr=f"{_POLICY}.backoff_initial_s",
                scale=1000,
                must=_MS,
            ),
        ]
    ] = UNSET
    backoff_max_ms: Opt[
        Annotated[
            int,
            meta(
                "The delay grows per failure up to this (at least `backoff_initial_ms`).",
                ge=0,
                le=DAY_MS,
                unit="ms",
                attr=f"{_POLICY}.backoff_max_s",
                scale=1000,
                must=_MS,
            ),
        ]
    ] = UNSET
    backoff_multiplier: Opt[
        Annotated[
            float,
            meta(
                "Growth of the delay per failed delivery.",
                ge=1,
                le=100,
                unit="factor",
                attr=f"{_POLICY}.backoff_multiplier",
                form=DISPATCHER,
            ),
        ]
    ] = UNSET
    backoff_jitter: Opt[
        Annotated[
            float,
            meta(
                "Each delay moves by up to this fraction either way.",
                ge=0,
                le=1,
                unit="fraction",
                attr=f"{_POLICY}.backoff_jitter",
                form=DISPATCHER,
            ),
        ]
    ] = UNSET
    max_deliveries: Opt[
        Annotated[
            int,
            meta(
                "After this many deliveries a record is poison and `poison_policy` applies.",
                ge=0,
                le=1_000_000,
                unit="deliveries",
                zero="unlimited",
                attr=f"{_POLICY}.max_deliveries",
                must="from {lo} to {hi}",
                form=DISPATCHER,
            ),
        ]
    ] = UNSET
    poison_policy: Opt[
        Annotated[
            PoisonPolicy,
            meta(
                "What happens to a poison record: moved to the dead-letter queue, acknowledged "
                "with a warning, or its partition BLOCKED.",
                attr=f"{_POLICY}.poison",
            ),
        ]
    ] = UNSET


class DispatchTable(PolicyTable, forbid_unknown_fields=True, kw_only=True):
    """``[dispatch]``: redelivery and poison rules of every subscription."""

    subscriptions: Annotated[
        dict[str, PolicyTable],
        meta('`[dispatch.subscriptions."topic/subscription"]`: any `[dispatch]` key above for '
             "one subscription."),
    ] = msgspec.field(default_factory=dict)  # fmt: skip


class DlqTable(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``[dlq]``: every subscription's dead-letter queue."""

    max_entries: Opt[
        Annotated[
            int,
            meta(
                "Most dead letters one queue holds.",
                ge=1,
                unit="entries",
                attr="dispatch.dlq.max_entries",
            ),
        ]
    ] = UNSET
    max_age_ms: Opt[
        Annotated[
            int,
            meta(
                "Older entries are dropped.",
                ge=0,
                unit="ms",
                zero="keep forever",
                attr="dispatch.dlq.max_age_s",
                scale=1000,
                must="milliseconds >= {lo}",
            ),
        ]
    ] = UNSET
    overflow: Opt[
        Annotated[
            OverflowPolicy,
            meta(
                "What a full queue does: evict the oldest, drop the new dead letter, or BLOCK the "
                "partition until there is room.",
                attr="dispatch.dlq.overflow",
            ),
        ]
    ] = UNSET
    max_event_bytes: Opt[
        Annotated[
            int,
            meta(
                "Longer values are cut to this and flagged truncated.",
                ge=1,
                le=MAX_EVENT_BYTES_LIMIT,
                unit="bytes",
                attr="dispatch.dlq.max_event_bytes",
            ),
        ]
    ] = UNSET
    max_replays: Opt[
        Annotated[
            int,
            meta(
                "Replay loop guard: an entry whose `x-replay-count` reached this is not replayed "
                "again.",
                ge=0,
                le=MAX_REPLAY_COUNT,
                unit="replays",
                zero="no replay",
                attr="dispatch.dlq.max_replays",
            ),
        ]
    ] = UNSET


class LimitsTable(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``[limits]``: what one client may ask of the broker (:class:`broker.limits.LimitsConfig`)."""

    max_headers_per_record: Opt[
        Annotated[int, _limit("max_headers_per_record", "headers", "Headers one record may carry.")]
    ] = UNSET
    max_header_bytes: Opt[
        Annotated[
            int,
            _limit("max_header_bytes", "bytes", "Bytes of one record's header names and values."),
        ]
    ] = UNSET
    max_header_name_bytes: Opt[
        Annotated[int, _limit("max_header_name_bytes", "bytes", "Bytes of one header name.")]
    ] = UNSET
    max_partitions_per_topic: Opt[
        Annotated[
            int,
            _limit("max_partitions_per_topic", "partitions", "Partitions one topic may have."),
        ]
    ] = UNSET
    max_subscriptions_per_topic: Opt[
        Annotated[
            int,
            _limit(
                "max_subscriptions_per_topic", "subscriptions", "Subscriptions one topic may have."
            ),
        ]
    ] = UNSET
    max_consumers_per_subscription: Opt[
        Annotated[
            int,
            _limit(
                "max_consumers_per_subscription",
                "consumers",
                "Consumers attached to one subscription at once.",
            ),
        ]
    ] = UNSET
    max_streams_per_connection: Opt[
        Annotated[
            int,
            _limit(
                "max_streams_per_connection",
                "streams",
                "Open Subscribe and PublishStream streams per client connection.",
            ),
        ]
    ] = UNSET
    max_credit_per_consumer: Opt[
        Annotated[
            int,
            _limit(
                "max_credit_per_consumer", "records", "Records of credit a consumer holds at once."
            ),
        ]
    ] = UNSET
    max_publish_stream_in_flight: Opt[
        Annotated[
            int,
            _limit(
                "max_publish_stream_in_flight",
                "publishes",
                "Publishes of one PublishStream read and not yet answered; past it the broker "
                "stops reading (backpressure, not an error).",
            ),
        ]
    ] = UNSET
    max_producers_per_partition: Opt[
        Annotated[
            int,
            _limit(
                "max_producers_per_partition",
                "producer ids",
                "Idempotent producer ids one partition remembers (about 2 KiB each); past it the "
                "least recently active idle one is forgotten.",
            ),
        ]
    ] = UNSET


class SecurityTable(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``[security]``: TLS, bearer tokens and the safe default."""

    tls_cert: Opt[
        Annotated[
            str,
            meta(
                "PEM certificate chain, leaf first; with `tls_key` the port serves TLS only.",
                min_length=1,
                unit="path",
                unset="plain TCP",
                must=_PATH,
            ),
        ]
    ] = UNSET
    tls_key: Opt[
        Annotated[
            str,
            meta(
                "Unencrypted PEM private key of `tls_cert`; set both or neither.",
                min_length=1,
                unit="path",
                unset="plain TCP",
                must=_PATH,
            ),
        ]
    ] = UNSET
    tls_client_ca: Opt[
        Annotated[
            str,
            meta(
                "PEM CAs of client certificates: every client must present one they signed "
                "(mutual TLS). Needs `tls_cert`.",
                min_length=1,
                unit="path",
                unset="no client certificates",
                must=_PATH,
            ),
        ]
    ] = UNSET
    tokens_file: Opt[
        Annotated[
            str,
            meta(
                "The tokens file (`headrace tokens`): every RPC then needs a bearer token.",
                min_length=1,
                unit="path",
                unset="no tokens",
                must=_PATH,
            ),
        ]
    ] = UNSET
    insecure: Opt[
        Annotated[
            bool,
            meta(
                "Serve on an address other hosts can reach without TLS and tokens (or client "
                "certificates), logging a warning.",
            ),
        ]
    ] = UNSET


class SubscriptionsTable(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``[subscriptions]``: the subscription lifecycle."""

    inactive_expiry_ms: Opt[
        Annotated[
            int,
            meta(
                "Delete a subscription with no consumer and no ack, commit or seek for this long.",
                ge=1,
                le=TEN_YEARS_MS,
                unit="ms",
                unset="never",
                must="a positive integer of milliseconds (leave it out to never expire "
                "subscriptions)",
                above="at most {hi} (ten years; leave it out to never expire subscriptions)",
            ),
        ]
    ] = UNSET


class ClusterTable(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``[cluster]``: cluster mode (etcd as the control plane); absent: a single broker."""

    etcd: Opt[
        Annotated[
            list[str],
            meta(
                "etcd client endpoints, host:port each; setting it turns cluster mode on "
                "(needs `node_id`). Flag `--cluster-etcd h:p,h:p`.",
                min_length=1,
                kind="address",
                unset="a single broker, no etcd",
                must='a list of host:port strings, e.g. ["127.0.0.1:2379"]',
            ),
        ]
    ] = UNSET
    node_id: Opt[
        Annotated[
            str,
            meta(
                "This broker's name in the cluster, unique and kept across restarts: 1-64 "
                "characters from A-Z a-z 0-9 . _ -, the first a letter or digit. Flag "
                "`--node-id`.",
                min_length=1,
                unset="required with `etcd`",
                must="a string of 1-64 characters from A-Z a-z 0-9 . _ -",
            ),
        ]
    ] = UNSET
    advertise: Opt[
        Annotated[
            str,
            meta(
                "The address other brokers and clients call this broker at. Flag `--advertise`.",
                kind="address",
                unset="the listen address with its bound port; required when listening "
                "on 0.0.0.0 or ::",
                must="a string host:port",
            ),
        ]
    ] = UNSET
    session_ttl_s: Opt[
        Annotated[
            int,
            meta(
                "The TTL of this broker's etcd lease (its session): it stops accepting writes "
                "before its own clock says the lease may have expired, and its topics go "
                "offline this long after it dies.",
                ge=2,
                le=60,
                unit="s",
                must="whole seconds from {lo} to {hi}",
                form=NAMED,
            ),
        ]
    ] = UNSET
    etcd_ca: Opt[
        Annotated[
            str,
            meta(
                "PEM CAs of the etcd servers' certificates: TLS toward etcd. Set `etcd_ca`, "
                "`etcd_cert` and `etcd_key` together, or none.",
                min_length=1,
                unit="path",
                unset="plain TCP to etcd",
                must=_PATH,
            ),
        ]
    ] = UNSET
    etcd_cert: Opt[
        Annotated[
            str,
            meta(
                "PEM client certificate this broker presents to etcd.",
                min_length=1,
                unit="path",
                unset="plain TCP to etcd",
                must=_PATH,
            ),
        ]
    ] = UNSET
    etcd_key: Opt[
        Annotated[
            str,
            meta(
                "Unencrypted PEM private key of `etcd_cert`.",
                min_length=1,
                unit="path",
                unset="plain TCP to etcd",
                must=_PATH,
            ),
        ]
    ] = UNSET
    prefix: Opt[
        Annotated[
            str,
            meta(
                "The etcd key prefix of this cluster's keys (several clusters may share one "
                "etcd under different prefixes); starts and ends with `/`.",
                min_length=2,
                must='a string that starts and ends with /, e.g. "/headrace/"',
            ),
        ]
    ] = UNSET
    tokens: Opt[
        Annotated[
            bool,
            meta(
                "Check bearer tokens kept in etcd (`headrace tokens create --cluster-etcd`): "
                "every RPC then needs one, and a token works on every broker at once. Needs "
                "`etcd`; not with `[security] tokens_file`. Flag `--cluster-tokens`.",
            ),
        ]
    ] = UNSET
    auto_rebalance: Opt[
        Annotated[
            bool,
            meta(
                "While this broker is the controller, move the leadership of each "
                "replicated topic back to its preferred leader (the first of its replicas) "
                "every `rebalance_interval_s` when that broker is alive and in sync.",
            ),
        ]
    ] = UNSET
    rebalance_interval_s: Opt[
        Annotated[
            int,
            meta(
                "Seconds between the automatic preferred-leader passes of `auto_rebalance`.",
                ge=1,
                le=86_400,
                unit="s",
                must="a whole number of seconds from 1 to 86400",
            ),
        ]
    ] = UNSET
    replica_lag_time_max_ms: Opt[
        Annotated[
            int,
            meta(
                "A follower of a replicated topic that has not caught up with its leader's "
                "end for this long leaves the in-sync set (Kafka's `replica.lag.time.max.ms`); "
                "it rejoins once caught up. Lower: a slow follower stops holding publishes "
                "back sooner; higher: fewer in-sync set changes under bursts.",
                ge=100,
                le=600_000,
                unit="ms",
                must="a whole number of milliseconds from 100 to 600000",
            ),
        ]
    ] = UNSET
    controlled_shutdown_timeout_s: Opt[
        Annotated[
            float,
            meta(
                "The most a stopping broker (SIGTERM, Ctrl-C) spends handing the replicated "
                "topics it leads to in-sync followers that are fetching and not stopping "
                "too (Kafka's controlled shutdown), etcd calls included; then it stops "
                "anyway and what was not handed over waits for an election. 0: hand "
                "nothing over.",
                ge=0,
                le=300,
                unit="s",
                must="a number of seconds from {lo} to {hi}",
                form=NAMED,
            ),
        ]
    ] = UNSET
    peer_tls_ca: Opt[
        Annotated[
            str,
            meta(
                "PEM CAs of the other brokers' server certificates, trusted when this broker "
                "calls them (replication). Brokers call each other over TLS when they serve "
                "it (`[security] tls_cert`); needs `tls_cert`.",
                min_length=1,
                unit="path",
                unset="`[security] tls_client_ca`; required when the broker serves TLS without it",
                must=_PATH,
            ),
        ]
    ] = UNSET
    peer_server_name: Opt[
        Annotated[
            str,
            meta(
                "The name checked in the other brokers' certificates instead of the host of "
                "their advertised address (one name on every broker's certificate); needs "
                "`[security] tls_cert`.",
                min_length=1,
                unset="the host of each broker's advertised address",
                must="a host name or IP address, without a port",
            ),
        ]
    ] = UNSET


class ConfigFile(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """The whole file: one Struct per table, each optional (an absent table is empty)."""

    broker: BrokerTable = msgspec.field(default_factory=BrokerTable)
    wal: WalTable = msgspec.field(default_factory=WalTable)
    heartbeat: HeartbeatTable = msgspec.field(default_factory=HeartbeatTable)
    backlog: BacklogTable = msgspec.field(default_factory=BacklogTable)
    dispatch: DispatchTable = msgspec.field(default_factory=DispatchTable)
    dlq: DlqTable = msgspec.field(default_factory=DlqTable)
    limits: LimitsTable = msgspec.field(default_factory=LimitsTable)
    security: SecurityTable = msgspec.field(default_factory=SecurityTable)
    subscriptions: SubscriptionsTable = msgspec.field(default_factory=SubscriptionsTable)
    cluster: ClusterTable = msgspec.field(default_factory=ClusterTable)


def set_fields(table: msgspec.Struct) -> dict[str, Any]:
    """The keys of ``table`` that the file set (not :data:`msgspec.UNSET`), by name."""
    return {
        name: value
        for name in table.__struct_fields__
        if (value := getattr(table, name)) is not UNSET
    }
