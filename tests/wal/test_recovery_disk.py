"""Torn and damaged tails on disk: what :meth:`wal.Log.open` cuts, keeps and reports.

The recovery rule (``wal/__init__.py``): only the active segment's tail is checked; the scan
stops at the first batch that is torn, corrupt or out of sequence; everything from there is
copied to ``<segment>.log.<position>.broken`` and cut; the count is reported. Each test
builds a clean log once, then damages a fresh copy of it per case.
"""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import struct
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.wal._helpers import CrashableFs, read_all
from wal import FaultyFs, Log, LogConfig, encode_columns
from wal.index import ENTRY


def value_for(i: int) -> bytes:
    """A payload that names its record id and whose content can be checked."""
    return b"%08d:" % i + hashlib.sha256(b"%d" % i).digest()[: i % 29]


def batch_bytes(first_id: int, count: int) -> bytes:
    """An encoded batch of records ``first_id``..``first_id + count - 1``."""
    return encode_columns([value_for(i) for i in range(first_id, first_id + count)])


def assert_intact(log: Log, head: int) -> None:
    """The log holds exactly records 0..head-1, each payload matching its offset."""
    assert log.head == head
    batches = read_all(log)
    offsets = [o for b in batches for o in b.offsets()]
    assert offsets == list(range(head))
    assert [v for b in batches for v in b.values()] == [value_for(o) for o in offsets]


def broken_files(path: Path) -> list[str]:
    """Names of the .broken files in a directory."""
    return sorted(n for n in os.listdir(path) if ".broken" in n)


@dataclass(frozen=True)
class Template:
    """A closed, clean log and where its last batch lies."""

    path: Path
    config: LogConfig
    active: Path  # the active segment's .log
    last_base: int  # base offset of the last batch
    start: int  # byte position of the last batch in the active segment
    end: int  # size of the active segment (end of the last batch)


def build(root: Path, config: LogConfig, *, batches: int = 14, alone: bool = False) -> Template:
    """Write ``batches`` batches (several segments); with ``alone`` the last batch is the only
    one in a freshly rolled active segment."""
    path = root / "template"
    log = Log.open(str(path), config)
    for k in range(batches - 1):
        log.append(batch_bytes(log.head, 1 + k % 3))
    if alone:
        log.roll()
    last_base = log.head
    last = batch_bytes(last_base, 3)
    log.append(last)
    log.flush()
    info = log.segment_infos()[-1]
    log.close()
    active = path / f"{info.base_offset:020d}.log"
    end = active.stat().st_size
    start = end - len(last)
    assert (start == 0) == alone, "the last batch must be alone exactly when asked"
    return Template(path, config, active, last_base, start, end)


def copy_of(t: Template, dest: Path) -> Path:
    """A fresh copy of the template directory; returns the copy's active .log path."""
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(t.path, dest)
    return dest / t.active.name


SHAPES = [
    pytest.param(1, False, id="every-batch-indexed"),
    pytest.param(100, False, id="index-every-100B"),
    pytest.param(1 << 30, False, id="no-index-entries"),
    pytest.param(100, True, id="last-batch-alone-in-segment"),
]


