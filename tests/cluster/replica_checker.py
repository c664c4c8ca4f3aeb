"""The checker of replicated topics (issue 37): what must hold after a fault test, read
from every replica's partition files on disk.

Role: after a run, :func:`read_replica` reads each broker's copy of a topic, read-only
(segments scanned with :func:`wal.inspect.inspect_dir`, so a torn tail is left out, and
the ``leader-epochs`` file decoded with :func:`wal.leader_epochs.decode`; nothing is
written, not even the leftover ``.tmp`` that opening a log would discard). The checks,
each raising :class:`ReplicaCheckError` naming what broke:

- :func:`check_acknowledged`: every acknowledged record is in the final leader's log
  exactly once, at the offset its ack gave, and in producer order per partition (its
  offsets rise with the producer's send order); no value is there twice at all (an
  idempotent producer's resend was never appended again).
- :func:`check_in_sync_identical`: every in-sync replica holds the same bytes as the
  leader below the high watermark (the raw batch bytes, compared as bytes, and the
  leader-epoch entries that date them).
- :func:`check_epochs`: no two leaders wrote in one epoch: across every replica, in sync
  or not (an old leader's divergent tail included), a given epoch and offset hold one
  batch (the same bytes), and an epoch begins at the same offset wherever it is recorded.
  The clients do not expose the epoch of an ack, so this is read from the logs: an ack
  is only given for a committed batch, and a committed batch is in the final leader's log
  (:func:`check_acknowledged`) under the epoch that wrote it.
- :func:`check_consumed`: no consumer saw a record that is not at that offset in the
  final leader's log (it saw something later truncated), and, when asked, every record
  below the high watermark was seen.

Invariant the checks rely on: a value identifies one record (the tests send unique
values), and replicas copy batches byte for byte, so equal bytes mean equal records.

Worked example: a leader at epoch 1 appends offsets 0-9, commits 0-7 and is killed; a
follower leads at epoch 2 from offset 8. The old leader's disk still holds 8-9 under
epoch 1, the new leader's 8.. under epoch 2: no (epoch, offset) conflict. Had the old
leader, frozen, come back and appended 10 at epoch 1 after the new leader took epoch 2,
it would still be alone in epoch 1 (the new leader never writes epoch 1), and the record
would never be acknowledged: :func:`check_acknowledged` catches an ack of it, since the
final log does not hold it.

Imports the wal's read-only parts and the batch codec only; nothing of the broker.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from proto.batch import iter_batches
from wal.fs import FileSystem
from wal.inspect import inspect_dir
from wal.leader_epochs import FILE_NAME, EpochEntry, decode

logger = logging.getLogger(__name__)

NO_EPOCH = -1
"""The epoch of a batch below the first ``leader-epochs`` entry (written unreplicated)."""


class ReplicaCheckError(AssertionError):
    """Raised when a replicated topic breaks one of the checker's rules."""


@dataclass(frozen=True, slots=True)
class LoggedBatch:
    """One batch as it is on disk.

    Attributes:
        base_offset: its first record's offset.
        values: its records' values, in offset order.
        producer_id: the producer that sent it (-1: none).
        base_sequence: the producer's sequence of its first record.
        raw: its bytes, header included, exactly as in the segment.
    """

    base_offset: int
    values: tuple[bytes, ...]
    producer_id: int
    base_sequence: int
    raw: bytes

    @property
    def next_offset(self) -> int:
        return self.base_offset + len(self.values)


@dataclass(frozen=True, slots=True)
class PartitionLog:
    """One replica's copy of one partition: its batches, oldest first, and its epochs."""

    batches: tuple[LoggedBatch, ...] = ()
    epochs: tuple[EpochEntry, ...] = ()

    @property
    def start(self) -> int:
        return self.batches[0].base_offset if self.batches else 0

    @property
    def end(self) -> int:
        return self.batches[-1].next_offset if self.batches else 0

    def records(self) -> list[tuple[int, bytes]]:
        """Every ``(offset, value)``, in offset order."""
        return [(b.base_offset + i, v) for b in self.batches for i, v in enumerate(b.values)]

    def epoch_of(self, offset: int) -> int:
        """The epoch that wrote ``offset``: the latest entry starting at or below it."""
        found = NO_EPOCH
        for entry in self.epochs:
            if entry.start_offset > offset:
                break
            found = entry.epoch
        return found

    def below(self, high_watermark: int) -> tuple[bytes, list[EpochEntry]]:
        """The bytes of every batch that starts below ``high_watermark``, and the epoch
        entries that start below it."""
        raw = b"".join(b.raw for b in self.batches if b.base_offset < high_watermark)
        return raw, [e for e in self.epochs if e.start_offset < high_watermark]


