"""Partition: periodic producer snapshots and the rebuild of dedup state at open.

A "crash" in process is the log's writer closed without :meth:`Partition.aclose`, so no
snapshot is written on the way out, as after a SIGKILL; the SIGKILL test runs a real
``headrace serve`` and kills it.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import grpc
import pytest

from broker.partition import UNKNOWN_OFFSETS, Partition
from proto import admin_pb2 as admin
from proto import admin_pb2_grpc, broker_pb2_grpc
from proto import broker_pb2 as pb
from tests.broker.test_kill import BrokerProcess
from tests.broker.test_serve_process import free_port
from wal import FileSystem, LogConfig, encode_columns
from wal.log import Log

PID = 7


def batch(seq: int, value: bytes = b"v" * 40, pid: int = PID) -> bytes:
    return encode_columns([value], producer_id=pid, base_sequence=seq)


def snapshot_doc(topic_dir: Path, index: int = 0) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((topic_dir / f"{index}.producers.json").read_bytes())
    return doc


async def open_partition(
    topic_dir: Path, config: LogConfig | None = None, snapshot_bytes: int = 1 << 30
) -> Partition:
    return await Partition.open(
        0, str(topic_dir), config or LogConfig(), FileSystem(), snapshot_bytes=snapshot_bytes
    )


async def crash(partition: Partition) -> None:
    """Stop the partition as a SIGKILL would: the log closes, no snapshot is written."""
    partition.writer.remove_listener(partition._on_durable)
    if partition._snapshot_task is not None:
        await partition._snapshot_task
    await partition.writer.aclose()


@pytest.mark.asyncio
async def test_a_roll_writes_a_snapshot_at_the_high_water_mark(tmp_path: Path) -> None:
    """Scenario: 512 B segments, batches of ~120 B from one producer, no byte threshold.
    Expected: each roll starts a snapshot; the file's offset is a durable offset at or
    below the head, and it lists exactly the batches below that offset."""
    p = await open_partition(tmp_path, LogConfig(segment_bytes=512))
    for seq in range(12):
        await p.append(batch(seq))
    await crash(p)
    assert p.log.segment_count >= 3
    assert p.snapshots_written >= 2
    doc = snapshot_doc(tmp_path)
    offset = doc["offset"]
    assert isinstance(offset, int)
    assert 0 < offset <= p.log.head
    producers = doc["producers"]
    assert isinstance(producers, dict)
    rows = producers[str(PID)]["appended"]
    assert rows[-1][3] == offset - 1  # every batch below the offset, none above


@pytest.mark.asyncio
async def test_snapshot_bytes_triggers_a_snapshot_without_a_roll(tmp_path: Path) -> None:
    """Scenario: one big segment, ``snapshot_bytes`` 1 KiB, 30 batches of ~120 B.
    Expected: snapshots were written while appending (no roll happened), none of them
    ahead of the high-water mark."""
    p = await open_partition(tmp_path, snapshot_bytes=1024)
    for seq in range(30):
        await p.append(batch(seq))
        if (tmp_path / "0.producers.json").exists():
            assert snapshot_doc(tmp_path)["offset"] <= p.writer.high_water_mark
    await crash(p)
    assert p.log.segment_count == 1
    assert p.snapshots_written >= 2


@pytest.mark.asyncio
async def test_dedup_survives_a_crash_and_the_scan_starts_at_the_snapshot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Scenario: 20 batches with snapshots at rolls, then a crash (no closing snapshot).
    Expected: the reopened partition reads the log from the snapshot's offset only, and
    answers retries of batches before and after the snapshot as duplicates with their
    original offsets (older ones as duplicates at unknown offsets, as before a crash);
    the next sequence is appended."""
    p = await open_partition(tmp_path, LogConfig(segment_bytes=512))
    first = [(await p.append(batch(seq)))[0] for seq in range(20)]
    await crash(p)
    offset = snapshot_doc(tmp_path)["offset"]
    assert isinstance(offset, int)
    assert 0 < offset < 20

    reads: list[int] = []
    real_read = Log.read

    def spy(self: Log, at: int, max_bytes: int = 1 << 20, *, upper: int | None = None) -> object:
        reads.append(at)
        return real_read(self, at, max_bytes, upper=upper)

    monkeypatch.setattr(Log, "read", spy)
    q = await open_partition(tmp_path, LogConfig(segment_bytes=512))
    monkeypatch.setattr(Log, "read", real_read)
    assert reads
    assert reads[0] == offset
    try:
        for seq in (16, 19):  # in the window: the original offsets
            assert await q.append(batch(seq)) == (first[seq], True)
        assert await q.append(batch(0)) == (UNKNOWN_OFFSETS, True)  # long ago, before it
        result, duplicate = await q.append(batch(20))
        assert (result.first_offset, duplicate) == (20, False)
    finally:
        await q.aclose()


