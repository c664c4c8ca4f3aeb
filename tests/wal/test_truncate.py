"""Disk tests of :meth:`wal.log.Log.truncate_to`: a replica cutting its log back.

Every test runs with segments that roll at ~512 B and an index entry every ~100 B, so a
few dozen batches span many segments, and the cut can land inside the active segment, at
a segment boundary, or inside a sealed segment (which then becomes active again). The
crash tests stop a truncation at each of its named crash points, drop the descriptors
unsynced, cut the power, and reopen with the real filesystem.
"""

from __future__ import annotations

import errno
import hashlib
import os
import random
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.wal._helpers import CrashableFs, read_all
from wal import (
    Fault,
    FaultyFs,
    LeaderEpochsCorruptError,
    Log,
    LogConfig,
    NotBatchBoundaryError,
    OffsetOutOfRangeError,
    SimulatedCrash,
    WalFailedError,
    encode_columns,
)
from wal.fs import CRASH_POINTS
from wal.leader_epochs import FILE_NAME, EpochEntry

CONFIG = LogConfig(segment_bytes=512, index_interval_bytes=100)
TRUNCATE_POINTS = [p for p in CRASH_POINTS if p.startswith("truncate.")]


def value_for(i: int) -> bytes:
    """A payload that names its record id and whose content can be checked."""
    return b"%08d:" % i + hashlib.sha256(b"%d" % i).digest()[: i % 29]


def fill(log: Log, batches: int, first_id: int = 0) -> list[bytes]:
    """Append ``batches`` batches of 1-3 records (ids from ``first_id``), and more until the
    active segment holds two batches or more; flush; return the values appended, in offset
    order."""
    values = []
    next_id = first_id
    n = 0
    while n < batches or log.head - log.active_position[0] < 2:
        n += 1
        ids = range(next_id, next_id + 1 + n % 3)
        next_id = ids.stop
        values += [value_for(i) for i in ids]
        log.append(encode_columns([value_for(i) for i in ids]))
    log.flush()
    return values


def values_of(log: Log) -> list[bytes]:
    """Every record value from the first offset to the head, in order."""
    return [r.value for b in read_all(log) for r in b.records()]


def boundaries(log: Log) -> list[int]:
    """Every batch boundary of the log, its head included."""
    return [b.base_offset for b in read_all(log)] + [log.head]


def snapshot(path: str) -> dict[str, bytes]:
    """Every file of the directory and its bytes."""
    return {n: Path(path, n).read_bytes() for n in sorted(os.listdir(path))}


def segment_bases(path: str) -> list[int]:
    """Base offsets of the .log files in the directory."""
    return sorted(int(n[:20]) for n in os.listdir(path) if n.endswith(".log"))


#: Where the cut lands, as a function of the log (which must span several segments).
TARGETS: dict[str, Callable[[Log], int]] = {
    "inside-active": lambda log: next(
        o for o in boundaries(log) if log.active_position[0] < o < log.head
    ),
    "at-active-base": lambda log: log.active_position[0],
    "inside-sealed": lambda log: [
        o for o in boundaries(log) if o not in {i.base_offset for i in log.segment_infos()}
    ][3],
    "segment-boundary": lambda log: log.segment_infos()[2].base_offset,
    "first-offset": lambda log: log.first_offset,
}


@pytest.mark.parametrize("where", sorted(TARGETS))
def test_truncate_leaves_exactly_the_prefix_and_appends_go_on(wal_dir: str, where: str) -> None:
    """Scenario: a log of 60 batches over many segments is truncated to a batch boundary
    (inside the active segment, at its base, inside a sealed segment, at a segment
    boundary, at the first offset); then a batch is appended and the log reopened.
    Expected: the head is the offset, the log reads exactly the old prefix, no segment
    starts past the offset, reads at the offset return nothing and past it raise; the
    append lands at the offset and survives a reopen, which cuts nothing."""
    log = Log.open(wal_dir, CONFIG)
    values = fill(log, 60)
    assert log.segment_count > 4
    offset = TARGETS[where](log)
    removed = log.truncate_to(offset)
    assert log.head == offset
    assert values_of(log) == values[:offset]
    assert all(base > offset or base == offset != log.first_offset for base in removed)
    assert all(base <= offset for base in segment_bases(wal_dir))
    assert log.read(offset) == []
    with pytest.raises(OffsetOutOfRangeError):
        log.read(offset + 1)
    assert log.append(encode_columns([b"after"])).first_offset == offset
    log.flush()
    log.close()
    log = Log.open(wal_dir, CONFIG)
    assert log.recovery.truncated_bytes == 0
    assert values_of(log) == [*values[:offset], b"after"]
    log.close()


