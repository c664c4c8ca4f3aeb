"""Disk tests of :class:`wal.segment.Segment`: one ``.log`` + ``.index`` pair.

Covers append/read round trips, the ``max_bytes`` and ``upper`` bounds of a read, the index
as a rebuildable cache (kafka ``LogSegmentTest.testRecoveryFixesCorruptIndex``), and damage
inside a sealed segment, which is reported and never skipped or cut.
"""

from __future__ import annotations

import hashlib
import os
import random
from collections.abc import Callable
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

import wal.recovery
from wal import CorruptSegmentError, FileSystem, LogConfig, RecordBatch, encode_columns
from wal import segment as segment_module
from wal.index import ENTRY
from wal.segment import Segment
from wal.validate import validate_batch

BASE = 1000
INTERVAL = 100
LIMITS = LogConfig().limits


def value_for(i: int) -> bytes:
    """A payload that names its record id and whose content can be checked."""
    return b"%08d:" % i + hashlib.sha256(b"%d" % i).digest()[: i % 29]


def batch_of(first_id: int, count: int, ts: int = 0) -> RecordBatch:
    """A validated batch of ``count`` records with ids ``first_id``..; base offset 0."""
    values = [value_for(i) for i in range(first_id, first_id + count)]
    return validate_batch(encode_columns(values, timestamps_ms=ts), LIMITS)


def fill(seg: Segment, counts: list[int], *, ts0: int = 0) -> list[tuple[int, int, int]]:
    """Append one batch per entry of ``counts``; return (base, next, position) of each.

    Batch ``k`` holds record ids equal to its offsets, and timestamp ``ts0 + k``.
    """
    placed = []
    for k, count in enumerate(counts):
        base, pos = seg.next_offset, seg.size
        seg.append([(base, batch_of(base, count, ts0 + k))], now_ms=0)
        placed.append((base, base + count, pos))
    return placed


def new_segment(directory: Path) -> Segment:
    """An empty segment based at ``BASE`` with an index entry every ~100 B."""
    return Segment.create(FileSystem(), str(directory), BASE, INTERVAL)


def walk(seg: Segment, start: int, upper: int = 1 << 62) -> list[RecordBatch]:
    """Read batch runs from ``start`` until the segment (or ``upper``) ends."""
    out: list[RecordBatch] = []
    offset = start
    while offset < min(seg.next_offset, upper):
        got = seg.read(offset, 1 << 20, upper)
        if not got:
            break
        out += got
        offset = got[-1].next_offset
    return out


def flip_magic(seg: Segment, pos: int) -> None:
    """Flip the magic byte of the batch header at ``pos`` in the segment's ``.log``."""
    with open(seg.path, "r+b") as f:
        f.seek(pos + 16)
        magic = f.read(1)
        f.seek(pos + 16)
        f.write(bytes([magic[0] ^ 0xFF]))


def assert_records(batches: list[RecordBatch], start: int, end: int) -> None:
    """The batches hold exactly the records with ids ``start``..``end - 1``, in order."""
    assert batches, "no batches"
    assert batches[0].base_offset == start
    expected = start
    for b in batches:
        assert b.base_offset == expected
        assert b.values() == [value_for(i) for i in b.offsets()]
        expected = b.next_offset
    assert expected == end


COUNTS = [1, 3, 2, 5, 1, 1, 4, 2, 3, 1, 6, 2]


def sealed_segment(directory: Path) -> tuple[Segment, list[tuple[int, int, int]]]:
    """A sealed, closed and reopened segment of ``COUNTS`` batches."""
    seg = new_segment(directory)
    placed = fill(seg, COUNTS)
    nxt, size = seg.next_offset, seg.size
    seg.seal()
    seg.close()
    reopened = Segment.open_sealed(FileSystem(), str(directory), BASE, nxt, INTERVAL)
    assert reopened.size == size
    return reopened, placed


