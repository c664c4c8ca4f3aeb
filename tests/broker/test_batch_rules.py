"""The format's rules over real gRPC: each violation a client can send gets
INVALID_ARGUMENT naming the field, and appends nothing; data on disk that an older
version wrote without those rules still reads."""

from __future__ import annotations

import struct
from pathlib import Path

import grpc
import pytest

from proto import admin_pb2 as admin
from proto import broker_pb2 as pb
from proto.batch import decode_batch
from tests.broker.conftest import Client, broker_config, serving
from tests.proto.violations import VIOLATIONS, Violation, one, reseal


async def _create(client: Client, name: str) -> None:
    await client.admin.CreateTopic(admin.CreateTopicRequest(name=name, partitions=1))


@pytest.mark.asyncio
@pytest.mark.parametrize("v", VIOLATIONS, ids=[v.id for v in VIOLATIONS])
async def test_publish_of_each_violation_is_invalid_argument(client: Client, v: Violation) -> None:
    """Scenario: Publish of a batch (CRC valid) that breaks one rule. Expected:
    INVALID_ARGUMENT whose message names the field; the partition's head stays 0; a valid
    batch published next lands at offset 0."""
    await _create(client, "rules")
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await client.broker.Publish(pb.PublishRequest(topic="rules", batch=v.make()))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    details = info.value.details() or ""
    assert v.field in details
    assert v.words in details
    ok = await client.broker.Publish(pb.PublishRequest(topic="rules", batch=one()))
    assert ok.base_offset == 0


@pytest.mark.asyncio
@pytest.mark.parametrize("size", [3, 11])
async def test_a_short_batch_message_shows_no_python_none(client: Client, size: int) -> None:
    """Scenario: Publish of fewer than 12 bytes (the issue's "the header announces None").
    Expected: INVALID_ARGUMENT that says how many bytes came and how many a header needs."""
    await _create(client, "short")
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await client.broker.Publish(pb.PublishRequest(topic="short", batch=one()[:size]))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    details = info.value.details() or ""
    assert "None" not in details
    assert f"got {size} bytes, fewer than the 56-byte batch header" in details


def _older_format_batch(base_offset: int) -> bytes:
    """A batch as a writer that enforced none of the new rules might have left it: a
    non-zero reserved field, non-zero padding, a stray key validity bit, at
    ``base_offset``; the CRC is valid."""
    data = bytearray(one())
    batch = decode_batch(bytes(data))
    assert batch is not None
    struct.pack_into("<Q", data, 0, base_offset)
    struct.pack_into("<I", data, 52, 0xABCD)
    data[batch.layout.key_validity] |= 0b100
    data[batch.layout.key_validity + 3] = 0x5A
    data[batch.layout.value_data + 5] = 0x77
    return reseal(data)


@pytest.mark.asyncio
async def test_an_older_segment_on_disk_still_reads(tmp_path: Path) -> None:
    """Scenario: a partition holds one published batch; with the broker stopped, a batch
    that breaks the publish-time rules (reserved, padding, bitmap tail) is laid after it in
    the segment, as an older version could have written it. Expected: the restarted broker
    recovers it whole (nothing cut) and Fetch returns both batches byte-exact."""
    config = broker_config(tmp_path / "data")
    async with serving(config) as (_, c):
        await _create(c, "old")
        await c.broker.Publish(pb.PublishRequest(topic="old", batch=one()))
    [segment] = (tmp_path / "data").rglob("00000000000000000000.log")
    older = _older_format_batch(base_offset=1)
    with segment.open("ab") as f:
        f.write(older)
    async with serving(config) as (_, c):
        got = await c.broker.Fetch(pb.FetchRequest(topic="old", partition=0, offset=0))
    assert len(got.batches) == 2
    assert got.batches[1] == older
    second = decode_batch(got.batches[1])
    assert second is not None
    assert (second.base_offset, second.values()) == (1, [b"hi"])
    assert got.high_water_mark == 2
    assert not list((tmp_path / "data").rglob("*.broken"))
