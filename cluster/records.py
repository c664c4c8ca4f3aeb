"""What the cluster keeps in etcd: the key layout under the prefix, and each value's record.

Role: the one place that knows key names and value shapes. Values are JSON, encoded and
decoded with msgspec Structs; a value that does not decode is a
:class:`~cluster.errors.RecordError` naming its key.

Key layout (``P`` is the prefix, ``/headrace/`` by default):

=============================  ==========================  =========================
key                            value                       lease
=============================  ==========================  =========================
``P cluster``                  :class:`ClusterRecord`      none
``P brokers/<node_id>``        :class:`BrokerRecord`       the broker's session lease
``P controller``               :class:`ControllerRecord`   the controller's session
``P topics/<name>``            :class:`TopicRecord`        none
``P config/defaults``          :class:`DefaultsRecord`     none
=============================  ==========================  =========================

Topic lifecycle (``TopicRecord.state``), each step a compare-and-set transaction::

    placing --controller sets owner--> creating --owner made local files--> ready
    ready --owner commits a delete--> deleting --owner deleted local files--> (key removed)
    creating --owner cannot make it, ever--> failed --creator saw it--> (key removed)
    placing --controller finds fewer live brokers than ``factor``--> failed (owner: the
        controller's node, which removes it if the creator does not)

Invariants:

- ``owner == ""`` exactly while ``state`` is ``placing``; a replicated topic's
  ``replicas`` is written with its owner (``owner == replicas[0]``, ``isr == (owner,)``:
  the leader adds the followers as they catch up); ``epoch`` is 0 until the owner
  first claims the topic (the ``creating -> ready`` step) and rises by one at each claim.
- A topic's ``id`` (16 hex digits) and ``partitions`` never change once written.
- Replicated (issue 37; ``cluster.replicas`` has the rules, ``cluster.replica_txn`` the
  transactions): the leader is ``owner``, in ``effective_isr()``, which is a subset of
  ``effective_replicas()``. An empty ``replicas``/``isr`` (an issue-36 record) means
  ``(owner,)``: factor 1.

Worked example: ``orders`` created with 3 partitions through broker b2, placed by the
controller on b1, made by b1::

    {"name":"orders","id":"9f0c...","partitions":3,"created_ms":...,"owner":"","epoch":0,"state":"placing"}
    {... "owner":"b1","epoch":0,"state":"creating"}
    {... "owner":"b1","epoch":1,"state":"ready"}      # b1 restarts: next claim -> epoch 2

Pure: imports neither asyncio, os nor time.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Annotated, Any, Literal, TypeVar

import msgspec

from cluster.errors import RecordError

R = TypeVar("R", bound=msgspec.Struct)


class TopicState(enum.Enum):
    """Where a topic is in its lifecycle (module docstring)."""

    PLACING = "placing"
    CREATING = "creating"
    READY = "ready"
    DELETING = "deleting"
    FAILED = "failed"
    """The owner refused to make it (``TopicRecord.failure`` says why); the creator
    removes the key (or the owner does, after :data:`FAILED_KEEP_S`)."""

    def is_placed(self) -> bool:
        """The topic has an owner (any state but ``placing``)."""
        return self is not TopicState.PLACING


class ClusterRecord(msgspec.Struct, frozen=True):
    """The cluster itself: written once, by the first broker, on absence."""

    id: str
    created_ms: int


class BrokerRecord(msgspec.Struct, frozen=True):
    """A live broker, under its session lease.

    Attributes:
        node_id: its unique name.
        address: ``host:port`` clients and brokers call it at.
        pid: its process id (for a person reading ``cluster status``).
        started_ms: wall-clock ms when the process started.
        version: Headrace's version.
        session_ms: wall-clock ms when this session (lease) began; a re-session rewrites it.
    """

    node_id: str
    address: str
    pid: int
    started_ms: int
    version: str
    session_ms: int = 0


class ControllerRecord(msgspec.Struct, frozen=True):
    """The controller, under its session lease. Its key's ``create_revision`` is the
    fencing token every controller write compares."""

    node_id: str
    address: str


FAILED_KEEP_S = 10.0
"""Seconds a ``failed`` record stays for its creator to see; then its owner removes it."""


class CreateFailure(msgspec.Struct, frozen=True):
    """Why the owner of a ``failed`` topic could not make it.

    Attributes:
        code: the gRPC status name a single broker would have answered the create with.
        message: that answer's message, naming the owner.
        at_ms: wall-clock ms when the owner gave up.
    """

    code: str
    message: str
    at_ms: int


class TopicRecord(msgspec.Struct, frozen=True, omit_defaults=True):
    """A topic of the cluster: its identity, owner (its leader), epoch, lifecycle state
    and, when replicated (issue 37), its replica set and in-sync set.

    Attributes:
        owner: the leader; "" while placing.
        epoch: the leader epoch, the fencing token of a leader: +1 at every claim,
            election or leadership transfer.
        replicas: the ordered replica set, first = preferred leader; empty in a record
            written before replication (it then means ``(owner,)``).
        isr: the in-sync set, always holding the leader; empty means ``(owner,)``.
        min_insync: in-sync replicas a publish needs (``min_insync_replicas``), >= 1.
        reassign_to: the replica set a reassignment is moving to; empty when none
            runs (``cluster.replicas.reassignment_step`` resumes from it).
        reassign_throttle: while a reassignment runs, the bytes per second the leader
            sends each replica outside the in-sync set (its catch-up); 0: no limit.
        reassign_from: while a reassignment runs, the replica set it started from (what
            ``headrace cluster reassign --cancel`` goes back to); empty when none runs or
            it asked for the replica set as it was (a move to the preferred leader). A
            cancel sets ``reassign_to`` to it (``cluster.replicas.is_cancelling``).
        factor: while ``placing``, how many replicas the controller is to place (the
            creator resolved it against the cluster's defaults and live brokers); 0 or 1:
            one replica, placed as issue 36 places a topic (``replicas`` stays empty). The
            controller clears it when it writes ``replicas``; ``len(replicas)`` is the
            factor from then on.
        failure: why the owner could not make the topic (state ``failed`` only).

    The replication fields are encoded only when not at their defaults, so a factor-1
    record is byte for byte what issue 36 wrote, and issue-36 records decode unchanged.
    """

    name: str
    id: str
    partitions: int
    created_ms: int
    owner: str
    epoch: int
    state: TopicState
    replicas: tuple[str, ...] = ()
    isr: tuple[str, ...] = ()
    min_insync: Annotated[int, msgspec.Meta(ge=1)] = 1
    reassign_to: tuple[str, ...] = ()
    reassign_throttle: Annotated[int, msgspec.Meta(ge=0)] = 0
    reassign_from: tuple[str, ...] = ()
    factor: Annotated[int, msgspec.Meta(ge=0)] = 0
    failure: CreateFailure | None = None

    def replace(self, **changes: object) -> TopicRecord:
        """A copy with ``changes`` applied."""
        return msgspec.structs.replace(self, **changes)

    def effective_replicas(self) -> tuple[str, ...]:
        """The replica set: ``replicas``, or ``(owner,)`` for a legacy record (``()``
        while no owner is chosen)."""
        if self.replicas:
            return self.replicas
        return (self.owner,) if self.owner else ()

    def effective_isr(self) -> tuple[str, ...]:
        """The in-sync set: ``isr``, or ``(owner,)`` for a legacy record (``()`` while no
        owner is chosen)."""
        if self.isr:
            return self.isr
        return (self.owner,) if self.owner else ()


class DefaultsRecord(msgspec.Struct, frozen=True, omit_defaults=True, forbid_unknown_fields=True):
    """The cluster's defaults for new topics (:mod:`cluster.config_defaults`); ``None``:
    not set cluster-wide (each broker's file decides). What each key may hold is the
    broker's TOML rule for the key of the same name.

    Attributes:
        default_partitions: partitions of a topic created without a count (CreateTopic
            with 0 partitions, auto-create).
        auto_create_topics: whether a publish to an unknown topic creates it.
        retention_ms: ``[wal] retention_ms`` of a new topic's partitions.
        retention_bytes: ``[wal] retention_bytes`` of a new topic's partitions.
        fsync: ``[wal] fsync`` of a new topic's partitions.
        fsync_interval_ms: ``[wal] fsync_interval_ms`` of a new topic's partitions.
        replication_factor: replicas of a topic created without a factor (CreateTopic
            with 0, auto-create); clamped to the live brokers at creation.
        min_insync_replicas: ``min_insync`` of a topic created without one; clamped to
            its factor.
        unclean_leader_election: whether an out-of-sync replica may lead a replicated
            topic when its leader and every in-sync replica are gone (records only they
            had are given up; ``cluster.replica_member``). Off unless set.
    """

    default_partitions: int | None = None
    auto_create_topics: bool | None = None
    retention_ms: int | None = None
    retention_bytes: int | None = None
    fsync: Literal["always", "interval", "never"] | None = None
    fsync_interval_ms: int | None = None
    replication_factor: int | None = None
    min_insync_replicas: int | None = None
    unclean_leader_election: bool | None = None

    def set_values(self) -> dict[str, Any]:
        """The keys set cluster-wide, with their values, in the fields' order."""
        return {k: v for k, v in msgspec.structs.asdict(self).items() if v is not None}


@dataclass(frozen=True, slots=True)
class Keys:
    """The etcd keys of one cluster, under ``prefix`` (which starts and ends with ``/``)."""

    prefix: str = "/headrace/"

    @property
    def cluster(self) -> str:
        return self.prefix + "cluster"

    @property
    def controller(self) -> str:
        return self.prefix + "controller"

    @property
    def brokers(self) -> str:
        """The prefix of every broker key."""
        return self.prefix + "brokers/"

    @property
    def topics(self) -> str:
        """The prefix of every topic key."""
        return self.prefix + "topics/"

    @property
    def config_defaults(self) -> str:
        """The key of the cluster's defaults document."""
        return self.prefix + "config/defaults"

    def broker(self, node_id: str) -> str:
        return self.brokers + node_id

    def topic(self, name: str) -> str:
        return self.topics + name


def encode(record: msgspec.Struct) -> bytes:
    """The JSON bytes of ``record``."""
    return msgspec.json.encode(record)


def decode(key: str, raw: bytes, kind: type[R]) -> R:
    """``raw`` (the value at ``key``) as a ``kind``.

    Raises:
        RecordError: ``raw`` is not such a record.
    """
    try:
        return msgspec.json.decode(raw, type=kind)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise RecordError(key, str(exc)) from exc