def read_partition(directory: Path, fs: FileSystem | None = None) -> PartitionLog:
    """Read one partition directory without changing a byte of it.

    Raises:
        ReplicaCheckError: a segment holds a damaged batch before its end (a torn tail of the
            newest segment is only left out), or the epochs file is damaged.
    """
    fs = fs or FileSystem()
    batches: list[LoggedBatch] = []
    reports = inspect_dir(str(directory), fs)
    for i, report in enumerate(reports):
        if report.problem and i != len(reports) - 1:
            raise ReplicaCheckError(f"{directory}/{report.name}: {report.problem}")
        fd = fs.open_readonly(os.path.join(directory, report.name))
        try:
            data = fs.pread(fd, report.valid_bytes, 0)
        finally:
            fs.close(fd)
        for batch in iter_batches(data):
            raw = bytes(batch.buffer)
            values = tuple(batch.values())
            batches.append(
                LoggedBatch(batch.base_offset, values, batch.producer_id, batch.base_sequence, raw)
            )
    path = directory / FILE_NAME
    epochs = decode(path.read_bytes(), str(path)) if path.exists() else []
    return PartitionLog(tuple(batches), tuple(epochs))


def read_replica(data_dir: Path, topic: str) -> dict[int, PartitionLog]:
    """Every partition of ``topic`` in a broker's data directory (none when absent)."""
    root = data_dir / "topics" / topic
    if not root.is_dir():
        return {}
    return {
        int(p.name): read_partition(p)
        for p in sorted(root.iterdir())
        if p.is_dir() and p.name.isdigit()
    }


@dataclass
class Acked:
    """What the producers were told, per producer and partition, with each record's place
    in that producer's sends.

    ``order`` is a number that rises with one producer's sends to one partition (its
    sequence, or a counter): the checker sorts by it. Records of different producers
    are not ordered between them.
    """

    streams: dict[tuple[str, int], list[tuple[int, int, bytes]]] = field(default_factory=dict)

    def add(
        self, partition: int, order: int, offset: int, value: bytes, producer: str = ""
    ) -> None:
        self.streams.setdefault((producer, partition), []).append((order, offset, value))

    def __len__(self) -> int:
        return sum(len(v) for v in self.streams.values())


def check_acknowledged(acked: Acked, leader: Mapping[int, PartitionLog]) -> None:
    """Every acknowledged record is in ``leader``'s log exactly once, at its acked offset
    (-1: a duplicate whose offset was not told), in producer order; no value twice.

    Raises:
        ReplicaCheckError: naming the partition and the record.
    """
    for partition, log in leader.items():
        seen: dict[bytes, int] = {}
        for offset, value in log.records():
            if value in seen:
                raise ReplicaCheckError(f"p{partition}: {value!r} at {seen[value]} and {offset}")
            seen[value] = offset
    for (producer, partition), rows in acked.streams.items():
        log = leader.get(partition, PartitionLog())
        where = {v: o for o, v in log.records()}
        last = -1
        for order, offset, value in sorted(rows):
            at = where.get(value)
            if at is None:
                raise ReplicaCheckError(f"p{partition}: acked {value!r} (offset {offset}) lost")
            if offset >= 0 and at != offset:
                raise ReplicaCheckError(f"p{partition}: acked {value!r} at {offset}, found at {at}")
            if at <= last:
                raise ReplicaCheckError(
                    f"p{partition}: {producer}'s {value!r} (#{order}) at {at}, not after {last}"
                )
            last = at


def check_in_sync_identical(
    replicas: Mapping[str, Mapping[int, PartitionLog]],
    leader: str,
    isr: Iterable[str],
    high_watermarks: Mapping[int, int],
) -> None:
    """Every member of ``isr`` holds the leader's bytes and epochs below each partition's
    high watermark.

    Raises:
        ReplicaCheckError: naming the replica, the partition and the first differing offset.
    """
    for partition, hw in high_watermarks.items():
        want = replicas[leader].get(partition, PartitionLog())
        want_raw, want_epochs = want.below(hw)
        if hw > 0 and want.end < hw:
            raise ReplicaCheckError(f"p{partition}: leader {leader} ends at {want.end} < hw {hw}")
        for node in isr:
            have = replicas[node].get(partition, PartitionLog())
            raw, epochs = have.below(hw)
            if raw != want_raw:
                raise ReplicaCheckError(
                    f"p{partition}: {node} differs from {leader} below hw {hw} from offset "
                    f"{_first_difference(want, have)} ({len(raw)} vs {len(want_raw)} bytes)"
                )
            if epochs != want_epochs:
                raise ReplicaCheckError(f"p{partition}: {node} epochs {epochs} != {want_epochs}")