def test_every_offset_reads_the_batch_holding_it(tmp_path: Path) -> None:
    """Scenario: 12 batches of 1-6 records appended one by one; read(o, max_bytes=1) for every
    offset. Expected: exactly one batch, the one with base <= o < next, with its records."""
    seg = new_segment(tmp_path)
    placed = fill(seg, COUNTS)
    for base, nxt, _pos in placed:
        for offset in range(base, nxt):
            got = seg.read(offset, 1, 1 << 62)
            assert [(b.base_offset, b.next_offset) for b in got] == [(base, nxt)]
            assert got[0].values() == [value_for(i) for i in range(base, nxt)]
    seg.close()


def test_multi_batch_append_round_trips(tmp_path: Path) -> None:
    """Scenario: one append() call carrying five batches, then another carrying three.
    Expected: a read from the base returns all eight, offsets dense, records intact."""
    seg = new_segment(tmp_path)
    items = []
    offset = BASE
    for count in (2, 1, 4, 1, 3):
        items.append((offset, batch_of(offset, count)))
        offset += count
    seg.append(items, now_ms=0)
    more = []
    for count in (5, 1, 2):
        more.append((offset, batch_of(offset, count)))
        offset += count
    seg.append(more, now_ms=0)
    assert seg.next_offset == offset
    assert_records(walk(seg, BASE), BASE, offset)
    assert len(walk(seg, BASE)) == 8
    seg.close()


@pytest.mark.parametrize("max_bytes", [1, 95, 96, 150, 300, 700, 1 << 20])
def test_max_bytes_is_a_soft_limit_with_at_least_one_batch(tmp_path: Path, max_bytes: int) -> None:
    """Scenario: read(o, max_bytes) from every offset. Expected: at least one batch; when more
    than one is returned their total is within max_bytes; the run is contiguous."""
    seg = new_segment(tmp_path)
    fill(seg, COUNTS)
    for offset in range(BASE, seg.next_offset):
        got = seg.read(offset, max_bytes, 1 << 62)
        assert got, f"nothing returned at offset {offset}"
        assert got[0].base_offset <= offset < got[0].next_offset
        total = sum(b.size for b in got)
        assert len(got) == 1 or total <= max_bytes, (offset, total)
        for a, b in pairwise(got):
            assert b.base_offset == a.next_offset
    seg.close()


@pytest.mark.parametrize(
    ("upper_delta", "expected_batches"),
    [
        (0, 0),  # upper at the segment base: nothing
        (1, 1),  # upper at batch 1's base (batch 0 holds one record): batch 0 only
        (2, 2),  # upper inside batch 1 (offsets 1-3): it starts below upper, so included
        (4, 2),  # upper at batch 2's base: batch 2 excluded
        (5, 3),  # upper inside batch 2 (offsets 4-5)
    ],
)
def test_read_stops_before_upper(tmp_path: Path, upper_delta: int, expected_batches: int) -> None:
    """Scenario: read from the base with ``upper`` at a boundary or inside a batch.
    Expected: exactly the batches whose base offset is below ``upper``."""
    seg = new_segment(tmp_path)
    fill(seg, COUNTS)
    got = seg.read(BASE, 1 << 20, BASE + upper_delta)
    assert len(got) == expected_batches
    assert all(b.base_offset < BASE + upper_delta for b in got)
    seg.close()


@pytest.mark.parametrize("delta", [0, 1, 50])
def test_read_at_or_past_next_offset_returns_nothing(tmp_path: Path, delta: int) -> None:
    """Scenario: read at next_offset + delta. Expected: an empty list, no error."""
    seg = new_segment(tmp_path)
    fill(seg, COUNTS)
    assert seg.read(seg.next_offset + delta, 1 << 20, 1 << 62) == []
    seg.close()


def test_sealed_segment_reopens_with_identical_reads(tmp_path: Path) -> None:
    """Scenario: seal, close and reopen a segment with open_sealed. Expected: the same batches
    from every offset, and its max timestamp recovered from disk."""
    seg, placed = sealed_segment(tmp_path)
    for base, nxt, pos in placed:
        for offset in range(base, nxt):
            got = seg.read(offset, 1, 1 << 62)
            assert (got[0].base_offset, got[0].next_offset) == (base, nxt)
        assert pos < seg.size
    assert_records(walk(seg, BASE), BASE, placed[-1][1])
    assert seg.max_timestamp_ms() == len(COUNTS) - 1
    seg.close()


