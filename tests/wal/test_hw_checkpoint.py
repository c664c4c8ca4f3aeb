"""Tests of the high-watermark checkpoint (issue 37): :mod:`wal.hw_checkpoint` and how a
:class:`wal.LogWriter` with held commits saves its mark, starts from it
(``hold_commits(at=...)``) and lowers it before a cut, on real files; the crash points
``hw_checkpoint.*`` with a crashing filesystem and a power cut.

The rule every test checks a side of: the checkpoint may lag the mark, never lead it.
"""

from __future__ import annotations

import asyncio
import os
import random
from pathlib import Path

import pytest

from tests.wal._helpers import CrashableFs
from wal import (
    FileSystem,
    FsyncPolicy,
    Log,
    LogConfig,
    LogWriter,
    SimulatedCrash,
    encode_columns,
)
from wal.fs import CRASH_POINTS
from wal.hw_checkpoint import FILE_NAME, HighWatermarkCheckpoint, decode, encode

CONFIG = LogConfig(fsync=FsyncPolicy.ALWAYS, segment_bytes=4096, index_interval_bytes=256)


def one(i: int) -> bytes:
    """A batch of one record naming ``i``."""
    return encode_columns([b"record-%d" % i])


async def fill(writer: LogWriter, count: int) -> None:
    for i in range(count):
        await writer.append(one(i))


def saved(path: Path) -> int | None:
    """What the partition's checkpoint file holds (None: no file)."""
    file = path / FILE_NAME
    return decode(file.read_bytes()) if file.exists() else None


def test_codec_round_trip_and_damage() -> None:
    """Scenario: offsets encoded and decoded; then a flipped digit, a torn file, another
    version. Expected: the round trip gives the offset back; each damage decodes as None
    (the log reads it as 0: lagging is safe)."""
    for offset in (0, 7, 10**12):
        assert decode(encode(offset)) == offset
    data = encode(1234)
    assert decode(data.replace(b"1234", b"1235")) is None
    assert decode(data[:-5]) is None
    assert decode(data.replace(b"high-watermark 1", b"high-watermark 2")) is None


def test_damaged_file_reads_as_zero(tmp_path: Path) -> None:
    """Scenario: a checkpoint file whose bytes fail their CRC. Expected: opening reads
    it as 0, not an error (a replica then waits for the replication to show records)."""
    (tmp_path / FILE_NAME).write_bytes(encode(50).replace(b"50", b"90"))
    checkpoint = HighWatermarkCheckpoint.open(str(tmp_path), fs=FileSystem())
    assert checkpoint.exists
    assert checkpoint.offset == 0


@pytest.mark.asyncio
async def test_held_mark_is_saved_and_a_reopened_log_starts_there(tmp_path: Path) -> None:
    """Scenario: a held log (interval 0) with 6 durable records commits to 4, then the
    writer closes, and the log is opened again. Expected: the file holds 4 after the
    commit and after the close; reopened, the writer holds commits from the open with
    the mark at 4 (durable end 6) and reads stop there until commit_to(6); a later
    hold_commits(at=0) does not move it back (commits were held already)."""
    path = tmp_path / "p"
    async with await LogWriter.open(str(path), CONFIG) as writer:
        writer.checkpoint_interval_s = 0
        writer.hold_commits()
        await fill(writer, 6)
        writer.commit_to(4)
        for _ in range(100):
            if saved(path) == 4:
                break
            await asyncio.sleep(0.01)
        assert saved(path) == 4
    assert saved(path) == 4
    async with await LogWriter.open(str(path), CONFIG) as writer:
        assert writer.commits_held
        assert writer.durable_end == 6
        assert writer.log.hw_checkpoint.offset == 4
        assert writer.high_water_mark == 4
        assert [b.base_offset for b in writer.read(0)] == [0, 1, 2, 3]
        writer.commit_to(6)
        writer.hold_commits(at=0)
        assert writer.high_water_mark == 6
    assert saved(path) == 6


@pytest.mark.asyncio
async def test_hold_at_is_clamped_to_the_log(tmp_path: Path) -> None:
    """Scenario: a log of 3 records held at 9 (a checkpoint past a power cut's end), and
    one emptied to start at 20 held at 5 (a checkpoint below the new start). Expected:
    marks 3 and 20: never past the durable end, never below the first offset."""
    async with await LogWriter.open(str(tmp_path / "a"), CONFIG) as writer:
        await fill(writer, 3)
        writer.release_commits()
        writer.hold_commits(at=9)
        assert writer.high_water_mark == 3
    async with await LogWriter.open(str(tmp_path / "b"), CONFIG) as writer:
        await writer.restart_at(20)
    async with await LogWriter.open(str(tmp_path / "b"), CONFIG) as writer:
        assert not writer.commits_held  # never held: no checkpoint, a plain log
        writer.hold_commits(at=5)
        assert writer.high_water_mark == 20


@pytest.mark.asyncio
async def test_saves_are_spaced_by_the_interval(tmp_path: Path) -> None:
    """Scenario: a log of 4 records held at 0 with an interval of 0.5 s (the first hold
    saves the mark at once) commits 1 soon after, later 2, 3 and 4 within a few ms.
    Expected: 0 saved at once; 1 only once the interval passed; then still 1 shortly
    after the later commits, and 4 once the next interval passed: one write per
    interval, and the last mark is never lost."""
    path = tmp_path / "p"
    async with await LogWriter.open(str(path), CONFIG) as writer:
        await fill(writer, 4)
        writer.checkpoint_interval_s = 0.5
        writer.hold_commits(at=0)
        await asyncio.sleep(0.05)
        assert saved(path) == 0
        writer.commit_to(1)
        await asyncio.sleep(0.05)
        assert saved(path) == 0  # within the interval of the first save
        await asyncio.sleep(0.5)
        assert saved(path) == 1
        for mark in (2, 3, 4):
            writer.commit_to(mark)
        await asyncio.sleep(0.1)
        assert saved(path) == 1
        await asyncio.sleep(0.6)
        assert saved(path) == 4


