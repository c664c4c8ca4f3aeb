"""The replication checker (:mod:`tests.cluster.replica_checker`) on real partition logs
written with :class:`wal.log.Log`: it passes a healthy run and catches each fault it is
meant to catch (so a nemesis test's pass means something)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from proto.batch import encode_columns
from tests.cluster.replica_checker import (
    Acked,
    LoggedBatch,
    PartitionLog,
    ReplicaCheckError,
    check_acknowledged,
    check_all,
    check_consumed,
    check_delivered,
    check_epochs,
    check_in_sync_identical,
    read_partition,
    read_replica,
)
from wal.log import Log

TOPIC = "t"


def _write(data_dir: Path, runs: Sequence[tuple[int, Sequence[bytes]]]) -> Path:
    """Partition 0 of ``TOPIC`` under ``data_dir``: for each ``(epoch, values)`` the epoch
    assigned at the head, then one batch per value (producer 7, sequence = its index)."""
    directory = data_dir / "topics" / TOPIC / "0"
    directory.mkdir(parents=True)
    log = Log.open(str(directory))
    seq = 0
    try:
        for epoch, values in runs:
            log.leader_epochs.assign(epoch, log.head)
            for value in values:
                log.append(encode_columns([value], producer_id=7, base_sequence=seq))
                seq += 1
        log.flush()
    finally:
        log.close()
    return directory


def _values(prefix: str, n: int, start: int = 0) -> list[bytes]:
    return [f"{prefix}{i}".encode() for i in range(start, start + n)]


def _acked(values: Sequence[bytes], first_offset: int = 0) -> Acked:
    acked = Acked()
    for i, value in enumerate(values):
        acked.add(0, i, first_offset + i, value)
    return acked


def test_a_healthy_run_passes_and_reading_changes_nothing(tmp_path: Path) -> None:
    """Scenario: three replicas with the same two epochs of records (a leftover
    ``leader-epochs.tmp`` in one); acks for all of them; a consumer that saw them all.
    Expected: check_all passes; every file of the read directory is unchanged after it
    (the leftover temp is still there)."""
    runs = [(1, _values("v", 5)), (2, _values("v", 5, 5))]
    dirs = [_write(tmp_path / n, runs) for n in ("b1", "b2", "b3")]
    (dirs[0] / "leader-epochs.tmp").write_bytes(b"half")
    before = {p.name: p.read_bytes() for p in dirs[0].iterdir()}
    replicas = {n: read_replica(tmp_path / n, TOPIC) for n in ("b1", "b2", "b3")}
    assert [v for _, v in replicas["b1"][0].records()] == _values("v", 10)
    check_all(
        replicas,
        leader="b1",
        isr=["b1", "b2", "b3"],
        high_watermarks={0: 10},
        acked=_acked(_values("v", 10)),
        seen={0: list(enumerate(_values("v", 10)))},
    )
    assert {p.name: p.read_bytes() for p in dirs[0].iterdir()} == before


def test_a_lost_a_doubled_and_a_reordered_ack_are_caught(tmp_path: Path) -> None:
    """Scenario: a leader log v0..v4 then v2 again; acks checked against it. Expected:
    the doubled v2 fails; on a log without it, an ack of v9 (not there) fails as lost,
    and acks whose send order disagrees with their offsets fail as out of order."""
    doubled = read_partition(_write(tmp_path / "a", [(1, [*_values("v", 5), b"v2"])]))
    with pytest.raises(ReplicaCheckError, match="at 2 and 5"):
        check_acknowledged(_acked(_values("v", 5)), {0: doubled})
    log = read_partition(_write(tmp_path / "b", [(1, _values("v", 5))]))
    with pytest.raises(ReplicaCheckError, match="lost"):
        check_acknowledged(_acked([*_values("v", 5), b"v9"]), {0: log})
    reordered = Acked()
    reordered.add(0, 0, 3, b"v3")
    reordered.add(0, 1, 1, b"v1")
    with pytest.raises(ReplicaCheckError, match="not after"):
        check_acknowledged(reordered, {0: log})
    check_acknowledged(_acked(_values("v", 5)), {0: log})


def test_an_in_sync_replica_short_or_different_below_the_watermark_is_caught(
    tmp_path: Path,
) -> None:
    """Scenario: a leader with v0..v5; one follower with v0..v3 only; another with
    v0..v5 but a different value at offset 4 (same record count and sizes). Expected:
    both fail check_in_sync_identical at watermark 6; the short one passes at watermark 4
    (it need not hold what is above the mark)."""
    leader = read_partition(_write(tmp_path / "l", [(1, _values("v", 6))]))
    short = read_partition(_write(tmp_path / "s", [(1, _values("v", 4))]))
    other = read_partition(_write(tmp_path / "o", [(1, [*_values("v", 4), b"x4", b"v5"])]))
    replicas = {"l": {0: leader}, "s": {0: short}, "o": {0: other}}
    with pytest.raises(ReplicaCheckError, match="s differs"):
        check_in_sync_identical(replicas, "l", ["l", "s"], {0: 6})
    with pytest.raises(ReplicaCheckError, match=r"o differs .* from offset 4"):
        check_in_sync_identical(replicas, "l", ["l", "o"], {0: 6})
    check_in_sync_identical(replicas, "l", ["l", "s"], {0: 4})


def test_two_leaders_in_one_epoch_are_caught_an_old_epochs_tail_is_not(
    tmp_path: Path,
) -> None:
    """Scenario: replica a wrote v0..v3 at epoch 1; replica b holds v0..v1 at epoch 1 and
    then other records from offset 2 at epoch 1 too (a second leader of epoch 1); replica
    c holds v0..v1 at epoch 1 and its own records from 2 at epoch 2 (a real successor).
    Expected: a with b fails (epoch 1, offset 2, two batches); a with c passes (a's tail
    is an old epoch's, truncated later); an epoch starting at two offsets fails."""
    a = read_partition(_write(tmp_path / "a", [(1, _values("v", 4))]))
    b = read_partition(_write(tmp_path / "b", [(1, [*_values("v", 2), b"w2", b"w3"])]))
    c = read_partition(_write(tmp_path / "c", [(1, _values("v", 2)), (2, [b"w2", b"w3"])]))
    with pytest.raises(ReplicaCheckError, match=r"epoch 1 offset 2 .* two leaders"):
        check_epochs({"a": {0: a}, "b": {0: b}})
    check_epochs({"a": {0: a}, "c": {0: c}})
    d = read_partition(_write(tmp_path / "d", [(1, _values("v", 3)), (2, [b"w3"])]))
    with pytest.raises(ReplicaCheckError, match=r"epoch 2 starts at 2 .* and at 3"):
        check_epochs({"c": {0: c}, "d": {0: d}})


def test_a_consumer_that_saw_a_truncated_record_or_missed_one_is_caught() -> None:
    """Scenario: a final log v0..v2 (epoch 1); a consumer that saw x2 at offset 2 (a
    record since truncated), another that saw only offsets 0 and 1. Expected: the first
    fails as truncated; the second fails only when asked for everything below hw 3."""
    values = _values("v", 3)
    batches = tuple(LoggedBatch(i, (v,), 7, i, b"raw" + v) for i, v in enumerate(values))
    final = {0: PartitionLog(batches)}
    with pytest.raises(ReplicaCheckError, match="truncated"):
        check_consumed({0: [(0, b"v0"), (1, b"v1"), (2, b"x2")]}, final)
    partial = {0: [(0, b"v0"), (1, b"v1")]}
    check_consumed(partial, final)
    with pytest.raises(ReplicaCheckError, match="1 committed records unseen"):
        check_consumed(partial, final, {0: 3})


def test_a_subscription_that_missed_or_got_a_truncated_record_is_caught() -> None:
    """Scenario: a final log v0..v2 with watermark 3; subscription a got all three (v1
    twice: a redelivery), b missed offset 1, c got x2 at offset 2 (since truncated).
    Expected: a passes; b fails naming p0/1; c fails naming the value."""
    final = {
        0: PartitionLog(tuple(LoggedBatch(i, (v,), 7, i, v) for i, v in enumerate(_values("v", 3))))
    }
    every = [(0, 0, b"v0"), (0, 1, b"v1"), (0, 1, b"v1"), (0, 2, b"v2")]
    check_delivered({"a": every}, final, {0: 3})
    with pytest.raises(ReplicaCheckError, match="b: p0/1 never delivered"):
        check_delivered({"b": [(0, 0, b"v0"), (0, 2, b"v2")]}, final, {0: 3})
    with pytest.raises(ReplicaCheckError, match="c: delivered b'x2' at p0/2"):
        check_delivered({"c": [*every[:2], (0, 2, b"x2")]}, final, {0: 3})
