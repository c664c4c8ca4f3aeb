"""Cold reads: what the page cache does not hold is read off the event loop.

A real file whose pages were dropped (``POSIX_FADV_DONTNEED``) would block; FaultyFs's
``cold`` makes the same miss deterministic for the log, its index and the dispatcher, and
its ``cold_delay_s`` stands for the disk's time, so a test can see the loop keep running
while a thread waits for it."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from broker.admin_service import offset_for_time
from dispatcher.dead_letter_config import DlqConfig
from dispatcher.dead_letter_queue import DeadLetterQueue
from dispatcher.registry import SubscriptionRegistry
from proto.batch import encode_columns
from tests.dispatcher.test_dead_letter_records import letter
from wal import CorruptSegmentError, FaultyFs, LogConfig, LogWriter, WalClosedError
from wal.cold_reads import COLD_READ_THREADS, cold_read_pool
from wal.fs import FileSystem, WouldBlockError, nonblocking_reads, reading_nonblocking

on_a_loop = pytest.mark.asyncio(loop_scope="function")

#: Small segments, no tail cache: every read below the head goes to the files.
CONFIG = LogConfig(segment_bytes=512, index_interval_bytes=100, tail_cache_bytes=0)


class SlowColdFs(FaultyFs):
    """FaultyFs whose blocking reads of a cold file take ``cold_delay_s`` (the disk)."""

    def __init__(self, cold_delay_s: float = 0.0) -> None:
        super().__init__()
        self.cold_delay_s = cold_delay_s
        self.cold_read_threads: set[str] = set()

    def pread(self, fd: int, size: int, offset: int) -> bytes:
        path = self.path_of(fd)
        cold = any(part in path for part in self.cold)
        if cold and self.cold_delay_s and not reading_nonblocking():
            self.cold_read_threads.add(threading.current_thread().name)
            time.sleep(self.cold_delay_s)  # a worker thread waits for the "disk"
        return super().pread(fd, size, offset)


async def _until(condition: Callable[[], bool]) -> None:
    async with asyncio.timeout(5):
        while not condition():  # noqa: ASYNC110 - threads change what it reads
            await asyncio.sleep(0.005)


async def _writer_with_sealed_segments(
    path: Path, fs: FaultyFs, clock: Callable[[], int] | None = None
) -> LogWriter:
    writer = await LogWriter.open(str(path), CONFIG, fs=fs, clock=clock)
    for i in range(40):
        await writer.append(encode_columns([b"%04d" % i]))
    assert len(writer.log.segment_infos()) > 2
    return writer


async def _cold_then_cached(writer: LogWriter, expected: list[memoryview]) -> None:
    """Offset 0 is cold: read_nowait gives None, read_cold gives ``expected``; then it is
    cached: read_nowait gives ``expected`` on the loop."""
    assert writer.read_nowait(0, 300) is None
    assert [b.buffer for b in await writer.read_cold(0, 300)] == expected
    again = writer.read_nowait(0, 300)
    assert again is not None
    assert [b.buffer for b in again] == expected


def _first_segment(writer: LogWriter) -> str:
    return f"{writer.log.segment_infos()[0].base_offset:020d}.log"


def test_a_dropped_page_would_block_and_a_blocking_read_brings_it_back(tmp_path: Path) -> None:
    """Scenario: 1 MiB written and synced, its pages dropped from the page cache; read
    without blocking, then blocking, then without blocking again. Expected: the first
    raises WouldBlockError, the blocking one returns the bytes, the last returns them too
    (cached now). Skipped where the filesystem keeps the pages or ignores RWF_NOWAIT."""
    fs = FileSystem()
    path = str(tmp_path / "f")
    data = os.urandom(1 << 20)
    fd = fs.open(path, create=True)
    try:
        fs.write_all(fd, [data], 0)
        fs.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        try:
            with nonblocking_reads():
                fs.pread(fd, len(data), 0)
        except WouldBlockError:
            pass
        else:
            pytest.skip("this filesystem served dropped pages without blocking")
        assert fs.pread(fd, len(data), 0) == data
        with nonblocking_reads():
            assert fs.pread(fd, len(data), 0) == data
    finally:
        fs.close(fd)


@on_a_loop
async def test_read_nowait_hands_a_cold_segment_to_read_cold(tmp_path: Path) -> None:
    """Scenario: a log with sealed segments; the first segment's file is cold. Expected:
    read_nowait gives None and counts a cold read; read_cold gives what a blocking read
    gives; after it the file is cached and read_nowait serves it on the loop."""
    fs = FaultyFs()
    writer = await _writer_with_sealed_segments(tmp_path / "log", fs)
    try:
        expected = [b.buffer for b in writer.read(0, 300)]
        fs.cold = {_first_segment(writer)}
        await _cold_then_cached(writer, expected)
        assert writer.cold_reads == 1
    finally:
        await writer.aclose()


@on_a_loop
async def test_a_cold_index_is_loaded_off_the_loop(tmp_path: Path) -> None:
    """Scenario: a log reopened (no index loaded yet) whose first segment's index file is
    cold. Expected: read_nowait gives None (the index load would block); read_cold loads
    it and reads; read_nowait then works."""
    path = tmp_path / "log"
    writer = await _writer_with_sealed_segments(path, FaultyFs())
    expected = [b.buffer for b in writer.read(0, 300)]
    await writer.aclose()
    fs = FaultyFs()
    writer = await LogWriter.open(str(path), CONFIG, fs=fs)
    try:
        fs.cold = {f"{0:020d}.index"}
        await _cold_then_cached(writer, expected)
    finally:
        await writer.aclose()


@on_a_loop
async def test_the_loop_does_not_wait_for_another_threads_index_load(tmp_path: Path) -> None:
    """Scenario: a reopened log; another thread holds the first segment's index load lock
    (as a cold read loading it would). Expected: read_nowait gives None at once instead of
    waiting; once the lock is free, it reads."""
    path = tmp_path / "log"
    await (await _writer_with_sealed_segments(path, FaultyFs())).aclose()
    writer = await LogWriter.open(str(path), CONFIG)
    try:
        segment = writer.log._segments[0]
        held = threading.Event()
        release = threading.Event()

        def hold() -> None:
            with segment._load_lock:
                held.set()
                release.wait(5)

        holder = threading.Thread(target=hold)
        holder.start()
        held.wait(5)
        started = time.monotonic()
        assert writer.read_nowait(0, 300) is None
        assert time.monotonic() - started < 1.0
        release.set()
        holder.join()
        assert writer.read_nowait(0, 300)
    finally:
        await writer.aclose()


@on_a_loop
async def test_a_subscription_catching_up_on_cold_data_never_stalls_the_loop(
    tmp_path: Path,
) -> None:
    """Scenario: 40 records over several sealed segments, every segment file cold, each
    cold read taking 50 ms of "disk"; a subscription from the earliest offset, and a task
    that ticks every millisecond meanwhile. Expected: the consumer gets all 40 in order;
    the reads ran on worker threads, not the loop's; the ticker kept running through them
    (at least 50 ticks while 100+ ms of cold reads went on)."""
    fs = SlowColdFs()
    writer = await _writer_with_sealed_segments(tmp_path / "log", fs)
    fs.cold = {f"{s.base_offset:020d}.log" for s in writer.log.segment_infos()[:-1]}
    fs.cold_delay_s = 0.05
    registry = SubscriptionRegistry(str(tmp_path / "state"))
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.001)
            ticks += 1

    ticking = asyncio.create_task(ticker())
    try:
        sub = await registry.subscribe("t", "s", [writer])
        session = sub.attach("c", credit=100)
        got: list[int] = []
        started = time.monotonic()
        async with asyncio.timeout(10):
            while len(got) < 40:
                delivery = await session.next()
                assert delivery is not None
                got += list(range(delivery.from_offset, delivery.to_offset))
        elapsed = time.monotonic() - started
        assert got == list(range(40))
        assert writer.cold_reads >= 1
        assert fs.cold_read_threads  # the "disk" waits happened ...
        assert threading.current_thread().name not in fs.cold_read_threads  # ... off the loop
        assert elapsed >= 0.1
        assert ticks >= 50
    finally:
        ticking.cancel()
        await registry.aclose()
        await writer.aclose()


class ScanWatchFs(FaultyFs):
    """FaultyFs that notes the thread of every pread of more than 300 bytes: a scan of
    these small segments (an index rebuild) reads the whole of one at once; the tests'
    reads ask for 300 bytes at most."""

    def __init__(self) -> None:
        super().__init__()
        self.scan_threads: list[str] = []

    def pread(self, fd: int, size: int, offset: int) -> bytes:
        if size > 300:
            self.scan_threads.append(threading.current_thread().name)
        return super().pread(fd, size, offset)


@on_a_loop
async def test_an_index_rebuild_never_runs_on_the_loop(tmp_path: Path) -> None:
    """Scenario: a log reopened after its first segment's index file was deleted, so the
    first read of that segment must rebuild the index with a scan. Expected: read_nowait
    gives None (the scan is due) without scanning; read_cold rebuilds and reads; then
    read_nowait reads on the loop; every scan read ran off the loop's thread."""
    path = tmp_path / "log"
    writer = await _writer_with_sealed_segments(path, FaultyFs())
    expected = [b.buffer for b in writer.read(0, 300)]
    await writer.aclose()
    (path / f"{0:020d}.index").unlink()
    fs = ScanWatchFs()
    writer = await LogWriter.open(str(path), CONFIG, fs=fs)
    try:
        fs.scan_threads.clear()
        await _cold_then_cached(writer, expected)
        assert fs.scan_threads  # the rebuild scanned ...
        assert threading.current_thread().name not in fs.scan_threads  # ... off the loop
    finally:
        await writer.aclose()


