"""Idempotent publishing over real gRPC: retries are answered, never appended twice."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import shutil
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
import pytest_asyncio

from broker.app import Broker
from broker.partition import Partition
from proto import admin_pb2 as admin
from proto import broker_pb2 as pb
from tests.broker.conftest import Client, broker_config, serving
from tests.wal.test_writer import HeldFs
from wal import AppendResult, LogConfig, decode_batch, encode_columns


def batch(pid: int, seq: int, *values: bytes) -> bytes:
    return encode_columns(list(values), producer_id=pid, base_sequence=seq)


async def head(c: Client, topic: str) -> int:
    info = await c.admin.DescribeTopic(admin.DescribeTopicRequest(name=topic))
    return int(info.partitions[0].head)


async def fetched_values(c: Client, topic: str) -> list[bytes]:
    """Every record value of partition 0 of ``topic``, in offset order."""
    got = await c.broker.Fetch(pb.FetchRequest(topic=topic, partition=0, offset=0))
    values: list[bytes] = []
    for raw in got.batches:
        decoded = decode_batch(raw)
        assert decoded is not None
        values += decoded.values()
    return values


async def publish(c: Client, data: bytes) -> pb.PublishResponse:
    response: pb.PublishResponse = await c.broker.Publish(
        pb.PublishRequest(topic="t", partition=0, batch=data)
    )
    return response


@pytest.mark.asyncio
async def test_retry_after_a_dropped_response_is_not_appended_twice(tmp_path: Path) -> None:
    """Scenario: a publish whose call is cancelled client-side (the response is lost; the
    broker may or may not have appended it), then the retry, then the next batch. Expected:
    the retry answers offsets 0-1 (as the original, or as the first append); the log holds
    each record once: head 3."""
    async with serving(broker_config(tmp_path / "d")) as (_, c):
        await c.admin.CreateTopic(admin.CreateTopicRequest(name="t", partitions=1))
        first = batch(42, 0, b"a", b"b")
        call = c.broker.Publish(pb.PublishRequest(topic="t", batch=first))
        await asyncio.sleep(0.01)
        call.cancel()
        retry = await publish(c, first)
        assert (retry.base_offset, retry.last_offset) == (0, 1)
        again = await publish(c, first)
        assert (again.base_offset, again.last_offset, again.duplicate) == (0, 1, True)
        nxt = await publish(c, batch(42, 2, b"c"))
        assert (nxt.base_offset, nxt.duplicate) == (2, False)
        assert await head(c, "t") == 3


@pytest.mark.asyncio
async def test_sequence_gap_is_failed_precondition(tmp_path: Path) -> None:
    """Scenario: sequences 0-1 then 5. Expected: FAILED_PRECONDITION naming the expected
    sequence; nothing appended."""
    async with serving(broker_config(tmp_path / "d")) as (_, c):
        await c.admin.CreateTopic(admin.CreateTopicRequest(name="t", partitions=1))
        await publish(c, batch(1, 0, b"a", b"b"))
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await publish(c, batch(1, 5, b"z"))
        assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "expected 2" in (info.value.details() or "")
        assert await head(c, "t") == 2


@pytest.mark.asyncio
async def test_concurrent_twins_share_one_append(tmp_path: Path) -> None:
    """Scenario: the same batch published 8 times concurrently. Expected: all 8 answers
    carry the same offsets, exactly one is not a duplicate, and the head is 1."""
    async with serving(broker_config(tmp_path / "d")) as (_, c):
        await c.admin.CreateTopic(admin.CreateTopicRequest(name="t", partitions=1))
        data = batch(7, 0, b"once")
        answers = await asyncio.gather(*(publish(c, data) for _ in range(8)))
        assert {(a.base_offset, a.last_offset) for a in answers} == {(0, 0)}
        assert sum(not a.duplicate for a in answers) == 1
        assert await head(c, "t") == 1


@pytest.mark.asyncio
@pytest.mark.parametrize("snapshot", ["kept", "lost", "stale"])
async def test_dedup_state_survives_a_restart(tmp_path: Path, snapshot: str) -> None:
    """Scenario: publish, restart, retry the last batch. The snapshot written at shutdown is
    kept, deleted (as after a crash), or replaced by an older one. Expected: in every case
    the retry is a duplicate with its original offsets and the head does not move."""
    config = broker_config(tmp_path / "d")
    snap = tmp_path / "d" / "topics" / "t" / "0.producers.json"
    async with serving(config) as (_, c):
        await c.admin.CreateTopic(admin.CreateTopicRequest(name="t", partitions=1))
        await publish(c, batch(9, 0, b"a"))
    shutil.copy(snap, tmp_path / "old.json")
    async with serving(config) as (_, c):
        await publish(c, batch(9, 1, b"b", b"c"))
        await publish(c, batch(3, 0, b"other producer"))
    if snapshot == "lost":
        snap.unlink()
    elif snapshot == "stale":
        shutil.copy(tmp_path / "old.json", snap)
    async with serving(config) as (_, c):
        retry = await publish(c, batch(9, 1, b"b", b"c"))
        assert (retry.base_offset, retry.last_offset, retry.duplicate) == (1, 2, True)
        other = await publish(c, batch(3, 0, b"other producer"))
        assert (other.base_offset, other.duplicate) == (3, True)
        assert await head(c, "t") == 4


def eight(pid: int) -> list[bytes]:
    """Producer ``pid``'s batches 0-7: two records each, sequences 0, 2, ..., 14."""
    return [batch(pid, 2 * i, b"%d-a" % i, b"%d-b" % i) for i in range(8)]