@pytest.mark.asyncio
async def test_a_cut_below_the_checkpoint_lowers_it_first(tmp_path: Path) -> None:
    """Scenario: a held log of 8 records committed and saved at 8 is cut to 5 (a replica
    cutting a divergent tail), then 3 new records appended (uncommitted), then the writer
    closes. Expected: the file holds 5 after the cut; reopened held at it, readers see
    5 records, none of the new ones."""
    path = tmp_path / "p"
    writer = await LogWriter.open(str(path), CONFIG)
    writer.checkpoint_interval_s = 0
    writer.hold_commits()
    await fill(writer, 8)
    writer.commit_to(8)
    for _ in range(100):
        if saved(path) == 8:
            break
        await asyncio.sleep(0.01)
    assert saved(path) == 8
    await writer.truncate_to(5)
    assert saved(path) == 5
    for i in range(3):
        await writer.append(one(100 + i))
    assert writer.high_water_mark == 5
    await writer.aclose()  # saves the mark: still 5
    assert saved(path) == 5
    async with await LogWriter.open(str(path), CONFIG) as reopened:
        assert reopened.durable_end == 8
        assert reopened.commits_held
        assert reopened.high_water_mark == 5


def test_a_stale_write_after_a_lowering_is_dropped(tmp_path: Path) -> None:
    """Scenario: a writer reads mark 40 at a generation, then a truncation lowers the
    checkpoint to 30 before the write of 40 runs. Expected: the write of 40 is dropped
    (returns False) and the file keeps 30; a write read at the new generation goes."""
    checkpoint = HighWatermarkCheckpoint.open(str(tmp_path), fs=FileSystem())
    assert checkpoint.advance(35, checkpoint.generation)
    generation = checkpoint.generation
    checkpoint.lower_to(30)
    assert not checkpoint.advance(40, generation)
    assert saved(tmp_path) == 30
    assert checkpoint.advance(31, checkpoint.generation)
    assert saved(tmp_path) == 31


@pytest.mark.parametrize("change", ["advance", "lower_to"])
@pytest.mark.parametrize("point", [p for p in CRASH_POINTS if p.startswith("hw_checkpoint.")])
@pytest.mark.parametrize("seed", range(3))
def test_a_crash_while_replacing_leaves_the_old_or_the_new_file(
    tmp_path: Path, change: str, point: str, seed: int
) -> None:
    """Scenario: a checkpoint of 50 is raised to 60 or lowered to 40, and the replacement
    crashes at ``point``; the descriptors are dropped and the power cut. Expected: the
    value in memory is still 50 (it changes only once the file is durable); reopening
    reads 50 or the new value, never an error or 0; the temp file is discarded when the
    log opens (after_tmp: always the old value)."""
    directory = str(tmp_path)
    HighWatermarkCheckpoint.open(directory, fs=FileSystem()).advance(50, 0)
    fs = CrashableFs(crash_at=point, page_size=16)
    checkpoint = HighWatermarkCheckpoint.open(directory, fs=fs)
    new = 60 if change == "advance" else 40
    apply = (
        (lambda: checkpoint.advance(new, checkpoint.generation))
        if change == "advance"
        else (lambda: checkpoint.lower_to(new))
    )
    with pytest.raises(SimulatedCrash):
        apply()
    assert checkpoint.offset == 50
    fs.die()
    fs.power_cut(random.Random(seed))
    reopened = HighWatermarkCheckpoint.open(directory, fs=FileSystem())
    assert reopened.offset in (50, new)
    if point == "hw_checkpoint.after_tmp":
        assert reopened.offset == 50
    Log.open(directory, CONFIG).close()  # opening a log discards the leftover temp
    assert not os.path.exists(os.path.join(directory, FILE_NAME + ".tmp"))


@pytest.mark.asyncio
async def test_a_log_with_a_checkpoint_opens_held_and_release_removes_it(
    tmp_path: Path,
) -> None:
    """Scenario: a log of 5 records is held (the first hold saves its mark, 5, at once),
    cut to 3 (the checkpoint lowered to 3), 2 records appended (not committed), closed
    and reopened; then released, closed and reopened again.
    Expected: the first reopen holds commits from the open at 3 (no role has asked yet:
    readers see none of the 2 uncommitted records); after the release the file is gone
    and the next open is a plain log again (mark 5, not held)."""
    path = tmp_path / "p"
    async with await LogWriter.open(str(path), CONFIG) as writer:
        await fill(writer, 5)
        writer.hold_commits()
        for _ in range(100):
            if saved(path) is not None:
                break
            await asyncio.sleep(0.01)
        assert saved(path) == 5
        await writer.truncate_to(3)  # lowers the checkpoint to 3
        for i in range(2):
            await writer.append(one(10 + i))
    async with await LogWriter.open(str(path), CONFIG) as writer:
        assert writer.commits_held
        assert writer.durable_end == 5
        assert writer.high_water_mark == 3
        writer.release_commits()
        assert writer.high_water_mark == 5
        assert saved(path) is None
    async with await LogWriter.open(str(path), CONFIG) as writer:
        assert not writer.commits_held
        assert writer.high_water_mark == 5