def _index_plausible_but_wrong(original: bytes, log_size: int) -> bytes:
    """Increasing entries inside the log, pointing into the middle of batches."""
    del original
    return ENTRY.pack(1, 8, 0) + ENTRY.pack(5, log_size // 2 + 4, 0)


def _index_random_same_length(original: bytes, log_size: int) -> bytes:
    del log_size
    rng = random.Random(7)
    return bytes(rng.getrandbits(8) for _ in original)


def _index_random_torn(original: bytes, log_size: int) -> bytes:
    del log_size
    rng = random.Random(8)
    return bytes(rng.getrandbits(8) for _ in range(len(original) + 5))


def _index_past_the_log(original: bytes, log_size: int) -> bytes:
    return original + ENTRY.pack(200, log_size + 64, 0)


def _index_not_increasing(original: bytes, log_size: int) -> bytes:
    del log_size
    size = ENTRY.size
    return original[size : 2 * size] + original[:size] + original[2 * size :]


def _index_zeros(original: bytes, log_size: int) -> bytes:
    del log_size
    return bytes(len(original))


def _index_nonsense_from_byte_5(original: bytes, log_size: int) -> bytes:
    """kafka's writeNonsenseToFile(indexFile, 5, length): random bytes from byte 5 on."""
    del log_size
    rng = random.Random(5)
    return original[:5] + bytes(rng.getrandbits(8) for _ in original[5:])


@pytest.mark.parametrize(
    "damage",
    [
        _index_random_same_length,
        _index_random_torn,
        _index_past_the_log,
        _index_not_increasing,
        _index_zeros,
        _index_nonsense_from_byte_5,
        _index_plausible_but_wrong,
    ],
)
def test_damaged_index_is_rebuilt_from_the_log(
    tmp_path: Path, damage: Callable[[bytes, int], bytes]
) -> None:
    """Scenario (kafka testRecoveryFixesCorruptIndex): a sealed segment's .index is replaced by
    garbage, then the segment is reopened and read from every offset. Expected: every read
    returns the right batch (the index is only a cache), and the .index on disk is rebuilt to
    exactly what appending wrote."""
    seg, placed = sealed_segment(tmp_path)
    original = Path(seg.index_path).read_bytes()
    assert len(original) >= 16, "the test needs at least two index entries"
    size = seg.size
    seg.close()
    Path(seg.index_path).write_bytes(damage(original, size))
    seg = Segment.open_sealed(FileSystem(), str(tmp_path), BASE, placed[-1][1], INTERVAL)
    for base, nxt, _pos in placed:
        for offset in range(base, nxt):
            got = seg.read(offset, 1, 1 << 62)
            assert (got[0].base_offset, got[0].next_offset) == (base, nxt)
    assert_records(walk(seg, BASE), BASE, placed[-1][1])
    seg.close()
    assert Path(seg.index_path).read_bytes() == original
    assert os.path.getsize(seg.path) == size


def test_missing_index_is_rebuilt_and_written_back(tmp_path: Path) -> None:
    """Scenario: a sealed segment's .index is deleted. Expected: reads are correct and the
    index is written back, equal to the original, with no .tmp left behind."""
    seg, placed = sealed_segment(tmp_path)
    original = Path(seg.index_path).read_bytes()
    seg.close()
    os.remove(seg.index_path)
    seg = Segment.open_sealed(FileSystem(), str(tmp_path), BASE, placed[-1][1], INTERVAL)
    assert_records(walk(seg, BASE), BASE, placed[-1][1])
    seg.close()
    assert Path(seg.index_path).read_bytes() == original
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]