def test_a_sealed_segment_made_active_again_rolls_and_reopens(wal_dir: str) -> None:
    """Scenario: a cut inside the oldest sealed segment; then enough appends to fill and
    roll it again, and a reopen. Expected: the segment takes appends as the active one,
    rolls at the size limit as any active segment, every record reads back in order
    after the reopen, and its index is sound (no rebuild, nothing cut)."""
    log = Log.open(wal_dir, CONFIG)
    values = fill(log, 40)
    first_end = log.segment_infos()[0].next_offset
    offset = [o for o in boundaries(log) if 0 < o < first_end][-1]
    log.truncate_to(offset)
    assert log.segment_count == 1
    more = fill(log, 30, first_id=10_000)
    assert log.segment_count > 2
    log.close()
    log = Log.open(wal_dir, CONFIG)
    assert values_of(log) == values[:offset] + more
    assert log.recovery.truncated_bytes == 0
    assert not log.recovery.tail.index_rebuilt
    log.close()


def test_truncate_to_head_changes_nothing(wal_dir: str) -> None:
    """Scenario: truncate_to(head). Expected: no segment removed, every file byte for byte
    as before."""
    log = Log.open(wal_dir, CONFIG)
    fill(log, 20)
    before = snapshot(wal_dir)
    assert log.truncate_to(log.head) == []
    assert snapshot(wal_dir) == before
    log.close()


@pytest.mark.parametrize("case", ["inside-batch", "below-first", "past-head"])
def test_a_refused_truncation_changes_nothing(wal_dir: str, case: str) -> None:
    """Scenario: truncate_to an offset inside a three-record batch, below the first
    retained offset (after retention), or past the head. Expected: NotBatchBoundaryError
    naming the batch, or OffsetOutOfRangeError; every file byte for byte as before, the log
    still writable."""
    log = Log.open(wal_dir, LogConfig(segment_bytes=512, index_interval_bytes=100))
    fill(log, 40)
    log.delete_before(log.segment_infos()[2].base_offset)
    head, before = log.head, snapshot(wal_dir)
    if case == "inside-batch":
        batch = next(b for b in read_all(log) if b.record_count == 3)
        with pytest.raises(NotBatchBoundaryError) as info:
            log.truncate_to(batch.base_offset + 1)
        assert (info.value.batch_base, info.value.batch_next) == (
            batch.base_offset,
            batch.next_offset,
        )
        assert "nothing was changed" in str(info.value)
    else:
        offset = log.first_offset - 1 if case == "below-first" else head + 1
        with pytest.raises(OffsetOutOfRangeError):
            log.truncate_to(offset)
    assert snapshot(wal_dir) == before
    assert log.failure is None
    assert log.append(encode_columns([b"x"])).first_offset == head
    log.close()


def test_the_dropped_bytes_are_gone_from_every_cache(wal_dir: str) -> None:
    """Scenario: every segment is read (indexes loaded, descriptors cached), then the log
    is cut inside a sealed segment and new records appended over the cut. Expected: every
    read, from any offset, returns the new records and never an old one (no stale index
    entry, descriptor or segment object serves the dropped bytes)."""
    log = Log.open(wal_dir, CONFIG)
    values = fill(log, 50)
    assert values_of(log) == values
    offset = TARGETS["inside-sealed"](log)
    log.truncate_to(offset)
    new = fill(log, 30, first_id=50_000)
    expected = values[:offset] + new
    for start in boundaries(log)[:-1]:
        got = [r.value for b in read_all(log, start) for r in b.records()]
        first = read_all(log, start)[0].base_offset
        assert got == expected[first:], start
    log.close()


# -- crashes --------------------------------------------------------------------------------


def _fires(point: str, where: str) -> bool:
    """Whether a truncation to ``where`` passes ``point`` (a cut inside the active segment
    removes no segment)."""
    return not (point == "truncate.after_segment_delete" and where == "inside-active")