def eight_values() -> list[bytes]:
    """The record values of :func:`eight`, in order."""
    return [b"%d-%s" % (i, part) for i in range(8) for part in (b"a", b"b")]


async def assert_retries_of_batches_0_and_3_are_duplicates(c: Client, sent: list[bytes]) -> None:
    """Batch 0 (out of the broker's window) answers duplicate with offsets -1, batch 3 (in
    it) duplicate with its original offsets; the head stays 16 and the log holds each
    record once."""
    old = await publish(c, sent[0])
    assert (old.duplicate, old.base_offset, old.last_offset) == (True, -1, -1)
    recent = await publish(c, sent[3])
    assert (recent.duplicate, recent.base_offset, recent.last_offset) == (True, 6, 7)
    assert await head(c, "t") == 16
    assert await fetched_values(c, "t") == eight_values()


@pytest.mark.asyncio
async def test_an_old_retry_is_a_duplicate_without_offsets(tmp_path: Path) -> None:
    """Scenario: one producer publishes 8 batches, then re-publishes batch 0 (older than
    the broker's window of recent batches) and batch 3, then re-sends all 8 (a replayed
    Spark task). Expected: every re-send answers duplicate=True, batches before the window
    with offsets -1; the head does not move, a Fetch shows no extra records, and the next
    batch is appended after them."""
    async with serving(broker_config(tmp_path / "d")) as (_, c):
        await c.admin.CreateTopic(admin.CreateTopicRequest(name="t", partitions=1))
        sent = eight(11)
        for i, data in enumerate(sent):
            first = await publish(c, data)
            assert (first.base_offset, first.duplicate) == (2 * i, False)
        await assert_retries_of_batches_0_and_3_are_duplicates(c, sent)
        replay = [await publish(c, data) for data in sent]
        assert all(r.duplicate for r in replay)
        assert [r.base_offset for r in replay] == [-1, -1, -1, 6, 8, 10, 12, 14]
        assert await head(c, "t") == 16
        nxt = await publish(c, batch(11, 16, b"new"))
        assert (nxt.base_offset, nxt.duplicate) == (16, False)


@pytest.mark.asyncio
async def test_a_retry_straddling_or_below_the_run_is_failed_precondition(
    tmp_path: Path,
) -> None:
    """Scenario: a producer whose first batch had sequence 10 appended 8 batches (10-25);
    then a batch starting at 8 (below its first sequence) and one covering 24-27 (past the
    next expected sequence, 26). Expected: both FAILED_PRECONDITION; nothing appended."""
    async with serving(broker_config(tmp_path / "d")) as (_, c):
        await c.admin.CreateTopic(admin.CreateTopicRequest(name="t", partitions=1))
        for i in range(8):
            await publish(c, batch(12, 10 + 2 * i, b"x", b"y"))
        for bad in (batch(12, 8, b"x", b"y"), batch(12, 24, b"x", b"y", b"z", b"w")):
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await publish(c, bad)
            assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "expected 26" in (info.value.details() or "")
        assert await head(c, "t") == 16


