"""Tests of the raw read a leader serves its followers (:meth:`wal.Log.read_raw`,
:meth:`wal.LogWriter.read_raw`): batch headers walked, bytes sliced from the segment, no
CRC computed and no record decoded.

The claims checked, on real files: a raw read is byte for byte the decoded read's batches
laid end to end, for any offset, budget and upper bound, across segments; a bit flipped
inside a batch passes the leader and is refused by the follower's append (the CRC is
checked there, before anything is written); a damaged header where the read starts is
damage, one after it ends the answer; a segment rolled while a thread reads changes
nothing; a segment retention deletes while a thread reads makes the read out of range;
the raw and the decoded read end alike (the same error, or the same bytes before damage
in a later segment) on a closed log, out of range, on an I/O error and on damage.
"""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.wal._replica import log_bytes, log_files, random_batches
from wal import (
    CorruptBatchError,
    CorruptSegmentError,
    Fault,
    FaultyFs,
    Log,
    LogConfig,
    LogWriter,
    OffsetOutOfRangeError,
    WalClosedError,
    WalIOError,
    iter_batches,
)
from wal.fs import reading_nonblocking

#: Segments of ~4 KiB, an index entry every 256 B, no tail cache: every read is the files'.
CONFIG = LogConfig(segment_bytes=4096, index_interval_bytes=256, tail_cache_bytes=0)


