"""The cluster's configuration defaults on the broker side: their rules, and what applies.

Role: :mod:`cluster.config_defaults` stores and watches the document; this module says what
each key may hold and how a broker combines it with its own file. A value is checked by the
TOML file's own Structs (:class:`~broker.config_schema.BrokerTable` for ``[broker]`` keys,
:class:`~broker.config_schema.WalTopicTable` for ``[wal]`` keys), so a cluster default has
exactly the range the file has, and a bad one is refused with the file's one-line message
(``fsync = 'sometimes': must be one of always, interval, never``).

Keys, and the file key each stands for:

=======================  ==========================  =========================================
cluster default          the file's key              used by
=======================  ==========================  =========================================
``default_partitions``   ``[broker]``                CreateTopic without partitions, auto-create
``auto_create_topics``   ``[broker]``                a publish to a topic the cluster lacks
``retention_ms``         ``[wal]``                   a new topic's partitions
``retention_bytes``      ``[wal]``                   a new topic's partitions
``fsync``                ``[wal]``                   a new topic's partitions
``fsync_interval_ms``    ``[wal]``                   a new topic's partitions
``replication_factor``   none: built-in 3            CreateTopic without a factor, auto-create
``min_insync_replicas``  none: built-in 2            CreateTopic without one, auto-create
=======================  ==========================  =========================================

The two replication keys have no file key: a single broker is always factor 1 (it never
reads them), and every broker of a cluster must agree, so only the cluster default or the
built-in value (:data:`BUILTIN`: factor 3, min_insync 2) applies. ``replication_factor``
is clamped to the live brokers when a topic is created, and ``min_insync_replicas`` to the
topic's factor (``cluster.replicas.replication_settings``): three or more live brokers
make factor 3, min_insync 2; two make factor 2, min_insync 2 (both copies must be in sync
for a publish: with one broker down such a topic refuses publishes until the other is
back in sync, and loses nothing acknowledged); one makes factor 1, min_insync 1. An
explicit CreateTopic value is not clamped.

Precedence, for one setting of one topic: the owner's ``[wal.topics.<name>]`` table (a
file that names the topic gives it all its log settings, over its ``[wal]``, as on a single
broker) > the cluster default > the broker's ``[broker]`` / ``[wal]`` key > the built-in
default. So every broker agrees on a topic its file does not name.

``unclean_leader_election`` (cluster-only too, built-in false; there is no per-topic
switch) lets an out-of-sync replica lead a replicated topic whose leader and in-sync
replicas are all gone, giving up the records only they had (``cluster.replica_member``).

Pure module: imports neither ``asyncio``, ``os`` nor ``time``.
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass, field
from typing import Annotated, Any

import msgspec

from broker.config_errors import explain
from broker.config_schema import BrokerTable, WalTopicTable
from broker.errors import ConfigError
from cluster.records import DefaultsRecord
from wal import LogConfig, WalConfigError
from wal.config import FsyncPolicy

_MAX_FACTOR = 64  # far above any sensible replica count; keeps a typo from meaning "all"

KEYS: tuple[str, ...] = DefaultsRecord.__struct_fields__
"""Every key a cluster default may have."""

# The built-in values of the cluster-only keys, the one place they are decided (issue 37:
# three copies, two of them in sync for a publish). Clamped when a topic is created, see
# the module docstring; a single broker never reads them (it keeps one copy).
BUILTIN: dict[str, int] = {"replication_factor": 3, "min_insync_replicas": 2}
"""The value of each cluster-only key when the cluster's defaults leave it out."""


class ReplicationTable(msgspec.Struct, forbid_unknown_fields=True):
    """The rules of the cluster-only keys (they have no file table to borrow)."""

    replication_factor: Annotated[int, msgspec.Meta(ge=1, le=_MAX_FACTOR)] | None = None
    min_insync_replicas: Annotated[int, msgspec.Meta(ge=1, le=_MAX_FACTOR)] | None = None
    unclean_leader_election: bool | None = None


#: The file's table of each key: ``[broker]`` or ``[wal]``; ``cluster``: none (cluster-only).
TABLES: dict[str, str] = {
    "default_partitions": "broker",
    "auto_create_topics": "broker",
    "retention_ms": "wal",
    "retention_bytes": "wal",
    "fsync": "wal",
    "fsync_interval_ms": "wal",
    "replication_factor": "cluster",
    "min_insync_replicas": "cluster",
    "unclean_leader_election": "cluster",
}
_SCHEMAS: dict[str, type[msgspec.Struct]] = {
    "broker": BrokerTable,
    "wal": WalTopicTable,
    "cluster": ReplicationTable,
}
_WAL_KEYS = tuple(k for k, t in TABLES.items() if t == "wal")
_WHERE = "cluster default"


def check_key(key: str) -> None:
    """Raise ``ConfigError`` unless ``key`` is a cluster default's key."""
    if key not in TABLES:
        raise ConfigError(f"{_WHERE}: unknown setting {key}; known: {', '.join(KEYS)}")


