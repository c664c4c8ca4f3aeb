"""Async tests of a follower's append (:meth:`wal.LogWriter.append_replicated`) and the
leader's raw read (:meth:`wal.LogWriter.read_raw`), on real files.

A leader is a :class:`~wal.LogWriter` written by ordinary appends; a follower with the same
config is fed ``read_raw`` answers from it. The claims checked: the follower's segment
files end byte-identical to the leader's; a refused chunk writes nothing; under ``always``
the head returned is durable (:class:`DurableFs` records what each ``fdatasync`` covered);
a cancelled caller still waits the append out.
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import random
import threading
from pathlib import Path

import pytest

from tests.wal._replica import log_bytes, log_files, random_batches
from wal import (
    CorruptBatchError,
    DiskFullError,
    Fault,
    FaultyFs,
    FsyncPolicy,
    LogConfig,
    LogWriter,
    OffsetOutOfRangeError,
    RecordBatch,
    ReplicaOffsetMismatchError,
    iter_batches,
)

#: Segments of ~4 KiB (a few dozen batches each), an index entry every 256 B, a tail cache
#: of 8 KiB: reads near the head come from memory, older ones from the files.
CONFIG = LogConfig(segment_bytes=4096, index_interval_bytes=256, tail_cache_bytes=8192)


class DurableFs(FaultyFs):
    """A FaultyFs that knows how far the log is durable: after each successful fdatasync of
    a ``.log`` it raises ``durable`` to the offset just past the file's last whole batch."""

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
    """Blocks the next fdatasync, before it runs, while ``hold`` is set."""

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


async def leader_with(
    path: Path, batches: list[bytes], *, rng: random.Random | None = None, rolls: bool = False
) -> LogWriter:
    """A leader holding ``batches``, appended by four concurrent tasks in turn (so group
    commits hold several); with ``rolls``, it also seals its segment at random moments."""
    leader = await LogWriter.open(str(path), CONFIG)
    for start in range(0, len(batches), 4):
        await asyncio.gather(*(leader.append(b) for b in batches[start : start + 4]))
        if rolls and rng is not None and rng.random() < 0.1:
            await leader.roll()
    return leader


async def feed(
    leader: LogWriter, follower: LogWriter, rng: random.Random, fs: DurableFs | None = None
) -> int:
    """Feed ``follower`` from ``leader`` in chunks of random ``max_bytes`` until it holds
    everything durable on the leader; check each call's answer; return the calls made."""
    calls = 0
    while follower.head < leader.high_water_mark:
        chunk = await leader.read_raw(follower.head, rng.choice([1, 100, 700, 3000, 20000]))
        head = await follower.append_replicated(chunk)
        calls += 1
        assert head == follower.head == follower.high_water_mark
        if fs is not None:
            assert fs.durable >= head, "append_replicated returned before its fdatasync"
    return calls


@pytest.mark.asyncio
@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_follower_fed_in_random_chunks_ends_byte_identical(tmp_path: Path, seed: int) -> None:
    """Scenario: a leader holds 300 random batches over many ~4 KiB segments; a follower
    with the same config (fsync always) is fed ``read_raw`` chunks of random sizes from its
    head. Expected: every call returns a durable head (an fdatasync covered it); at the end
    the follower's ``.log`` files have the leader's names and bytes, and its raw reads
    (tail cache and files) give the leader's bytes."""
    rng = random.Random(seed)
    leader = await leader_with(tmp_path / "leader", random_batches(rng, 300))
    fs = DurableFs()
    follower = await LogWriter.open(str(tmp_path / "follower"), CONFIG, fs=fs)
    calls = await feed(leader, follower, rng, fs)
    assert calls > 10
    assert follower.head == leader.high_water_mark
    assert await follower.read_raw(0, 1 << 30) == await leader.read_raw(0, 1 << 30)
    await leader.aclose()
    await follower.aclose()
    leader_files = log_files(tmp_path / "leader")
    assert len(leader_files) > 5
    assert log_files(tmp_path / "follower") == leader_files


@pytest.mark.asyncio
async def test_leader_rolls_of_its_own_leave_the_same_log_in_other_segments(
    tmp_path: Path,
) -> None:
    """Scenario: the leader also seals segments at random moments (as a time-based roll
    does), which the follower does not. Expected: the follower's segment files end to end
    are the leader's byte for byte, and each record is at the same offset."""
    rng = random.Random(7)
    leader = await leader_with(tmp_path / "leader", random_batches(rng, 200), rng=rng, rolls=True)
    follower = await LogWriter.open(str(tmp_path / "follower"), CONFIG)
    await feed(leader, follower, rng)
    await leader.aclose()
    await follower.aclose()
    assert log_files(tmp_path / "follower").keys() != log_files(tmp_path / "leader").keys()
    assert log_bytes(tmp_path / "follower") == log_bytes(tmp_path / "leader")