CRASH_CASES = [
    pytest.param(p, w, seed, id=f"{p}-{w}-{seed}")
    for p in TRUNCATE_POINTS
    for w in ("inside-active", "inside-sealed", "segment-boundary", "first-offset")
    for seed in range(3)
    if _fires(p, w)
]


@pytest.mark.parametrize(("point", "where", "seed"), CRASH_CASES)
def test_a_crash_in_a_truncation_leaves_a_prefix_no_shorter_than_the_cut(
    tmp_path: Path, point: str, where: str, seed: int
) -> None:
    """Scenario: a log (its last batches not synced) is truncated; the truncation crashes
    at ``point``; the descriptors are dropped unsynced and the power cut. Expected: the
    reopened log is a prefix of the old one no shorter than the cut, with a sound index
    (every offset reads back); a second reopen cuts nothing; finishing the truncation
    gives exactly the cut, and appends go on from it."""
    path = str(tmp_path / "log")
    fs = CrashableFs(page_size=64)
    log = Log.open(path, CONFIG, fs=fs)
    values = fill(log, 50)
    unsynced: list[bytes] = []
    while len(unsynced) < 3 or log.head - log.active_position[0] < 2:
        unsynced.append(b"unsynced-%d" % len(unsynced))  # never synced: a power cut may
        log.append(encode_columns([unsynced[-1]]))  # take them
    offset = TARGETS[where](log)
    fs.crash_at = point
    with pytest.raises(SimulatedCrash):
        log.truncate_to(offset)
    fs.die()
    fs.power_cut(random.Random(seed))
    log = Log.open(path, CONFIG)
    assert offset <= log.head <= len(values) + len(unsynced)
    assert values_of(log) == (values + unsynced)[: log.head]
    log.close()
    log = Log.open(path, CONFIG)
    assert log.recovery.truncated_bytes == 0
    log.truncate_to(offset)
    assert values_of(log) == (values + unsynced)[:offset]
    assert log.append(encode_columns([b"after"])).first_offset == offset
    log.close()


@pytest.mark.parametrize("tear", ["index-garbage", "index-torn-entry", "log-torn-tail"])
def test_torn_files_after_a_truncation_are_repaired_on_open(wal_dir: str, tear: str) -> None:
    """Scenario: a log truncated inside a sealed segment (now active), then its files torn
    as a crash could leave them: the index overwritten with garbage, the index with half
    an entry appended, or half a batch appended to the log. Expected: the reopened log
    holds exactly the truncated prefix (the torn tail cut, the index rebuilt or trimmed)
    and appends continue at the cut."""
    log = Log.open(wal_dir, CONFIG)
    values = fill(log, 40)
    offset = TARGETS["inside-sealed"](log)
    log.truncate_to(offset)
    base = log.active_position[0]
    log.close()
    index = Path(wal_dir, f"{base:020d}.index")
    data = Path(wal_dir, f"{base:020d}.log")
    if tear == "index-garbage":
        index.write_bytes(os.urandom(48))
    elif tear == "index-torn-entry":
        index.write_bytes(index.read_bytes() + b"\x01" * 7)
    else:
        data.write_bytes(data.read_bytes() + encode_columns([b"torn"])[:30])
    log = Log.open(wal_dir, CONFIG)
    assert log.head == offset
    assert values_of(log) == values[:offset]
    assert log.append(encode_columns([b"after"])).first_offset == offset
    log.close()


# -- the leader-epoch history ---------------------------------------------------------------


def test_truncation_drops_the_epochs_that_began_at_or_past_the_cut(wal_dir: str) -> None:
    """Scenario: epochs 1, 3 and 4 begin at offsets 0, 20 and 40; the log is cut at 40,
    then at 30. Expected: the first cut drops epoch 4 (it began at the cut), the second
    keeps epoch 3, which now ends at the log's end; the file says the same after a
    reopen."""
    log = Log.open(wal_dir, CONFIG)
    fill(log, 40)
    bounds = boundaries(log)
    starts = [bounds[5], bounds[15], bounds[25]]
    for epoch, start in zip((1, 3, 4), starts, strict=True):
        log.leader_epochs.assign(epoch, start)
    log.truncate_to(starts[2])
    assert log.leader_epochs.entries() == [EpochEntry(1, starts[0]), EpochEntry(3, starts[1])]
    cut = bounds[20]
    log.truncate_to(cut)
    assert log.leader_epochs.end_offset_for(3) == (3, cut)
    assert log.leader_epochs.end_offset_for(4) == (3, cut)
    log.close()
    log = Log.open(wal_dir, CONFIG)
    assert log.leader_epochs.entries() == [EpochEntry(1, starts[0]), EpochEntry(3, starts[1])]
    log.close()


