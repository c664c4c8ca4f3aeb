"""Idempotent publishing over real gRPC: retries are answered, never appended twice."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import grpc
import pytest

from proto import admin_pb2 as admin
from proto import broker_pb2 as pb
from tests.broker.conftest import Client, broker_config, serving
from wal import encode_columns


def batch(pid: int, seq: int, *values: bytes) -> bytes:
    return encode_columns(list(values), producer_id=pid, base_sequence=seq)


async def head(c: Client, topic: str) -> int:
    info = await c.admin.DescribeTopic(admin.DescribeTopicRequest(name=topic))
    return int(info.partitions[0].head)


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