def _damaged(chunk: bytes, at: int = -3, bit: int = 0x01) -> bytes:
    out = bytearray(chunk)
    out[at] ^= bit  # by default inside the last batch's body: its CRC fails
    return bytes(out)


CASES = {
    # name: (how the chunk is made from the leader's raw bytes, the error expected)
    "gap": ("drop the second batch", ReplicaOffsetMismatchError),
    "overlap": ("repeat the first batch", ReplicaOffsetMismatchError),
    "ahead": ("start one batch past the head", ReplicaOffsetMismatchError),
    "behind": ("start one batch before the head", ReplicaOffsetMismatchError),
    "corrupt": ("flip a bit in the last batch", CorruptBatchError),
    "partial": ("cut the last batch short", CorruptBatchError),
    "header": ("flip a bit of the last batch's record_count", CorruptBatchError),
    "length": ("flip a bit of the last batch's batch_length", CorruptBatchError),
    "crc": ("flip a bit of the last batch's crc32c", CorruptBatchError),
    "last_byte": ("flip the top bit of the chunk's last byte", CorruptBatchError),
}


@pytest.mark.asyncio
@pytest.mark.parametrize("case", sorted(CASES))
async def test_a_refused_chunk_writes_nothing(tmp_path: Path, case: str) -> None:
    """Scenario: a follower holds the leader's first 20 batches; it is given a chunk of the
    next batches spoiled as ``case`` says. Expected: the error of that case; no pwritev
    was made, the follower's head, mark and files are as before; the next good chunk is
    appended and the files end identical to the leader's."""
    rng = random.Random(case)
    leader = await leader_with(tmp_path / "leader", random_batches(rng, 40))
    all_batches = list(iter_batches(await leader.read_raw(0, 1 << 30)))
    fs = FaultyFs()
    follower = await LogWriter.open(str(tmp_path / "follower"), CONFIG, fs=fs)
    await follower.append_replicated(b"".join(bytes(b.buffer) for b in all_batches[:20]))
    good = [bytes(b.buffer) for b in all_batches[20:25]]
    bad = {
        "gap": [good[0], *good[2:]],
        "overlap": [good[0], good[0], *good[1:]],
        "ahead": good[1:],
        "behind": [bytes(all_batches[19].buffer), *good],
        "corrupt": [*good[:-1], _damaged(good[-1])],
        "partial": [*good[:-1], good[-1][:-8]],
        "header": [*good[:-1], _damaged(good[-1], 20)],
        "length": [*good[:-1], _damaged(good[-1], 9)],
        "crc": [*good[:-1], _damaged(good[-1], 13, 0x40)],
        "last_byte": [*good[:-1], _damaged(good[-1], -1, 0x80)],
    }[case]
    head, files, writes = follower.head, log_files(tmp_path / "follower"), fs.calls["pwritev"]
    with pytest.raises(CASES[case][1]):
        await follower.append_replicated(b"".join(bad))
    assert fs.calls["pwritev"] == writes
    assert follower.head == follower.high_water_mark == head
    assert log_files(tmp_path / "follower") == files
    await feed(leader, follower, rng)
    await follower.aclose()
    await leader.aclose()
    assert log_files(tmp_path / "follower") == log_files(tmp_path / "leader")


@pytest.mark.asyncio
async def test_a_batch_over_the_followers_limits_is_appended_as_the_leader_holds_it(
    tmp_path: Path,
) -> None:
    """Scenario: a leader holds 40 batches; its follower's max_batch_bytes is 8 bytes under
    the biggest of them and its max_record_bytes 1 (every record is over it). Expected:
    the follower appends them all (its limits are for publishes; the leader applied its
    own), and its files end byte-identical to the leader's."""
    rng = random.Random(7)
    leader = await leader_with(tmp_path / "leader", random_batches(rng, 40))
    raw = await leader.read_raw(0, 1 << 30)
    biggest = max(b.size for b in iter_batches(raw))
    config = dataclasses.replace(CONFIG, max_batch_bytes=biggest - 8, max_record_bytes=1)
    follower = await LogWriter.open(str(tmp_path / "follower"), config)
    assert await follower.append_replicated(raw) == leader.head
    await follower.aclose()
    await leader.aclose()
    assert log_files(tmp_path / "follower") == log_files(tmp_path / "leader")


