"""The retention task and the backlog quota (:mod:`broker.retention`) over real logs with
512-byte segments and a real :class:`SubscriptionRegistry`; then one publish over quota
through real gRPC on loopback.

Every batch here is 5 records of 192 bytes, so a 512-byte segment holds two batches: the
segments start at offsets 0, 10, 20, ...
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from broker.backlog import BacklogConfig, BacklogPolicy
from broker.errors import BacklogQuotaExceededError, ShuttingDownError
from broker.metrics import BrokerMetrics
from broker.partition import Partition
from broker.retention import RetentionService
from broker.topics import TopicRegistry
from dispatcher import Subscription, SubscriptionRegistry
from proto import admin_pb2 as admin
from proto import broker_pb2 as pb
from tests._helpers import ManualClock, eventually
from tests.broker.conftest import broker_config, serving
from wal import LogConfig, encode_columns

pytestmark = pytest.mark.asyncio(loop_scope="function")

SMALL = LogConfig(segment_bytes=512, index_interval_bytes=100)
RECORDS_PER_BATCH = 5


@dataclass
class Env:
    """One topic ``t`` with one partition, its subscriptions and the retention service."""

    partition: Partition
    subscriptions: SubscriptionRegistry
    retention: RetentionService
    metrics: BrokerMetrics

    async def publish(self, batches: int) -> None:
        """Append ``batches`` batches of 5 records to the partition."""
        for _ in range(batches):
            await self.partition.append(encode_columns([b"v" * 8] * RECORDS_PER_BATCH))

    async def subscribe(self, name: str, cursor: int) -> Subscription:
        """A subscription whose saved cursor is ``cursor``."""
        sub = await self.subscriptions.subscribe("t", name, [self.partition.writer])
        if cursor:
            sub.commit(0, cursor)
        await self.subscriptions.save(sub)
        return sub

    def metric(self, name: str, **labels: str) -> float:
        """A sample of topic ``t`` partition 0 (0 when never recorded)."""
        value = self.metrics.registry.get_sample_value(
            name, {"topic": "t", "partition": "0", **labels}
        )
        return value or 0.0


@asynccontextmanager
async def running(
    tmp_path: Path,
    *,
    wal: LogConfig = SMALL,
    backlog: BacklogConfig | None = None,
    poll_s: float = 0.01,
    interval_s: float = 3600,
    clock: ManualClock | None = None,
) -> AsyncIterator[Env]:
    """Topics, subscriptions and a retention service (its task not started: tests drive
    passes with ``run_once`` or start it)."""
    data = str(tmp_path / "data")
    topics = TopicRegistry(data, wal)
    await topics.open()
    topic = await topics.create("t", 1)
    subs = SubscriptionRegistry(data, flush_interval_s=3600)
    await subs.open({"t": [topic.partitions[0].writer]})
    metrics = BrokerMetrics()
    retention = RetentionService(
        topics,
        subs.saved_floor,
        metrics,
        backlog=backlog,
        interval_s=interval_s,
        poll_s=poll_s,
        clock=clock or time.monotonic,
    )
    try:
        yield Env(topic.partitions[0], subs, retention, metrics)
    finally:
        await retention.aclose()
        await subs.aclose()
        await topics.aclose()


# -- retention --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("floor", "first_after"),
    [(0, 0), (10, 10), (25, 20), (60, 60), (95, 90)],
    ids=["floor-0", "floor-at-base", "floor-mid-segment", "floor-60", "floor-in-active"],
)
async def test_retention_never_deletes_at_or_past_the_saved_floor(
    tmp_path: Path, floor: int, first_after: int
) -> None:
    """Scenario: retention_bytes=1 (everything is over the limit), ten segments (offsets
    0-99); a caught-up subscription saved at 100 and a slow one at ``floor``. Expected: one pass
    deletes every segment wholly below the slowest saved cursor and none holding it: the
    first offset becomes the base of the segment holding the floor; the deletions are
    counted."""
    async with running(tmp_path, wal=LogConfig(segment_bytes=512, retention_bytes=1)) as env:
        await env.publish(20)
        await env.subscribe("fast", 100)
        await env.subscribe("slow", floor)
        assert env.subscriptions.saved_floor("t") == [floor]
        await env.retention.run_once()
        assert env.partition.writer.first_offset == first_after
        assert env.partition.writer.first_offset <= floor
        deleted = first_after // 10
        assert env.metric("headrace_retention_deleted_segments_total") == deleted


async def test_retention_follows_acks_saved_between_passes(tmp_path: Path) -> None:
    """Scenario: retention_bytes=1, a subscription saved at 0, a pass; then it commits 50
    and is saved, and another pass runs. Expected: nothing goes in the first pass; the
    second deletes up to offset 50."""
    async with running(tmp_path, wal=LogConfig(segment_bytes=512, retention_bytes=1)) as env:
        await env.publish(20)
        sub = await env.subscribe("s", 0)
        await env.retention.run_once()
        assert env.partition.writer.first_offset == 0
        sub.commit(0, 50)
        await env.subscriptions.save(sub)
        await env.retention.run_once()
        assert env.partition.writer.first_offset == 50


async def test_without_subscriptions_retention_applies_retention_bytes(tmp_path: Path) -> None:
    """Scenario: no subscription, retention_bytes=1000, ten segments of 384 bytes (3840).
    Expected: the oldest segments go while the log still holds at least 1000 bytes without
    them: 7 segments, first offset 70; a second pass deletes nothing more."""
    async with running(tmp_path, wal=LogConfig(segment_bytes=512, retention_bytes=1000)) as env:
        await env.publish(20)
        assert env.subscriptions.saved_floor("t") is None
        await env.retention.run_once()
        assert env.partition.writer.first_offset == 70
        assert env.partition.log.size_bytes >= 1000
        await env.retention.run_once()
        assert env.partition.writer.first_offset == 70
        assert env.metric("headrace_retention_deleted_segments_total") == 7


async def test_the_task_runs_passes_until_closed(tmp_path: Path) -> None:
    """Scenario: the retention task started with a 10 ms interval, no subscription,
    retention_bytes=1. Expected: it deletes the sealed segments by itself; aclose stops
    it."""
    wal = LogConfig(segment_bytes=512, retention_bytes=1)
    async with running(tmp_path, wal=wal, interval_s=0.01) as env:
        env.retention.start()
        await env.publish(20)
        await eventually(lambda: env.partition.writer.first_offset == 90)
        await env.retention.aclose()
        await env.publish(20)
        await asyncio.sleep(0.05)
        assert env.partition.writer.first_offset == 90


# -- the backlog quota --------------------------------------------------------------------


def reject(quota: int) -> BacklogConfig:
    return BacklogConfig(quota_messages=quota, policy=BacklogPolicy.REJECT_PRODUCER)


async def test_reject_producer_refuses_publishes_over_quota(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Scenario: quota 10, a subscription saved at 0; 10 records published (exactly at the
    quota), then 5 more, then two publishes are tried. Expected: at the quota a publish is
    admitted; over it, BacklogQuotaExceededError naming topic, partition, backlog 15 and
    quota 10 and what to do; both refusals counted, one warning logged; once the
    subscription saves cursor 10 (and the cached floor is stale), publishes go through and
    the return under the quota is logged."""
    clock = ManualClock()
    async with running(tmp_path, backlog=reject(10), poll_s=0.1, clock=clock) as env:
        await env.subscribe("s", 0)
        await env.publish(2)
        assert env.retention.admit("t", env.partition) is None
        await env.publish(1)
        caplog.set_level(logging.INFO, logger="broker.retention")
        for _ in range(2):
            with pytest.raises(BacklogQuotaExceededError) as info:
                env.retention.admit("t", env.partition)
        err = info.value
        assert (err.topic, err.partition, err.backlog, err.quota) == ("t", 0, 15, 10)
        assert err.policy == "reject_producer"
        assert "consume and acknowledge" in str(err)
        assert "quota_messages" in str(err)
        labels = {"policy": "reject_producer"}
        assert env.metric("headrace_backlog_quota_exceeded_requests_total", **labels) == 2
        over = [r for r in caplog.records if "over the quota" in r.getMessage()]
        assert len(over) == 1
        sub = env.subscriptions.get("t", "s")
        sub.commit(0, 10)
        await env.subscriptions.save(sub)
        clock.advance(0.1)
        assert env.retention.admit("t", env.partition) is None
        assert any("back within the quota" in r.getMessage() for r in caplog.records)