@pytest.mark.parametrize(("interval", "alone"), SHAPES)
def test_torn_tail_at_every_byte_of_the_last_batch(
    tmp_path: Path, interval: int, alone: bool
) -> None:
    """Scenario: for every byte position p inside the last batch, the active .log is cut at p
    and the log reopened. Expected: every earlier batch intact, head = the last batch's base,
    truncated_bytes = p - start, a .broken file named after the position holding exactly the
    dropped bytes (none when p is the batch boundary), the .log cut back to the boundary,
    and appending then reopening again is clean."""
    t = build(tmp_path, LogConfig(segment_bytes=512, index_interval_bytes=interval), alone=alone)
    original = t.active.read_bytes()
    assert t.end - t.start > 56
    for cut in range(t.start, t.end):
        case = tmp_path / "case"
        active = copy_of(t, case)
        os.truncate(active, cut)
        log = Log.open(str(case), t.config)
        where = f"cut at byte {cut} (batch spans {t.start}..{t.end})"
        assert log.recovery.truncated_bytes == cut - t.start, where
        assert_intact(log, t.last_base)
        if cut > t.start:
            expected_name = f"{active.name}.{t.start}.broken"
            assert log.recovery.tail.broken_path == str(case / expected_name), where
            assert broken_files(case) == [expected_name], where
            assert (case / expected_name).read_bytes() == original[t.start : cut], where
            assert active.stat().st_size == t.start, where
        else:
            assert log.recovery.tail.broken_path is None, where
            assert broken_files(case) == [], where
        assert log.append(batch_bytes(t.last_base, 2)).first_offset == t.last_base
        log.close()
        log = Log.open(str(case), t.config)
        assert log.recovery.truncated_bytes == 0, where
        assert_intact(log, t.last_base + 2)
        log.close()