@pytest.mark.asyncio
@pytest.mark.parametrize("snapshot", ["kept", "lost"])
async def test_an_old_retry_is_a_duplicate_after_a_restart(tmp_path: Path, snapshot: str) -> None:
    """Scenario: 8 batches of one producer, a broker restart (with the snapshot written at
    shutdown, or without it as after a crash: the log is rescanned), then re-publishing
    batches 0 and 3. Expected: both duplicate=True (batch 0 with offsets -1), the head
    stays 16 and a Fetch shows no extra records."""
    config = broker_config(tmp_path / "d")
    snap = tmp_path / "d" / "topics" / "t" / "0.producers.json"
    sent = eight(13)
    async with serving(config) as (_, c):
        await c.admin.CreateTopic(admin.CreateTopicRequest(name="t", partitions=1))
        for data in sent:
            await publish(c, data)
    assert json.loads(snap.read_text())["producers"]["13"]["first_sequence"] == 0
    if snapshot == "lost":
        snap.unlink()
    async with serving(config) as (_, c):
        await assert_retries_of_batches_0_and_3_are_duplicates(c, sent)


@pytest.mark.asyncio
async def test_a_data_dir_with_an_old_format_snapshot_opens(tmp_path: Path) -> None:
    """Scenario: the producer snapshot on disk is in the format from before first_sequence
    (a bare list of rows per producer), then the broker restarts. Expected: it opens and
    trusts the snapshot; batch 3 (a row) is a duplicate with its offsets, batch 0 (older
    than every row) stays FAILED_PRECONDITION as before, and nothing is appended."""
    config = broker_config(tmp_path / "d")
    snap = tmp_path / "d" / "topics" / "t" / "0.producers.json"
    sent = eight(14)
    async with serving(config) as (_, c):
        await c.admin.CreateTopic(admin.CreateTopicRequest(name="t", partitions=1))
        for data in sent:
            await publish(c, data)
    doc = json.loads(snap.read_text())
    doc["producers"] = {pid: e["appended"] for pid, e in doc["producers"].items()}
    snap.write_text(json.dumps(doc))
    async with serving(config) as (_, c):
        recent = await publish(c, sent[3])
        assert (recent.duplicate, recent.base_offset, recent.last_offset) == (True, 6, 7)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await publish(c, sent[0])
        assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert await head(c, "t") == 16
        assert await fetched_values(c, "t") == eight_values()


# -- a publish cancelled while its batch waits in the log writer ---------------------------


@contextlib.asynccontextmanager
async def held_broker(tmp_path: Path) -> AsyncIterator[tuple[Broker, Client, HeldFs]]:
    """A broker whose partitions' logs run on a :class:`HeldFs` (its next fdatasync held
    while ``hold`` is set, until ``released``), a client, and topic t."""
    fs = HeldFs()
    try:
        async with (
            Broker(broker_config(tmp_path / "d"), fs=fs) as running,
            grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as channel,
        ):
            c = Client(channel)
            await c.admin.CreateTopic(admin.CreateTopicRequest(name="t", partitions=1))
            yield running, c, fs
    finally:
        fs.released.set()  # never leave the writer's thread waiting


def published_records(broker: Broker) -> float:
    """``headrace_published_records_total`` of t/0."""
    value = broker.metrics.registry.get_sample_value(
        "headrace_published_records_total", {"topic": "t", "partition": "0"}
    )
    return value or 0.0


def errors_logged(caplog: pytest.LogCaptureFixture) -> list[str]:
    """Every record logged at ERROR or above, by any logger."""
    return [f"{r.name}: {r.getMessage()}" for r in caplog.records if r.levelno >= logging.ERROR]


PublishCall = grpc.aio.UnaryUnaryCall[pb.PublishRequest, pb.PublishResponse]


