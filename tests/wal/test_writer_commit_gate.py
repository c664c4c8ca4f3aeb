"""Async tests of the commit gate of :class:`wal.LogWriter` (issue 37): ``hold_commits``,
``commit_to``, ``release_commits``, ``durable_end`` and the durable listeners, on real
files.

Unreplicated (the default) the mark is the durable end, as every other test in
``tests/wal`` checks unchanged; held, readers see only what was committed while a leader's
raw read serves up to the durable end.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from wal import FsyncPolicy, LogConfig, LogWriter, OffsetOutOfRangeError, encode_columns

CONFIG = LogConfig(fsync=FsyncPolicy.ALWAYS, segment_bytes=4096, index_interval_bytes=256)


def one(i: int) -> bytes:
    """A batch of one record naming ``i``."""
    return encode_columns([b"record-%d" % i])


async def fill(writer: LogWriter, count: int) -> None:
    for i in range(count):
        await writer.append(one(i))


@pytest.mark.asyncio
async def test_unheld_mark_is_durable_end(tmp_path: Path) -> None:
    """Unreplicated: after each append the mark equals the durable end, the listeners of
    both are told the same offsets, and commit_to cannot move the mark past it."""
    marks: list[int] = []
    durables: list[int] = []
    async with await LogWriter.open(str(tmp_path / "p"), CONFIG) as writer:
        writer.add_listener(marks.append)
        writer.add_durable_listener(durables.append)
        await fill(writer, 3)
        assert not writer.commits_held
        assert writer.high_water_mark == writer.durable_end == 3
        assert marks == durables == [1, 2, 3]
        assert writer.commit_to(10) == 3
        assert marks == [1, 2, 3]


@pytest.mark.asyncio
async def test_held_mark_moves_only_by_commit_to(tmp_path: Path) -> None:
    """Held at 2: five more appends make the durable end 7 (durable listeners told), the
    mark stays 2 and reads stop there; commit_to(4) moves it to 4 (listener told 4),
    commit_to(3) does not move it back, commit_to(100) clamps it to 7."""
    marks: list[int] = []
    durables: list[int] = []
    async with await LogWriter.open(str(tmp_path / "p"), CONFIG) as writer:
        await fill(writer, 2)
        writer.hold_commits()
        writer.add_listener(marks.append)
        writer.add_durable_listener(durables.append)
        for i in range(2, 7):
            await writer.append(one(i))
        assert writer.durable_end == 7
        assert durables == [3, 4, 5, 6, 7]
        assert writer.high_water_mark == 2
        assert marks == []
        assert [b.base_offset for b in writer.read(0)] == [0, 1]
        assert writer.read(2) == []
        assert writer.commit_to(4) == 4
        assert marks == [4]
        assert [b.base_offset for b in writer.read(0)] == [0, 1, 2, 3]
        assert writer.commit_to(3) == 4
        assert writer.commit_to(100) == 7
        assert marks == [4, 7]


@pytest.mark.asyncio
async def test_held_raw_read_serves_durable_end(tmp_path: Path) -> None:
    """Held at 0 with 4 durable batches: read_raw stops at the mark (nothing), read_raw
    with durable=True returns all 4 batches' bytes, from the tail cache and from the files
    alike (a cache of 0 bytes forces the file read)."""
    for cache in (1 << 20, 0):
        config = LogConfig(fsync=FsyncPolicy.ALWAYS, tail_cache_bytes=cache)
        async with await LogWriter.open(str(tmp_path / f"p{cache}"), config) as writer:
            writer.hold_commits()
            await fill(writer, 4)
            assert await writer.read_raw(0) == b""
            raw = await writer.read_raw(0, durable=True)
            stored = writer.log.read(0, 1 << 20, upper=4)
            assert [b.base_offset for b in stored] == [0, 1, 2, 3]
            assert raw == b"".join(bytes(b.buffer) for b in stored)
            assert await writer.read_raw(4, durable=True) == b""


@pytest.mark.asyncio
async def test_release_commits_publishes_durable_end(tmp_path: Path) -> None:
    """Held with 3 durable and 1 committed: release moves the mark to 3 at once (listener
    told), and later appends move it again without commit_to."""
    marks: list[int] = []
    async with await LogWriter.open(str(tmp_path / "p"), CONFIG) as writer:
        writer.hold_commits()
        await fill(writer, 3)
        writer.commit_to(1)
        writer.add_listener(marks.append)
        writer.release_commits()
        assert writer.high_water_mark == 3
        assert marks == [3]
        await writer.append(one(9))
        assert writer.high_water_mark == 4
        assert marks == [3, 4]


@pytest.mark.asyncio
async def test_truncate_lowers_durable_end_and_mark(tmp_path: Path) -> None:
    """Held, 5 durable, 3 committed: a truncation to 2 makes both 2; appends then raise the
    durable end from 2 and commit_to(3) commits the new batch; a truncation past the
    head is refused and changes neither."""
    async with await LogWriter.open(str(tmp_path / "p"), CONFIG) as writer:
        writer.hold_commits()
        await fill(writer, 5)
        writer.commit_to(3)
        await writer.truncate_to(2)
        assert (writer.durable_end, writer.high_water_mark) == (2, 2)
        with pytest.raises(OffsetOutOfRangeError):
            await writer.truncate_to(9)
        assert (writer.durable_end, writer.high_water_mark) == (2, 2)
        await writer.append(one(7))
        assert writer.durable_end == 3
        assert writer.high_water_mark == 2
        assert writer.commit_to(3) == 3


@pytest.mark.asyncio
async def test_interval_policy_durable_end_waits_for_sync(tmp_path: Path) -> None:
    """Under ``interval`` with commits held the durable end moves at the periodic sync
    (not at the write) and only then may a commit reach it."""
    config = LogConfig(fsync=FsyncPolicy.INTERVAL, fsync_interval_ms=50)
    async with await LogWriter.open(str(tmp_path / "p"), config) as writer:
        writer.hold_commits()
        synced = asyncio.Event()
        writer.add_durable_listener(lambda _end: synced.set())
        await writer.append(one(0))
        assert writer.commit_to(1) == writer.durable_end
        await asyncio.wait_for(synced.wait(), 5)
        assert writer.durable_end == 1
        assert writer.commit_to(1) == 1