@on_a_loop
async def test_damage_in_a_sealed_segment_is_found_off_the_loop_then_reported_at_once(
    tmp_path: Path,
) -> None:
    """Scenario: the header of the first sealed segment's second batch damaged (its base
    offset), so a read there fails its walk and the segment must be scanned to tell a
    wrong index from a damaged log. Expected: read_nowait gives None without scanning;
    read_cold scans (on a thread) and raises CorruptSegmentError; read_nowait then raises
    it at once on the loop, with no further scan."""
    path = tmp_path / "log"
    writer = await _writer_with_sealed_segments(path, FaultyFs())
    first = writer.read(0, 300)[0]
    await writer.aclose()
    segment = path / f"{0:020d}.log"
    data = bytearray(segment.read_bytes())
    data[first.size] ^= 0xFF  # the second batch's base offset
    segment.write_bytes(bytes(data))
    fs = ScanWatchFs()
    writer = await LogWriter.open(str(path), CONFIG, fs=fs)
    try:
        fs.scan_threads.clear()
        assert writer.read_nowait(1, 300) is None
        assert fs.scan_threads == []
        with pytest.raises(CorruptSegmentError):
            await writer.read_cold(1, 300)
        scans = len(fs.scan_threads)
        assert scans >= 1
        with pytest.raises(CorruptSegmentError):
            writer.read_nowait(1, 300)
        assert len(fs.scan_threads) == scans
        assert threading.current_thread().name not in fs.scan_threads
    finally:
        await writer.aclose()