def test_random_bit_flips_in_the_last_batch(tmp_path: Path) -> None:
    """Scenario: 300 seeded trials each flip 1-3 random bits anywhere in the last batch, then
    reopen. Expected: recovery never raises, everything before the batch is intact, and the
    whole damaged batch (and only it) is cut and kept in the .broken file."""
    t = build(tmp_path, LogConfig(segment_bytes=512, index_interval_bytes=100))
    original = t.active.read_bytes()
    rng = random.Random(20240601)
    for trial in range(300):
        data = bytearray(original)
        flipped = []
        for _ in range(rng.randint(1, 3)):
            bit = rng.randrange((t.end - t.start) * 8)
            data[t.start + bit // 8] ^= 1 << (bit % 8)
            flipped.append(bit)
        if bytes(data) == original:
            continue  # the same bit twice: nothing to detect
        case = tmp_path / "case"
        active = copy_of(t, case)
        active.write_bytes(data)
        log = Log.open(str(case), t.config)
        where = f"trial {trial}, bits {flipped} of the batch at {t.start}"
        assert log.recovery.truncated_bytes == t.end - t.start, where
        assert (case / broken_files(case)[0]).read_bytes() == bytes(data[t.start :]), where
        assert_intact(log, t.last_base)
        log.close()


def _zeros(n: int) -> bytes:
    return bytes(n)


GARBAGE = [
    pytest.param(_zeros(1), id="1-zero"),
    pytest.param(_zeros(8), id="8-zeros"),
    pytest.param(_zeros(55), id="55-zeros"),
    pytest.param(_zeros(56), id="56-zeros-a-header's-worth"),
    pytest.param(_zeros(57), id="57-zeros"),
    pytest.param(_zeros(4096), id="4096-zeros"),
    pytest.param(bytes(random.Random(3).getrandbits(8) for _ in range(100)), id="random-100"),
    pytest.param(b"\xff" * 64, id="ff-64"),
]


@pytest.mark.parametrize("garbage", GARBAGE)
def test_garbage_after_the_last_batch_is_cut(tmp_path: Path, garbage: bytes) -> None:
    """Scenario: bytes that are not a batch are appended after the last valid batch (a
    preallocated or half-written tail). Expected: no batch is lost, the head is unchanged,
    exactly the garbage is cut and kept in the .broken file."""
    t = build(tmp_path, LogConfig(segment_bytes=512, index_interval_bytes=100))
    case = tmp_path / "case"
    active = copy_of(t, case)
    with active.open("ab") as f:
        f.write(garbage)
    log = Log.open(str(case), t.config)
    assert log.recovery.truncated_bytes == len(garbage)
    assert (case / f"{active.name}.{t.end}.broken").read_bytes() == garbage
    assert active.stat().st_size == t.end
    assert_intact(log, t.last_base + 3)
    log.close()


@pytest.mark.parametrize(
    "base_delta", [-3, -1, 1, 1000], ids=["repeat-last", "overlap", "gap-1", "gap-1000"]
)
def test_valid_batch_out_of_sequence_is_cut(tmp_path: Path, base_delta: int) -> None:
    """Scenario: a whole, valid batch is appended whose base offset is head + base_delta
    (a repeat of the last batch, an overlap, or a gap). Expected: it is cut as a tail (GAP)
    and its bytes kept; nothing before it moves."""
    t = build(tmp_path, LogConfig(segment_bytes=512, index_interval_bytes=100))
    head = t.last_base + 3
    stray = bytearray(batch_bytes(0, 2))
    struct.pack_into("<Q", stray, 0, head + base_delta)
    case = tmp_path / "case"
    active = copy_of(t, case)
    with active.open("ab") as f:
        f.write(stray)
    log = Log.open(str(case), t.config)
    assert log.recovery.truncated_bytes == len(stray)
    assert "offset" in log.recovery.tail.reason
    assert_intact(log, head)
    log.close()


@pytest.mark.parametrize("cut_batches", [1, 3])
@pytest.mark.parametrize("extra", [0, 20], ids=["at-boundary", "mid-batch"])
def test_index_entries_past_the_log_are_dropped(
    tmp_path: Path, cut_batches: int, extra: int
) -> None:
    """Scenario: the active .log is cut back by whole batches (plus ``extra`` bytes of the
    next one) under a longer .index, as a crash between data and index writes can leave it.
    Expected: head = base of the first lost batch, truncated_bytes = extra, the .index on
    disk loses exactly the entries past the log, and later appends and reads from every
    offset are right."""
    config = LogConfig(segment_bytes=1 << 20, index_interval_bytes=1)
    path = tmp_path / "log"
    log = Log.open(str(path), config)
    bounds = []  # (base, position) of each batch
    for k in range(12):
        bounds.append((log.head, log.size_bytes))
        log.append(batch_bytes(log.head, 1 + k % 3))
    log.close()
    index = path / f"{0:020d}.index"
    entries = [e[:2] for e in ENTRY.iter_unpack(index.read_bytes())]
    assert len(entries) == 11  # every batch after the first is indexed
    lost_base, lost_pos = bounds[-cut_batches]
    os.truncate(path / f"{0:020d}.log", lost_pos + extra)
    log = Log.open(str(path), config)
    assert log.recovery.truncated_bytes == extra
    assert_intact(log, lost_base)
    kept = [e for e in entries if e[1] < lost_pos]
    on_disk = [e[:2] for e in ENTRY.iter_unpack(index.read_bytes())]
    assert on_disk == kept
    for _ in range(6):
        log.append(batch_bytes(log.head, 2))
    head = log.head
    for offset in range(head):
        got = log.read(offset, 1)
        assert got[0].base_offset <= offset < got[0].next_offset
    log.close()
    log = Log.open(str(path), config)
    assert_intact(log, head)
    log.close()


def test_active_index_missing_is_rebuilt_and_reported(tmp_path: Path) -> None:
    """Scenario: the active segment's .index (which had entries) is deleted. Expected: the
    whole segment is scanned, nothing is cut, the report says the index was rebuilt, the
    rebuilt .index equals the original, and every offset reads right."""
    config = LogConfig(segment_bytes=1 << 20, index_interval_bytes=100)
    path = tmp_path / "log"
    log = Log.open(str(path), config)
    for k in range(20):
        log.append(batch_bytes(log.head, 1 + k % 3))
    head = log.head
    log.close()
    index = path / f"{0:020d}.index"
    original = index.read_bytes()
    assert len(original) >= 16
    index.unlink()
    log = Log.open(str(path), config)
    assert log.recovery.truncated_bytes == 0
    assert log.recovery.tail.scanned_bytes == (path / f"{0:020d}.log").stat().st_size
    assert log.recovery.tail.index_rebuilt is True
    assert_intact(log, head)
    log.close()
    assert index.read_bytes() == original


def test_active_index_with_a_wrong_older_entry_is_not_trusted(tmp_path: Path) -> None:
    """Scenario: in the active segment's .index an older entry is shifted by 8 bytes (still
    increasing, inside the log) while the newest is right. Expected: the index is only a
    cache, so reads from every offset are still right (no CorruptSegmentError)."""
    config = LogConfig(segment_bytes=1 << 20, index_interval_bytes=1)
    path = tmp_path / "log"
    log = Log.open(str(path), config)
    for k in range(10):
        log.append(batch_bytes(log.head, 1 + k % 3))
    head = log.head
    log.close()
    index = path / f"{0:020d}.index"
    raw = bytearray(index.read_bytes())
    rel, pos, ts = ENTRY.unpack_from(raw, 2 * ENTRY.size)
    ENTRY.pack_into(raw, 2 * ENTRY.size, rel, pos + 8, ts)
    index.write_bytes(raw)
    log = Log.open(str(path), config)
    for offset in range(head):
        got = log.read(offset, 1)
        assert got[0].base_offset <= offset < got[0].next_offset
    assert_intact(log, head)
    log.close()


def test_large_segment_without_index_scans_in_chunks(tmp_path: Path) -> None:
    """Scenario: a ~9 MiB active segment (one 5 MB batch among 100 KB ones), so the recovery
    scan crosses its 4 MiB read chunks, with its .index deleted and 1000 bytes of a torn
    batch at the end. Expected: every batch is found, exactly the torn bytes are cut, and
    every batch reads back intact."""
    config = LogConfig(segment_bytes=64 << 20, index_interval_bytes=4096)
    path = tmp_path / "log"
    log = Log.open(str(path), config)
    sizes = [100_000] * 20 + [-1] + [100_000] * 20
    for size in sizes:
        if size < 0:
            values = [bytes([k]) * 1_000_000 for k in range(5)]
        else:
            values = [value_for(log.head) + b"." * size]
        log.append(encode_columns(values))
    head = log.head
    log.close()
    seg = path / f"{0:020d}.log"
    size = seg.stat().st_size
    assert size > 8 << 20
    torn = encode_columns([b"t" * 5000])[:1000]
    with seg.open("ab") as f:
        f.write(torn)
    (path / f"{0:020d}.index").unlink()
    log = Log.open(str(path), config)
    assert log.recovery.truncated_bytes == 1000
    assert log.head == head
    batches = read_all(log)
    assert [b.record_count for b in batches] == [1 if s > 0 else 5 for s in sizes]
    assert batches[20].values() == [bytes([k]) * 1_000_000 for k in range(5)]
    assert batches[21].values()[0].startswith(value_for(25))
    log.close()


def test_second_tear_at_the_same_position_keeps_both_broken_files(tmp_path: Path) -> None:
    """Scenario: a tail is torn and recovered, then torn again at the same position with
    different bytes. Expected: the second .broken file gets a new name; the first keeps its
    bytes."""
    t = build(tmp_path, LogConfig(segment_bytes=512, index_interval_bytes=100))
    case = tmp_path / "case"
    active = copy_of(t, case)
    for junk in (b"\x01" * 30, b"\x02" * 40):
        with active.open("ab") as f:
            f.write(junk)
        log = Log.open(str(case), t.config)
        assert log.recovery.truncated_bytes == len(junk)
        log.close()
    names = broken_files(case)
    assert len(names) == 2
    contents = sorted((case / n).read_bytes() for n in names)
    assert contents == [b"\x01" * 30, b"\x02" * 40]
    first = case / f"{active.name}.{t.end}.broken"
    assert first.read_bytes() == b"\x01" * 30


def test_an_index_entry_never_vouches_for_unsynced_data(tmp_path: Path) -> None:
    """Regression (issue 14 A). Scenario: 4 batches appended and synced; then a large batch
    A and a small batch B are appended and not synced (B's position gets an index entry:
    one entry per batch); the process dies and the power cut loses a page inside A but keeps
    B's page and the ``.index`` as written. Expected: no entry in the ``.index`` points at A
    or B (entries are written only for synced data), so recovery scans from before A, cuts
    A and B, and every read succeeds, also once the segment is sealed. (Before the fix the
    entry for B was on disk, recovery trusted everything before it, and the hole in A
    made a later read of the sealed segment fail with CorruptSegmentError.)"""
    config = LogConfig(segment_bytes=1 << 20, index_interval_bytes=1)
    path = tmp_path / "log"
    fs = CrashableFs()
    log = Log.open(str(path), config, fs=fs)
    for k in range(4):
        log.append(batch_bytes(log.head, 1 + k % 3))
    log.flush()
    synced = log.head
    a_pos = log.size_bytes
    log.append(encode_columns([b"A" * 9000]))
    b_pos = log.size_bytes
    log.append(batch_bytes(log.head, 1))
    fs.die()  # no sync: A and B are in the page cache only
    positions = [ENTRY.unpack_from(e)[1] for e in _entries(path / f"{0:020d}.index")]
    segment = path / f"{0:020d}.log"
    raw = bytearray(segment.read_bytes())
    lost = (a_pos // 4096 + 1) * 4096  # a page wholly inside A: the disk never got it
    assert a_pos < lost
    assert lost + 4096 <= b_pos
    raw[lost : lost + 4096] = bytes(4096)
    segment.write_bytes(raw)
    log = Log.open(str(path), config)
    assert log.head == synced, "recovery accepted a hole: it trusted an unsynced region"
    assert log.recovery.truncated_bytes == len(raw) - a_pos
    assert_intact(log, synced)
    assert a_pos not in positions
    assert b_pos not in positions
    log.append(batch_bytes(synced, 2))
    log.roll()
    log.close()
    log = Log.open(str(path), config)
    assert_intact(log, synced + 2)
    log.close()


def _entries(index: Path) -> list[bytes]:
    """The raw 16-byte entries of an ``.index`` file."""
    data = index.read_bytes()
    return [data[i : i + ENTRY.size] for i in range(0, len(data) - ENTRY.size + 1, ENTRY.size)]


class _SyncLog(FaultyFs):
    """Records the path of every fdatasync."""

    def __init__(self) -> None:
        super().__init__()
        self.synced: list[str] = []

    def fdatasync(self, fd: int) -> None:
        self.synced.append(self._paths.get(fd, ""))
        super().fdatasync(fd)


def test_index_entries_recovery_drops_are_cut_and_the_cut_synced(tmp_path: Path) -> None:
    """Scenario: a clean log of 10 batches (one index entry each); then two entries that
    point past the end of the log are appended to its ``.index`` (stale entries of data a
    power cut took back). Expected: opening drops them, cuts the ``.index`` to the trusted
    entries and fdatasyncs the ``.index`` before anything is appended, so they cannot come
    back later and vouch for new data written at their positions."""
    config = LogConfig(segment_bytes=1 << 20, index_interval_bytes=1)
    path = tmp_path / "log"
    log = Log.open(str(path), config)
    for k in range(10):
        log.append(batch_bytes(log.head, 1 + k % 3))
    head, end = log.head, log.size_bytes
    log.close()
    index = path / f"{0:020d}.index"
    trusted = index.read_bytes()
    index.write_bytes(trusted + ENTRY.pack(head, end, 0) + ENTRY.pack(head + 2, end + 90, 0))
    fs = _SyncLog()
    log = Log.open(str(path), config, fs=fs)
    assert index.read_bytes() == trusted
    assert str(index) in fs.synced
    assert_intact(log, head)
    log.close()