async def publish_held(c: Client, fs: HeldFs, data: bytes, deadline_s: float) -> PublishCall:
    """Start a Publish of ``data`` with a ``deadline_s`` deadline; return once its batch is
    held in the writer's fdatasync."""
    fs.hold = True
    call: PublishCall = c.broker.Publish(
        pb.PublishRequest(topic="t", batch=data), timeout=deadline_s
    )
    assert await asyncio.to_thread(fs.entered.wait, 5)
    return call


async def deadline_passes(call: PublishCall) -> None:
    """Wait for ``call`` to fail with DEADLINE_EXCEEDED, then give the broker a moment to
    cancel its handler (the cancellation crosses loopback)."""
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    await asyncio.sleep(0.2)


@pytest.mark.asyncio
async def test_a_publish_cancelled_in_the_writer_is_kept_and_its_retry_is_a_duplicate(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Scenario: a Publish with a 100 ms deadline whose batch is held in the writer's
    fdatasync until after the deadline; then the same bytes again, twice (the client's
    retries: the first while the batch is still held, the second after). Expected: the
    first call fails DEADLINE_EXCEEDED; the batch is appended once, and both retries answer
    its offsets 0-1 as duplicates; head 2, two records counted as published, and nothing
    logged at ERROR."""
    caplog.set_level(logging.DEBUG)
    async with held_broker(tmp_path) as (broker, c, fs):
        data = batch(21, 0, b"a", b"b")
        await deadline_passes(await publish_held(c, fs, data, 0.1))
        retry = asyncio.ensure_future(publish(c, data))
        await asyncio.sleep(0.1)
        assert not retry.done()  # it waits for the held copy: neither appended nor refused
        fs.released.set()
        answer = await asyncio.wait_for(retry, 5)
        assert (answer.base_offset, answer.last_offset, answer.duplicate) == (0, 1, True)
        again = await publish(c, data)
        assert (again.base_offset, again.last_offset, again.duplicate) == (0, 1, True)
        assert await head(c, "t") == 2
        assert published_records(broker) == 2
    assert errors_logged(caplog) == []


@pytest.mark.asyncio
async def test_a_twin_of_a_publish_cancelled_in_the_writer_gets_its_answer(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Scenario: a Publish with a 300 ms deadline whose batch is held in the writer's
    fdatasync; its twin (the same bytes, 10 s deadline) arrives while it is held and waits
    for it; then the first call's deadline passes, then the writer is released. Expected:
    the twin is answered at once with the batch's offsets 0-1 as a duplicate (not
    DEADLINE_EXCEEDED 10 s later: the first caller's cancellation is not the twin's); the
    log holds the two records once (head 2), and nothing is logged at ERROR."""
    caplog.set_level(logging.DEBUG)
    async with held_broker(tmp_path) as (_, c, fs):
        data = batch(22, 0, b"a", b"b")
        first = await publish_held(c, fs, data, 0.3)
        twin = c.broker.Publish(pb.PublishRequest(topic="t", batch=data), timeout=10)
        await deadline_passes(first)
        fs.released.set()
        started = time.monotonic()
        answer = await twin
        assert time.monotonic() - started < 5
        assert (answer.base_offset, answer.last_offset, answer.duplicate) == (0, 1, True)
        assert await head(c, "t") == 2
        assert await fetched_values(c, "t") == [b"a", b"b"]
    assert errors_logged(caplog) == []


@pytest.mark.asyncio
async def test_a_publish_stream_cut_while_its_batch_is_held_logs_nothing_at_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Scenario: a PublishStream sends batch a (held in the writer's fdatasync) and a batch
    of the same producer that leaves a sequence gap; the client cancels the stream; then
    the writer is released, and a is published again. Expected: a is appended once (the
    re-publish is its duplicate at offset 0; head 1); the gap batch's failure, which has
    no stream left to go to, is not logged (nothing at ERROR, even after a garbage
    collection, where a never-retrieved task exception would be reported)."""
    caplog.set_level(logging.DEBUG)
    async with held_broker(tmp_path) as (_, c, fs):
        a = batch(23, 0, b"a")
        requests = [
            pb.PublishRequest(topic="t", batch=a),
            pb.PublishRequest(topic="t", batch=batch(23, 7, b"gap")),
        ]
        fs.hold = True
        stream = c.broker.PublishStream(iter(requests))
        assert await asyncio.to_thread(fs.entered.wait, 5)
        await asyncio.sleep(0.1)  # the gap batch reaches the broker too
        stream.cancel()
        await asyncio.sleep(0.2)  # the cancellation crosses loopback
        fs.released.set()
        again = await publish(c, a)
        assert (again.base_offset, again.duplicate) == (0, True)
        assert await head(c, "t") == 1
        gc.collect()
    assert errors_logged(caplog) == []


# -- the same at the Partition, without gRPC ------------------------------------------


@pytest_asyncio.fixture
async def held_partition(tmp_path: Path) -> AsyncIterator[tuple[Partition, HeldFs]]:
    """Partition 0 of a topic directory, on a :class:`HeldFs`: no broker, no gRPC."""
    fs = HeldFs()
    partition = await Partition.open(0, str(tmp_path), LogConfig(), fs)
    try:
        yield partition, fs
    finally:
        fs.released.set()
        await partition.aclose()


@pytest.mark.asyncio
async def test_a_twin_admitted_before_the_append_task_starts_waits_for_it(
    held_partition: tuple[Partition, HeldFs],
) -> None:
    """Scenario: two appends of the same batch started together, so the second is decided
    (InFlight) before the first one's append task has run a step. Expected: both answer
    offset 0, exactly one as a duplicate; the head is 1."""
    partition, _ = held_partition
    data = batch(3, 0, b"x")
    answers = await asyncio.gather(partition.append(data), partition.append(data))
    assert sorted(answers, key=lambda a: a[1]) == [
        (AppendResult(0, 0), False),
        (AppendResult(0, 0), True),
    ]
    assert partition.writer.head == 1


@pytest.mark.asyncio
async def test_a_cancelled_caller_waits_for_its_append_which_is_committed(
    held_partition: tuple[Partition, HeldFs],
) -> None:
    """Scenario: an append held in the writer's fdatasync; its caller is cancelled; a twin
    arrives; the writer is released; then the batch is appended again. Expected: the
    cancelled caller waits for the append (not done while it is held), then raises
    CancelledError; the twin and the later retry answer offsets 0-1 as duplicates; the
    head is 2: the dedup entry was committed although the caller was gone."""
    partition, fs = held_partition
    data = batch(4, 0, b"a", b"b")
    fs.hold = True
    caller = asyncio.create_task(partition.append(data))
    assert await asyncio.to_thread(fs.entered.wait, 5)
    caller.cancel()
    twin = asyncio.create_task(partition.append(data))
    await asyncio.sleep(0.05)
    assert not caller.done()
    assert not twin.done()
    fs.released.set()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert await twin == (AppendResult(0, 1), True)
    assert await partition.append(data) == (AppendResult(0, 1), True)
    assert partition.writer.head == 2


# -- producer expiry ----------------------------------------------------------------------

MINUTE = 60_000
T0 = 1_700_000_000_000


def expired_count(broker: Broker) -> float:
    """``headrace_expired_producer_ids_total`` of t/0 (0 when never recorded)."""
    value = broker.metrics.registry.get_sample_value(
        "headrace_expired_producer_ids_total", {"topic": "t", "partition": "0"}
    )
    return value or 0.0


@pytest.mark.asyncio
async def test_an_idle_producer_is_forgotten_by_the_retention_pass(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Scenario: producer_expiry_ms one minute, a manual wall clock. Producers 1 and 2
    publish at T0; producer 2 publishes again at T0 + 30 s; at T0 + 60.001 s a retention
    pass runs, then both re-send their batches. Expected: the pass forgets producer 1 only
    (one INFO line naming t/0 and the count; the counter at 1); producer 1's re-send is
    appended again (the trade-off: a retry later than the expiry is a new batch), producer
    2's re-sends are still duplicates with their original offsets."""
    now = [T0]
    config = broker_config(
        tmp_path / "d", producer_expiry_ms=MINUTE, retention_check_interval_ms=3_600_000
    )
    async with serving(config, clock=lambda: now[0]) as (broker, c):
        await c.admin.CreateTopic(admin.CreateTopicRequest(name="t", partitions=1))
        await publish(c, batch(1, 0, b"one"))
        await publish(c, batch(2, 0, b"two"))
        now[0] += 30_000
        await publish(c, batch(2, 1, b"two again"))
        now[0] += 30_001
        caplog.set_level(logging.INFO, logger="broker.retention")
        await broker.retention.run_once()
        lines = [r.getMessage() for r in caplog.records if "producer id" in r.getMessage()]
        assert len(lines) == 1
        assert lines[0].startswith("t/0: forgot 1 idempotent producer id(s)")
        assert expired_count(broker) == 1
        forgotten = await publish(c, batch(1, 0, b"one"))
        assert (forgotten.base_offset, forgotten.duplicate) == (3, False)
        recent = await publish(c, batch(2, 1, b"two again"))
        assert (recent.base_offset, recent.last_offset, recent.duplicate) == (2, 2, True)
        older = await publish(c, batch(2, 0, b"two"))
        assert (older.base_offset, older.duplicate) == (1, True)
        assert await fetched_values(c, "t") == [b"one", b"two", b"two again", b"one"]
        await broker.retention.run_once()
        assert expired_count(broker) == 1


@pytest.mark.asyncio
async def test_idle_time_counts_across_a_restart(tmp_path: Path) -> None:
    """Scenario: producer 5 publishes at T0; the broker shuts down cleanly (snapshot) and
    restarts at T0 + 50 s; passes run at T0 + 60 s and T0 + 60.001 s. Expected: the snapshot
    carries producer 5's last append, so the restart does not reset its idle time: kept
    (still a duplicate) at the first pass, forgotten at the second, a minute after its
    append and not a minute after the restart."""
    now = [T0]
    config = broker_config(
        tmp_path / "d", producer_expiry_ms=MINUTE, retention_check_interval_ms=3_600_000
    )
    snap = tmp_path / "d" / "topics" / "t" / "0.producers.json"
    async with serving(config, clock=lambda: now[0]) as (_, c):
        await c.admin.CreateTopic(admin.CreateTopicRequest(name="t", partitions=1))
        await publish(c, batch(5, 0, b"a"))
    assert json.loads(snap.read_text())["producers"]["5"]["last_append_ms"] == T0
    now[0] += 50_000
    async with serving(config, clock=lambda: now[0]) as (broker, c):
        now[0] += 10_000
        await broker.retention.run_once()
        retry = await publish(c, batch(5, 0, b"a"))
        assert (retry.base_offset, retry.duplicate) == (0, True)
        now[0] += 1
        await broker.retention.run_once()
        assert expired_count(broker) == 1
        again = await publish(c, batch(5, 0, b"a"))
        assert (again.base_offset, again.duplicate) == (1, False)


@pytest.mark.asyncio
async def test_a_crash_restart_does_not_expire_producers_early(tmp_path: Path) -> None:
    """Scenario: producer 6 publishes at T0 with record timestamps 0 (as a client may set
    them: event time); the snapshot is lost (a crash), so the restart at T0 + 30 s rebuilds
    from the log; a retention pass runs at T0 + 90 s. Expected: the scan stamps producer 6
    with the restart time, not the records' timestamps, so the pass keeps it and its retry
    is a duplicate; a minute after the restart it is forgotten."""
    now = [T0]
    config = broker_config(
        tmp_path / "d", producer_expiry_ms=MINUTE, retention_check_interval_ms=3_600_000
    )
    async with serving(config, clock=lambda: now[0]) as (_, c):
        await c.admin.CreateTopic(admin.CreateTopicRequest(name="t", partitions=1))
        await publish(c, batch(6, 0, b"a"))
    (tmp_path / "d" / "topics" / "t" / "0.producers.json").unlink()
    now[0] += 30_000
    async with serving(config, clock=lambda: now[0]) as (broker, c):
        now[0] += MINUTE
        await broker.retention.run_once()
        assert expired_count(broker) == 0
        retry = await publish(c, batch(6, 0, b"a"))
        assert (retry.base_offset, retry.duplicate) == (0, True)
        now[0] += 1
        await broker.retention.run_once()
        assert expired_count(broker) == 1
