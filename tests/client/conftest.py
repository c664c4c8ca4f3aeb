"""Fixtures and helpers of the client tests: a real broker on loopback, and a reader of
what a partition's log holds (over gRPC Fetch, independent of the client under test)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest_asyncio

from broker.app import Broker
from proto import broker_pb2 as pb
from proto import broker_pb2_grpc
from proto.batch import RecordBatch, decode_batch
from tests.broker.conftest import broker_config


@pytest_asyncio.fixture
async def broker(tmp_path: Path) -> AsyncIterator[Broker]:
    """A running broker with its data in ``tmp_path``."""
    async with Broker(broker_config(tmp_path / "data")) as running:
        yield running


def address(broker: Broker) -> str:
    """Where ``broker`` listens."""
    return f"127.0.0.1:{broker.port}"


async def read_batches(broker: Broker, topic: str, partition: int) -> list[RecordBatch]:
    """Every batch of a partition, fetched over gRPC."""
    out: list[RecordBatch] = []
    async with grpc.aio.insecure_channel(address(broker)) as channel:
        stub = broker_pb2_grpc.BrokerStub(channel)
        offset = 0
        while True:
            got = await stub.Fetch(pb.FetchRequest(topic=topic, partition=partition, offset=offset))
            if not got.batches:
                return out
            for raw in got.batches:
                b = decode_batch(raw)
                assert b is not None
                out.append(b)
                offset = b.next_offset


async def read_partition(
    broker: Broker, topic: str, partition: int
) -> list[tuple[int, bytes, bytes | None]]:
    """Every (offset, value, key) of a partition, fetched over gRPC."""
    return [
        row
        for b in await read_batches(broker, topic, partition)
        for row in zip(b.offsets(), b.values(), b.keys(), strict=True)
    ]