@on_a_loop
async def test_retention_during_a_cold_read_moves_the_subscription_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Scenario: a subscription from the earliest offset over cold sealed segments, each
    cold read taking 200 ms; while the first one is on its thread, retention deletes every
    sealed segment. Expected: no dispatch error is logged; the consumer's deliveries go on
    from the new first offset to the head, in order."""
    fs = SlowColdFs()
    writer = await _writer_with_sealed_segments(tmp_path / "log", fs)
    sealed = writer.log.segment_infos()[:-1]
    fs.cold = {f"{s.base_offset:020d}.log" for s in sealed}
    fs.cold_delay_s = 0.2
    registry = SubscriptionRegistry(str(tmp_path / "state"))
    try:
        sub = await registry.subscribe("t", "s", [writer])
        session = sub.attach("c", credit=100)
        await _until(lambda: bool(fs.cold_read_threads))
        await writer.delete_before(writer.high_water_mark)
        first = writer.first_offset
        assert first == sealed[-1].next_offset
        got: list[int] = []
        async with asyncio.timeout(10):
            while not got or got[-1] < writer.high_water_mark - 1:
                delivery = await session.next()
                assert delivery is not None
                got += list(range(delivery.from_offset, delivery.to_offset))
        assert got[-(writer.high_water_mark - first) :] == list(
            range(first, writer.high_water_mark)
        )
        assert "dispatch failed" not in caplog.text
    finally:
        await registry.aclose()
        await writer.aclose()


@on_a_loop
async def test_aclose_waits_for_a_cold_read_on_its_thread(tmp_path: Path) -> None:
    """Scenario: a cold read taking 200 ms of "disk" is on its thread when the writer is
    closed. Expected: aclose returns only after that read ended, with every batch; a
    cold read asked for once closing began raises WalClosedError."""
    fs = SlowColdFs()
    writer = await _writer_with_sealed_segments(tmp_path / "log", fs)
    expected = [b.buffer for b in writer.read(0, 300)]
    fs.cold = {_first_segment(writer)}
    fs.cold_delay_s = 0.2
    read = asyncio.create_task(writer.read_cold(0, 300))
    await _until(lambda: bool(fs.cold_read_threads))
    closing = asyncio.create_task(writer.aclose())
    await asyncio.sleep(0)
    with pytest.raises(WalClosedError):
        await writer.read_cold(0, 300)
    await closing
    assert read.done()
    assert [b.buffer for b in read.result()] == expected


class GatedColdFs(FaultyFs):
    """FaultyFs whose blocking reads of a cold file wait until :attr:`gate` opens (a disk
    that does not answer), counting the reads waiting at once."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.waiting = 0
        self.most_waiting = 0
        self.threads: set[str] = set()
        self.paths_read: list[str] = []  # every pread's file, in order
        self._count = threading.Lock()

    def pread(self, fd: int, size: int, offset: int) -> bytes:
        path = self.path_of(fd)
        self.paths_read.append(os.path.basename(path))
        if any(part in path for part in self.cold) and not reading_nonblocking():
            with self._count:
                self.waiting += 1
                self.most_waiting = max(self.most_waiting, self.waiting)
                self.threads.add(threading.current_thread().name)
            self.gate.wait(10)
            with self._count:
                self.waiting -= 1
        return super().pread(fd, size, offset)


