"""Fixtures: a real broker on 127.0.0.1 (port 0), and gRPC stubs on a real channel."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import grpc
import pytest_asyncio

from broker.app import Broker
from broker.config import BrokerConfig
from proto import admin_pb2_grpc, broker_pb2_grpc
from wal import LogConfig
from wal.log import Clock


def broker_config(data_dir: Path, **changes: object) -> BrokerConfig:
    """A broker on an ephemeral loopback port, no metrics listener, small segments."""
    base = BrokerConfig(
        data_dir=str(data_dir),
        listen="127.0.0.1:0",
        metrics_listen="",
        grace_seconds=1.0,
        wal=LogConfig(segment_bytes=64 << 10),
    )
    return base.replace(**changes)


class Client:
    """Stubs of both services on one channel."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.channel = channel
        self.broker = broker_pb2_grpc.BrokerStub(channel)
        self.admin = admin_pb2_grpc.AdminStub(channel)


@pytest_asyncio.fixture
async def broker(tmp_path: Path) -> AsyncIterator[Broker]:
    """A running broker with its data in ``tmp_path``."""
    async with Broker(broker_config(tmp_path / "data")) as running:
        yield running


@pytest_asyncio.fixture
async def client(broker: Broker) -> AsyncIterator[Client]:
    """A channel to ``broker``."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{broker.port}") as channel:
        yield Client(channel)


@asynccontextmanager
async def serving(
    config: BrokerConfig, *, clock: Clock | None = None
) -> AsyncIterator[tuple[Broker, Client]]:
    """Run a broker with ``config`` (and wall ``clock``, ms) and connect a client to it."""
    async with (
        Broker(config, clock=clock) as running,
        grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as channel,
    ):
        yield running, Client(channel)
