"""Async tests of :class:`wal.LogWriter`: group commit, acknowledgement order, the
high-water mark under each fsync policy, listeners, bounded reads, and closing.

The durability claims (``DESIGN.md`` section 2, rules 1-2) are checked against what the
filesystem was actually asked to do: :class:`DurableFs` records, at each successful
``fdatasync`` of a ``.log``, the offset just past the last whole batch in that file.
An acknowledgement or a high-water mark beyond that frontier is a durability bug.
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest

from tests.wal._helpers import read_all
from wal import (
    AppendResult,
    FaultyFs,
    FsyncPolicy,
    Log,
    LogConfig,
    LogWriter,
    OffsetOutOfRangeError,
    WalClosedError,
    WalFailedError,
    encode_columns,
    iter_batches,
)
from wal.index import ENTRY


def value_for(i: int) -> bytes:
    """A payload that names its record id and whose content can be checked."""
    return b"%08d:" % i + hashlib.sha256(b"%d" % i).digest()[: i % 29]


def batch_bytes(ids: Sequence[int]) -> bytes:
    """An encoded batch holding the records with these ids."""
    return encode_columns([value_for(i) for i in ids])


class DurableFs(FaultyFs):
    """A FaultyFs that knows how far the log is durable: after each successful fdatasync of
    a ``.log`` file it parses the file and raises ``durable`` to the offset just past its
    last whole batch. Segments are synced in order, so the maximum is the frontier."""

    def __init__(self) -> None:
        super().__init__()
        self.durable = 0

    def fdatasync(self, fd: int) -> None:
        super().fdatasync(fd)
        path = self.path_of(fd)
        if path.endswith(".log"):
            for batch in iter_batches(self.read_file(path)):
                self.durable = max(self.durable, batch.next_offset)


class HeldFs(FaultyFs):
    """Blocks one fdatasync, *before* it runs, while ``hold`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.hold = False
        self.entered = threading.Event()
        self.released = threading.Event()

    def fdatasync(self, fd: int) -> None:
        if self.hold:
            self.hold = False
            self.entered.set()
            self.released.wait(10)
        super().fdatasync(fd)


async def appender(writer: LogWriter, ids: Sequence[int]) -> list[AppendResult]:
    """Append one single-record batch per id, in order, each awaited."""
    return [await writer.append(batch_bytes([i])) for i in ids]


def stored_values(path: str) -> list[bytes]:
    """Every value in the closed log at ``path``, in offset order."""
    log = Log.open(path)
    try:
        return [v for b in log.read(0, 1 << 30) for v in b.values()]
    finally:
        log.close()


@pytest.mark.asyncio
async def test_group_commit_coalesces_concurrent_appends(wal_dir: str) -> None:
    """Scenario: 16 tasks each append 25 single-record batches, awaiting each. Expected:
    far fewer fdatasync calls than appends (at most one per eight); 400 distinct dense
    offsets; each task's records in its own order; everything reads back."""
    fs = FaultyFs()
    writer = await LogWriter.open(wal_dir, LogConfig(), fs=fs)
    syncs_before = fs.calls.get("fdatasync", 0)
    tasks = [appender(writer, range(t * 1000, t * 1000 + 25)) for t in range(16)]
    results = await asyncio.gather(*tasks)
    syncs = fs.calls.get("fdatasync", 0) - syncs_before
    assert syncs <= 400 // 8, f"{syncs} fdatasync calls for 400 appends"
    offsets = sorted(r.first_offset for rs in results for r in rs)
    assert offsets == list(range(400))
    for rs in results:
        assert [r.first_offset for r in rs] == sorted(r.first_offset for r in rs)
    assert writer.high_water_mark == writer.head == 400
    await writer.aclose()
    by_offset = {
        r.first_offset: t * 1000 + k for t, rs in enumerate(results) for k, r in enumerate(rs)
    }
    assert stored_values(wal_dir) == [value_for(by_offset[o]) for o in range(400)]


@pytest.mark.asyncio
async def test_appenders_woken_by_one_completion_are_written_as_one_group(
    wal_dir: str,
) -> None:
    """Scenario: fsync ALWAYS; 16 tasks each append 20 single-record batches, awaiting
    each. A group's completion wakes all its appenders in one loop turn. Expected: every
    group commit holds all 16 appends (20 commits of 16): none of them waits for the next
    round."""
    writer = await LogWriter.open(wal_dir, LogConfig())
    groups: list[int] = []
    writer.on_commit = lambda _write_s, _sync_s, batches: groups.append(batches)
    await asyncio.gather(*(appender(writer, range(t * 100, t * 100 + 20)) for t in range(16)))
    assert groups == [16] * 20
    await writer.aclose()


@pytest.mark.asyncio
async def test_always_acks_and_hwm_only_over_synced_data(wal_dir: str) -> None:
    """Scenario: fsync ALWAYS, 8 concurrent appenders of 10 batches each, rolling 4 KiB
    segments; a listener and every acknowledgement compare against the durable frontier.
    Expected: every acknowledged offset is below the frontier when its future resolves,
    the high-water mark already covers it (persist, notify, then ack), and no listener call
    ever sees a mark beyond the frontier."""
    fs = DurableFs()
    config = LogConfig(segment_bytes=4096, index_interval_bytes=512)
    writer = await LogWriter.open(wal_dir, config, fs=fs)
    late_acks: list[tuple[int, int]] = []
    early_marks: list[tuple[int, int]] = []
    stale_marks: list[tuple[int, int]] = []

    def on_mark(hwm: int) -> None:
        if hwm > fs.durable:
            early_marks.append((hwm, fs.durable))

    writer.add_listener(on_mark)

    async def checked(ids: range) -> None:
        for i in ids:
            result = await writer.append(batch_bytes([i, i + 500_000]))
            if result.last_offset >= fs.durable:
                late_acks.append((result.last_offset, fs.durable))
            if writer.high_water_mark <= result.last_offset:
                stale_marks.append((result.last_offset, writer.high_water_mark))

    await asyncio.gather(*(checked(range(t * 100, t * 100 + 10)) for t in range(8)))
    assert writer.head == 160
    assert late_acks == [], "acknowledged before fdatasync"
    assert early_marks == [], "high-water mark advanced over unsynced data"
    assert stale_marks == [], "acknowledged before the high-water mark covered it"
    assert fs.durable == 160
    await writer.aclose()


@pytest.mark.asyncio
async def test_always_future_waits_for_fdatasync(wal_dir: str) -> None:
    """Scenario: fsync ALWAYS; the fdatasync of an append is held before it runs. Expected:
    while held, the append's future is pending and the high-water mark has not moved; once
    released, the append is acknowledged and the mark covers it."""
    fs = HeldFs()
    writer = await LogWriter.open(wal_dir, LogConfig(), fs=fs)
    await writer.append(batch_bytes([0]))
    fs.hold = True
    task = asyncio.create_task(writer.append(batch_bytes([1])))
    assert await asyncio.to_thread(fs.entered.wait, 10)
    await asyncio.sleep(0.05)
    assert not task.done()
    assert writer.high_water_mark == 1
    assert writer.read(1) == []
    fs.released.set()
    result = await task
    assert result.first_offset == 1
    assert writer.high_water_mark == 2
    await writer.aclose()


@pytest.mark.asyncio
async def test_interval_acks_before_sync_and_hwm_after_flush(wal_dir: str) -> None:
    """Scenario: fsync INTERVAL with a one-hour period (the timer never fires here); three
    appends, then writer.flush(). Expected: the appends are acknowledged with nothing
    synced; the high-water mark stays at 0, no listener call, writer.read sees nothing
    while the log itself holds the data; after flush() the data is durable, the mark is
    the head, the listener got exactly that, and writer.read returns all three."""
    fs = DurableFs()
    config = LogConfig(fsync=FsyncPolicy.INTERVAL, fsync_interval_ms=3_600_000)
    writer = await LogWriter.open(wal_dir, config, fs=fs)
    marks: list[int] = []
    writer.add_listener(marks.append)
    results = [await writer.append(batch_bytes([i, i + 100])) for i in range(3)]
    assert [r.first_offset for r in results] == [0, 2, 4]
    assert writer.head == 6
    assert fs.durable == 0, "INTERVAL must not fdatasync per append"
    assert writer.high_water_mark == 0
    assert marks == []
    assert writer.read(0) == []
    assert len(writer.log.read(0)) == 3
    await writer.flush()
    assert fs.durable == 6
    assert writer.high_water_mark == 6
    assert marks == [6]
    assert [b.base_offset for b in writer.read(0)] == [0, 2, 4]
    await writer.aclose()


@pytest.mark.asyncio
async def test_interval_timer_advances_hwm(wal_dir: str) -> None:
    """Scenario: fsync INTERVAL every 20 ms; one append, no explicit flush. Expected: the
    append is acknowledged at once; within a few periods the timer's fdatasync makes it
    durable and the high-water mark reaches the head."""
    fs = DurableFs()
    config = LogConfig(fsync=FsyncPolicy.INTERVAL, fsync_interval_ms=20)
    writer = await LogWriter.open(wal_dir, config, fs=fs)
    marks: list[int] = []
    writer.add_listener(marks.append)
    await writer.append(batch_bytes([1, 2, 3]))
    for _ in range(500):
        if writer.high_water_mark == 3:
            break
        await asyncio.sleep(0.01)
    assert writer.high_water_mark == 3
    assert fs.durable == 3
    assert marks == [3]
    await writer.aclose()


@pytest.mark.asyncio
async def test_never_advances_hwm_after_write_without_sync(wal_dir: str) -> None:
    """Scenario: fsync NEVER; five appends. Expected: no fdatasync during them; after each
    acknowledgement the high-water mark already equals the head, and each advance reached
    the listener."""
    fs = FaultyFs()
    config = LogConfig(fsync=FsyncPolicy.NEVER)
    writer = await LogWriter.open(wal_dir, config, fs=fs)
    marks: list[int] = []
    writer.add_listener(marks.append)
    syncs = fs.calls.get("fdatasync", 0)
    for i in range(5):
        result = await writer.append(batch_bytes([i]))
        assert writer.high_water_mark == writer.head == result.last_offset + 1
    assert fs.calls.get("fdatasync", 0) == syncs
    assert marks == [1, 2, 3, 4, 5]
    await writer.aclose()


@pytest.mark.asyncio
async def test_roll_makes_data_durable_and_advances_hwm(wal_dir: str) -> None:
    """Scenario: fsync INTERVAL (timer idle), two appends, then writer.roll(). Expected: the
    roll seals (syncs) the segment, so the data is durable and the high-water mark moves to
    the head."""
    fs = DurableFs()
    config = LogConfig(fsync=FsyncPolicy.INTERVAL, fsync_interval_ms=3_600_000)
    writer = await LogWriter.open(wal_dir, config, fs=fs)
    await writer.append(batch_bytes([0]))
    await writer.append(batch_bytes([1]))
    assert writer.high_water_mark == 0
    await writer.roll()
    assert fs.durable == 2
    assert writer.high_water_mark == 2
    await writer.aclose()


@pytest.mark.asyncio
async def test_listeners_see_strictly_increasing_batch_boundaries(wal_dir: str) -> None:
    """Scenario: 16 concurrent appenders of multi-record batches; two listeners, the first
    of which always raises. Expected: the good listener sees strictly increasing marks,
    each the end of an acknowledged batch, ending at the head; a failing listener does not
    stop the writer or the others; a removed listener hears nothing more."""
    writer = await LogWriter.open(wal_dir, LogConfig())
    marks: list[int] = []

    def broken(hwm: int) -> None:
        raise RuntimeError(f"listener bug at {hwm}")

    writer.add_listener(broken)
    writer.add_listener(marks.append)

    async def many(t: int) -> list[AppendResult]:
        return [
            await writer.append(batch_bytes(range(t * 100 + k * 3, t * 100 + k * 3 + 3)))
            for k in range(5)
        ]

    results = await asyncio.gather(*(many(t) for t in range(16)))
    ends = {r.last_offset + 1 for rs in results for r in rs}
    assert marks
    assert marks == sorted(set(marks))
    assert set(marks) <= ends
    assert marks[-1] == writer.head == 240
    writer.remove_listener(marks.append)
    await writer.append(batch_bytes([9999]))
    assert marks[-1] == 240
    await writer.aclose()


@pytest.mark.asyncio
async def test_writer_read_is_bounded_by_hwm(wal_dir: str) -> None:
    """Scenario: fsync ALWAYS, 10 appends. Expected: reads return only batches ending at or
    below the mark; a read at the mark is empty; below the first offset raises."""
    config = LogConfig(segment_bytes=512, index_interval_bytes=100, retention_bytes=1)
    writer = await LogWriter.open(wal_dir, config)
    for i in range(30):
        await writer.append(batch_bytes([i]))
    hwm = writer.high_water_mark
    assert hwm == 30
    got = writer.read(0, 1 << 20)
    assert got[-1].next_offset == hwm
    assert [v for b in got for v in b.values()] == [value_for(i) for i in range(30)]
    assert writer.read(hwm) == []
    deleted = await writer.apply_retention()
    assert deleted
    assert writer.first_offset > 0
    with pytest.raises(OffsetOutOfRangeError):
        writer.read(writer.first_offset - 1)
    await writer.aclose()


@pytest.mark.asyncio
async def test_aclose_drains_queued_appends_then_refuses(wal_dir: str) -> None:
    """Scenario: 50 appends are queued (each task has enqueued its command), then aclose().
    Expected: all 50 are acknowledged with dense offsets; afterwards append, flush, roll
    and retention raise WalClosedError; a second aclose() is harmless; the reopened log
    holds all 50 records and its high-water mark equals its head."""
    writer = await LogWriter.open(wal_dir, LogConfig())
    tasks = [asyncio.create_task(writer.append(batch_bytes([i]))) for i in range(50)]
    await asyncio.sleep(0)  # every task runs up to awaiting its future
    await writer.aclose()
    results = [t.result() for t in tasks]
    assert [r.first_offset for r in results] == list(range(50))
    with pytest.raises(WalClosedError):
        await writer.append(batch_bytes([50]))
    with pytest.raises(WalClosedError):
        await writer.flush()
    with pytest.raises(WalClosedError):
        await writer.roll()
    with pytest.raises(WalClosedError):
        await writer.apply_retention()
    await writer.aclose()
    assert stored_values(wal_dir) == [value_for(i) for i in range(50)]
    async with await LogWriter.open(wal_dir, LogConfig()) as again:
        assert again.high_water_mark == again.head == 50


@pytest.mark.asyncio
async def test_appends_after_aclose_started_are_refused(wal_dir: str) -> None:
    """Scenario: aclose() is started; then a new append is attempted before it finishes.
    Expected: WalClosedError at once, and the writer still closes cleanly."""
    writer = await LogWriter.open(wal_dir, LogConfig())
    await writer.append(batch_bytes([0]))
    closing = asyncio.create_task(writer.aclose())
    await asyncio.sleep(0)
    with pytest.raises(WalClosedError):
        await writer.append(batch_bytes([1]))
    await closing
    assert stored_values(wal_dir) == [value_for(0)]


@pytest.mark.asyncio
async def test_full_queue_applies_backpressure_without_losing_appends(wal_dir: str) -> None:
    """Scenario: a writer with a command queue of 2 and 40 concurrent appends. Expected:
    appenders wait for room instead of failing; all 40 are acknowledged, dense and stored."""
    writer = await LogWriter.open(wal_dir, LogConfig(), queue_size=2)
    results = await asyncio.gather(*(writer.append(batch_bytes([i])) for i in range(40)))
    assert sorted(r.first_offset for r in results) == list(range(40))
    await writer.aclose()
    by_offset = {r.first_offset: i for i, r in enumerate(results)}
    assert stored_values(wal_dir) == [value_for(by_offset[o]) for o in range(40)]


@pytest.mark.asyncio
async def test_writer_delete_before_goes_through_the_writer_task(wal_dir: str) -> None:
    """Scenario: a writer with several sealed segments; delete_before(head). Expected: every
    sealed segment is deleted, first_offset moves to the active segment, and appends and
    reads go on."""
    writer = await LogWriter.open(wal_dir, LogConfig(segment_bytes=512, index_interval_bytes=100))
    for i in range(30):
        await writer.append(batch_bytes([2 * i, 2 * i + 1]))
    head = writer.high_water_mark
    deleted = await writer.delete_before(head)
    assert deleted
    assert writer.first_offset == writer.log.segment_infos()[0].base_offset > 0
    result = await writer.append(batch_bytes([60]))
    assert result.first_offset == head
    assert writer.read(writer.first_offset)[0].base_offset == writer.first_offset
    await writer.aclose()


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("fsync", "synced"), [(FsyncPolicy.ALWAYS, True), (FsyncPolicy.NEVER, False)]
)
async def test_on_commit_reports_write_and_fsync_time(
    wal_dir: str, fsync: FsyncPolicy, synced: bool
) -> None:
    """Scenario: an observer on a writer; three appends. Expected: one call per group
    commit with a non-negative write time, an fsync time only under fsync always, and the
    group sizes adding up to the appends."""
    calls: list[tuple[float, float | None, int]] = []
    writer = await LogWriter.open(wal_dir, LogConfig(fsync=fsync))
    writer.on_commit = lambda w, s, n: calls.append((w, s, n))
    for i in range(3):
        await writer.append(batch_bytes([i]))
    await writer.aclose()
    assert sum(n for _, _, n in calls) == 3
    assert all(w >= 0 for w, _, _ in calls)
    assert all((s is not None and s >= 0) == synced for _, s, _ in calls)


@pytest.mark.asyncio
async def test_interval_timer_writes_index_entries_while_appends_go_on(wal_dir: str) -> None:
    """Scenario: fsync INTERVAL every 1 ms, an index entry per batch, 300 appends from 30
    tasks, so the timer's sync (with its index write) runs beside the writer's appends;
    then the writer closes and the log is reopened. Expected: the ``.index`` holds one
    well-formed entry per batch, each at a batch start, and every record reads back."""
    config = LogConfig(fsync=FsyncPolicy.INTERVAL, fsync_interval_ms=1, index_interval_bytes=1)
    writer = await LogWriter.open(wal_dir, config)

    async def task(k: int) -> None:
        for i in range(10):
            await writer.append(batch_bytes([k * 10 + i]))
            await asyncio.sleep(0)

    await asyncio.gather(*(task(k) for k in range(30)))
    await writer.aclose()
    log = Log.open(wal_dir, config)
    batches = read_all(log)
    assert sorted(v for b in batches for v in b.values()) == sorted(
        value_for(i) for i in range(300)
    )
    index = (Path(wal_dir) / f"{0:020d}.index").read_bytes()
    starts, pos = set(), 0
    for b in batches:
        starts.add((b.base_offset, pos))
        pos += b.size
    entries = [(rel, pos) for rel, pos, _ts in ENTRY.iter_unpack(index)]
    assert len(entries) == len(batches) - 1  # none for the batch at position 0
    assert set(entries) <= starts
    log.close()


@pytest.mark.asyncio
async def test_appends_queued_during_a_sync_are_the_next_group(wal_dir: str) -> None:
    """Scenario: fsync ALWAYS; the writer thread is held inside the fdatasync of one
    append while ten more are queued; then it is released. Expected: the ten are written
    as one group with one fdatasync (two syncs for the eleven appends), all acknowledged
    in queue order, dense."""
    fs = HeldFs()
    writer = await LogWriter.open(wal_dir, LogConfig(), fs=fs)
    fs.hold = True
    first = asyncio.create_task(writer.append(batch_bytes([0])))
    assert await asyncio.to_thread(fs.entered.wait, 10)
    syncs_before = fs.calls.get("fdatasync", 0)
    rest = [asyncio.create_task(writer.append(batch_bytes([i]))) for i in range(1, 11)]
    await asyncio.sleep(0.02)  # every task has queued its append
    fs.released.set()
    results = [await first, *[await t for t in rest]]
    assert [r.first_offset for r in results] == list(range(11))
    assert fs.calls.get("fdatasync", 0) - syncs_before == 2  # the held one, then the group
    await writer.aclose()


@pytest.mark.asyncio
async def test_on_done_settles_the_append_of_a_cancelled_caller(wal_dir: str) -> None:
    """Scenario: an append with an ``on_done`` callback is held in its fdatasync; its
    caller is cancelled; then the sync is released. Expected: the caller ends cancelled,
    the batch is written all the same, and ``on_done`` hears its offsets, once."""
    fs = HeldFs()
    writer = await LogWriter.open(wal_dir, LogConfig(), fs=fs)
    heard: list[AppendResult | BaseException] = []
    fs.hold = True
    caller = asyncio.create_task(writer.append(batch_bytes([0]), on_done=heard.append))
    assert await asyncio.to_thread(fs.entered.wait, 10)
    caller.cancel()
    fs.released.set()
    with pytest.raises(asyncio.CancelledError):
        await caller
    await writer.flush()
    assert heard == [AppendResult(0, 0)]
    assert writer.high_water_mark == writer.head == 1
    await writer.aclose()
    assert stored_values(wal_dir) == [value_for(0)]


@pytest.mark.asyncio
async def test_on_done_hears_an_append_refused_before_it_was_queued(wal_dir: str) -> None:
    """Scenario: ``append`` with ``on_done`` on a closed writer. Expected: it raises
    WalClosedError, and ``on_done`` heard that same error, once."""
    writer = await LogWriter.open(wal_dir, LogConfig())
    await writer.aclose()
    heard: list[AppendResult | BaseException] = []
    with pytest.raises(WalClosedError):
        await writer.append(batch_bytes([0]), on_done=heard.append)
    assert len(heard) == 1
    assert isinstance(heard[0], WalClosedError)


@pytest.mark.asyncio
async def test_the_writer_thread_serves_appends_and_ends_with_aclose(wal_dir: str) -> None:
    """Scenario: an open writer; 200 appends made and awaited one after another, fsync
    ALWAYS; then ``aclose``. Expected: a ``wal-writer:<path>`` thread runs while open;
    every append is acknowledged in order; the thread is gone after ``aclose``."""
    writer = await LogWriter.open(wal_dir, LogConfig())
    names = {t.name for t in threading.enumerate()}
    assert any(n.startswith("wal-writer:") for n in names)
    results = [await writer.append(batch_bytes([i])) for i in range(200)]
    assert [r.first_offset for r in results] == list(range(200))
    await writer.aclose()
    assert not any(t.name == f"wal-writer:{wal_dir}" for t in threading.enumerate())


@pytest.mark.asyncio
async def test_a_writer_thread_killed_by_a_bug_fails_appends_instead_of_hanging(
    wal_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Scenario: a bug (not an I/O error) raises out of the writer thread's group commit.
    Expected: the append in that group fails with WalFailedError naming the writer thread,
    later appends are refused the same way at once, and ``aclose`` still returns."""
    writer = await LogWriter.open(wal_dir, LogConfig())
    await writer.append(batch_bytes([0]))

    def bug(_group: object) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(writer._worker, "_commit_on_thread", bug)
    with pytest.raises(WalFailedError, match="writer thread failed"):
        await asyncio.wait_for(writer.append(batch_bytes([1])), 10)
    with pytest.raises(WalFailedError, match="writer thread failed"):
        await writer.append(batch_bytes([2]))
    await asyncio.wait_for(writer.aclose(), 10)


@pytest.mark.asyncio
async def test_an_append_staged_as_the_writer_thread_dies_fails_instead_of_hanging(
    wal_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Scenario: append 1 meets a bug in the writer thread. Append 2 passes its open
    check while the thread still runs; the log's ``validate``, which append 2 calls next,
    lets the thread die first, so append 2 is staged after the thread's failure report
    was posted (that report empties a queue append 2 is not in yet). Expected: both fail
    with WalFailedError naming the writer thread; neither hangs; ``aclose`` returns."""
    writer = await LogWriter.open(wal_dir, LogConfig())
    await writer.append(batch_bytes([0]))
    thread = next(t for t in threading.enumerate() if t.name == f"wal-writer:{wal_dir}")
    go = threading.Event()

    def bug(_group: object) -> None:
        go.wait(10)
        raise RuntimeError("a bug")

    monkeypatch.setattr(writer._worker, "_commit_on_thread", bug)
    first = asyncio.create_task(writer.append(batch_bytes([1])))
    await asyncio.sleep(0)  # append 1 staged
    await asyncio.sleep(0)  # and handed to the thread, which waits in the bug
    validate = writer.log.validate

    def validate_while_the_thread_dies(data: bytes) -> object:
        go.set()
        thread.join(10)  # the thread set its failure and posted its report
        assert not thread.is_alive()
        return validate(data)

    monkeypatch.setattr(writer.log, "validate", validate_while_the_thread_dies)
    with pytest.raises(WalFailedError, match="writer thread failed"):
        await asyncio.wait_for(writer.append(batch_bytes([2])), 10)
    with pytest.raises(WalFailedError, match="writer thread failed"):
        await asyncio.wait_for(first, 10)
    await asyncio.wait_for(writer.aclose(), 10)