@on_a_loop
async def test_cold_reads_wait_in_a_pool_of_their_own(tmp_path: Path) -> None:
    """Scenario: ten cold reads of a segment whose "disk" does not answer until released,
    then a job for asyncio's default thread pool (where state saves and topic operations
    run). Expected: exactly COLD_READ_THREADS reads wait at once, on the cold-read
    threads; the default pool's job is done while they wait; once the disk answers, all
    ten give the segment's batches."""
    fs = GatedColdFs()
    writer = await _writer_with_sealed_segments(tmp_path / "log", fs)
    expected = [b.buffer for b in writer.read(0, 300)]
    fs.cold = {_first_segment(writer)}
    reads = [asyncio.create_task(writer.read_cold(0, 300)) for _ in range(10)]
    try:
        await _until(lambda: fs.waiting == COLD_READ_THREADS)
        assert await asyncio.wait_for(asyncio.to_thread(lambda: "saved"), 5) == "saved"
        assert fs.most_waiting == COLD_READ_THREADS
        assert all(name.startswith("headrace-cold-read") for name in fs.threads)
    finally:
        fs.gate.set()
        results = await asyncio.gather(*reads)
        await writer.aclose()
    assert all([b.buffer for b in got] == expected for got in results)


@on_a_loop
async def test_status_reads_a_cold_cursor_record_off_the_loop(tmp_path: Path) -> None:
    """Scenario: 40 records stamped at 1,000 ms after the epoch, a subscription at offset
    0 with no consumer, the segment holding its cursor record cold (50 ms of "disk").
    Expected: status reports the whole lag and an age taken from that record (now minus
    1 s: more than 50 years), and the record was read on a worker thread, not the loop's."""
    fs = SlowColdFs(cold_delay_s=0.05)
    writer = await _writer_with_sealed_segments(tmp_path / "log", fs, clock=lambda: 1_000)
    registry = SubscriptionRegistry(str(tmp_path / "state"))
    try:
        sub = await registry.subscribe("t", "s", [writer])
        fs.cold = {_first_segment(writer)}
        (part,) = (await sub.status()).partitions
        assert part.lag == 40
        assert part.oldest_unacked_age_s == pytest.approx(time.time() - 1, abs=60)
        assert fs.cold_read_threads
        assert threading.current_thread().name not in fs.cold_read_threads
    finally:
        await registry.aclose()
        await writer.aclose()


@on_a_loop
async def test_a_time_lookup_goes_on_when_retention_deletes_what_a_thread_reads(
    tmp_path: Path,
) -> None:
    """Scenario: offset_for_time(0) over cold sealed segments, each cold read taking
    200 ms; while the first read is on its thread, retention deletes every sealed segment.
    Expected: the answer is the new first offset (the oldest record left), not an error;
    the read ran off the loop."""
    fs = SlowColdFs()
    writer = await _writer_with_sealed_segments(tmp_path / "log", fs)
    try:
        fs.cold = {f"{s.base_offset:020d}.log" for s in writer.log.segment_infos()[:-1]}
        fs.cold_delay_s = 0.2
        lookup = asyncio.create_task(offset_for_time(writer, 0))
        await _until(lambda: bool(fs.cold_read_threads))
        await writer.delete_before(writer.high_water_mark)
        assert await lookup == writer.first_offset > 0
        assert threading.current_thread().name not in fs.cold_read_threads
    finally:
        await writer.aclose()


