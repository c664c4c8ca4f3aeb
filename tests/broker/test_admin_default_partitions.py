"""CreateTopic with ``partitions`` 0 means the default; the CLI's ``--partitions`` and the
client's ``partitions`` are optional (absent: 0 is sent). A single broker, in process,
over real gRPC on loopback; the cluster's default is tested in
``tests/cluster/test_broker_config_defaults.py``."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest
from click.testing import CliRunner

from broker.cli import cli
from client import AsyncAdminClient
from proto import admin_pb2 as admin
from tests.broker.conftest import broker_config, serving

pytestmark = pytest.mark.asyncio


@pytest.mark.parametrize(
    ("partitions", "expected"),
    [(0, 3), (1, 1), (5, 5)],
)
async def test_create_topic_with_0_partitions_gets_the_brokers_default(
    tmp_path: Path, partitions: int, expected: int
) -> None:
    """Scenario: a broker whose ``default_partitions`` is 3 gets CreateTopic with
    ``partitions`` 0, 1 and 5. Expected: 0 makes a topic of 3 partitions (the default),
    the others exactly what they ask."""
    async with serving(broker_config(tmp_path, default_partitions=3)) as (_, client):
        info = await client.admin.CreateTopic(
            admin.CreateTopicRequest(name="t", partitions=partitions), timeout=10
        )
    assert len(info.partitions) == expected


async def test_create_topic_with_negative_partitions_is_invalid(tmp_path: Path) -> None:
    """Scenario: CreateTopic with ``partitions`` -1. Expected: INVALID_ARGUMENT naming
    ``partitions``; no topic is made."""
    async with serving(broker_config(tmp_path, default_partitions=3)) as (broker, client):
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await client.admin.CreateTopic(
                admin.CreateTopicRequest(name="t", partitions=-1), timeout=10
            )
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "partitions" in (refused.value.details() or "")
        assert broker.topics.names() == []


async def test_cli_and_client_create_without_partitions_use_the_default(tmp_path: Path) -> None:
    """Scenario: a broker whose ``default_partitions`` is 4; ``headrace topics create cli``
    with no ``--partitions``, then the client's ``create_topic("lib")`` and
    ``create_topic("lib", exist_ok=True)`` with no count. Expected: the CLI exits 0 saying
    4 partitions; the client's topic has 4; the second call returns it (any count is
    accepted when none was asked)."""
    async with serving(broker_config(tmp_path, default_partitions=4)) as (broker, _):
        address = f"127.0.0.1:{broker.port}"
        made = await asyncio.to_thread(
            CliRunner().invoke, cli, ["topics", "create", "cli", "--broker", address]
        )
        assert made.exit_code == 0, made.output
        assert "created topic cli with 4 partitions" in made.output
        async with AsyncAdminClient(address) as client:
            first = await client.create_topic("lib")
            again = await client.create_topic("lib", exist_ok=True)
    assert len(first.partitions) == 4
    assert again.topic_id == first.topic_id
