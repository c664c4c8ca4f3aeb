"""What a follower does with its leader's answer for one log: the pure rules of
:class:`~broker.replica.fetcher.FollowerTopic`.

Role: given where the follower's log is (:class:`LogPosition`: first offset, head, its
leader-epoch entries) and the leader's answer for that log (:class:`LogReply`), decide
one action: append the leader's bytes (with the epoch entries to copy first), cut the log
back, empty it to a new start, only commit, or back off. The async shell carries it out.

Rules (Kafka's KIP-101 and KIP-320, in the leader's shape of ``broker.replica.leader``):

- The follower asks with ``fetch_offset`` = its head and ``last_fetched_epoch`` = the
  epoch of its last record (the newest entry starting below the head; -1 when no entry
  dates a record, :func:`last_fetched_epoch`).
- ``diverging (E', X)``: cut to ``min(X, the follower's own end of E')`` (its end of the
  largest epoch it has at or below ``E'``; its oldest entry's start when it has none),
  never to the high watermark alone; below its first offset the log is emptied instead
  (:class:`RestartAt`, at ``max(cut, leader's log start)``). Then it fetches again and
  is checked again, until the leader finds no divergence.
- ``OFFSET_OUT_OF_RANGE`` with the head below the leader's log start (retention there, a
  wiped disk here): empty the log and start again at the leader's log start. With the
  head past the leader's end (and no divergence, which the leader checks first): cut to
  the leader's end.
- Records no epoch entry dates (written before the topic was replicated, or a copy that
  stopped before the leader's first epoch) are kept only below the start of the leader's
  oldest epoch entry: the leader sends every entry when asked with -1, and anything past
  that start would be of an epoch the follower cannot know, so it is cut there first.
  (``OffsetForLeaderEpoch`` cannot say this: a follower with no epoch has none to ask
  about, and the leader answers ``(-1, -1)`` for any epoch below its oldest; the fetch's
  own ``epochs`` list, sent whole for -1, carries the leader's oldest start.)
- Batches: the leader's entries that date them (epoch above the follower's last, start
  in ``[head, end)``) are copied into the follower's ``leader-epochs`` *before* the
  bytes are appended (a crash between leaves an entry past the log's end, which opening
  drops), and an entry of the follower's that starts at or past its head (it dates no
  record: an epoch that wrote nothing here) is dropped first.
- Batches whose first one starts below the head (a leader's batch spans it: records
  with no epoch here that were batched otherwise) cut the log to that batch's start, or
  to the batch boundary below it here; batches starting past the head back off.
- Every other answer (an error of the whole fetch or of one log) backs off, with
  :func:`backoff_s` (exponential, jittered).

Worked example: the follower has epochs ``[(3, 100)]`` and head 160, having fetched
``[100, 160)`` from the epoch-3 leader. The new leader (epoch 4) had ``[100, 150)`` of
epoch 3 and wrote its own batches from 150: its entries ``[(3, 100), (4, 150)]``. The
follower asks ``(fetch_offset 160, last_fetched_epoch 3)``; the leader's epoch 3 ends at
150 < 160: ``diverging (3, 150)``. The follower's own epoch 3 ends at 160 (its head), so
it cuts to ``min(150, 160) = 150`` and asks again ``(150, 3)``: no divergence; the
batches from 150 come with the entries ``[(3, 100), (4, 150)]``, of which it copies
``(4, 150)`` before appending them.

Pure: imports neither asyncio, os nor time.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from proto import replication_pb2 as _pb
from proto.batch import HEADER
from wal.leader_epochs import EpochEntry, end_offset_for

#: The first pause after a failed fetch (s), doubled at each failure in a row.
BACKOFF_BASE_S = 0.05
#: The longest pause between failed fetches (s).
BACKOFF_MAX_S = 2.0


class LogPosition(NamedTuple):
    """Where a follower's log is: its first offset, its head (the offset it fetches
    from) and its leader-epoch entries, oldest first."""

    first_offset: int
    head: int
    epochs: Sequence[EpochEntry]


@dataclass(frozen=True, slots=True)
class LogReply:
    """The leader's answer for one log (a ``LogData``), in domain terms.

    Attributes:
        log: its log id (``p/<partition>``).
        error: a ``ReplicaError`` value (0: none).
        high_watermark: the leader's committed end of the log.
        log_start: the leader's first retained offset.
        log_end: the leader's durable end.
        batches: whole batches from the fetch offset, as stored on the leader.
        diverging: ``(epoch, end_offset)`` when the leader found a divergence.
        epochs: the leader's entries at or after the asked ``last_fetched_epoch``.
    """

    log: str
    error: int = _pb.REPLICA_ERROR_NONE
    high_watermark: int = 0
    log_start: int = 0
    log_end: int = 0
    batches: bytes = b""
    diverging: tuple[int, int] | None = None
    epochs: tuple[EpochEntry, ...] = ()


def reply_from_pb(data: _pb.LogData) -> LogReply:
    """The domain form of a ``LogData``."""
    diverging = None
    if data.HasField("diverging"):
        diverging = (data.diverging.epoch, data.diverging.end_offset)
    return LogReply(
        log=data.log,
        error=data.error,
        high_watermark=data.high_watermark,
        log_start=data.log_start,
        log_end=data.log_end,
        batches=data.batches,
        diverging=diverging,
        epochs=tuple(EpochEntry(e.epoch, e.start_offset) for e in data.epochs),
    )


class BatchHeader(NamedTuple):
    """What the producer table needs of a copied batch."""

    producer_id: int
    base_sequence: int
    first_offset: int
    last_offset: int


def batch_headers(data: bytes | memoryview) -> list[BatchHeader]:
    """The headers of the whole batches laid end to end in ``data`` (a leader's raw
    read), read in place without decoding records or checking CRCs (the append checks
    them). Stops at a tail too short for a header or a length that does not fit."""
    out: list[BatchHeader] = []
    pos, end = 0, len(data)
    while end - pos >= HEADER.size:
        base, length, _crc, _m, _v, _f, count, _t0, _t1, pid, seq, _r = HEADER.unpack_from(
            data, pos
        )
        if length < HEADER.size or pos + length > end or count < 1:
            break
        out.append(BatchHeader(pid, seq, base, base + count - 1))
        pos += length
    return out


def last_fetched_epoch(epochs: Sequence[EpochEntry], head: int) -> int:
    """The epoch of the follower's last record: the newest entry starting below
    ``head``; -1 when none does (no record, or none an entry dates)."""
    for entry in reversed(epochs):
        if entry.start_offset < head:
            return entry.epoch
    return -1


# -- actions ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Append:
    """Append ``batches`` (the leader's bytes, first at the head), after dropping the
    entries starting at or past ``drop_epochs_from`` (when set) and copying ``assign``
    into ``leader-epochs``; then commit up to ``high_watermark``."""

    batches: bytes
    headers: tuple[BatchHeader, ...]
    assign: tuple[EpochEntry, ...]
    drop_epochs_from: int | None
    high_watermark: int


@dataclass(frozen=True, slots=True)
class TruncateTo:
    """Cut the log back to ``offset`` (records at or past it go); ``why`` for the log."""

    offset: int
    why: str


@dataclass(frozen=True, slots=True)
class RestartAt:
    """Empty the log; it starts again at ``offset``; ``why`` for the log."""

    offset: int
    why: str


@dataclass(frozen=True, slots=True)
class Commit:
    """Nothing to write: commit up to ``high_watermark``."""

    high_watermark: int


@dataclass(frozen=True, slots=True)
class BackOff:
    """The leader refused this log (``error``, a ``ReplicaError``): pause, then fetch
    again."""

    error: int
    why: str


Action = Append | TruncateTo | RestartAt | Commit | BackOff


def plan(position: LogPosition, reply: LogReply) -> Action:
    """The one thing to do with the leader's answer for a log (see the module rules)."""
    if reply.diverging is not None:
        return _diverged(position, reply, *reply.diverging)
    if reply.error == _pb.OFFSET_OUT_OF_RANGE:
        return _out_of_range(position, reply)
    if reply.error != _pb.REPLICA_ERROR_NONE:
        return BackOff(reply.error, f"{reply.log}: the leader answered {_name(reply.error)}")
    head = position.head
    if head > position.first_offset and last_fetched_epoch(position.epochs, head) < 0:
        oldest = reply.epochs[0].start_offset if reply.epochs else head
        if head > oldest:
            return _cut(
                position,
                reply,
                oldest,
                f"records from {oldest} on have no epoch here; the leader's epochs begin there",
            )
    if not reply.batches:
        return Commit(reply.high_watermark)
    headers = batch_headers(reply.batches)
    first = headers[0].first_offset if headers else head
    if first < head:  # the leader's batch spans this head: the batch ends disagree
        return _cut(position, reply, first, f"the leader's batch at {first} spans the head {head}")
    if first > head:
        return BackOff(
            _pb.REPLICA_ERROR_NONE, f"{reply.log}: the leader sent batches from {first}, not {head}"
        )
    return _append(position, reply, headers)


def _append(position: LogPosition, reply: LogReply, headers: list[BatchHeader]) -> Append:
    head = position.head
    end = headers[-1].last_offset + 1 if headers else head
    kept = [e for e in position.epochs if e.start_offset < head]
    drop = head if len(kept) < len(position.epochs) else None
    last = kept[-1].epoch if kept else -1
    assign = tuple(e for e in reply.epochs if e.epoch > last and head <= e.start_offset < end)
    return Append(reply.batches, tuple(headers), assign, drop, reply.high_watermark)


def _diverged(position: LogPosition, reply: LogReply, epoch: int, end: int) -> Action:
    """Cut to the smaller of the leader's end of ``epoch`` and the follower's own."""
    own_epoch, own_end = end_offset_for(position.epochs, epoch, position.head)
    if own_epoch < 0:  # no epoch <= the leader's here: records an entry dates all go
        own_end = position.epochs[0].start_offset if position.epochs else position.head
    target = min(end, own_end, position.head) if end >= 0 else min(own_end, position.head)
    why = f"diverges from the leader at {target} (leader's epoch {epoch} ends at {end})"
    if target >= position.head:
        # The leader says the logs diverge but nothing here lies past the point: a stale
        # answer (the log changed meanwhile); ask again after a pause, never loop hot.
        return BackOff(_pb.REPLICA_ERROR_NONE, f"{reply.log}: {why}, but the head is there")
    return _cut(position, reply, target, why)


def _out_of_range(position: LogPosition, reply: LogReply) -> Action:
    if position.head < reply.log_start:
        return RestartAt(
            reply.log_start,
            f"head {position.head} is below the leader's log start {reply.log_start}",
        )
    if position.head > reply.log_end:
        return _cut(
            position, reply, reply.log_end, f"head {position.head} is past the leader's end"
        )
    return BackOff(
        _pb.OFFSET_OUT_OF_RANGE,
        f"{reply.log}: out of range at {position.head} though the leader holds "
        f"[{reply.log_start}, {reply.log_end}]",
    )


def _cut(position: LogPosition, reply: LogReply, target: int, why: str) -> TruncateTo | RestartAt:
    """Cut to ``target``, or empty the log when that is below its first offset."""
    if target < position.first_offset:
        return RestartAt(max(target, reply.log_start), f"{why}, below the first offset here")
    return TruncateTo(target, why)


def _name(error: int) -> str:
    try:
        return _pb.ReplicaError.Name(error)
    except ValueError:
        return f"error {error}"


def backoff_s(
    failures: int,
    rng: random.Random,
    *,
    base_s: float = BACKOFF_BASE_S,
    max_s: float = BACKOFF_MAX_S,
) -> float:
    """The pause after ``failures`` failed fetches in a row (>= 1): "equal jitter", half
    of ``min(max_s, base_s * 2 ** (failures - 1))`` plus a uniform draw up to the other
    half, so followers of a restarted leader do not all call at once.

    Example (base 0.05 s, max 2 s): 1 failure -> 25-50 ms; 3 -> 100-200 ms; 7 and more
    -> 1-2 s.
    """
    ceiling = min(max_s, base_s * 2.0 ** min(max(failures - 1, 0), 30))
    return ceiling / 2 + rng.uniform(0, ceiling / 2)