@on_a_loop
async def test_a_dead_letter_peek_reads_cold_segments_and_holds_off_removals(
    tmp_path: Path,
) -> None:
    """Scenario: a dead-letter queue of 20 entries over small segments, all of its sealed
    segments cold (200 ms of "disk" each); a peek starts, and an ack of entries 0-12 is
    asked for while its first read is on a thread. Expected: the peek gives all 20 entries
    (the ack waited: it would have deleted the segments being read); the reads ran off
    the loop; a peek after the ack gives 13-19."""
    fs = SlowColdFs()
    directory = str(tmp_path / "dlq")
    dlq = await DeadLetterQueue.open(directory, DlqConfig(), fs=fs, log_config=CONFIG)
    try:
        for i in range(20):
            await dlq.put([letter(i)])
        sealed = [n for n in os.listdir(os.path.join(directory, "log")) if n.endswith(".log")]
        assert len(sealed) > 2
        fs.cold = set(sorted(sealed)[:-1])
        fs.cold_delay_s = 0.2
        peek = asyncio.create_task(dlq.peek())
        await _until(lambda: bool(fs.cold_read_threads))
        ack = asyncio.create_task(dlq.ack_up_to(12))
        assert [e.sequence for e in await peek] == list(range(20))
        assert await ack == 13
        assert [e.sequence for e in await dlq.peek()] == list(range(13, 20))
        assert threading.current_thread().name not in fs.cold_read_threads
    finally:
        await dlq.aclose()


@on_a_loop
async def test_a_cold_read_cancelled_while_it_waits_for_a_thread_never_runs(
    tmp_path: Path,
) -> None:
    """Scenario: COLD_READ_THREADS cold reads of the first segment hold every cold-read
    thread on a disk that does not answer; a read of the second segment queues behind
    them and its caller is cancelled (a Fetch past its deadline). Expected: that caller
    gets CancelledError at once, not when the disk answers; the others then give their
    batches; the second segment's file is never read, though the pool ran dry after."""
    fs = GatedColdFs()
    writer = await _writer_with_sealed_segments(tmp_path / "log", fs)
    second = writer.log.segment_infos()[1]
    fs.cold = {_first_segment(writer)}
    holding = [asyncio.create_task(writer.read_cold(0, 300)) for _ in range(COLD_READ_THREADS)]
    try:
        await _until(lambda: fs.waiting == COLD_READ_THREADS)
        queued = asyncio.create_task(writer.read_cold(second.base_offset, 300))
        await asyncio.sleep(0)  # it is queued for a thread
        queued.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(queued, 2)
    finally:
        fs.gate.set()
        await asyncio.gather(*holding)
        await asyncio.get_running_loop().run_in_executor(cold_read_pool(), lambda: None)
        await writer.aclose()
    assert f"{second.base_offset:020d}.log" not in fs.paths_read


#: Run in a fresh interpreter, so the fork happens in a process whose only threads are
#: the ones it made (a test process has gRPC's and others, which a fork may catch holding
#: a lock): cold reads fill the pool, then a forked child does one on a fresh loop. Exit
#: code 0: the child's read gave batches; 3: it did not end within 20 s.
_FORK_SCRIPT = """
import asyncio, os, sys, time
from proto.batch import encode_columns
from wal import FaultyFs, LogConfig, LogWriter

CONFIG = LogConfig(segment_bytes=512, index_interval_bytes=100, tail_cache_bytes=0)
FIRST = "%020d.log" % 0

async def cold_reads(path, count):
    fs = FaultyFs()
    writer = await LogWriter.open(path, CONFIG, fs=fs)
    try:
        if writer.high_water_mark == 0:
            for i in range(40):
                await writer.append(encode_columns([b"%04d" % i]))
        fs.cold = {FIRST}
        return all(await asyncio.gather(*(writer.read_cold(0, 300) for _ in range(count))))
    finally:
        await writer.aclose()

path = sys.argv[1]
assert asyncio.run(cold_reads(path, 8))
pid = os.fork()
if pid == 0:
    os._exit(0 if asyncio.run(cold_reads(path, 1)) else 1)
deadline = time.monotonic() + 20
while time.monotonic() < deadline:
    done, status = os.waitpid(pid, os.WNOHANG)
    if done:
        sys.exit(os.waitstatus_to_exitcode(status))
    time.sleep(0.05)
os.kill(pid, 9)
sys.exit(3)
"""


def test_a_forked_child_gets_cold_read_threads_of_its_own(tmp_path: Path) -> None:
    """Scenario: a process does cold reads (its pool's threads then idle), then forks, and
    the child reads a cold segment. Expected: the child's read gives batches and it exits
    0 (the parent's pool, copied, counts threads the child does not have as idle and
    would never start one: the child hung)."""
    done = subprocess.run(
        [sys.executable, "-c", _FORK_SCRIPT, str(tmp_path / "log")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
