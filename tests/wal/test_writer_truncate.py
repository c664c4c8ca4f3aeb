"""Async tests of :meth:`wal.LogWriter.truncate_to`: a replica cutting its log back while
readers, listeners and the periodic sync go on.

Claims: afterwards the head and the high-water mark are the cut, no read (tail cache,
files, cold reads) returns a dropped record, listeners are not told of the lower mark and
are told of the next append's, a refused truncation changes nothing, and a caller
cancelled midway still leaves the truncation done.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from tests.wal._helpers import read_all
from wal import (
    FaultyFs,
    FsyncPolicy,
    LogConfig,
    LogWriter,
    NotBatchBoundaryError,
    OffsetOutOfRangeError,
    encode_columns,
)

CONFIG = LogConfig(segment_bytes=512, index_interval_bytes=100)


async def fill(writer: LogWriter, first: int, count: int) -> list[int]:
    """Append ``count`` two-record batches valued ``b"<first + i>"``; return their bases."""
    bases = []
    for i in range(first, first + count):
        result = await writer.append(encode_columns([b"%d" % i, b"%d+" % i]))
        bases.append(result.first_offset)
    return bases


async def values_from(writer: LogWriter, offset: int) -> list[bytes]:
    """Every record value from ``offset`` to the high-water mark, read as the loop reads."""
    out: list[bytes] = []
    while offset < writer.high_water_mark:
        batches = await writer.aread(offset)
        assert batches, f"nothing at {offset} below the mark {writer.high_water_mark}"
        assert batches[0].base_offset == offset  # reads here start at batch boundaries
        out += [r.value for b in batches for r in b.records()]
        offset = batches[-1].next_offset
    return out


@pytest.mark.asyncio
async def test_truncate_drops_the_tail_from_every_read_and_appends_go_on(tmp_path: Path) -> None:
    """Scenario: 40 batches over many segments (the newest in the tail cache), then the
    writer truncates inside a sealed segment, and 5 new batches are appended. Expected:
    head and mark are the cut at once; a read at the cut gives nothing, past it raises;
    the new batches take the cut's offsets and every read returns them, never the dropped
    ones (the tail cache emptied); the listener was not called for the truncation, then
    was called with the new marks."""
    async with await LogWriter.open(str(tmp_path), CONFIG) as writer:
        bases = await fill(writer, 0, 40)
        marks: list[int] = []
        writer.add_listener(marks.append)
        offset = bases[8]
        removed = await writer.truncate_to(offset)
        assert removed
        assert all(base >= offset for base in removed)
        assert (writer.head, writer.high_water_mark) == (offset, offset)
        assert marks == []
        assert await writer.aread(offset) == []
        with pytest.raises(OffsetOutOfRangeError):
            await writer.aread(offset + 1)
        new = await fill(writer, 1000, 5)
        assert new[0] == offset
        assert marks == [b + 2 for b in new]
        values = await values_from(writer, 0)
        old = [v for i in range(8) for v in (b"%d" % i, b"%d+" % i)]
        assert values == old + [v for i in range(1000, 1005) for v in (b"%d" % i, b"%d+" % i)]
        assert [r.value for b in read_all(writer.log) for r in b.records()] == values


@pytest.mark.asyncio
@pytest.mark.parametrize("case", ["inside-batch", "past-head"])
async def test_a_refused_truncation_leaves_the_writer_as_it_was(tmp_path: Path, case: str) -> None:
    """Scenario: truncate_to an offset inside a batch, or past the head. Expected: the
    typed error; head, mark and reads unchanged; the next append lands at the head."""
    async with await LogWriter.open(str(tmp_path), CONFIG) as writer:
        bases = await fill(writer, 0, 20)
        head = writer.head
        before = await values_from(writer, 0)
        error = NotBatchBoundaryError if case == "inside-batch" else OffsetOutOfRangeError
        with pytest.raises(error):
            await writer.truncate_to(bases[5] + 1 if case == "inside-batch" else head + 2)
        assert (writer.head, writer.high_water_mark) == (head, head)
        assert await values_from(writer, 0) == before
        assert (await fill(writer, 99, 1)) == [head]


class HeldSyncFs(FaultyFs):
    """A FaultyFs whose next fdatasync of a ``.log`` after ``hold`` is set waits for
    ``release``: it holds the writer thread in a group commit, so that a truncation
    queued behind it is still pending when its caller is cancelled."""

    def __init__(self) -> None:
        super().__init__()
        self.hold = False
        self.began = threading.Event()
        self.release = threading.Event()

    def fdatasync(self, fd: int) -> None:
        if self.hold and self.path_of(fd).endswith(".log"):
            self.hold = False
            self.began.set()
            assert self.release.wait(10)
        super().fdatasync(fd)


@pytest.mark.asyncio
async def test_a_cancelled_caller_still_leaves_the_truncation_done(tmp_path: Path) -> None:
    """Scenario: a group commit is held in its fdatasync; truncate_to is called (queued
    behind it) and its caller cancelled; then the sync is released. Expected: the caller
    sees CancelledError only after the truncation ran to its end: head and mark are the
    cut, and the next append lands there."""
    fs = HeldSyncFs()
    async with await LogWriter.open(str(tmp_path), CONFIG, fs=fs) as writer:
        bases = await fill(writer, 0, 20)
        fs.hold = True
        pending = asyncio.ensure_future(writer.append(encode_columns([b"held"])))
        await asyncio.to_thread(fs.began.wait, 10)
        task = asyncio.ensure_future(writer.truncate_to(bases[10]))
        await asyncio.sleep(0)
        task.cancel()
        await asyncio.sleep(0.05)
        assert not task.done()  # waiting for the truncation, not gone
        fs.release.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        await pending
        assert (writer.head, writer.high_water_mark) == (bases[10], bases[10])
        assert (await fill(writer, 500, 1)) == [bases[10]]


@pytest.mark.asyncio
async def test_interval_sync_never_claims_past_a_truncation(tmp_path: Path) -> None:
    """Scenario: policy ``interval`` (5 ms): batches are appended and truncated away again
    and again while the periodic sync runs. Expected: the mark never passes the head, and
    after the last truncation and a few intervals it equals the head; every read returns
    only the records kept."""
    config = LogConfig(
        segment_bytes=512,
        index_interval_bytes=100,
        fsync=FsyncPolicy.INTERVAL,
        fsync_interval_ms=5,
    )
    async with await LogWriter.open(str(tmp_path), config) as writer:
        kept = await fill(writer, 0, 10)
        for round_ in range(8):
            await fill(writer, 100 * (round_ + 1), 4)
            await asyncio.sleep(0.003)
            await writer.truncate_to(kept[-1] + 2)
            assert writer.high_water_mark <= writer.head == kept[-1] + 2
        await asyncio.sleep(0.05)
        assert writer.high_water_mark == writer.head
        expected = [v for i in range(10) for v in (b"%d" % i, b"%d+" % i)]
        assert await values_from(writer, 0) == expected


class HeldReadFs(FaultyFs):
    """A FaultyFs whose reads on a cold-read thread (named ``headrace-cold-read``...) wait
    for ``release`` once ``hold`` is set, so that a cold read is in flight on demand."""

    def __init__(self) -> None:
        super().__init__()
        self.hold = False
        self.began = threading.Event()
        self.release = threading.Event()

    def pread(self, fd: int, size: int, offset: int) -> bytes:
        if self.hold and threading.current_thread() is not threading.main_thread():
            self.hold = False
            self.began.set()
            assert self.release.wait(10)
        return super().pread(fd, size, offset)


@pytest.mark.asyncio
async def test_a_truncation_waits_for_a_cold_read_in_flight(tmp_path: Path) -> None:
    """Scenario: a cold read of the first segment is held inside its pread on its thread;
    a truncation into that segment is asked for, then the read released. Expected: the
    truncation does not touch the files while the read runs (the head is unchanged until
    the read ends), the read returns whole batches, and the truncation then completes."""
    fs = HeldReadFs()
    async with await LogWriter.open(str(tmp_path), CONFIG, fs=fs) as writer:
        bases = await fill(writer, 0, 30)
        fs.hold = True
        read = asyncio.ensure_future(writer.read_cold(0))
        await asyncio.to_thread(fs.began.wait, 10)
        truncation = asyncio.ensure_future(writer.truncate_to(bases[2]))
        await asyncio.sleep(0.05)
        assert not truncation.done()
        assert writer.log.head > bases[2]  # the files are untouched while the read runs
        fs.release.set()
        batches = await read
        assert batches[0].base_offset == 0
        await truncation
        assert (writer.head, writer.high_water_mark) == (bases[2], bases[2])