class GatedFs(FaultyFs):
    """Holds the first blocking ``pread`` (a cold-read thread's, not the loop's) of a file
    whose path contains ``gate`` until ``release`` is set; ``entered`` says it waits."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = ""
        self.entered = threading.Event()
        self.release = threading.Event()

    def pread(self, fd: int, size: int, offset: int) -> bytes:
        if self.gate and self.gate in self.path_of(fd) and not reading_nonblocking():
            self.gate = ""
            self.entered.set()
            self.release.wait(10)
        return super().pread(fd, size, offset)


def _outcome(read: Callable[[], bytes]) -> bytes | type[BaseException]:
    """What ``read`` answers, or the type of what it raises."""
    try:
        return read()
    except Exception as exc:  # the outcome compared is the error's type
        return type(exc)


#: A case's change to the log: returns the log to read (reopened, when the change is on
#: disk) and the offset to read from.
Change = Callable[[Log, Path], tuple[Log, int]]


def _close(log: Log, path: Path) -> tuple[Log, int]:
    log.close()
    return log, 0


def _delete_oldest(log: Log, path: Path) -> tuple[Log, int]:
    log.delete_before(log.segment_infos()[1].base_offset)
    return log, 0  # below the first offset now


def _past_head(log: Log, path: Path) -> tuple[Log, int]:
    return log, log.head + 1


def _open_fails(nth: int) -> Change:
    def reopen(log: Log, path: Path) -> tuple[Log, int]:
        name = sorted(log_files(path))[nth]
        log.close()
        fs = FaultyFs(faults=[Fault("open", path_contains=name, times=None)])
        return Log.open(str(path), CONFIG, fs=fs), 0

    return reopen


def _damaged_header(nth: int) -> Change:
    def damage(log: Log, path: Path) -> tuple[Log, int]:
        name = sorted(log_files(path))[nth]
        log.close()
        data = bytearray((path / name).read_bytes())
        data[16] ^= 0xFF  # the first batch's magic: after base (8), length (4) and crc (4)
        (path / name).write_bytes(bytes(data))
        return Log.open(str(path), CONFIG), 0

    return damage


def _first_segment(path: Path) -> bytes:
    return log_files(path)[min(log_files(path))]


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (_close, WalClosedError),
        (_delete_oldest, OffsetOutOfRangeError),
        (_past_head, OffsetOutOfRangeError),
        (_open_fails(0), WalIOError),
        (_open_fails(1), WalIOError),
        (_damaged_header(0), CorruptSegmentError),
        (_damaged_header(1), _first_segment),
    ],
    ids=[
        "closed",
        "below-first-offset",
        "past-head",
        "io-error-where-the-read-starts",
        "io-error-in-a-later-segment",
        "damage-where-the-read-starts",
        "damage-at-a-later-segments-start",
    ],
)
def test_the_raw_and_the_decoded_read_end_alike(
    tmp_path: Path,
    change: Change,
    expected: type[BaseException] | Callable[[Path], bytes],
) -> None:
    """Scenario: a log of 60 batches over several 4 KiB segments, changed as the case
    says, then read raw and decoded from the offset the case gives, with a budget past
    the whole log. Expected: both reads end the same way, the case's: its error
    (WalClosedError on a closed log; OffsetOutOfRangeError below the first offset left
    by retention and past the head; WalIOError when a segment's file cannot be opened,
    where the read starts or in a later segment; CorruptSegmentError for a damaged
    header where the read starts), or, for damage at a later segment's first batch, the
    bytes of every batch before it and nothing more."""
    path = tmp_path / "log"
    log = Log.open(str(path), CONFIG)
    for batch in random_batches(random.Random(3), 60):
        log.append(batch)
    log.flush()
    assert log.segment_count > 3
    log, offset = change(log, path)
    raw = _outcome(lambda: log.read_raw(offset, 1 << 30))
    decoded = _outcome(lambda: b"".join(bytes(b.buffer) for b in log.read(offset, 1 << 30)))
    log.close()
    want = expected if isinstance(expected, type) else expected(path)
    assert raw == want
    assert decoded == want


async def _leader(path: Path, n: int, fs: FaultyFs | None = None, seed: int = 1) -> LogWriter:
    writer = await LogWriter.open(str(path), CONFIG, fs=fs)
    for batch in random_batches(random.Random(seed), n):
        await writer.append(batch)
    return writer


async def _entered(event: threading.Event) -> None:
    for _ in range(500):
        if event.is_set():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the cold read never reached the gated file")


@pytest.mark.asyncio
async def test_a_raw_read_is_the_decoded_reads_bytes_everywhere(tmp_path: Path) -> None:
    """Scenario: a log of 300 batches over many 4 KiB segments; a raw read and a decoded
    read of the same (offset, max_bytes, upper) for every offset and six budgets, with
    the head and an upper bound inside the log. Expected: the raw bytes are always the
    decoded batches' bytes end to end (the same first batch from inside a batch, the same
    whole first batch past the budget, the same stop at a segment's end or the bound)."""
    writer = await _leader(tmp_path / "log", 300)
    await writer.aclose()
    log = Log.open(str(tmp_path / "log"), CONFIG)
    try:
        assert log.segment_count > 10
        head = log.head
        compared = 0
        for upper in (head, head * 2 // 3):
            for offset in range(head + 1):
                for budget in (0, 1, 300, 1000, 5000, 1 << 20):
                    raw = log.read_raw(offset, budget, upper=upper)
                    decoded = log.read(offset, budget, upper=upper)
                    assert raw == b"".join(bytes(b.buffer) for b in decoded), (offset, budget)
                    compared += bool(raw)
        assert compared > head * 8
        assert log.read_raw(0, 1 << 30) == log_bytes(tmp_path / "log")
        with pytest.raises(OffsetOutOfRangeError):
            log.read_raw(head + 1)
    finally:
        log.close()


@pytest.mark.asyncio
async def test_a_flipped_bit_inside_a_batch_reaches_the_follower_which_refuses_it(
    tmp_path: Path,
) -> None:
    """Scenario: a bit flipped in the middle of a batch (its records, not its header) in
    the oldest, sealed segment; the leader reads it raw, a follower appends the answer.
    Expected: the decoded read raises CorruptSegmentError there; the raw read answers the
    bytes (no CRC computed on the leader); the follower refuses them with
    CorruptBatchError and writes nothing."""
    writer = await _leader(tmp_path / "leader", 120)
    await writer.aclose()
    first = min(log_files(tmp_path / "leader"))
    path = tmp_path / "leader" / first
    data = bytearray(path.read_bytes())
    victim = list(iter_batches(bytes(data)))[2]
    position = sum(b.size for b in list(iter_batches(bytes(data)))[:2]) + victim.size - 3
    data[position] ^= 0x10
    path.write_bytes(bytes(data))
    log = Log.open(str(tmp_path / "leader"), CONFIG)
    try:
        with pytest.raises(CorruptSegmentError):
            log.read(victim.base_offset, 1)
        raw = log.read_raw(victim.base_offset, 1)
        assert raw == bytes(data[position - victim.size + 3 : position + 3])
    finally:
        log.close()
    follower = await LogWriter.open(str(tmp_path / "follower"), CONFIG)
    try:
        await follower.append_replicated(bytes(data[: position - victim.size + 3]))
        with pytest.raises(CorruptBatchError):
            await follower.append_replicated(raw)
        assert follower.head == victim.base_offset
    finally:
        await follower.aclose()


@pytest.mark.asyncio
async def test_a_damaged_header_is_damage_where_the_read_starts_and_an_end_after_it(
    tmp_path: Path,
) -> None:
    """Scenario: the magic byte of the fifth batch of the oldest (sealed) segment
    overwritten. Expected: a raw read from the first batch answers the four batches before
    it and stops; a raw read from the damaged batch raises CorruptSegmentError."""
    writer = await _leader(tmp_path / "log", 120)
    await writer.aclose()
    first = min(log_files(tmp_path / "log"))
    path = tmp_path / "log" / first
    data = bytearray(path.read_bytes())
    batches = list(iter_batches(bytes(data)))
    position = sum(b.size for b in batches[:4])
    data[position + 16] ^= 0xFF  # magic: after base (8), length (4) and crc (4)
    path.write_bytes(bytes(data))
    log = Log.open(str(tmp_path / "log"), CONFIG)
    try:
        assert log.read_raw(0, 1 << 30) == bytes(data[:position])
        with pytest.raises(CorruptSegmentError):
            log.read_raw(batches[4].base_offset, 1 << 30)
    finally:
        log.close()


@pytest.mark.asyncio
async def test_a_segment_rolled_while_a_thread_reads_changes_nothing(tmp_path: Path) -> None:
    """Scenario: a raw read from offset 0 goes to a cold-read thread (the oldest segment
    is out of the page cache) and is held in its first pread; meanwhile the log takes 40
    more batches and rolls its segment twice. Expected: the read answers the log's bytes
    from 0 exactly to the durable end it was called at, whole batches, nothing of what
    came after."""
    fs = GatedFs()
    writer = await _leader(tmp_path / "log", 80, fs)
    first = min(log_files(tmp_path / "log"))
    fs.cold.add(first)
    fs.gate = first
    end = writer.durable_end
    read = asyncio.create_task(writer.read_raw(0, 1 << 30, durable=True))
    await _entered(fs.entered)
    for batch in random_batches(random.Random(2), 40):
        await writer.append(batch)
        if writer.head % 20 < 3:
            await writer.roll()
    await writer.roll()
    fs.release.set()
    got = await read
    assert writer.cold_reads == 1
    assert writer.head > end
    assert list(iter_batches(got))[-1].next_offset == end
    assert got == log_bytes(tmp_path / "log")[: len(got)]
    await writer.aclose()


@pytest.mark.asyncio
async def test_a_segment_deleted_while_a_thread_reads_is_out_of_range(tmp_path: Path) -> None:
    """Scenario: a raw read from offset 0 over the whole log goes to a cold-read thread
    and is held in its first pread of the oldest segment; meanwhile retention deletes the
    three oldest segments (``delete_before``). Expected: the read raises
    OffsetOutOfRangeError (the next segment's file is gone, and 0 is below the log's
    first offset now), not an I/O error; a read from the new first offset answers."""
    fs = GatedFs()
    writer = await _leader(tmp_path / "log", 120, fs)
    files = sorted(log_files(tmp_path / "log"))
    assert len(files) > 4
    fs.cold.add(files[0])
    fs.gate = files[0]
    read = asyncio.create_task(writer.read_raw(0, 1 << 30, durable=True))
    await _entered(fs.entered)
    floor = int(files[3].split(".")[0])
    assert await writer.delete_before(floor) == [int(f.split(".")[0]) for f in files[:3]]
    fs.release.set()
    with pytest.raises(OffsetOutOfRangeError):
        await read
    assert writer.first_offset == floor
    again = await writer.read_raw(floor, 1 << 30, durable=True)
    assert again == log_bytes(tmp_path / "log")
    await writer.aclose()
