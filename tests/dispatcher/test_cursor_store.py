"""The cursor store (dispatcher.cursor_store): coalesced, atomic saves of subscription state
files on a real file system, with at most one flush in flight.

A file system that blocks its write on a threading event the test controls holds a flush
in flight deterministically (the writes run on the store's own thread)."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest
import pytest_asyncio

from dispatcher import PartitionSnapshot, Subscription, state_file
from dispatcher.cursor_store import CursorStore
from dispatcher.errors import DispatcherClosedError
from wal import FileSystem, LogWriter, encode_columns
from wal.fs import Buffer

pytestmark = pytest.mark.asyncio(loop_scope="function")


class HeldFs(FileSystem):
    """Records each ``atomic_write_many``; the first waits for :attr:`go`; ``fail`` makes
    the next one raise."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[list[str]] = []
        self.in_write = threading.Event()
        self.go = threading.Event()
        self.fail = False
        self.concurrent = 0
        self.most_concurrent = 0

    def atomic_write_many(self, files: Sequence[tuple[str, Buffer]]) -> None:
        self.concurrent += 1
        self.most_concurrent = max(self.most_concurrent, self.concurrent)
        try:
            self.writes.append(sorted(os.path.basename(path) for path, _ in files))
            if len(self.writes) == 1:
                self.in_write.set()
                self.go.wait(5)
            if self.fail:
                self.fail = False
                raise OSError(28, "No space left on device")
            super().atomic_write_many(files)
        finally:
            self.concurrent -= 1


@pytest_asyncio.fixture
async def writer(tmp_path: Path) -> AsyncIterator[LogWriter]:
    w = await LogWriter.open(str(tmp_path / "log"))
    yield w
    await w.aclose()


def _subs(writer: LogWriter, count: int) -> dict[tuple[str, str], Subscription]:
    subs = [Subscription("t", f"s{i}", [writer], [PartitionSnapshot(0)]) for i in range(count)]
    return {(s.topic, s.name): s for s in subs}


def _saved_cursor(root: Path, name: str) -> int:
    doc = state_file.decode((root / "t" / f"{name}{state_file.SUFFIX}").read_bytes())
    return doc.partitions[0].cursor


async def _wait_thread(event: threading.Event) -> None:
    assert await asyncio.to_thread(event.wait, 5)


async def test_saves_during_a_flush_share_the_next_one(tmp_path: Path, writer: LogWriter) -> None:
    """Scenario: s0's save starts a flush, which is held in its write; meanwhile s0 moves
    its cursor to 5 and saves again, and s1..s5 save. Then the write goes on.
    Expected: one flush at a time; the held one wrote s0 alone; every later save waited
    for, and shares, the one next flush (one write of all six files), so s0's file holds
    cursor 5; all seven saves return."""
    await writer.append(encode_columns([b"x"] * 10))
    subs = _subs(writer, 6)
    fs = HeldFs()
    store = CursorStore(str(tmp_path / "subs"), fs, flush_interval_s=3600, lookup=subs.get)
    s0 = subs[("t", "s0")]
    first = asyncio.create_task(store.save(s0))
    await _wait_thread(fs.in_write)
    assert await s0.commit(0, 5) == 5  # no dispatch task: the caller applies it
    later = [asyncio.create_task(store.save(s)) for s in subs.values()]
    await asyncio.sleep(0.01)
    assert not first.done()
    assert not any(t.done() for t in later)
    fs.go.set()
    async with asyncio.timeout(5):
        await asyncio.gather(first, *later)
    assert fs.writes == [["s0.json"], [f"s{i}.json" for i in range(6)]]
    assert fs.most_concurrent == 1
    assert store.flushes == 2
    assert _saved_cursor(tmp_path / "subs", "s0") == 5
    assert store.saved_floor("t") == [0]
    await store.aclose([])


async def test_a_failed_flush_fails_its_saves_and_keeps_them_dirty(
    tmp_path: Path, writer: LogWriter
) -> None:
    """Scenario: the first flush's write fails (disk full); then the background flush
    runs. Expected: the save that waited raises the OSError and nothing is on disk; the
    subscription stays dirty, so the next flush, with no save asking, writes it."""
    subs = _subs(writer, 1)
    fs = HeldFs()
    fs.go.set()
    fs.fail = True
    store = CursorStore(str(tmp_path / "subs"), fs, flush_interval_s=0.01, lookup=subs.get)
    (sub,) = subs.values()
    with pytest.raises(OSError, match="No space left"):
        await store.save(sub)
    assert not (tmp_path / "subs" / "t" / "s0.json").exists()
    await store.flush()  # what the background flush does: it is still dirty
    assert store.flushes == 1
    assert _saved_cursor(tmp_path / "subs", "s0") == 0
    await store.aclose([])


async def test_a_save_after_close_is_refused_with_a_clear_error(
    tmp_path: Path, writer: LogWriter
) -> None:
    """Scenario: the store closes (its final save writes s0), then a late commit asks for a
    save, and aclose is called again. Expected: the final save is on disk; the late save
    and flush raise DispatcherClosedError (not the executor's RuntimeError) and write
    nothing; the second aclose is a no-op."""
    subs = _subs(writer, 1)
    (sub,) = subs.values()
    fs = HeldFs()
    fs.go.set()
    store = CursorStore(str(tmp_path / "subs"), fs, flush_interval_s=3600, lookup=subs.get)
    store.start()
    await store.aclose([sub])
    assert fs.writes == [["s0.json"]]
    with pytest.raises(DispatcherClosedError, match="shutting down"):
        await store.save(sub)
    with pytest.raises(DispatcherClosedError):
        await store.flush()
    await store.aclose([sub])
    assert fs.writes == [["s0.json"]]
    assert store.flushes == 1