@pytest.mark.asyncio
async def test_a_snapshot_ahead_of_a_truncated_log_is_discarded_for_good(tmp_path: Path) -> None:
    """Scenario: batches 0-9 (one record each), a snapshot at offset 10, then a power cut
    tears the log so recovery keeps only batches 0-5, below the snapshot.
    Expected: the snapshot is deleted, not trusted: batch 3 is a duplicate (still in the
    log), batch 6 is appended again (it was lost: a trusted snapshot would have called it
    a duplicate and lost it). Then batches of two records each at sequences 7, 9 and 11
    are appended (offsets 7-8, 9-10, 11-12) and the broker crashes again with no new
    snapshot. Expected: the reopened partition answers from the log, e.g. sequence 7 as a
    duplicate at 7-8; the old snapshot at 10 did not come back to describe sequences 5-9
    as one-record batches (it would answer 7 as a duplicate at unknown offsets)."""
    p = await open_partition(tmp_path)
    for seq in range(10):
        await p.append(batch(seq))
    assert await p.save_snapshot() == 10
    await crash(p)
    segment = tmp_path / "0" / f"{0:020d}.log"
    size = segment.stat().st_size
    os.truncate(segment, size * 6 // 10 + 5)  # batches are equal: keeps 0-5 and a torn 6th

    q = await open_partition(tmp_path)
    assert q.log.head == 6
    assert not (tmp_path / "0.producers.json").exists()
    assert await q.append(batch(3)) == ((3, 3), True)
    assert await q.append(batch(6)) == ((6, 6), False)
    for seq in (7, 9, 11):
        assert await q.append(pair(seq)) == ((seq, seq + 1), False)
    await crash(q)

    r = await open_partition(tmp_path)
    try:
        for seq in (7, 9, 11):
            assert await r.append(pair(seq)) == ((seq, seq + 1), True)
        assert r.log.head == 13
    finally:
        await r.aclose()


@pytest.mark.asyncio
async def test_a_snapshot_waits_for_durable_batches_not_yet_in_the_table(tmp_path: Path) -> None:
    """Scenario: five batches are appended concurrently in one group commit; a snapshot is
    started the moment the high-water mark passes them (from a mark listener: they are
    durable, but no append has resumed to commit its batch to the table yet).
    Expected: the snapshot waits for those commits: its offset is 5 and it lists all five
    batches."""
    p = await open_partition(tmp_path)
    started: list[asyncio.Task[int]] = []
    uncommitted: list[int] = []

    def on_mark(mark: int) -> None:
        if mark == 5 and not started:
            uncommitted.append(len(p._in_flight))
            started.append(asyncio.create_task(p.save_snapshot()))

    p.writer.add_listener(on_mark)
    await asyncio.gather(*(p.append(batch(seq)) for seq in range(5)))
    assert await started[0] == 5
    await crash(p)
    assert uncommitted == [5]
    rows = snapshot_doc(tmp_path)["producers"][str(PID)]["appended"]
    assert [r[0] for r in rows] == [0, 1, 2, 3, 4]


def pair(seq: int) -> bytes:
    return encode_columns([b"x", b"y"], producer_id=PID, base_sequence=seq)


# ---------------------------------------------------------------------------------------
# A real broker process, SIGKILLed

CONFIG = """\
[broker]
grace_seconds = 1.0
producer_snapshot_bytes = 4096

[wal]
fsync = "always"
segment_bytes = 16384
"""


@pytest.mark.asyncio
@pytest.mark.timeout(60)
async def test_dedup_survives_sigkill_with_snapshots_written_while_serving(
    tmp_path: Path,
) -> None:
    """Scenario: ``headrace serve`` with 16 KiB segments and ``producer_snapshot_bytes`` 4
    KiB; 200 acknowledged batches from one producer; SIGKILL; restart.
    Expected: the broker wrote a snapshot while serving (its offset within the log, past
    0); after the restart, retries of the last acknowledged batches are answered as
    duplicates with their original offsets, one of the first as a duplicate at unknown
    offsets, and the next batch is appended right after them."""
    broker = BrokerProcess(tmp_path, free_port(), CONFIG)
    await broker.start()
    try:
        async with grpc.aio.insecure_channel(broker.address) as channel:
            stub = broker_pb2_grpc.BrokerStub(channel)
            await admin_pb2_grpc.AdminStub(channel).CreateTopic(
                admin.CreateTopicRequest(name="t", partitions=1)
            )
            sent = []
            for seq in range(200):
                got = await stub.Publish(pb.PublishRequest(topic="t", batch=batch(seq)))
                sent.append(got.base_offset)
        broker.kill()
        doc = snapshot_doc(tmp_path / "data" / "topics" / "t")
        assert isinstance(doc["offset"], int)
        assert 0 < doc["offset"] <= 200
        await broker.start()
        async with grpc.aio.insecure_channel(broker.address) as channel:
            stub = broker_pb2_grpc.BrokerStub(channel)
            for seq in (195, 199):  # in the window: the original offsets
                got = await stub.Publish(pb.PublishRequest(topic="t", batch=batch(seq)))
                assert (got.base_offset, got.duplicate) == (sent[seq], True)
            got = await stub.Publish(pb.PublishRequest(topic="t", batch=batch(0)))
            assert (got.base_offset, got.duplicate) == (-1, True)  # long ago: no offsets
            got = await stub.Publish(pb.PublishRequest(topic="t", batch=batch(200)))
            assert (got.base_offset, got.duplicate) == (200, False)
    finally:
        broker.kill()