@pytest.mark.asyncio
async def test_the_head_check_is_made_at_the_write_after_queued_appends(tmp_path: Path) -> None:
    """Scenario: a local append is queued on the follower (as a deposed leader's could be)
    and, in the same loop turn, a replicated chunk that starts at the old head. Expected:
    the local append lands first; the chunk is refused at the write (its first batch is no
    longer at the head) and nothing of it is written."""
    rng = random.Random(11)
    leader = await leader_with(tmp_path / "leader", random_batches(rng, 5))
    chunk = await leader.read_raw(0, 1 << 30)
    follower = await LogWriter.open(str(tmp_path / "follower"), CONFIG)
    local = asyncio.ensure_future(follower.append(random_batches(random.Random(1), 1)[0]))
    await asyncio.sleep(0)
    with pytest.raises(ReplicaOffsetMismatchError) as info:
        await follower.append_replicated(chunk)
    assert (info.value.index, info.value.found) == (0, 0)
    result = await local
    assert follower.head == result.last_offset + 1 == info.value.expected
    await follower.aclose()
    await leader.aclose()


@pytest.mark.asyncio
async def test_a_cancelled_caller_still_waits_the_append_out(tmp_path: Path) -> None:
    """Scenario: the follower's fdatasync is held while a replicated append waits for it,
    and its caller is cancelled. Expected: the caller does not return while the sync is
    held; once released it raises CancelledError, and the batches are written, synced and
    counted (head and mark past them); the next chunk appends from there."""
    rng = random.Random(5)
    leader = await leader_with(tmp_path / "leader", random_batches(rng, 30))
    raw = await leader.read_raw(0, 1 << 30)
    batches = list(iter_batches(raw))
    first = b"".join(bytes(b.buffer) for b in batches[:10])
    fs = HeldFs()
    follower = await LogWriter.open(str(tmp_path / "follower"), CONFIG, fs=fs)
    fs.hold = True
    task = asyncio.create_task(follower.append_replicated(first))
    assert await asyncio.to_thread(fs.entered.wait, 10)
    task.cancel()
    await asyncio.sleep(0.05)
    assert not task.done(), "the caller left while its append was still being synced"
    fs.released.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert follower.head == follower.high_water_mark == batches[9].next_offset
    await feed(leader, follower, rng)
    await follower.aclose()
    await leader.aclose()
    assert log_files(tmp_path / "follower") == log_files(tmp_path / "leader")


@pytest.mark.asyncio
async def test_interval_returns_once_written_and_the_mark_waits_for_the_sync(
    tmp_path: Path,
) -> None:
    """Scenario: a follower under fsync ``interval`` (a minute apart) appends a chunk
    within one segment. Expected: the call returns the new head with no fdatasync made,
    the mark has not moved and a raw read from 0 gives nothing; after flush() the mark is
    the head."""
    rng = random.Random(3)
    leader = await leader_with(tmp_path / "leader", random_batches(rng, 10))
    chunk = await leader.read_raw(0, 1500)
    fs = DurableFs()
    config = dataclasses.replace(CONFIG, fsync=FsyncPolicy.INTERVAL, fsync_interval_ms=60_000)
    follower = await LogWriter.open(str(tmp_path / "follower"), config, fs=fs)
    syncs = fs.calls.get("fdatasync", 0)
    head = await follower.append_replicated(chunk)
    assert 0 < head == follower.head < leader.high_water_mark
    assert fs.calls.get("fdatasync", 0) == syncs
    assert follower.high_water_mark == 0
    assert await follower.read_raw(0) == b""
    await follower.flush()
    assert follower.high_water_mark == head == fs.durable
    await follower.aclose()
    await leader.aclose()


@pytest.mark.asyncio
async def test_never_returns_once_written_and_the_mark_follows(tmp_path: Path) -> None:
    """Scenario: a follower under fsync ``never`` appends a chunk within one segment.
    Expected: no fdatasync, and the mark is the head at once (the policy's promise: the
    page cache)."""
    rng = random.Random(4)
    leader = await leader_with(tmp_path / "leader", random_batches(rng, 10))
    fs = FaultyFs()
    config = dataclasses.replace(CONFIG, fsync=FsyncPolicy.NEVER)
    follower = await LogWriter.open(str(tmp_path / "follower"), config, fs=fs)
    syncs = fs.calls.get("fdatasync", 0)
    head = await follower.append_replicated(await leader.read_raw(0, 1500))
    assert fs.calls.get("fdatasync", 0) == syncs
    assert 0 < head == follower.head == follower.high_water_mark
    await follower.aclose()
    await leader.aclose()


