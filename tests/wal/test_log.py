"""Disk tests of :class:`wal.log.Log`: many segments, reads, reopen, cleanup and retention.

Every test runs with ``small_config`` (segments roll at ~512 B, an index entry every
~100 B), so a few dozen batches span ten or more segments. Time for rolling and retention
comes from an injected clock; nothing sleeps.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from itertools import pairwise
from pathlib import Path

import pytest

from tests.wal._helpers import read_all
from wal import (
    CorruptSegmentError,
    Log,
    LogConfig,
    OffsetOutOfRangeError,
    WalClosedError,
    encode_columns,
)


def value_for(i: int) -> bytes:
    """A payload that names its record id and whose content can be checked."""
    return b"%08d:" % i + hashlib.sha256(b"%d" % i).digest()[: i % 29]


def batch_bytes(first_id: int, count: int, ts: int = 0) -> bytes:
    """An encoded batch of records ``first_id``..``first_id + count - 1``."""
    return encode_columns(
        [value_for(i) for i in range(first_id, first_id + count)], timestamps_ms=ts
    )


def counts(n: int) -> list[int]:
    """Record counts of ``n`` batches: a fixed mix of 1 to 4."""
    return [1 + (k * 7) % 4 for k in range(n)]


def fill(log: Log, n: int, *, ts: int = 0, ts_step: int = 0) -> list[tuple[int, int]]:
    """Append ``n`` batches whose record ids equal their offsets; return (base, next) pairs.

    Batch ``k`` is stamped ``ts + k * ts_step``.
    """
    placed = []
    for k, count in enumerate(counts(n)):
        result = log.append(batch_bytes(log.head, count, ts + k * ts_step))
        placed.append((result.first_offset, result.last_offset + 1))
    return placed


def assert_intact(log: Log) -> None:
    """Reading first_offset..head returns every record, in order, payload matching its id."""
    batches = read_all(log)
    offsets = [o for b in batches for o in b.offsets()]
    assert offsets == list(range(log.first_offset, log.head))
    assert [v for b in batches for v in b.values()] == [value_for(o) for o in offsets]


def files(path: str) -> dict[str, int]:
    """Name -> size of every file in the directory."""
    return {n: os.path.getsize(os.path.join(path, n)) for n in sorted(os.listdir(path))}


def log_bases(path: str) -> list[int]:
    """Base offsets of the segment .log files present."""
    return sorted(int(n[:20]) for n in os.listdir(path) if n.endswith(".log"))


def test_round_trip_across_many_segments(wal_dir: str, small_config: LogConfig) -> None:
    """Scenario: 120 batches (300 records) into 512-byte segments. Expected: more than ten
    segment files, none over 512 bytes, offsets dense, every record readable and intact."""
    log = Log.open(wal_dir, small_config)
    placed = fill(log, 120)
    assert log.head == placed[-1][1] == sum(counts(120))
    assert_intact(log)
    sizes = files(wal_dir)
    logs = {n: s for n, s in sizes.items() if n.endswith(".log")}
    assert len(logs) > 10
    assert all(s <= small_config.segment_bytes for s in logs.values())
    assert log_bases(wal_dir)[0] == 0
    log.close()


@pytest.mark.parametrize("record_bytes", [400, 600, 2000])
def test_batch_larger_than_a_segment_gets_one_of_its_own(wal_dir: str, record_bytes: int) -> None:
    """Scenario: 512-byte segments; small batches, then one batch whose single record is
    ``record_bytes`` long, then small batches again. Expected: a batch that does not fit
    starts a new segment and (when over 512 B) stays alone in it; nothing is split; every
    record reads back intact."""
    config = LogConfig(segment_bytes=512, index_interval_bytes=100)
    log = Log.open(wal_dir, config)
    fill(log, 3)
    big_offset = log.head
    big = encode_columns([b"B" * record_bytes])
    log.append(big)
    after = log.head
    log.append(batch_bytes(after, 1))
    bases = log_bases(wal_dir)
    assert big_offset in bases
    big_size = os.path.getsize(Path(wal_dir, f"{big_offset:020d}.log"))
    if len(big) > 512:
        assert after in bases
        assert big_size == len(big)
    got = log.read(big_offset, 1)
    assert got[0].values() == [b"B" * record_bytes]
    assert log.read(after)[0].values() == [value_for(after)]
    log.close()


def test_every_offset_reads_the_batch_holding_it(wal_dir: str, small_config: LogConfig) -> None:
    """Scenario: read(o, max_bytes=1) for every offset of a 60-batch log. Expected: one batch,
    the one holding o (it may start before o), with the right records."""
    log = Log.open(wal_dir, small_config)
    placed = fill(log, 60)
    for base, nxt in placed:
        for offset in range(base, nxt):
            got = log.read(offset, 1)
            assert [(b.base_offset, b.next_offset) for b in got] == [(base, nxt)]
            assert got[0].values() == [value_for(i) for i in range(base, nxt)]
    log.close()


@pytest.mark.parametrize("max_bytes", [1, 96, 200, 400, 700, 1000, 3000])
def test_max_bytes_is_honoured_but_one_batch_always_returned(
    wal_dir: str, small_config: LogConfig, max_bytes: int
) -> None:
    """Scenario: read(o, max_bytes) from every offset of a 60-batch, many-segment log.
    Expected: at least one batch, holding o; more than one only if they fit in max_bytes
    together (also when the run crosses segments); the run is dense."""
    log = Log.open(wal_dir, small_config)
    fill(log, 60)
    for offset in range(log.head):
        got = log.read(offset, max_bytes)
        assert got
        assert got[0].base_offset <= offset < got[0].next_offset
        total = sum(b.size for b in got)
        assert len(got) == 1 or total <= max_bytes, (
            f"read({offset}, {max_bytes}) returned {len(got)} batches, {total} bytes"
        )
        for a, b in pairwise(got):
            assert b.base_offset == a.next_offset
    log.close()


def test_large_max_bytes_reads_to_the_head(wal_dir: str, small_config: LogConfig) -> None:
    """Scenario: read(0, 1 MiB) on a many-segment log. Expected: one call returns every
    batch, crossing all segment boundaries."""
    log = Log.open(wal_dir, small_config)
    placed = fill(log, 40)
    got = log.read(0, 1 << 20)
    assert [(b.base_offset, b.next_offset) for b in got] == placed
    log.close()


def test_read_at_head_returns_nothing(wal_dir: str, small_config: LogConfig) -> None:
    """Scenario: read at exactly the head, on an empty and on a filled log. Expected: []."""
    log = Log.open(wal_dir, small_config)
    assert log.read(0) == []
    fill(log, 10)
    assert log.read(log.head) == []
    log.close()


@pytest.mark.parametrize("where", ["below-first", "far-below", "head+1", "far-past-head"])
def test_out_of_range_reads_raise(wal_dir: str, where: str) -> None:
    """Scenario: retention removed the oldest segments; read below the first offset or past
    the head. Expected: OffsetOutOfRangeError carrying the offset, first offset and head."""
    config = LogConfig(segment_bytes=512, index_interval_bytes=100, retention_bytes=1)
    log = Log.open(wal_dir, config)
    fill(log, 40)
    assert log.apply_retention()
    first, head = log.first_offset, log.head
    assert first > 1
    offset = {
        "below-first": first - 1,
        "far-below": 0,
        "head+1": head + 1,
        "far-past-head": head + 1000,
    }[where]
    with pytest.raises(OffsetOutOfRangeError) as info:
        log.read(offset)
    assert (info.value.offset, info.value.first_offset, info.value.head) == (offset, first, head)
    log.close()


def test_reopen_preserves_everything(wal_dir: str, small_config: LogConfig) -> None:
    """Scenario: fill, close, reopen, twice. Expected: same head, first offset, files (names
    and sizes) and records; the recovery report shows a clean tail."""
    log = Log.open(wal_dir, small_config)
    fill(log, 70)
    head = log.head
    log.close()
    before = files(wal_dir)
    for _ in range(2):
        log = Log.open(wal_dir, small_config)
        assert (log.first_offset, log.head) == (0, head)
        assert log.recovery.truncated_bytes == 0
        assert log.recovery.tail.broken_path is None
        assert log.recovery.segments == len(log_bases(wal_dir))
        assert_intact(log)
        log.close()
        assert files(wal_dir) == before


def test_appends_continue_after_reopen(wal_dir: str, small_config: LogConfig) -> None:
    """Scenario: fill, reopen, append more. Expected: new offsets follow on from the old head
    and the whole log reads back dense and intact."""
    log = Log.open(wal_dir, small_config)
    fill(log, 30)
    head = log.head
    log.close()
    log = Log.open(wal_dir, small_config)
    result = log.append(batch_bytes(log.head, 3))
    assert result.first_offset == head
    fill(log, 20)
    assert_intact(log)
    log.close()


@pytest.mark.parametrize("damage", ["delete", "garbage"])
def test_every_index_damaged_is_rebuilt(wal_dir: str, small_config: LogConfig, damage: str) -> None:
    """Scenario: every .index of a closed log is deleted, or overwritten with bytes that are
    not a plausible index. Expected: reopening works, reads from every offset are right, and
    each sealed .index is rewritten identical to the original once read."""
    log = Log.open(wal_dir, small_config)
    placed = fill(log, 60)
    log.close()
    originals = {
        n: Path(wal_dir, n).read_bytes() for n in os.listdir(wal_dir) if n.endswith(".index")
    }
    for name, data in originals.items():
        path = Path(wal_dir, name)
        if damage == "delete":
            path.unlink()
        else:
            path.write_bytes(b"\xff\xee" * (len(data) // 2 + 3))
    log = Log.open(wal_dir, small_config)
    for base, nxt in placed:
        for offset in range(base, nxt):
            assert log.read(offset, 1)[0].base_offset == base
    log.close()
    for name, data in originals.items():
        assert Path(wal_dir, name).read_bytes() == data, name


def test_leftovers_and_stray_index_are_removed_on_open(
    wal_dir: str, small_config: LogConfig
) -> None:
    """Scenario: a closed log plus .tmp and .deleted leftovers, and a .index with no .log.
    Expected: open removes exactly those, lists them in the recovery report, keeps every
    segment file and a .broken file untouched, and the data reads back intact."""
    log = Log.open(wal_dir, small_config)
    fill(log, 30)
    log.close()
    before = files(wal_dir)
    junk = [
        "00000000000000000000.index.tmp",
        "00000000000000000005.log.tmp",
        "00000000000000000000.log.deleted",
        "00000000000000000000.index.deleted",
        "99999999999999999999.index",
    ]
    for name in junk:
        Path(wal_dir, name).write_bytes(b"junk")
    kept = "00000000000000000000.log.8.broken"
    Path(wal_dir, kept).write_bytes(b"forensics")
    log = Log.open(wal_dir, small_config)
    assert sorted(log.recovery.leftovers_removed) == sorted(junk)
    after = files(wal_dir)
    assert not set(junk) & set(after)
    assert Path(wal_dir, kept).read_bytes() == b"forensics"
    assert {n: s for n, s in after.items() if n != kept} == before
    assert_intact(log)
    log.close()


def test_empty_newest_segment_is_dropped_on_open(wal_dir: str, small_config: LogConfig) -> None:
    """Scenario: roll() leaves an empty newest segment; the log is closed and reopened.
    Expected: the empty pair is removed, the head is unchanged, and the next append lands in
    the previous segment at the old head."""
    log = Log.open(wal_dir, small_config)
    fill(log, 3)
    head = log.head
    log.roll()
    assert log_bases(wal_dir) == [0, head]
    log.close()
    log = Log.open(wal_dir, small_config)
    assert log_bases(wal_dir) == [0]
    assert not Path(wal_dir, f"{head:020d}.index").exists()
    assert log.head == head
    assert log.append(batch_bytes(head, 1)).first_offset == head
    assert_intact(log)
    log.close()


def test_fresh_log_keeps_its_single_empty_segment(wal_dir: str, small_config: LogConfig) -> None:
    """Scenario: open a new directory, close, reopen. Expected: one empty segment at offset 0
    both times, head 0."""
    for _ in range(2):
        log = Log.open(wal_dir, small_config)
        assert (log.first_offset, log.head) == (0, 0)
        log.close()
        assert log_bases(wal_dir) == [0]


def test_roll_on_empty_active_segment_is_a_no_op(wal_dir: str, small_config: LogConfig) -> None:
    """Scenario: roll() twice in a row. Expected: the second roll creates no segment."""
    log = Log.open(wal_dir, small_config)
    fill(log, 2)
    log.roll()
    log.roll()
    assert log_bases(wal_dir) == [0, log.head]
    log.close()


def test_closed_log_refuses_reads_and_writes(wal_dir: str, small_config: LogConfig) -> None:
    """Scenario: close, then append and read. Expected: WalClosedError for both; close is
    idempotent."""
    log = Log.open(wal_dir, small_config)
    fill(log, 2)
    log.close()
    log.close()
    with pytest.raises(WalClosedError):
        log.append(batch_bytes(0, 1))
    with pytest.raises(WalClosedError):
        log.read(0)


# -- retention -----------------------------------------------------------------------


def retention_log(wal_dir: str, retention_bytes: int) -> Log:
    """A small-segment log with size retention and a clock fixed at 1_000_000 ms."""
    config = LogConfig(segment_bytes=512, index_interval_bytes=100, retention_bytes=retention_bytes)
    return Log.open(wal_dir, config, clock=lambda: 1_000_000)


def test_retention_by_bytes_deletes_oldest_whole_segments(wal_dir: str) -> None:
    """Scenario: a log of ~12 segments with retention_bytes=2000. Expected: the oldest
    segments go, both files each; what is left is at least 2000 bytes and dropping the next
    oldest would go below; first_offset is the new first base; the rest reads intact."""
    log = retention_log(wal_dir, retention_bytes=2000)
    fill(log, 60)
    bases = log_bases(wal_dir)
    sizes_before = {b: os.path.getsize(Path(wal_dir, f"{b:020d}.log")) for b in bases}
    deleted = log.apply_retention()
    assert deleted == bases[: len(deleted)]
    assert deleted
    remaining = log_bases(wal_dir)
    assert remaining == bases[len(deleted) :]
    assert not any(Path(wal_dir, f"{b:020d}.index").exists() for b in deleted)
    assert log.first_offset == remaining[0]
    kept_bytes = sum(sizes_before[b] for b in remaining)
    assert kept_bytes >= 2000
    assert kept_bytes - sizes_before[remaining[0]] < 2000
    assert_intact(log)
    with pytest.raises(OffsetOutOfRangeError):
        log.read(log.first_offset - 1)
    assert log.apply_retention() == []
    log.close()


def test_retention_never_deletes_the_active_segment(wal_dir: str) -> None:
    """Scenario: retention_bytes=1 (everything is over the limit). Expected: every sealed
    segment is deleted, the active one stays, and appends continue at the head."""
    log = retention_log(wal_dir, retention_bytes=1)
    fill(log, 40)
    head = log.head
    active = log_bases(wal_dir)[-1]
    log.apply_retention()
    assert log_bases(wal_dir) == [active]
    assert (log.first_offset, log.head) == (active, head)
    assert log.append(batch_bytes(head, 2)).first_offset == head
    assert_intact(log)
    log.close()


@pytest.mark.parametrize(
    "floor_pick",
    ["zero", "first-segment-middle", "boundary", "boundary+1", "middle-of-log", "head", "none"],
)
def test_retention_never_passes_the_floor(wal_dir: str, floor_pick: str) -> None:
    """Scenario: retention_bytes=1 with a floor offset (the slowest subscription's cursor).
    Expected: exactly the segments wholly below the floor are deleted; the segment holding
    the floor stays; first_offset <= floor; no floor deletes every sealed segment."""
    log = retention_log(wal_dir, retention_bytes=1)
    fill(log, 50)
    bases = log_bases(wal_dir)
    assert len(bases) > 6
    floor = {
        "zero": 0,
        "first-segment-middle": bases[1] - 1,
        "boundary": bases[3],
        "boundary+1": bases[3] + 1,
        "middle-of-log": (bases[5] + bases[6]) // 2,
        "head": log.head,
        "none": None,
    }[floor_pick]
    deleted = log.apply_retention(floor_offset=floor)
    # segment i holds [bases[i], bases[i+1]); it may go only if bases[i+1] <= floor
    expected = bases[:-1] if floor is None else [b for b, nxt in pairwise(bases) if nxt <= floor]
    assert deleted == expected
    assert log_bases(wal_dir) == bases[len(expected) :]
    if floor is not None:
        assert log.first_offset <= floor
    assert_intact(log)
    log.close()


@pytest.mark.parametrize("pick", ["zero", "inside-first", "boundary", "boundary+1", "head"])
def test_delete_before_removes_whole_segments_below_the_offset(wal_dir: str, pick: str) -> None:
    """Scenario: retention disabled; delete_before(offset) for offsets at and around segment
    boundaries. Expected: exactly the sealed segments wholly below the offset go, whatever
    retention says; the active segment stays; the rest reads intact."""
    log = Log.open(wal_dir, LogConfig(segment_bytes=512, index_interval_bytes=100))
    fill(log, 50)
    bases = log_bases(wal_dir)
    offset = {
        "zero": 0,
        "inside-first": bases[1] - 1,
        "boundary": bases[3],
        "boundary+1": bases[3] + 1,
        "head": log.head,
    }[pick]
    assert log.apply_retention() == []
    deleted = log.delete_before(offset)
    assert deleted == [b for b, nxt in pairwise(bases) if nxt <= offset]
    assert log_bases(wal_dir) == bases[len(deleted) :]
    assert log.first_offset <= offset
    assert_intact(log)
    log.close()


@pytest.mark.parametrize(
    ("age_ms", "old_deleted"),
    [
        (10_000, False),  # exactly retention_ms old: kept
        (10_001, True),  # one ms older than retention_ms: deleted
    ],
)
def test_retention_by_age_boundary(wal_dir: str, age_ms: int, old_deleted: bool) -> None:
    """Scenario: retention_ms=10_000; several sealed segments hold records stamped 1_000, then
    a roll and segments stamped 500_000; the clock reads 1_000 + age_ms. Expected: the old
    segments are kept at exactly the limit and all deleted one millisecond past it; the young
    ones always stay."""
    now = [0]
    config = LogConfig(segment_bytes=512, index_interval_bytes=100, retention_ms=10_000)
    log = Log.open(wal_dir, config, clock=lambda: now[0])
    fill(log, 40, ts=1_000)
    old_head = log.head
    log.roll()
    fill(log, 30, ts=500_000)
    bases = log_bases(wal_dir)
    old = [b for b in bases if b < old_head]
    assert len(old) > 2
    assert len(bases) > len(old) + 1
    now[0] = 1_000 + age_ms
    deleted = log.apply_retention()
    assert deleted == (old if old_deleted else [])
    assert log.first_offset == (old_head if old_deleted else 0)
    assert_intact(log)
    log.close()


def test_retention_by_age_deletes_only_old_sealed_segments(wal_dir: str) -> None:
    """Scenario: batches stamped 1000 ms apart across many segments, retention_ms=10_000,
    clock at the last stamp + 5_000. Expected: exactly the sealed segments whose newest
    record is more than 10_000 ms older than now are deleted, oldest first, and the same
    answer comes from a reopened log (timestamps recovered from disk)."""
    now = [0]
    config = LogConfig(segment_bytes=512, index_interval_bytes=100, retention_ms=10_000)
    log = Log.open(wal_dir, config, clock=lambda: now[0])
    placed = fill(log, 60, ts=0, ts_step=1000)
    now[0] = 59 * 1000 + 5_000
    bases = log_bases(wal_dir)
    newest_ts = {}
    for b, nxt in zip(bases, [*bases[1:], log.head], strict=True):
        stamps = [k * 1000 for k, (base, _n) in enumerate(placed) if b <= base < nxt]
        newest_ts[b] = max(stamps)
    expected = []
    for b in bases[:-1]:
        if now[0] - newest_ts[b] > 10_000:
            expected.append(b)
        else:
            break
    assert expected, "the scenario must make some segments old"
    assert len(expected) < len(bases) - 1, "the scenario must keep some sealed segments"
    log.close()
    log = Log.open(wal_dir, config, clock=lambda: now[0])
    assert log.apply_retention() == expected
    assert log.first_offset == bases[len(expected)]
    assert_intact(log)
    log.close()


def test_retention_by_age_uses_the_newest_record_even_after_reopen(wal_dir: str) -> None:
    """Scenario: retention_ms=10_000, clock at 20_000; the first segment starts with a record
    stamped 500_000 (producer timestamps need not increase) followed by records stamped
    1_000. Expected: that segment holds a young record, so retention keeps it, before and
    after a reopen alike (the newest timestamp is not just the tail's)."""
    config = LogConfig(segment_bytes=512, index_interval_bytes=100, retention_ms=10_000)
    log = Log.open(wal_dir, config, clock=lambda: 20_000)
    log.append(batch_bytes(0, 1, ts=500_000))
    for i in range(1, 21):
        log.append(batch_bytes(i, 1, ts=1_000))
    first_segment = log.segment_infos()[0]
    assert first_segment.max_timestamp_ms == 500_000
    assert first_segment.next_offset > 2, "the young record must not be alone in its segment"
    assert log.apply_retention() == []
    log.close()
    log = Log.open(wal_dir, config, clock=lambda: 20_000)
    assert log.segment_infos()[0].max_timestamp_ms == 500_000
    assert log.apply_retention() == []
    assert log.first_offset == 0
    log.close()


def test_retention_disabled_deletes_nothing(wal_dir: str, small_config: LogConfig) -> None:
    """Scenario: no retention_ms or retention_bytes. Expected: apply_retention() returns []
    and every segment stays."""
    log = Log.open(wal_dir, small_config, clock=lambda: 10**15)
    fill(log, 40)
    bases = log_bases(wal_dir)
    assert log.apply_retention(floor_offset=None) == []
    assert log_bases(wal_dir) == bases
    log.close()


# -- damage inside a sealed segment -------------------------------------------------


@pytest.mark.parametrize("where", [12, 16, 60, -1], ids=["crc", "magic", "body", "last-byte"])
def test_damage_in_sealed_segment_is_reported_never_cut(wal_dir: str, where: int) -> None:
    """Scenario: one byte flipped in the third batch of the oldest (sealed) segment, then the
    log is reopened. Expected: reopening cuts nothing (same files, no .broken); reading from
    0 returns the two batches before the damage, then CorruptSegmentError there; segments
    after it still read intact; the head is unchanged."""
    config = LogConfig(segment_bytes=512, index_interval_bytes=100)
    log = Log.open(wal_dir, config)
    placed = fill(log, 40)
    head = log.head
    first_next = log_bases(wal_dir)[1]
    log.close()
    seg_path = Path(wal_dir, f"{0:020d}.log")
    data = bytearray(seg_path.read_bytes())
    positions = [0]
    for _ in range(3):
        positions.append(positions[-1] + int.from_bytes(data[positions[-1] + 8 :][:4], "little"))
    at = positions[2] + where if where >= 0 else positions[3] + where
    data[at] ^= 0x10
    seg_path.write_bytes(data)
    before = files(wal_dir)

    log = Log.open(wal_dir, config)
    assert files(wal_dir) == before
    assert log.recovery.truncated_bytes == 0
    assert log.head == head
    got = log.read(0, 1 << 20)
    assert [(b.base_offset, b.next_offset) for b in got] == placed[:2]
    with pytest.raises(CorruptSegmentError) as info:
        log.read(placed[2][0])
    assert info.value.position == positions[2]
    assert info.value.base_offset == 0
    later = read_all(log, first_next)
    assert [o for b in later for o in b.offsets()] == list(range(first_next, head))
    log.close()
    assert files(wal_dir) == before


def test_damage_at_a_segments_first_batch_leaves_earlier_segments_readable(
    wal_dir: str,
) -> None:
    """Scenario: one byte flipped in the first batch of the second segment; the log is
    reopened and read from 0 with a budget that reaches past the damage. Expected: the
    first segment's batches, all of them (the read stops before the damage); a read at
    the second segment's base raises CorruptSegmentError there. Before, the error threw
    away the intact batches already read, so nothing before the damage could be read (or
    delivered) with a large budget."""
    config = LogConfig(segment_bytes=512, index_interval_bytes=100)
    log = Log.open(wal_dir, config)
    placed = fill(log, 40)
    log.close()
    second = log_bases(wal_dir)[1]
    path = Path(wal_dir, f"{second:020d}.log")
    data = bytearray(path.read_bytes())
    data[20] ^= 0x10  # inside the first batch's CRC-covered header
    path.write_bytes(data)
    log = Log.open(wal_dir, config)
    got = log.read(0, 1 << 20)
    assert [(b.base_offset, b.next_offset) for b in got] == [p for p in placed if p[0] < second]
    with pytest.raises(CorruptSegmentError) as info:
        log.read(second, 1 << 20)
    assert info.value.base_offset == second
    log.close()


def _cut_sealed_at_boundary(path: Path, bounds: list[int]) -> None:
    os.truncate(path, bounds[-2])  # the last two batches of the segment are gone


def _cut_sealed_inside_header(path: Path, bounds: list[int]) -> None:
    os.truncate(path, bounds[-1] + 20)  # the last batch keeps 20 bytes of its header


def _remove_sealed(path: Path, bounds: list[int]) -> None:
    del bounds
    path.unlink()  # a whole segment is missing between two others


@pytest.mark.parametrize(
    "damage", [_cut_sealed_at_boundary, _cut_sealed_inside_header, _remove_sealed]
)
def test_sealed_segment_that_ends_short_is_damage(
    wal_dir: str, damage: Callable[[Path, list[int]], None]
) -> None:
    """Scenario: the second sealed segment of a closed log loses its end (cut at a batch
    boundary or inside a header) or vanishes, so offsets below the head have no data.
    Expected: walking reads from offset 0 never get an empty answer below the head: they
    return data or raise CorruptSegmentError, and a read at a lost offset raises
    CorruptSegmentError (the log never passes over damage silently)."""
    config = LogConfig(segment_bytes=512, index_interval_bytes=100)
    log = Log.open(wal_dir, config)
    fill(log, 40)
    head = log.head
    log.close()
    bases = log_bases(wal_dir)
    victim = Path(wal_dir, f"{bases[1]:020d}.log")
    data = victim.read_bytes()
    bounds = [0]
    while bounds[-1] < len(data):
        bounds.append(bounds[-1] + int.from_bytes(data[bounds[-1] + 8 : bounds[-1] + 12], "little"))
    bounds.pop()  # batch start positions
    lost = bases[2] - 1  # the segment's last offset
    damage(victim, bounds)
    log = Log.open(wal_dir, config)
    assert log.head == head
    with pytest.raises(CorruptSegmentError):
        log.read(lost)
    with pytest.raises(CorruptSegmentError):
        read_all(log)
    log.close()


@pytest.mark.parametrize(
    ("second_at", "segments"),
    [
        (999, 1),  # 999 ms after the first append: not old yet
        (1000, 2),  # exactly segment_ms old: roll before appending
    ],
)
def test_roll_by_age_with_injected_clock(wal_dir: str, second_at: int, segments: int) -> None:
    """Scenario: segment_ms=1000; an append at t=0 and another at ``second_at``.
    Expected: the second lands in a new segment exactly when the first is 1000 ms old."""
    now = [0]
    config = LogConfig(segment_bytes=1 << 20, segment_ms=1000)
    log = Log.open(wal_dir, config, clock=lambda: now[0])
    log.append(batch_bytes(0, 1))
    now[0] = second_at
    log.append(batch_bytes(1, 1))
    assert len(log_bases(wal_dir)) == segments
    assert log_bases(wal_dir)[-1] == (1 if segments == 2 else 0)
    assert_intact(log)
    log.close()


def test_segment_age_counts_from_first_append_in_this_process(wal_dir: str) -> None:
    """Scenario: segment_ms=1000; an append at t=0, close, reopen at t=10_000, append, then
    append at 10_999 and 11_000. Expected: no roll on reopen however old the file (age is
    counted from the first append in this process), then a roll at 11_000."""
    now = [0]
    config = LogConfig(segment_bytes=1 << 20, segment_ms=1000)
    log = Log.open(wal_dir, config, clock=lambda: now[0])
    log.append(batch_bytes(0, 1))
    log.close()
    now[0] = 10_000
    log = Log.open(wal_dir, config, clock=lambda: now[0])
    log.append(batch_bytes(1, 1))
    now[0] = 10_999
    log.append(batch_bytes(2, 1))
    assert log_bases(wal_dir) == [0]
    now[0] = 11_000
    log.append(batch_bytes(3, 1))
    assert log_bases(wal_dir) == [0, 3]
    assert_intact(log)
    log.close()


@pytest.mark.parametrize(("extra", "segments"), [(0, 1), (8, 2)])
def test_a_group_rolls_exactly_when_it_no_longer_fits(
    wal_dir: str, extra: int, segments: int
) -> None:
    """Scenario: one ``append_many`` of 4 equal batches into an empty log whose
    ``segment_bytes`` is exactly their total (``extra`` 0), or 8 bytes less.
    Expected: at exactly the total they share one segment; 8 bytes less and the last batch
    opens a second segment; either way the offsets run on and every batch reads back."""
    data = encode_columns([b"v" * 40], timestamps_ms=1)
    config = LogConfig(segment_bytes=4 * len(data) - extra)
    log = Log.open(wal_dir, config)
    try:
        results = log.append_many([log.validate(data) for _ in range(4)])
        assert [r.first_offset for r in results] == [0, 1, 2, 3]
        assert log.segment_count == segments
        assert [b.base_offset for b in read_all(log)] == [0, 1, 2, 3]
    finally:
        log.close()
