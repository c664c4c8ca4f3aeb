"""Async tests of :meth:`wal.LogWriter.restart_at`: a replica emptying its log to a new
start while its commits are held (a follower's writer).

Claims: afterwards the first offset, head, durable end and high-water mark are the new
start, no read returns an old record, the next append (ordinary or replicated) is given
the new start, a refused restart changes nothing, and a cancelled caller still leaves
the restart done.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.wal.test_writer_truncate import CONFIG, fill, values_from
from wal import LogConfig, LogWriter, OffsetOutOfRangeError, encode_columns


@pytest.mark.asyncio
@pytest.mark.parametrize("start", [0, 10, 5000], ids=["below-first", "inside", "above-head"])
async def test_restart_empties_the_log_and_moves_every_mark_to_the_start(
    tmp_path: Path, start: int
) -> None:
    """Scenario: a held writer with 40 batches (80 records) over many segments, its mark
    committed to 30, restarts at ``start``. Expected: first offset, head, durable end and
    mark are all ``start``; a read at an old offset raises (or gives nothing at the
    start); the next append is given ``start`` and, committed, reads back alone; a
    reopen sees the same log."""
    path = str(tmp_path / "log")
    writer = await LogWriter.open(path, CONFIG)
    writer.hold_commits()
    await fill(writer, 0, 40)
    writer.commit_to(30)
    removed = await writer.restart_at(start)
    assert removed
    marks = (writer.first_offset, writer.head, writer.durable_end, writer.high_water_mark)
    assert marks == (start, start, start, start)
    with pytest.raises(OffsetOutOfRangeError):
        await writer.aread(start + 1)
    assert await writer.aread(start) == []
    result = await writer.append(encode_columns([b"again"]))
    assert result.first_offset == start
    assert writer.high_water_mark == start  # held: the append is not committed yet
    writer.commit_to(start + 1)
    assert await values_from(writer, start) == [b"again"]
    await writer.aclose()
    reopened = await LogWriter.open(path, CONFIG)
    assert (reopened.first_offset, reopened.head) == (start, start + 1)
    assert await values_from(reopened, start) == [b"again"]
    await reopened.aclose()


@pytest.mark.asyncio
async def test_a_replicated_append_follows_a_restart_at_the_leaders_start(tmp_path: Path) -> None:
    """Scenario: a leader's log whose retention deleted its first segments (log start
    above 0); an empty follower restarts at the leader's first offset and appends the
    leader's bytes from there. Expected: the follower's head is the leader's, and its
    records are the leader's from the leader's first offset."""
    leader = await LogWriter.open(str(tmp_path / "leader"), CONFIG)
    await fill(leader, 0, 40)
    await leader.delete_before(leader.log.segment_infos()[3].base_offset)
    follower = await LogWriter.open(str(tmp_path / "follower"), CONFIG)
    await follower.restart_at(leader.first_offset)
    offset = leader.first_offset
    while offset < leader.head:
        data = await leader.read_raw(offset, 300)
        offset = await follower.append_replicated(data)
    assert follower.head == leader.head
    assert await values_from(follower, leader.first_offset) == await values_from(
        leader, leader.first_offset
    )
    await leader.aclose()
    await follower.aclose()


@pytest.mark.asyncio
async def test_a_refused_restart_changes_nothing(tmp_path: Path) -> None:
    """Scenario: restart at -1. Expected: ValueError; head, mark and records unchanged."""
    writer = await LogWriter.open(str(tmp_path / "log"), LogConfig(segment_bytes=512))
    await fill(writer, 0, 5)
    before = await values_from(writer, 0)
    with pytest.raises(ValueError, match="negative"):
        await writer.restart_at(-1)
    assert (writer.head, writer.high_water_mark) == (10, 10)
    assert await values_from(writer, 0) == before
    await writer.aclose()


@pytest.mark.asyncio
async def test_a_cancelled_caller_still_leaves_the_restart_done(tmp_path: Path) -> None:
    """Scenario: the task awaiting a restart is cancelled at once. Expected: it sees the
    cancellation, and the log is empty at the new start all the same."""
    writer = await LogWriter.open(str(tmp_path / "log"), CONFIG)
    await fill(writer, 0, 30)
    task = asyncio.create_task(writer.restart_at(777))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert (writer.first_offset, writer.head, writer.high_water_mark) == (777, 777, 777)
    await writer.aclose()