async def test_no_subscription_means_no_backlog(tmp_path: Path) -> None:
    """Scenario: quota 5, no subscription, 50 records published. Expected: every publish
    is admitted (nobody is behind)."""
    async with running(tmp_path, backlog=reject(5)) as env:
        await env.publish(10)
        await env.retention.run_once()
        assert env.retention.admit("t", env.partition) is None


def block(quota: int, timeout_ms: int) -> BacklogConfig:
    return BacklogConfig(
        quota_messages=quota, policy=BacklogPolicy.BLOCK_PRODUCER, block_timeout_ms=timeout_ms
    )


async def test_block_producer_waits_for_an_ack_to_be_saved(tmp_path: Path) -> None:
    """Scenario: block_producer, quota 5, timeout 5 s, a subscription saved at 0, 10 records
    published; a publish is tried. Expected: it waits (the event loop runs on); after the
    subscription saves cursor 10 it proceeds within a few polls, and the wait is counted."""
    async with running(tmp_path, backlog=block(5, 5_000)) as env:
        sub = await env.subscribe("s", 0)
        await env.publish(2)
        blocked = env.retention.admit("t", env.partition)
        assert blocked is not None
        waiting = asyncio.ensure_future(blocked)
        await asyncio.sleep(0.1)
        assert not waiting.done()
        sub.commit(0, 10)
        await env.subscriptions.save(sub)
        async with asyncio.timeout(2):
            await waiting
        await env.publish(1)
        labels = {"policy": "block_producer"}
        assert env.metric("headrace_backlog_quota_exceeded_requests_total", **labels) == 1