@pytest.mark.asyncio
async def test_read_raw_bounds(tmp_path: Path) -> None:
    """Scenario: raw reads of a leader at its edges. Expected: at the mark, ``b""``; with
    ``max_bytes`` 1, exactly one whole batch; from inside a batch, from that batch's start;
    past the head, OffsetOutOfRangeError; every answer is a slice of the log's bytes."""
    rng = random.Random(9)
    leader = await leader_with(tmp_path / "leader", random_batches(rng, 20))
    raw = await leader.read_raw(0, 1 << 30)
    batches = list(iter_batches(raw))
    assert await leader.read_raw(leader.high_water_mark) == b""
    one = await leader.read_raw(batches[3].base_offset, 1)
    assert one == bytes(batches[3].buffer)
    multi = next(b for b in batches if b.record_count > 1)
    assert (await leader.read_raw(multi.base_offset + 1, 1)) == bytes(multi.buffer)
    with pytest.raises(OffsetOutOfRangeError):
        await leader.read_raw(leader.head + 1)
    await leader.aclose()
    assert raw == log_bytes(tmp_path / "leader")


@pytest.mark.asyncio
async def test_read_raw_of_a_cold_segment_goes_to_a_thread(tmp_path: Path) -> None:
    """Scenario: a leader whose oldest segment is out of the page cache (FaultyFs.cold) and
    out of the tail cache. Expected: the raw read is served off the loop (one cold read
    counted) and gives the file's bytes from the start."""
    rng = random.Random(10)
    fs = FaultyFs()
    leader = await LogWriter.open(str(tmp_path / "leader"), CONFIG, fs=fs)
    for batch in random_batches(rng, 120):
        await leader.append(batch)
    first = min(log_files(tmp_path / "leader"))
    fs.cold.add(first)
    got = await leader.read_raw(0, 2000)
    assert leader.cold_reads == 1
    assert got == log_files(tmp_path / "leader")[first][: len(got)]
    await leader.aclose()


@pytest.mark.asyncio
async def test_reads_stay_true_across_local_and_replicated_appends(tmp_path: Path) -> None:
    """Scenario: a log takes 10 local appends (they go to the tail cache), then 10
    replicated batches (which do not), then 10 local appends again (a follower promoted).
    Expected: a read from every batch's offset gives the files' bytes from there (the cache
    never answers with a stale or missing batch); the offsets are dense."""
    rng = random.Random(12)
    leader = await leader_with(tmp_path / "leader", random_batches(rng, 20))
    batches = list(iter_batches(await leader.read_raw(0, 1 << 30)))
    writer = await LogWriter.open(str(tmp_path / "log"), CONFIG)
    for batch in batches[:10]:  # local appends of the same records (base offset 0 sent)
        await writer.append(bytes(8) + bytes(batch.buffer[8:]))
    await writer.append_replicated(b"".join(bytes(b.buffer) for b in batches[10:]))
    for produced in random_batches(rng, 10):
        await writer.append(produced)
    files = log_bytes(tmp_path / "log")
    positions = _positions(files)
    assert [b.base_offset for b, _ in positions[1:]] == [b.next_offset for b, _ in positions[:-1]]
    starts = {b.base_offset: pos for b, pos in positions}
    for offset, pos in starts.items():
        got = await writer.read_raw(offset, 1 << 30)
        assert got == files[pos:], offset
    assert await writer.read_raw(0, 1 << 30) == files
    await writer.aclose()
    await leader.aclose()


def _positions(data: bytes) -> list[tuple[RecordBatch, int]]:
    out, pos = [], 0
    for batch in iter_batches(data):
        out.append((batch, pos))
        pos += batch.size
    return out


@pytest.mark.asyncio
async def test_a_full_disk_mid_chunk_keeps_the_whole_batches_before_it(tmp_path: Path) -> None:
    """Scenario: a chunk spanning a segment roll is appended while the disk fills after the
    first segment's write (ENOSPC on the second pwritev). Expected: DiskFullError naming
    the batches written; those are in the log, synced, and the head and mark are past
    them; with space back, fetching from the head ends identical to the leader."""
    rng = random.Random(13)
    leader = await leader_with(tmp_path / "leader", random_batches(rng, 60))
    chunk = await leader.read_raw(0, 1 << 30)
    batches = list(iter_batches(chunk))
    fs = DurableFs()
    follower = await LogWriter.open(str(tmp_path / "follower"), CONFIG, fs=fs)
    fs.faults.append(Fault("pwritev", errno.ENOSPC, after=1, path_contains=".log"))
    with pytest.raises(DiskFullError) as info:
        await follower.append_replicated(chunk)
    written = info.value.written
    assert 0 < written < len(batches)
    assert follower.head == follower.high_water_mark == batches[written - 1].next_offset
    assert fs.durable == follower.head
    fs.faults.clear()
    await feed(leader, follower, rng)
    await follower.aclose()
    await leader.aclose()
    assert log_files(tmp_path / "follower") == log_files(tmp_path / "leader")