def read_until_damage(seg: Segment, good: list[RecordBatch]) -> None:
    """Read batch runs from the base, collecting them in ``good``, checking each batch sits
    at the offset the previous one ended at; return only if the end is reached."""
    offset = BASE
    while offset < seg.next_offset:
        got = seg.read(offset, 1 << 20, 1 << 62)
        assert got, f"read at {offset} returned nothing before the damage"
        for b in got:
            assert b.base_offset == offset, "a batch with a wrong offset was returned"
            offset = b.next_offset
        good += got


# Byte positions inside a batch's 56-byte header (see wal.batch) and in its body.
DAMAGE_POINTS = [
    pytest.param(0, 0x02, id="base_offset-low-byte"),
    pytest.param(0, 0x01, id="base_offset-low-bit"),
    pytest.param(7, 0x80, id="base_offset-high-byte"),
    pytest.param(8, 0x08, id="batch_length"),
    pytest.param(12, 0x01, id="crc"),
    pytest.param(16, 0xFF, id="magic"),
    pytest.param(20, 0x01, id="record_count"),
    pytest.param(56, 0x01, id="first-timestamp-in-body"),
    pytest.param(-1, 0x40, id="last-byte"),
]


@pytest.mark.parametrize(("where", "mask"), DAMAGE_POINTS)
def test_damage_in_sealed_segment_stops_reads_there(tmp_path: Path, where: int, mask: int) -> None:
    """Scenario: one byte of batch 6 of a sealed segment is flipped; the segment is reopened
    and read batch run by batch run from its base. Expected: batches 0-5 come back intact with
    their true offsets, then CorruptSegmentError at batch 6's position; a read starting
    inside batch 6 raises too; the file is never changed."""
    seg, placed = sealed_segment(tmp_path)
    seg.close()
    victim = 6
    base, nxt, pos = placed[victim]
    batch_end = placed[victim + 1][2]
    at = pos + where if where >= 0 else batch_end + where
    data = bytearray(Path(seg.path).read_bytes())
    data[at] ^= mask
    Path(seg.path).write_bytes(data)
    seg = Segment.open_sealed(FileSystem(), str(tmp_path), BASE, placed[-1][1], INTERVAL)

    good: list[RecordBatch] = []
    with pytest.raises(CorruptSegmentError) as info:
        read_until_damage(seg, good)
    assert info.value.position == pos
    assert info.value.base_offset == BASE
    assert_records(good, BASE, base)
    for offset in (base, nxt - 1):
        with pytest.raises(CorruptSegmentError):
            seg.read(offset, 1 << 20, 1 << 62)
    seg.close()
    assert Path(seg.path).read_bytes() == bytes(data)


class CountingFs(FileSystem):
    """A real file system that counts the bytes read through ``pread``."""

    def __init__(self) -> None:
        self.read_bytes = 0

    def pread(self, fd: int, size: int, offset: int) -> bytes:
        data = super().pread(fd, size, offset)
        self.read_bytes += len(data)
        return data