async def test_block_producer_times_out(tmp_path: Path) -> None:
    """Scenario: block_producer, quota 5, timeout 100 ms, nobody acknowledges. Expected:
    after about 100 ms the publish fails with BacklogQuotaExceededError saying how long it
    waited."""
    async with running(tmp_path, backlog=block(5, 100)) as env:
        await env.subscribe("s", 0)
        await env.publish(2)
        blocked = env.retention.admit("t", env.partition)
        assert blocked is not None
        started = time.monotonic()
        with pytest.raises(BacklogQuotaExceededError) as info:
            await blocked
        assert time.monotonic() - started >= 0.09
        assert info.value.waited_ms == 100
        assert "after waiting 100 ms" in str(info.value)


async def test_block_producer_is_released_by_shutdown(tmp_path: Path) -> None:
    """Scenario: a publish blocked over quota when the retention service closes.
    Expected: it fails at once with ShuttingDownError (UNAVAILABLE), not after the
    timeout."""
    async with running(tmp_path, backlog=block(5, 30_000)) as env:
        await env.subscribe("s", 0)
        await env.publish(2)
        blocked = env.retention.admit("t", env.partition)
        assert blocked is not None
        waiting = asyncio.ensure_future(blocked)
        await asyncio.sleep(0.05)
        await env.retention.aclose()
        async with asyncio.timeout(1):
            with pytest.raises(ShuttingDownError):
                await waiting


@pytest.mark.parametrize("trigger", ["publish", "retention-pass"])
async def test_evict_oldest_backlog_deletes_past_the_floor(tmp_path: Path, trigger: str) -> None:
    """Scenario: evict_oldest_backlog, quota 20, a subscription saved at 0, 100 records in
    ten segments (no retention configured); then a publish (or a retention pass) finds
    the partition over quota. Expected: the publish is admitted; segments below 80 are
    deleted (head 100 - quota 20), past the saved floor; 80 evicted records are counted;
    the subscription's consumer then starts at offset 80 (it skips forward)."""
    policy = BacklogPolicy.EVICT_OLDEST_BACKLOG
    async with running(tmp_path, backlog=BacklogConfig(20, policy)) as env:
        sub = await env.subscribe("s", 0)
        await env.publish(20)
        if trigger == "publish":
            assert env.retention.admit("t", env.partition) is None
        else:
            await env.retention.run_once()
        await eventually(lambda: env.partition.writer.first_offset == 80)
        assert env.metric("headrace_backlog_evicted_records_total") == 80
        session = sub.attach("c", 100)
        async with asyncio.timeout(5):
            first = await session.next()
        assert first is not None
        assert first.from_offset == 80


# -- over gRPC ------------------------------------------------------------------------------


async def test_publish_over_quota_gets_resource_exhausted_over_grpc(tmp_path: Path) -> None:
    """Scenario: a real broker with quota 3 (reject_producer) and a 20 ms retention pass; a
    subscription created by AckUpTo at offset 0; one-record publishes until one fails.
    Expected: publishes succeed until the backlog passes 3, then RESOURCE_EXHAUSTED with a
    message naming the topic, the partition and the quota."""
    config = broker_config(
        tmp_path / "data",
        retention_check_interval_ms=20,
        backlog=BacklogConfig(quota_messages=3),
    )
    async with serving(config) as (_broker, client):
        await client.admin.CreateTopic(admin.CreateTopicRequest(name="orders", partitions=1))
        await client.broker.AckUpTo(
            pb.AckUpToRequest(topic="orders", subscription="billing", partition=0, offset=0)
        )
        published = 0
        error: grpc.aio.AioRpcError | None = None
        request = pb.PublishRequest(topic="orders", partition=0, batch=encode_columns([b"x"]))
        async with asyncio.timeout(5):
            while error is None:
                try:
                    await client.broker.Publish(request)
                    published += 1
                except grpc.aio.AioRpcError as exc:
                    error = exc
                await asyncio.sleep(0.005)
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert published > 3
    details = error.details() or ""
    assert "'orders' partition 0" in details
    assert "quota of 3" in details