def _first_difference(a: PartitionLog, b: PartitionLog) -> int:
    for x, y in zip(a.batches, b.batches, strict=False):
        if x.raw != y.raw:
            return min(x.base_offset, y.base_offset)
    return min(a.end, b.end)


def check_epochs(replicas: Mapping[str, Mapping[int, PartitionLog]]) -> None:
    """No two leaders wrote in one epoch, across every replica's copy (module docstring).

    Raises:
        ReplicaCheckError: two different batches at one offset of one epoch, or one epoch
            starting at two offsets.
    """
    partitions = {p for logs in replicas.values() for p in logs}
    for partition in sorted(partitions):
        written: dict[tuple[int, int], tuple[str, bytes]] = {}
        starts: dict[int, tuple[str, int]] = {}
        for node, logs in sorted(replicas.items()):
            log = logs.get(partition, PartitionLog())
            for batch in log.batches:
                key = (log.epoch_of(batch.base_offset), batch.base_offset)
                other = written.setdefault(key, (node, batch.raw))
                if other[1] != batch.raw:
                    raise ReplicaCheckError(
                        f"p{partition}: epoch {key[0]} offset {key[1]} holds different "
                        f"batches on {other[0]} and {node}: two leaders in one epoch"
                    )
            for entry in log.epochs:
                clamped = entry.start_offset == log.start  # retention or a restart_at
                first = starts.setdefault(entry.epoch, (node, entry.start_offset))
                if first[1] != entry.start_offset and not clamped:
                    raise ReplicaCheckError(
                        f"p{partition}: epoch {entry.epoch} starts at {first[1]} on "
                        f"{first[0]} and at {entry.start_offset} on {node}"
                    )


def check_consumed(
    seen: Mapping[int, Sequence[tuple[int, bytes]]],
    leader: Mapping[int, PartitionLog],
    high_watermarks: Mapping[int, int] | None = None,
) -> None:
    """No consumer saw a record that is not in ``leader``'s final log at that offset; with
    ``high_watermarks``, every record below them was seen.

    Raises:
        ReplicaCheckError: naming the partition, offset and value.
    """
    for partition, rows in seen.items():
        final = dict(leader.get(partition, PartitionLog()).records())
        for offset, value in rows:
            if final.get(offset) != value:
                raise ReplicaCheckError(
                    f"p{partition}: a consumer saw {value!r} at {offset}, the final log holds "
                    f"{final.get(offset)!r} there (truncated after it was read)"
                )
    for partition, hw in (high_watermarks or {}).items():
        got = {o for o, _ in seen.get(partition, ())}
        log = leader.get(partition, PartitionLog())
        missed = [o for o, _ in log.records() if o < hw and o not in got]
        if missed:
            raise ReplicaCheckError(
                f"p{partition}: {len(missed)} committed records unseen: {missed[:5]}"
            )


def check_delivered(
    received: Mapping[str, Iterable[tuple[int, int, bytes]]],
    leader: Mapping[int, PartitionLog],
    high_watermarks: Mapping[int, int],
) -> None:
    """Each subscription (name -> the ``(partition, offset, value)`` its consumers got,
    redeliveries included) got only records the final log holds at their offsets, and
    every record below each partition's high watermark at least once.

    Raises:
        ReplicaCheckError: naming the subscription and the first record wrong or missed.
    """
    finals = {p: dict(log.records()) for p, log in leader.items()}
    for name, rows in received.items():
        got = set(rows)
        for partition, offset, value in sorted(got):
            if finals.get(partition, {}).get(offset) != value:
                raise ReplicaCheckError(
                    f"{name}: delivered {value!r} at p{partition}/{offset}, not in the final log"
                )
        for partition, hw in high_watermarks.items():
            for offset, value in finals.get(partition, {}).items():
                if offset < hw and (partition, offset, value) not in got:
                    raise ReplicaCheckError(f"{name}: p{partition}/{offset} never delivered")


def check_all(
    replicas: Mapping[str, Mapping[int, PartitionLog]],
    *,
    leader: str,
    isr: Iterable[str],
    high_watermarks: Mapping[int, int],
    acked: Acked,
    seen: Mapping[int, Sequence[tuple[int, bytes]]] | None = None,
) -> None:
    """Every check above, on one run's end state.

    Raises:
        ReplicaCheckError: from the first check that fails.
    """
    check_acknowledged(acked, replicas[leader])
    check_in_sync_identical(replicas, leader, isr, high_watermarks)
    check_epochs(replicas)
    if seen is not None:
        check_consumed(seen, replicas[leader], high_watermarks)
    logger.info(
        "replica checker: %d acked records, leader %s, hw %s: all checks hold",
        len(acked),
        leader,
        dict(high_watermarks),
    )