@pytest.mark.parametrize("sealed", [False, True], ids=["active", "sealed"])
def test_reads_that_meet_known_damage_do_not_rescan_the_segment(
    tmp_path: Path, sealed: bool, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Scenario: 200 batches (an index entry every ~100 B); the magic byte of batch 150 is
    flipped on disk; reads start at batch 150 five times. Expected: each raises
    CorruptSegmentError at batch 150's position. The first finds out whether the index or
    the log is wrong: a sealed segment by one full scan, the active one by a walk of the
    headers from its start, with no scan (CRC checks and decoding cost ten times more).
    The later ones read less than a tenth of what lies before the damage and never scan
    (reads run on the caller's thread, the event loop, and every dispatch pass retries
    them). The damage is logged once; batches before it still read back intact."""
    scans: list[int] = []
    real_scan = wal.recovery.scan_file

    def counting_scan(fs: FileSystem, fd: int, pos: int, *rest: Any) -> Any:
        if pos == 0:  # a full scan (a sealed segment's first read also checks its tail)
            scans.append(pos)
        return real_scan(fs, fd, pos, *rest)

    fs = CountingFs()
    seg = Segment.create(fs, str(tmp_path), BASE, INTERVAL)
    placed = fill(seg, [1] * 200)
    if sealed:
        nxt = seg.next_offset
        seg.seal()
        seg.close()
        seg = Segment.open_sealed(fs, str(tmp_path), BASE, nxt, INTERVAL)
    victim = 150
    base, _nxt, pos = placed[victim]
    flip_magic(seg, pos)
    monkeypatch.setattr(segment_module, "scan_file", counting_scan)
    for attempt in range(5):
        before = fs.read_bytes
        with pytest.raises(CorruptSegmentError) as info:
            seg.read(base, 1 << 20, 1 << 62)
        assert info.value.position == pos
        if attempt:
            assert fs.read_bytes - before < pos // 10, f"attempt {attempt} scanned again"
    assert len(scans) == (1 if sealed else 0)
    damage_lines = [r for r in caplog.records if "damaged at byte" in r.getMessage()]
    assert len(damage_lines) == 1
    assert_records(walk(seg, BASE, base), BASE, base)
    seg.close()


def test_rename_deleted_moves_both_files(tmp_path: Path) -> None:
    """Scenario: rename_deleted on a sealed segment. Expected: both files now end in
    .deleted, the originals are gone, and the returned paths name them."""
    seg, _placed = sealed_segment(tmp_path)
    renamed = seg.rename_deleted()
    assert sorted(renamed) == sorted([seg.path + ".deleted", seg.index_path + ".deleted"])
    assert not os.path.exists(seg.path)
    assert not os.path.exists(seg.index_path)
    assert all(os.path.exists(p) for p in renamed)


def test_index_entries_reach_the_file_only_after_a_sync_of_their_data(tmp_path: Path) -> None:
    """Scenario: 12 batches appended (several index entries due), then flush, then 3 more
    appended, then seal. Expected: before the flush the ``.index`` file is empty though
    reads already work; after the flush it holds entries that all point at the starts of
    the 12 synced batches; the 3 later batches' entries reach it only with the seal's sync.
    (The recovery rule in ``wal/__init__`` rests on this.)"""
    seg = new_segment(tmp_path)
    placed = fill(seg, COUNTS)
    index_file = tmp_path / f"{BASE:020d}.index"

    def stored() -> list[tuple[int, int]]:
        return [(BASE + rel, pos) for rel, pos, _ts in ENTRY.iter_unpack(index_file.read_bytes())]

    assert stored() == []
    assert_records(walk(seg, BASE), BASE, seg.next_offset)
    seg.flush()
    synced = stored()
    assert synced
    assert set(synced) <= {(base, pos) for base, _nxt, pos in placed}
    more = fill(seg, [2, 2, 2])
    assert stored() == synced
    seg.seal()
    assert stored()[: len(synced)] == synced
    assert set(stored()[len(synced) :]) <= {(base, pos) for base, _nxt, pos in more}
    assert len(stored()) > len(synced)
    seg.close()


def test_header_damage_in_the_active_segment_leaves_later_batches_readable(
    tmp_path: Path,
) -> None:
    """Scenario: 12 batches in the active segment (an index entry at each); the magic
    byte of batch 6's header is flipped on disk; a read starts at batch 6, then reads start
    past it, and 3 more batches are appended. Expected: the read at batch 6 raises
    CorruptSegmentError at its position; reads from batch 7 on, and of the new batches,
    return them intact. (A scan's index stops at the damage: had it replaced the writer's
    index, every read past the damage would have failed too.)"""
    seg = new_segment(tmp_path)
    placed = fill(seg, [5] * 12)
    victim = 6
    base, _nxt, pos = placed[victim]
    flip_magic(seg, pos)
    with pytest.raises(CorruptSegmentError) as info:
        seg.read(base, 1 << 20, 1 << 62)
    assert info.value.position == pos
    after = placed[victim + 1][0]
    assert_records(walk(seg, after), after, placed[-1][1])
    more = fill(seg, [4, 4, 4])
    assert_records(walk(seg, more[0][0]), more[0][0], more[-1][1])
    assert_records(walk(seg, after), after, more[-1][1])
    seg.close()
