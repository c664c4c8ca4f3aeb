"""CreateTopic's replication settings on a single broker (issue 37): it keeps one copy, so
factor 0 or 1 and min_insync 0 or 1 only, and every TopicInfo says so (leader and only
replica ``local``). A single broker, in process, over real gRPC on loopback; a cluster's
settings are tested in ``tests/cluster/test_broker_replica_settings.py``."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import grpc
import pytest
from click.testing import CliRunner

from broker.cli import cli
from proto import admin_pb2 as admin
from tests.broker.conftest import broker_config, serving

pytestmark = pytest.mark.asyncio


@pytest.mark.parametrize(("factor", "min_insync"), [(0, 0), (1, 0), (0, 1), (1, 1)])
async def test_factor_and_min_insync_0_or_1_make_a_topic_of_one_replica(
    tmp_path: Path, factor: int, min_insync: int
) -> None:
    """Scenario: CreateTopic with each mix of 0 (the default) and 1. Expected: the topic is
    made; its TopicInfo names ``local`` as leader, only replica and in-sync set, epoch 0,
    min_insync 1."""
    async with serving(broker_config(tmp_path)) as (_, client):
        info = await client.admin.CreateTopic(
            admin.CreateTopicRequest(
                name="t", partitions=1, replication_factor=factor, min_insync_replicas=min_insync
            ),
            timeout=10,
        )
    assert (info.leader, info.epoch, info.min_insync_replicas) == ("local", 0, 1)
    assert (list(info.replicas), list(info.isr)) == (["local"], ["local"])


@pytest.mark.parametrize(
    ("factor", "min_insync", "field", "says"),
    [
        (3, 0, "replication_factor", "3 needs a cluster"),
        (2, 2, "replication_factor", "2 needs a cluster"),
        (-1, 0, "replication_factor", "-1 needs a cluster"),
        (1, 2, "min_insync_replicas", "2 exceeds the replication factor 1"),
        (0, -1, "min_insync_replicas", "-1 exceeds the replication factor 1"),
    ],
)
async def test_anything_else_is_invalid_and_makes_nothing(
    tmp_path: Path, factor: int, min_insync: int, field: str, says: str
) -> None:
    """Scenario: CreateTopic asking a single broker for more than one copy, more in-sync
    replicas than one, or a negative value. Expected: INVALID_ARGUMENT naming the field
    and the value (a factor above 1 says a cluster is needed); no topic is made."""
    async with serving(broker_config(tmp_path)) as (broker, client):
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await client.admin.CreateTopic(
                admin.CreateTopicRequest(
                    name="t", replication_factor=factor, min_insync_replicas=min_insync
                ),
                timeout=10,
            )
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        details = refused.value.details() or ""
        assert details.startswith(f"{field}: {says}"), details
        assert broker.topics.names() == []


async def test_the_cli_refuses_a_factor_and_describes_as_before(tmp_path: Path) -> None:
    """Scenario: ``headrace topics create big --replication-factor 3`` against a single
    broker, then ``topics create t`` and ``topics describe t`` (table and --json).
    Expected: the first exits 1 with one line saying a cluster is needed; the describe
    prints no replication lines and its JSON has none of the replication keys (a single
    broker's output is as it was)."""
    async with serving(broker_config(tmp_path)) as (broker, _):
        seed = ["--broker", f"127.0.0.1:{broker.port}"]

        def invoke(*args: str) -> tuple[int, str]:
            done = CliRunner().invoke(cli, [*args, *seed])
            return done.exit_code, done.output

        code, out = await asyncio.to_thread(
            invoke, "topics", "create", "big", "--replication-factor", "3"
        )
        assert code == 1
        assert "needs a cluster" in out
        assert len(out.strip().splitlines()) == 1
        assert (await asyncio.to_thread(invoke, "topics", "create", "t"))[0] == 0
        code, table = await asyncio.to_thread(invoke, "topics", "describe", "t")
        assert code == 0
        assert "leader" not in table
        assert "replicas" not in table
        code, out = await asyncio.to_thread(invoke, "topics", "describe", "t", "--json")
        [doc] = json.loads(out)
        assert {"leader", "epoch", "replicas", "isr", "min_insync_replicas"}.isdisjoint(doc)
        assert doc["name"] == "t"