def test_open_drops_epochs_that_begin_past_the_log_end(wal_dir: str) -> None:
    """Scenario: epochs begin at the head and past it (as a crash between cutting the log
    and its epoch file leaves them), then the log is reopened. Expected: the epoch past
    the end is dropped, on disk too; the one at the end stays (a leader records its epoch
    before its first append)."""
    log = Log.open(wal_dir, CONFIG)
    fill(log, 10)
    head = log.head
    log.leader_epochs.assign(1, 0)
    log.leader_epochs.assign(2, head)
    log.leader_epochs.assign(3, head + 5)
    log.close()
    log = Log.open(wal_dir, CONFIG)
    assert log.leader_epochs.entries() == [EpochEntry(1, 0), EpochEntry(2, head)]
    log.close()
    log = Log.open(wal_dir, CONFIG, fs=FaultyFs(crash_at="leader_epochs.after_tmp"))
    assert log.leader_epochs.entries() == [EpochEntry(1, 0), EpochEntry(2, head)]  # no write
    log.close()


def test_a_damaged_epoch_file_stops_the_open_with_its_name(wal_dir: str) -> None:
    """Scenario: the leader-epochs file has a flipped digit. Expected: Log.open raises
    LeaderEpochsCorruptError naming the file and what to do; it does not open with an
    empty history."""
    log = Log.open(wal_dir, CONFIG)
    fill(log, 5)
    log.leader_epochs.assign(7, 0)
    log.close()
    path = Path(wal_dir, FILE_NAME)
    path.write_bytes(path.read_bytes().replace(b"7 0", b"8 0"))
    with pytest.raises(LeaderEpochsCorruptError) as info:
        Log.open(wal_dir, CONFIG)
    assert str(path) in str(info.value)
    assert "re-replicates" in str(info.value)


def test_retention_keeps_the_epoch_covering_the_new_first_offset(wal_dir: str) -> None:
    """Scenario: epochs 1 and 2 begin at 0 and in the third segment; retention deletes the
    first two segments. Expected: epoch 1 stays, clamped to the new first offset; epoch 2
    is unchanged."""
    log = Log.open(wal_dir, CONFIG)
    fill(log, 40)
    third = log.segment_infos()[2].base_offset
    start2 = [o for o in boundaries(log) if o > third][1]
    log.leader_epochs.assign(1, 0)
    log.leader_epochs.assign(2, start2)
    log.delete_before(third)
    assert log.first_offset == third
    assert log.leader_epochs.entries() == [EpochEntry(1, third), EpochEntry(2, start2)]
    log.close()


@pytest.mark.parametrize("op", ["truncate", "fdatasync", "fsync_dir"])
def test_an_io_error_in_a_truncation_latches_and_a_reopen_recovers(wal_dir: str, op: str) -> None:
    """Scenario: a truncation into a sealed segment meets an I/O error (EIO) cutting a
    file, syncing one, or syncing the directory. Expected: WalFailedError, the log
    latched (the next append refuses); reopening gives a prefix of the old log no shorter
    than the cut, and the truncation then completes."""
    fs = FaultyFs(faults=[Fault(op, error=errno.EIO, times=None)])
    log = Log.open(wal_dir, CONFIG)
    values = fill(log, 40)
    log.close()
    log = Log.open(wal_dir, CONFIG, fs=fs)
    offset = TARGETS["inside-sealed"](log)
    with pytest.raises(WalFailedError):
        log.truncate_to(offset)
    with pytest.raises(WalFailedError):
        log.append(encode_columns([b"refused"]))
    log.close()
    log = Log.open(wal_dir, CONFIG)
    assert offset <= log.head <= len(values)
    assert values_of(log) == values[: log.head]
    log.truncate_to(offset)
    assert values_of(log) == values[:offset]
    log.close()