def parse_value(key: str, text: str) -> Any:
    """``text`` (as typed after ``KEY=``) as ``key``'s value, checked by the file's rules.

    TOML's spelling: ``true``/``false`` for a switch, digits for a number (``_`` allowed),
    a word for a policy.

    Raises:
        ConfigError: unknown key, or a value the file would refuse; one line naming both.
    """
    check_key(key)
    value: Any = text
    if text in ("true", "false"):
        value = text == "true"
    else:
        with contextlib.suppress(ValueError):
            value = int(text)
    return check_value(key, value)


def check_value(key: str, value: Any) -> Any:
    """``value`` if the file's Struct takes it for ``key`` (a policy as its text).

    Raises:
        ConfigError: it does not; the file's message, ``cluster default`` as its source.
    """
    check_key(key)
    schema = _SCHEMAS[TABLES[key]]
    try:
        msgspec.convert({key: value}, schema)
    except msgspec.ValidationError as exc:
        raise ConfigError(explain(exc, {key: value}, schema, _WHERE)) from exc
    return value


def usable(record: DefaultsRecord) -> tuple[DefaultsRecord, list[str]]:
    """``record`` without the keys the file's rules refuse (a document written by hand, or
    by a broker with other ranges), and the message of each key left out."""
    kept: dict[str, Any] = {}
    messages: list[str] = []
    for key, value in record.set_values().items():
        try:
            kept[key] = check_value(key, value)
        except ConfigError as exc:
            messages.append(str(exc))
    return DefaultsRecord(**kept), messages


def log_config(record: DefaultsRecord, base: LogConfig) -> LogConfig:
    """``base`` (the broker's ``[wal]`` defaults) with the cluster's ``[wal]`` defaults.

    Raises:
        ConfigError: :class:`wal.LogConfig` refuses the combination.
    """
    changes: dict[str, Any] = {k: v for k, v in record.set_values().items() if k in _WAL_KEYS}
    if "fsync" in changes:
        changes["fsync"] = FsyncPolicy(changes["fsync"])
    try:
        return dataclasses.replace(base, **changes)
    except WalConfigError as exc:  # wal.LogConfig has the last word on its own values
        raise ConfigError(f"{_WHERE}: {exc}") from exc


@dataclass
class TopicDefaults:
    """What this broker uses for a new topic: the cluster's defaults over its file's.

    Task-safety: changed by the defaults view's task (:meth:`apply`), read by any task on
    the same loop.

    Attributes:
        file_partitions: ``[broker] default_partitions`` of this broker's file.
        file_auto_create: ``[broker] auto_create_topics`` of this broker's file.
        file_wal: ``[wal]`` of this broker's file.
        record: the cluster's defaults in use (keys the file's rules refuse left out).
    """

    file_partitions: int
    file_auto_create: bool
    file_wal: LogConfig
    record: DefaultsRecord = field(default_factory=DefaultsRecord)

    def apply(self, record: DefaultsRecord) -> list[str]:
        """Use ``record`` from now on; returns the message of each key left out."""
        kept, messages = usable(record)
        try:
            log_config(kept, self.file_wal)
        except ConfigError as exc:  # a combination LogConfig refuses: keep the file's [wal]
            messages.append(str(exc))
            kept = msgspec.structs.replace(kept, **dict.fromkeys(_WAL_KEYS))
        self.record = kept
        return messages

    @property
    def default_partitions(self) -> int:
        """Partitions of a topic created without a count."""
        cluster = self.record.default_partitions
        return self.file_partitions if cluster is None else cluster

    @property
    def auto_create_topics(self) -> bool:
        """Whether a publish to a topic the cluster lacks creates it."""
        cluster = self.record.auto_create_topics
        return self.file_auto_create if cluster is None else cluster

    @property
    def replication_factor(self) -> int:
        """Replicas of a topic created without a factor (before clamping to the live
        brokers): the cluster's default, else :data:`BUILTIN`."""
        cluster = self.record.replication_factor
        return BUILTIN["replication_factor"] if cluster is None else cluster

    @property
    def min_insync_replicas(self) -> int:
        """``min_insync`` of a topic created without one (before clamping to its factor):
        the cluster's default, else :data:`BUILTIN`."""
        cluster = self.record.min_insync_replicas
        return BUILTIN["min_insync_replicas"] if cluster is None else cluster

    @property
    def unclean_leader_election(self) -> bool:
        """Whether an out-of-sync replica may lead a replicated topic whose leader and
        in-sync replicas are all gone: the cluster's default, else False (Kafka's
        ``unclean.leader.election.enable``; cluster-wide only)."""
        return bool(self.record.unclean_leader_election)

    @property
    def wal(self) -> LogConfig:
        """The log settings of a new topic that ``[wal.topics]`` does not name."""
        return log_config(self.record, self.file_wal)
