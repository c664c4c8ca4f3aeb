"""Fault injection: I/O errors, torn and short writes, crashes at named points, bad input.

Every fault is deterministic: :class:`wal.FaultyFs` fails a chosen call, caps writes, or
raises :class:`wal.SimulatedCrash` at a named crash point; ``power_cut`` then drops what
was never synced. The claims checked (``DESIGN.md`` section 2, ``STYLE.md`` rule 19):

- an I/O error in append, flush or roll latches the log: that append and every later one
  raise ``WalFailedError`` until the log is reopened, and nothing failed was acknowledged;
- reopening recovers: a torn tail is cut, every acknowledged record is intact and in order;
- a rejected batch leaves the log exactly as it was.
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import os
import random
import struct
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from tests.wal._helpers import CrashableFs, read_all
from wal import (
    BatchRejectedError,
    BatchTooLargeError,
    DiskFullError,
    EmptyBatchError,
    Fault,
    FaultyFs,
    FileSystem,
    FsyncPolicy,
    InvalidBatchError,
    Log,
    LogConfig,
    LogWriter,
    RecordTooLargeError,
    SimulatedCrash,
    WalFailedError,
    WalIOError,
    encode_columns,
    hw_checkpoint,
)
from wal.fs import CRASH_POINTS


def value_for(i: int) -> bytes:
    """A payload that names its record id and whose content can be checked."""
    return b"%08d:" % i + hashlib.sha256(b"%d" % i).digest()[: i % 29]


def batch_bytes(ids: Sequence[int]) -> bytes:
    """An encoded batch holding the records with these ids."""
    return encode_columns([value_for(i) for i in ids])


def read_values(log: Log) -> list[bytes]:
    """Every value from the first offset to the head, checking offsets are dense."""
    offset = log.first_offset
    out: list[bytes] = []
    while offset < log.head:
        got = log.read(offset)
        assert got, f"read at {offset} returned nothing below head {log.head}"
        for b in got:
            assert b.base_offset == offset, f"batch at {b.base_offset}, expected {offset}"
            out += b.values()
            offset = b.next_offset
    return out


def files(path: str) -> dict[str, int]:
    """Name -> size of every file in the directory."""
    return {n: os.path.getsize(os.path.join(path, n)) for n in sorted(os.listdir(path))}


def append_and_flush(log: Log, data: bytes) -> None:
    """Append one batch and make it durable: the acknowledgement path."""
    log.append(data)
    log.flush()


def append_until_failure(log: Log, first_id: int) -> None:
    """Append single-record batches (ids from ``first_id``) until an append raises."""
    for i in range(first_id, first_id + 50):
        log.append(batch_bytes([i]))
    raise AssertionError("50 appends and no failure: the injected fault never fired")


# -- I/O errors latch the log ----------------------------------------------------------

IO_FAULTS = [
    # op, errno, partial bytes written before failing, what reopening finds
    # (a write that finds the disk full does not latch: see the disk-full tests below)
    pytest.param("pwritev", errno.EROFS, 0, "acked", id="pwritev-EROFS"),
    pytest.param("pwritev", errno.EIO, 0, "acked", id="pwritev-EIO"),
    pytest.param("pwritev", errno.EIO, 1, "acked", id="pwritev-EIO-torn-1B"),
    pytest.param("pwritev", errno.EIO, 57, "acked", id="pwritev-EIO-torn-57B"),
    pytest.param("pwritev", errno.EIO, 95, "acked", id="pwritev-EIO-torn-95B"),
    pytest.param("fdatasync", errno.EIO, 0, "written", id="fdatasync-EIO"),
    pytest.param("fdatasync", errno.ENOSPC, 0, "written", id="fdatasync-ENOSPC"),
]


@pytest.mark.parametrize(("op", "error", "partial", "after_reopen"), IO_FAULTS)
def test_io_error_latches_the_log_until_reopened(
    wal_dir: str, op: str, error: int, partial: int, after_reopen: str
) -> None:
    """Scenario: 12 batches appended and flushed (acknowledged), then the next append+flush
    meets an injected error on one .log call. Expected: WalFailedError saying what failed
    and to reopen; later appends, flushes and rolls raise it too although the fault fired
    only once; reopening with a healthy fs keeps every acknowledged record, cuts exactly
    the torn bytes, and a batch whose write completed but whose sync failed is intact."""
    config = LogConfig(segment_bytes=4096, index_interval_bytes=100)
    fs = FaultyFs()
    log = Log.open(wal_dir, config, fs=fs)
    for i in range(12):
        log.append(batch_bytes([i]))
    log.flush()
    acked = log.head
    fs.faults.append(Fault(op, error=error, partial=partial, path_contains=".log"))
    doomed = batch_bytes([100, 101])
    with pytest.raises(WalFailedError) as info:
        append_and_flush(log, doomed)
    message = str(info.value)
    assert os.strerror(error) in message
    assert "reopen" in message
    assert info.value.path == wal_dir
    assert log.failure is not None
    attempts: list[Callable[[], object]] = [
        lambda: log.append(batch_bytes([200])),
        log.flush,
        log.roll,
    ]
    for attempt in attempts:
        with pytest.raises(WalFailedError):
            attempt()
    assert fs.faults[0].seen == 1, "later calls must be refused by the latch, not the fault"
    assert read_values(log)[:acked] == [value_for(i) for i in range(acked)]
    log.close()

    log = Log.open(wal_dir, config)
    assert log.recovery.truncated_bytes == partial
    if partial:
        broken = log.recovery.tail.broken_path
        assert broken is not None
        written = struct.pack("<Q", acked) + doomed[8:]  # the log patches the base offset
        assert Path(broken).read_bytes() == written[:partial]
    expected = [value_for(i) for i in range(acked)]
    if after_reopen == "written":
        expected += [value_for(100), value_for(101)]
    assert read_values(log) == expected
    log.append(batch_bytes([300]))
    log.flush()
    assert read_values(log)[-1] == value_for(300)
    log.close()


@pytest.mark.parametrize(
    "fault",
    [
        pytest.param(
            Fault("fdatasync", error=errno.EIO, path_contains=".index"),
            id="seal-index-fdatasync-EIO",
        ),
        pytest.param(
            Fault("open", error=errno.EMFILE, path_contains=".log"), id="new-segment-open-EMFILE"
        ),
        pytest.param(Fault("truncate", error=errno.EIO), id="new-segment-truncate-EIO"),
        pytest.param(
            Fault("fdatasync", error=errno.ENOSPC, path_contains=".log"),
            id="seal-log-fdatasync-ENOSPC",
        ),
    ],
)
def test_failed_roll_latches_and_reopen_recovers(wal_dir: str, fault: Fault) -> None:
    """Scenario: appends fill 512-byte segments until one append must roll, and the roll
    fails (sealing or creating the next segment). Expected: that append raises
    WalFailedError, later ones too; after reopening every acknowledged record is intact
    and appends continue at the head."""
    config = LogConfig(segment_bytes=512, index_interval_bytes=100)
    fs = FaultyFs()
    log = Log.open(wal_dir, config, fs=fs)
    i = 0
    while log.size_bytes < 400:
        log.append(batch_bytes([i]))
        i += 1
    log.flush()
    acked = i
    fs.faults.append(fault)
    with pytest.raises(WalFailedError):
        append_until_failure(log, i)
    with pytest.raises(WalFailedError):
        log.append(batch_bytes([999]))
    log.close()
    log = Log.open(wal_dir, config)
    values = read_values(log)
    assert values[:acked] == [value_for(k) for k in range(acked)]
    assert values == [value_for(k) for k in range(len(values))]
    log.append(batch_bytes([500]))
    assert read_values(log)[-1] == value_for(500)
    log.close()


@pytest.mark.parametrize(
    "fault",
    [
        pytest.param(Fault("truncate", error=errno.EIO), id="new-segment-truncate-EIO"),
        pytest.param(
            Fault("open", error=errno.EMFILE, path_contains=".index"), id="new-index-open-EMFILE"
        ),
        pytest.param(
            Fault("open", error=errno.EMFILE, path_contains=".log"), id="new-log-open-EMFILE"
        ),
    ],
)
def test_failed_roll_leaks_no_descriptor(wal_dir: str, fault: Fault) -> None:
    """Scenario: a roll fails while creating the next segment's files; the latched log is
    closed. Expected: every descriptor the log opened is closed again."""
    fs = CrashableFs()
    log = Log.open(wal_dir, LogConfig(segment_bytes=512, index_interval_bytes=100), fs=fs)
    fs.faults.append(fault)
    with pytest.raises(WalFailedError):
        append_until_failure(log, 0)
    log.close()
    assert fs.open_fds == set()


def test_failed_open_leaks_no_descriptor(wal_dir: str) -> None:
    """Scenario: a log of several segments is reopened and opening the active segment's
    index fails with EMFILE. Expected: WalIOError, and every descriptor opened on the way
    (the sealed segments' and the active .log) is closed again."""
    config = LogConfig(segment_bytes=512, index_interval_bytes=100)
    log = Log.open(wal_dir, config)
    for i in range(30):
        log.append(batch_bytes([i]))
    log.close()
    fs = CrashableFs(faults=[Fault("open", error=errno.EMFILE, path_contains=".index")])
    with pytest.raises(WalIOError):
        Log.open(wal_dir, config, fs=fs)
    assert fs.open_fds == set()


def test_retention_rename_failure_is_reported_and_log_stays_usable(wal_dir: str) -> None:
    """Scenario: retention's rename to .deleted fails with EIO. Expected: WalIOError naming
    the operation; the log is not latched (appends and flushes work); reopening shows a
    dense log with every record intact."""
    config = LogConfig(segment_bytes=512, index_interval_bytes=100, retention_bytes=1)
    fs = FaultyFs(faults=[Fault("rename", error=errno.EIO, path_contains=".log")])
    log = Log.open(wal_dir, config, fs=fs)
    for i in range(30):
        log.append(batch_bytes([i]))
    log.flush()
    with pytest.raises(WalIOError) as info:
        log.apply_retention()
    assert info.value.op == "delete segment"
    assert info.value.errno == errno.EIO
    assert log.failure is None
    log.append(batch_bytes([30]))
    log.flush()
    log.close()
    log = Log.open(wal_dir, config)
    values = read_values(log)
    assert values == [value_for(k) for k in range(log.first_offset, 31)]
    log.close()


# -- a full disk: cut back, stay healthy, accept again once there is room ---------------


@pytest.mark.parametrize("error", [errno.ENOSPC, errno.EDQUOT], ids=["ENOSPC", "EDQUOT"])
@pytest.mark.parametrize("partial", [0, 1, 57], ids=["nothing", "torn-1B", "torn-57B"])
def test_full_disk_write_is_cut_back_and_the_log_stays_healthy(
    wal_dir: str, error: int, partial: int
) -> None:
    """Scenario: 12 batches acknowledged; then every write to the .log finds the disk full
    (having written ``partial`` bytes first), for two appends; then space is freed.
    Expected: each append raises DiskFullError naming the segment file and saying the disk
    is full, the log does not latch, the file holds exactly the acknowledged bytes (the torn
    part was cut back), the second append tried the disk again; once space is back the next
    append lands at the old head, and a reopen cuts nothing and reads every record."""
    config = LogConfig(segment_bytes=4096, index_interval_bytes=100)
    fs = FaultyFs()
    log = Log.open(wal_dir, config, fs=fs)
    for i in range(12):
        append_and_flush(log, batch_bytes([i]))
    acked, size = log.head, files(wal_dir)[f"{0:020d}.log"]
    fault = Fault("pwritev", error=error, partial=partial, times=None, path_contains=".log")
    fs.faults.append(fault)
    for k in range(2):
        with pytest.raises(DiskFullError) as info:
            append_and_flush(log, batch_bytes([100 + k]))
        assert info.value.path == os.path.join(wal_dir, f"{0:020d}.log")
        assert info.value.errno == error
        assert "disk is full" in str(info.value)
        assert log.failure is None
        assert log.head == acked
        assert files(wal_dir)[f"{0:020d}.log"] == size
    assert fault.seen == 2, "the second append must try the disk again"
    fs.faults.clear()  # space freed
    append_and_flush(log, batch_bytes([200]))
    expected = [value_for(i) for i in range(12)] + [value_for(200)]
    assert read_values(log) == expected
    log.close()
    log = Log.open(wal_dir, config)
    assert log.recovery.truncated_bytes == 0
    assert read_values(log) == expected
    log.close()


@pytest.mark.parametrize(
    "fault",
    [
        pytest.param(
            Fault("pwritev", error=errno.ENOSPC, after=1, partial=30, path_contains=".log"),
            id="write-to-the-new-segment",
        ),
        pytest.param(
            Fault("open", error=errno.ENOSPC, path_contains=".log"), id="create-the-new-segment"
        ),
    ],
)
def test_full_disk_in_a_group_that_spans_a_roll_keeps_the_written_prefix(
    wal_dir: str, fault: Fault
) -> None:
    """Scenario: one append_many of 8 batches must roll after the first few (3 or so); the
    disk fills while the roll creates the next segment or writes into it. Expected:
    DiskFullError whose ``written`` counts the batches that fit before the roll; the log
    holds exactly those (sealed, whole) and does not latch; once
    space is back the next append rolls and lands right after them; a reopen agrees."""
    config = LogConfig(segment_bytes=512, index_interval_bytes=100)
    fs = FaultyFs()
    log = Log.open(wal_dir, config, fs=fs)
    i = 0
    while log.size_bytes + 3 * len(batch_bytes([0])) <= 512:
        append_and_flush(log, batch_bytes([i]))
        i += 1
    fs.faults.append(fault)
    batches = [log.validate(batch_bytes([100 + k])) for k in range(8)]
    fit, room = 0, 512 - log.size_bytes
    while batches[fit].size <= room:
        room -= batches[fit].size
        fit += 1
    assert 1 <= fit < 8
    with pytest.raises(DiskFullError) as info:
        log.append_many(batches)
    assert info.value.written == fit
    assert log.failure is None
    assert log.head == i + fit
    fs.faults.clear()
    append_and_flush(log, batch_bytes([300]))
    expected = [value_for(k) for k in range(i)] + [value_for(100 + k) for k in range(fit)]
    expected.append(value_for(300))
    assert read_values(log) == expected
    assert log.segment_count == 2
    log.close()
    log = Log.open(wal_dir, config)
    assert log.recovery.truncated_bytes == 0
    assert read_values(log) == expected
    log.close()


@pytest.mark.asyncio
async def test_writer_rejects_appends_while_the_disk_is_full_and_resumes_by_itself(
    wal_dir: str,
) -> None:
    """Scenario: a writer with 5 acknowledged appends; the disk fills; 10 concurrent appends
    and a flush arrive; space is freed; 3 more appends. Expected: the 10 fail with
    DiskFullError (not WalFailedError), the high-water mark stays at 5 and reads still
    work; after space is freed the appends are acknowledged at offsets 5, 6, 7 with no
    restart, and everything reads back in order."""
    fs = FaultyFs()
    writer = await LogWriter.open(wal_dir, LogConfig(), fs=fs)
    for i in range(5):
        await writer.append(batch_bytes([i]))
    fs.faults.append(Fault("pwritev", error=errno.ENOSPC, times=None, path_contains=".log"))
    outcomes = await asyncio.gather(
        *(writer.append(batch_bytes([100 + k])) for k in range(10)), return_exceptions=True
    )
    assert all(isinstance(o, DiskFullError) for o in outcomes), outcomes
    await writer.flush()
    assert writer.high_water_mark == 5
    assert [b.values()[0] for b in writer.read(0)] == [value_for(i) for i in range(5)]
    fs.faults.clear()
    got = [await writer.append(batch_bytes([5 + k])) for k in range(3)]
    assert [r.first_offset for r in got] == [5, 6, 7]
    assert writer.high_water_mark == 8
    values = [v for b in writer.read(0) for v in b.values()]
    assert values == [value_for(i) for i in range(8)]
    await writer.aclose()


# -- the writer: a failed group commit --------------------------------------------------


class GatedFs(FaultyFs):
    """Holds the writer inside one fdatasync (after it succeeded) until released, so that
    the test can queue a whole group behind it and arm a fault meanwhile."""

    def __init__(self) -> None:
        super().__init__()
        self.armed = False
        self.entered = threading.Event()
        self.released = threading.Event()

    def fdatasync(self, fd: int) -> None:
        super().fdatasync(fd)
        if self.armed:
            self.armed = False
            self.entered.set()
            self.released.wait(10)


WRITER_FAULTS = [
    pytest.param("pwritev", errno.EIO, 0, id="pwritev-EIO"),
    pytest.param("pwritev", errno.EIO, 300, id="pwritev-EIO-torn-300B"),
    pytest.param("fdatasync", errno.EIO, 0, id="fdatasync-EIO"),
]


@pytest.mark.asyncio
@pytest.mark.parametrize(("op", "error", "partial"), WRITER_FAULTS)
async def test_failed_group_commit_fails_every_pending_append(
    wal_dir: str, op: str, error: int, partial: int
) -> None:
    """Scenario: 5 appends acknowledged; a 6th is held inside its fdatasync while 15 more
    queue behind it and a fault is armed; then released. Expected: the 6th is acknowledged;
    the 15 form one group and all fail with the same WalFailedError; the high-water mark
    stops at the 6th; later appends and flushes fail; after reopening every acknowledged
    record is intact, the torn bytes are cut, and anything of the failed group that
    survived follows in queue order."""
    fs = GatedFs()
    writer = await LogWriter.open(wal_dir, LogConfig(), fs=fs)
    for i in range(5):
        await writer.append(batch_bytes([i]))
    fs.armed = True
    held = asyncio.create_task(writer.append(batch_bytes([5])))
    assert await asyncio.to_thread(fs.entered.wait, 10)
    fault = Fault(op, error=error, partial=partial, path_contains=".log")
    fs.faults.append(fault)
    group = [asyncio.create_task(writer.append(batch_bytes([6 + k]))) for k in range(15)]
    await asyncio.sleep(0)
    fs.released.set()
    sixth = await held
    outcomes = await asyncio.gather(*group, return_exceptions=True)
    assert all(isinstance(o, WalFailedError) for o in outcomes), outcomes
    assert len({id(o) for o in outcomes}) == 1, "the 15 appends were not one group"
    assert fault.seen == 1
    assert writer.high_water_mark == sixth.last_offset + 1 == 6
    with pytest.raises(WalFailedError):
        await writer.append(batch_bytes([99]))
    with pytest.raises(WalFailedError):
        await writer.flush()
    assert writer.read(0)[-1].next_offset == 6
    await asyncio.wait_for(writer.aclose(), 10)

    # The torn write may hold whole batches of the failed group: they survive (they were
    # never acknowledged, so a retry duplicates them: at-least-once); the rest is cut.
    whole, cut = 0, partial
    while cut >= len(batch_bytes([6 + whole])):
        cut -= len(batch_bytes([6 + whole]))
        whole += 1
    log = Log.open(wal_dir, LogConfig())
    assert log.recovery.truncated_bytes == cut
    values = read_values(log)
    assert values[:6] == [value_for(i) for i in range(6)]
    assert values == [value_for(i) for i in range(len(values))]
    if op == "pwritev":
        assert len(values) == 6 + whole
    log.close()


@pytest.mark.asyncio
async def test_writer_open_fails_cleanly_when_its_first_sync_fails(wal_dir: str) -> None:
    """Scenario: LogWriter.open's initial fdatasync (of recovered data) fails with EIO.
    Expected: WalFailedError from open, every descriptor it opened is closed, and a later
    open with a healthy fs works."""
    fs = CrashableFs(faults=[Fault("fdatasync", error=errno.EIO, path_contains=".log")])
    with pytest.raises(WalFailedError):
        await LogWriter.open(wal_dir, LogConfig(), fs=fs)
    assert fs.open_fds == set()
    async with await LogWriter.open(wal_dir, LogConfig()) as writer:
        assert (await writer.append(batch_bytes([0]))).first_offset == 0


# -- short writes ------------------------------------------------------------------------


def test_short_writes_still_produce_an_identical_log(tmp_path: Path) -> None:
    """Scenario: the same 80 batches appended through a FaultyFs that writes at most 7 bytes
    per pwritev, and through the real fs. Expected: many more pwritev calls than appends,
    and the two directories are byte-for-byte identical; the short-written log reopens
    clean and reads back intact."""
    config = LogConfig(segment_bytes=512, index_interval_bytes=100)
    short = FaultyFs(max_write=7)
    for path, fs in ((tmp_path / "short", short), (tmp_path / "plain", FileSystem())):
        log = Log.open(str(path), config, fs=fs)
        for i in range(80):
            log.append(batch_bytes(range(i, i + 1 + i % 3)))
            if i % 10 == 0:
                log.flush()
        log.close()
    assert short.calls["pwritev"] > 80 * 10
    names = sorted(os.listdir(tmp_path / "plain"))
    assert sorted(os.listdir(tmp_path / "short")) == names
    for name in names:
        assert (tmp_path / "short" / name).read_bytes() == (tmp_path / "plain" / name).read_bytes()
    log = Log.open(str(tmp_path / "short"), config)
    assert log.recovery.truncated_bytes == 0
    assert len(read_values(log)) == log.head
    log.close()


# -- invalid input leaves the log unchanged ---------------------------------------------


def _too_large_record() -> bytes:
    return encode_columns([b"x" * 50, b"y" * 101])


def _too_large_batch() -> bytes:
    return encode_columns([b"z" * 90] * 4)


def _crc_flipped() -> bytes:
    data = bytearray(batch_bytes([1, 2]))
    data[-1] ^= 1
    return bytes(data)


def _truncated() -> bytes:
    return batch_bytes([1, 2])[:-8]


def _two_batches() -> bytes:
    return batch_bytes([1]) + batch_bytes([2])


def _trailing_byte() -> bytes:
    return batch_bytes([1]) + b"\x00"


def _bad_magic() -> bytes:
    data = bytearray(batch_bytes([1]))
    data[16] = 0x47
    return bytes(data)


def _empty() -> bytes:
    return b""


def _header_only() -> bytes:
    return batch_bytes([1])[:56]


INVALID = [
    pytest.param(_too_large_record, RecordTooLargeError, id="record-too-large"),
    pytest.param(_too_large_batch, BatchTooLargeError, id="batch-too-large"),
    pytest.param(_crc_flipped, InvalidBatchError, id="crc-mismatch"),
    pytest.param(_truncated, InvalidBatchError, id="truncated"),
    pytest.param(_two_batches, InvalidBatchError, id="two-batches"),
    pytest.param(_trailing_byte, InvalidBatchError, id="trailing-byte"),
    pytest.param(_bad_magic, InvalidBatchError, id="bad-magic"),
    pytest.param(_empty, InvalidBatchError, id="empty-bytes"),
    pytest.param(_header_only, InvalidBatchError, id="header-only"),
]

LIMITED = LogConfig(
    segment_bytes=512, index_interval_bytes=100, max_record_bytes=100, max_batch_bytes=300
)


@pytest.mark.parametrize(("make", "error"), INVALID)
def test_rejected_batch_leaves_the_log_unchanged(
    wal_dir: str, make: Callable[[], bytes], error: type[InvalidBatchError]
) -> None:
    """Scenario: a log with data; append() of a malformed or over-limit batch. Expected: the
    typed error (its message says nothing was appended), the same head, identical file
    names and sizes, the log not latched, and the next valid append lands at the head."""
    log = Log.open(wal_dir, LIMITED)
    for i in range(8):
        log.append(batch_bytes([i]))
    log.flush()
    head, before = log.head, files(wal_dir)
    with pytest.raises(error) as info:
        log.append(make())
    assert isinstance(info.value, BatchRejectedError)  # a WalError and the codec's error
    assert error is InvalidBatchError or type(info.value) is error
    assert "nothing was appended" in str(info.value)
    assert log.head == head
    assert files(wal_dir) == before
    assert log.failure is None
    assert log.append(batch_bytes([8])).first_offset == head
    log.close()


@pytest.mark.asyncio
@pytest.mark.parametrize(("make", "error"), INVALID)
async def test_writer_rejects_bad_batch_without_harm(
    wal_dir: str, make: Callable[[], bytes], error: type[InvalidBatchError]
) -> None:
    """Scenario: LogWriter.append() of a malformed or over-limit batch. Expected: the typed
    error; head, high-water mark and files unchanged; the writer keeps accepting appends."""
    async with await LogWriter.open(wal_dir, LIMITED) as writer:
        await writer.append(batch_bytes([0]))
        head, hwm, before = writer.head, writer.high_water_mark, files(wal_dir)
        with pytest.raises(error):
            await writer.append(make())
        assert (writer.head, writer.high_water_mark) == (head, hwm)
        assert files(wal_dir) == before
        assert (await writer.append(batch_bytes([1]))).first_offset == head


def test_empty_record_list_cannot_be_encoded() -> None:
    """Scenario: encode_columns([]). Expected: EmptyBatchError, an InvalidBatchError."""
    with pytest.raises(EmptyBatchError):
        encode_columns([])


# -- crashes at named points ---------------------------------------------------------------

CRASH_CONFIG = LogConfig(segment_bytes=512, index_interval_bytes=100, retention_bytes=1500)


class Workload:
    """A random mix of log operations, keeping the model a crash is checked against.

    ``values[o]`` is the payload attempted at offset ``o`` (appended or being appended);
    offsets below ``acked`` were acknowledged: a flush, roll or clean close returned after
    they were written. ``floor`` is the highest retention floor passed so far. A
    truncation lowers ``acked`` to its offset before it starts (a replica gives up records
    on purpose) and raises it to the offset once done (it syncs what it keeps); ``values``
    is cut only once it returned, so a crash inside one leaves a prefix of ``values``.
    ``epoch`` is the newest leader epoch assigned.
    """

    def __init__(self, path: Path, fs: CrashableFs, rng: random.Random) -> None:
        self.path = path
        self.fs = fs
        self.rng = rng
        self.values: list[bytes] = []
        self.acked = 0
        self.floor = 0
        self.next_id = 0
        self.epoch = 0
        self.log = Log.open(str(path), CRASH_CONFIG, fs=fs)

    def step(self) -> None:
        """One random operation."""
        r = self.rng.random()
        if r < 0.5:
            self.append()
        elif r < 0.6:
            self.log.roll()
            self.acked = self.log.head
        elif r < 0.7:
            self.retention()
        elif r < 0.76:
            self.truncate()
        elif r < 0.78:
            self.restart()
        elif r < 0.8:
            self.epoch += 1
            self.log.leader_epochs.assign(self.epoch, self.log.head)
        elif r < 0.9:
            self.reopen_torn()
        else:
            self.reopen_with_lost_index()

    def append(self) -> None:
        for _ in range(self.rng.randint(1, 3)):
            ids = range(self.next_id, self.next_id + self.rng.randint(1, 3))
            self.next_id = ids.stop
            self.values += [value_for(i) for i in ids]  # attempted before the call
            result = self.log.append(batch_bytes(ids))
            assert result.last_offset + 1 == len(self.values)
        if self.rng.random() < 0.7:
            self.log.flush()
            self.acked = self.log.head
            if self.rng.random() < 0.5:  # a replica saves its mark (never past acked)
                checkpoint = self.log.hw_checkpoint
                mark = self.rng.randint(max(self.log.first_offset, self.acked - 3), self.acked)
                checkpoint.advance(mark, checkpoint.generation)

    def retention(self) -> None:
        floor = self.rng.randint(self.log.first_offset, self.log.head)
        self.floor = max(self.floor, floor)
        self.log.apply_retention(floor)
        assert self.log.first_offset <= self.floor

    def truncate(self) -> None:
        """Cut the log back to one of its last few batch boundaries."""
        bounds = [b.base_offset for b in read_all(self.log)] + [self.log.head]
        offset = self.rng.choice(bounds[-6:])
        cuts = offset < self.log.head
        self.acked = min(self.acked, offset)
        self.log.truncate_to(offset)
        del self.values[offset:]
        if cuts:
            self.acked = offset
        assert self.log.head == offset

    def restart(self) -> None:
        """Empty the log to a new start at or a little past the head (a replica whose
        leader's log start passed it). The records are given up on purpose: ``acked``
        drops to the first offset before, ``floor`` rises to the start (nothing below
        it is retained after), and ``values`` is padded with placeholders to the start,
        so every outcome of a crash inside (a prefix, an empty log at the old first
        offset or at the start) passes :func:`check_survivors`."""
        start = self.log.head + self.rng.randint(0, 5)
        if start == self.log.first_offset:
            start += 1  # a new base: the segment swap (restart.after_create) runs
        self.acked = min(self.acked, self.log.first_offset)
        self.floor = max(self.floor, start)
        self.values += [b""] * (start - len(self.values))
        self.log.restart_at(start)
        self.acked = start
        assert (self.log.first_offset, self.log.head) == (start, start)

    def reopen_torn(self) -> None:
        """The process dies idle, power fails, a half-written batch is at the end."""
        self.fs.die()
        self.fs.power_cut(self.rng)
        newest = max(p for p in self.path.iterdir() if p.name.endswith(".log"))
        with newest.open("ab") as f:
            f.write(batch_bytes([10**7])[: self.rng.randint(1, 60)])
        self.log = Log.open(str(self.path), CRASH_CONFIG, fs=self.fs)
        assert self.log.head >= self.acked
        del self.values[self.log.head :]

    def reopen_with_lost_index(self) -> None:
        """A clean restart after a sealed segment's index was lost; then read everything."""
        self.acked = self.log.head
        self.log.close()
        sealed = sorted(p for p in self.path.iterdir() if p.name.endswith(".index"))[:-1]
        if sealed:
            self.rng.choice(sealed).unlink()
        self.log = Log.open(str(self.path), CRASH_CONFIG, fs=self.fs)
        assert read_values(self.log) == self.values[self.log.first_offset :]


def check_survivors(path: Path, w: Workload) -> int:
    """Reopen with the real fs: every acknowledged record is intact and in order, what else
    survived is a prefix of what was attempted, and the high-watermark checkpoint as the
    crash left it is not past the log's end (a cut lowers it first). Returns the head."""
    saved = path / hw_checkpoint.FILE_NAME
    checkpoint = hw_checkpoint.decode(saved.read_bytes()) if saved.exists() else 0
    log = Log.open(str(path), CRASH_CONFIG)
    try:
        assert checkpoint is not None
        assert checkpoint <= log.head, (checkpoint, log.head)
        assert w.acked <= log.head <= len(w.values), (w.acked, log.head, len(w.values))
        assert log.first_offset <= w.floor
        assert read_values(log) == w.values[log.first_offset : log.head]
        assert all(e.start_offset <= log.head for e in log.leader_epochs.entries())
        return log.head
    finally:
        log.close()


@pytest.mark.parametrize("seed", range(1, 9))
@pytest.mark.parametrize("point", CRASH_POINTS)
def test_crash_at_named_point_loses_no_acknowledged_record(
    tmp_path: Path, point: str, seed: int
) -> None:
    """Scenario: a seeded mix of appends, flushes, rolls, retention, truncations, restarts
    at a new start, leader epoch assignments, torn restarts and restarts with a lost
    sealed index runs; after a random number of steps a crash is armed at ``point`` and
    the run goes on until it fires; the descriptors are dropped unsynced and the power
    is cut (unsynced bytes keep a random prefix). Expected: the crash fires at that
    point; reopening with the real fs finds every acknowledged record intact and in
    order and nothing but a prefix of the attempted ones, and no leader epoch starting
    past the end; a second reopen cuts nothing more."""
    rng = random.Random(f"{point}/{seed}")
    fs = CrashableFs()
    path = tmp_path / "log"
    w = Workload(path, fs, rng)
    arm_at = rng.randint(0, 40)
    fired = None
    try:
        for step in range(600):
            if step == arm_at:
                fs.crash_at = point
            w.step()
    except SimulatedCrash as crash:
        fired = crash.point
    assert fired == point, f"the workload never passed {point}"
    fs.die()
    fs.power_cut(rng)
    head = check_survivors(path, w)
    log = Log.open(str(path), CRASH_CONFIG)
    assert log.recovery.truncated_bytes == 0
    assert log.head == head
    assert not [p for p in path.iterdir() if p.name.endswith((".tmp", ".deleted"))]
    log.close()


def test_every_crash_point_is_covered() -> None:
    """Scenario: the crash-point table. Expected: it names exactly the fifteen points the
    parametrized crash test exercises (a new point must get a scenario here)."""
    assert set(CRASH_POINTS) == {
        "append.after_write",
        "append.after_sync",
        "roll.after_seal",
        "roll.after_create",
        "retention.after_rename",
        "recovery.after_broken",
        "index.after_tmp",
        "truncate.after_segment_delete",
        "truncate.after_index",
        "truncate.after_data",
        "leader_epochs.after_tmp",
        "leader_epochs.after_rename",
        "restart.after_create",
        "hw_checkpoint.after_tmp",
        "hw_checkpoint.after_rename",
    }


class _Choices(random.Random):
    """An rng for ``power_cut`` that always draws ``value`` and the lowest integer."""

    def __init__(self, value: float) -> None:
        super().__init__(0)
        self._value = value

    def random(self) -> float:
        return self._value

    def randint(self, a: int, b: int) -> int:
        return a


@pytest.mark.parametrize("lose", ["tail", "page"])
def test_a_sync_covers_only_what_was_written_before_it_began(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, lose: str
) -> None:
    """Scenario: 100 bytes are written; an fdatasync begins on another thread and is held;
    meanwhile the first 10 bytes are rewritten and 100 more appended; the sync ends, the
    file is closed, the power fails, and every choice the model has goes against the data
    (the unsynced tail cut as far as it may be, or every unsynced page reverted).
    Expected: what the sync began with survives, and nothing written while it ran does
    (the tail falls back to 100 bytes, or the rewritten page reverts to its content as of
    the sync's start); counting the size at the sync's end would keep both."""
    fs = FaultyFs(page_size=64)
    path = str(tmp_path / "f")
    fd = fs.open(path, create=True, exclusive=True)
    first = bytes(range(100))
    fs.pwritev(fd, [first], 0)
    began, release = threading.Event(), threading.Event()
    real = os.fdatasync

    def held(descriptor: int) -> None:
        began.set()
        assert release.wait(10)
        real(descriptor)

    monkeypatch.setattr(os, "fdatasync", held)
    syncing = threading.Thread(target=fs.fdatasync, args=(fd,))
    syncing.start()
    assert began.wait(10)
    fs.pwritev(fd, [b"X" * 10], 0)
    fs.pwritev(fd, [b"Y" * 100], 100)
    release.set()
    syncing.join(10)
    monkeypatch.setattr(os, "fdatasync", real)
    fs.close(fd)
    fs.power_cut(_Choices(0.0 if lose == "tail" else 0.9))
    data = Path(path).read_bytes()
    if lose == "tail":  # the size falls back to what the sync began with
        assert len(data) == 100
        assert data[10:] == first[10:]
    else:  # the size stays; each page written during the sync reverts
        assert len(data) == 200
        assert data[:100] == first
        assert data[128:] == b"\0" * 72  # page 2 never reached the disk: no old content


@pytest.mark.asyncio
async def test_the_interval_mark_claims_only_what_its_sync_began_with(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Scenario: fsync ``interval`` (every 20 ms). Batch A is appended; its periodic
    fdatasync (on a worker thread) is held while batch B is appended and acknowledged (the
    policy acknowledges after the write); then the sync ends, and every later periodic
    sync is held for good. The process dies and the power fails, every choice against the
    data. Expected: the high-water mark stops at A's end, not B's (B's bytes came after
    the sync began); after the power cut the log reopens with A whole, and B at most as a
    prefix the recovery cut off or kept whole."""
    fs = CrashableFs(page_size=64)
    path = str(tmp_path / "log")
    armed, held, release = threading.Event(), threading.Event(), threading.Event()
    forever = threading.Event()
    real = os.fdatasync

    def fdatasync(fd: int) -> None:
        periodic = not threading.current_thread().name.startswith("wal-writer")
        if armed.is_set() and periodic:
            if not held.is_set():
                held.set()
                assert release.wait(10)
            else:
                forever.wait(10)  # the process "dies" while this one waits
        real(fd)

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    config = LogConfig(fsync=FsyncPolicy.INTERVAL, fsync_interval_ms=20)
    writer = await LogWriter.open(path, config, fs=fs)
    marks: list[int] = []
    writer.add_listener(marks.append)
    armed.set()
    a = await writer.append(encode_columns([value_for(i) for i in range(3)]))
    for _ in range(1000):
        if held.is_set():
            break
        await asyncio.sleep(0.01)
    assert held.is_set(), "no periodic sync began"
    b = await writer.append(encode_columns([value_for(i) for i in range(3, 8)]))
    release.set()
    for _ in range(1000):
        if marks:
            break
        await asyncio.sleep(0.01)
    assert marks == [a.last_offset + 1]
    assert writer.high_water_mark == a.last_offset + 1 < b.last_offset + 1
    fs.die()
    fs.power_cut(_Choices(0.0))
    forever.set()
    monkeypatch.setattr(os, "fdatasync", real)
    log = Log.open(path, config)
    try:
        assert log.head in (a.last_offset + 1, b.last_offset + 1)
        values = [v for batch in read_all(log) for v in batch.values()]
        assert values == [value_for(i) for i in range(log.head)]
    finally:
        log.close()
