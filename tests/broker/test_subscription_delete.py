"""DeleteSubscription and inactivity expiry over real gRPC against a real broker, with the
client library as the caller: refused while a consumer is attached, ``force`` ends that
consumer's stream, the data is no longer pinned, the name starts afresh, the dead-letter
queue and metric series go, and all of it holds across a restart. Expiry runs on a manual
monotonic clock. (Crash points and cancellation: ``tests/dispatcher/test_registry_delete.py``.)
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import grpc
import pytest
from prometheus_client import generate_latest

from broker.app import Broker
from broker.config import SubscriptionsConfig
from client import (
    AdminClient,
    AsyncAdminClient,
    AsyncConsumer,
    AsyncProducer,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
)
from dispatcher import SubscriptionType
from proto import broker_pb2 as _pb
from proto import broker_pb2_grpc
from tests._helpers import ManualClock
from tests.broker.conftest import broker_config
from tests.broker.test_dlq_admin import letter
from tests.client.conftest import address
from wal import LogConfig

pytestmark = pytest.mark.asyncio(loop_scope="function")

TOPIC, SUB = "orders", "billing"  # the names test_dlq_admin.letter() uses


async def publish(broker: Broker, count: int, size: int = 10, partitions: int = 1) -> None:
    """Publish ``count`` records of ``size`` bytes, one batch each, round robin."""
    async with AsyncProducer(address(broker), linger_ms=0) as producer:
        for i in range(count):
            await producer.publish(TOPIC, b"%0*d" % (size, i), partition=i % partitions)


async def drain(consumer: AsyncConsumer) -> None:
    """Receive until the consumer fails: what was buffered, then the end of the stream."""
    while True:
        await consumer.receive()


def state_file(tmp_path: Path, sub: str = SUB) -> Path:
    return tmp_path / "data" / "subscriptions" / TOPIC / f"{sub}.json"


def queue_dir(tmp_path: Path, sub: str = SUB) -> Path:
    return tmp_path / "data" / "dlq" / TOPIC / sub


async def test_refused_while_attached_then_force_ends_the_stream(tmp_path: Path) -> None:
    """Scenario: consumer 'worker-1' reads a record of a subscription that also has dead
    letters; a delete, then a forced delete. Expected: the first fails FAILED_PRECONDITION
    naming the consumer and --force, and changes nothing; the forced one returns
    ['worker-1'], the consumer's stream ends with NotFound 'subscription deleted' (it does
    not reconnect and recreate it), and the state file, queue and metric series are gone."""
    async with (
        Broker(broker_config(tmp_path / "data")) as broker,
        AsyncAdminClient(address(broker)) as admin,
    ):
        await admin.create_topic(TOPIC, 2)
        await publish(broker, 4, partitions=2)
        consumer = AsyncConsumer(
            TOPIC, SUB, broker=address(broker), consumer_name="worker-1", ack_interval_ms=0
        )
        async with consumer:
            consumer.ack(await consumer.receive(timeout=5))
            dlq = await broker.subscriptions.dead_letter_queue(TOPIC, SUB)
            assert dlq is not None
            await dlq.put([letter(1), letter(2)])
            broker.subscriptions.heartbeat_round()
            assert f'subscription="{SUB}"' in generate_latest(broker.metrics.registry).decode()
            with pytest.raises(FailedPrecondition) as refused:
                await admin.delete_subscription(TOPIC, SUB)
            assert "'worker-1'" in str(refused.value)
            assert "use --force to detach them" in str(refused.value)
            assert (await admin.describe_subscription(TOPIC, SUB)).consumers == ("worker-1",)
            assert await admin.count_dead_letters(TOPIC, SUB) == 2

            assert await admin.delete_subscription(TOPIC, SUB, force=True) == ["worker-1"]
            with pytest.raises(NotFound, match="subscription deleted"):
                await asyncio.wait_for(drain(consumer), 5)
        with pytest.raises(NotFound):
            await admin.describe_subscription(TOPIC, SUB)
        assert await admin.list_subscriptions(TOPIC) == []
        assert not state_file(tmp_path).exists()
        assert not queue_dir(tmp_path).exists()
        assert all(s.subscription != SUB for s in broker.subscriptions.samples())
        assert f'subscription="{SUB}"' not in generate_latest(broker.metrics.registry).decode()


@pytest.mark.parametrize(
    ("topic", "subscription", "error", "words"),
    [
        ("ghost", SUB, NotFound, "topic 'ghost'"),
        (TOPIC, "ghost", NotFound, "subscription 'ghost' on topic 'orders' does not exist"),
        ("a/b", SUB, InvalidArgument, "not a valid topic name"),
        (TOPIC, "-x", InvalidArgument, "not a valid subscription name"),
        (TOPIC, "", InvalidArgument, "not a valid subscription name"),
    ],
)
async def test_unknown_and_bad_names(
    tmp_path: Path, topic: str, subscription: str, error: type[Exception], words: str
) -> None:
    """Scenario: a delete naming a missing topic or subscription, or a bad name. Expected:
    NotFound or InvalidArgument with a message saying which; the real subscription stays."""
    async with Broker(broker_config(tmp_path / "data")) as broker:
        admin = await asyncio.to_thread(AdminClient, address(broker))  # the sync twin
        try:
            await asyncio.to_thread(admin.create_topic, TOPIC, 1)
            writers = [p.writer for p in broker.topics.get(TOPIC).partitions]
            await broker.subscriptions.subscribe(TOPIC, SUB, writers)
            with pytest.raises(error) as caught:
                await asyncio.to_thread(admin.delete_subscription, topic, subscription)
            assert words in str(caught.value)
            listed = await asyncio.to_thread(admin.list_subscriptions)
            assert [s.subscription for s in listed] == [SUB]
        finally:
            await asyncio.to_thread(admin.close)


async def test_retention_is_unpinned_and_the_name_starts_afresh_across_a_restart(
    tmp_path: Path,
) -> None:
    """Scenario: 60 records over many small segments with retention_bytes 1 KiB; an idle
    subscription with a saved cursor at 0 holds retention back; it is deleted, the broker
    restarts, and a consumer subscribes with the same name. Expected: retention deletes
    nothing while it exists and deletes segments once it is gone; after the restart it is
    still gone (no state file, no queue); the new subscription starts at the log's first
    offset with no redeliveries and an empty queue."""
    config = broker_config(
        tmp_path / "data",
        wal=LogConfig(segment_bytes=512, retention_bytes=1024),
        retention_check_interval_ms=3_600_000,  # run by hand below
    )
    async with Broker(config) as broker, AsyncAdminClient(address(broker)) as admin:
        await admin.create_topic(TOPIC, 1)
        writers = [p.writer for p in broker.topics.get(TOPIC).partitions]
        await broker.subscriptions.subscribe(TOPIC, SUB, writers)
        await publish(broker, 60, size=100)
        await broker.retention.run_once()
        assert writers[0].first_offset == 0  # pinned by the saved cursor
        await admin.delete_subscription(TOPIC, SUB)
        await broker.retention.run_once()
        first = writers[0].first_offset
        assert first > 0
    assert not state_file(tmp_path).exists()
    async with Broker(config) as broker, AsyncAdminClient(address(broker)) as admin:
        assert await admin.list_subscriptions() == []
        assert not queue_dir(tmp_path).exists()
        consumer = AsyncConsumer(TOPIC, SUB, broker=address(broker), initial_position="earliest")
        async with consumer:
            message = await consumer.receive(timeout=5)
        assert (message.offset, message.redelivery_count) == (first, 0)
        assert await admin.count_dead_letters(TOPIC, SUB) == 0


def expired_total(broker: Broker) -> float | None:
    return broker.metrics.registry.get_sample_value(
        "headrace_expired_subscriptions_total", {"topic": TOPIC}
    )


async def test_expiry_deletes_only_idle_subscriptions_and_counts_them(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Scenario: expiry 60 s on a manual monotonic clock; 'idle' has no consumer, 'busy'
    keeps one attached, 'reader' commits (AckUpTo) at +30 s. Expected: nothing at +0 or
    +59 s; at +60 s only 'idle' goes (INFO log with topic, subscription and idle time;
    the counter at 1); at +90 s 'reader' goes (counter 2); 'busy' stays throughout."""
    clock = ManualClock()
    config = broker_config(
        tmp_path / "data", subscriptions=SubscriptionsConfig(inactive_expiry_ms=60_000)
    )
    caplog.set_level(logging.INFO, logger="dispatcher.registry")
    async with (
        Broker(config, monotonic=clock) as broker,
        AsyncAdminClient(address(broker)) as admin,
    ):
        subs = broker.subscriptions
        await admin.create_topic(TOPIC, 1)
        await publish(broker, 3)
        writers = [p.writer for p in broker.topics.get(TOPIC).partitions]
        for name in ("idle", "busy", "reader"):
            await subs.subscribe(TOPIC, name, writers, type_=SubscriptionType.SHARED)
        assert expired_total(broker) is None
        busy = AsyncConsumer(TOPIC, "busy", broker=address(broker), type="shared")

        async def names() -> set[str]:
            await subs.expire_idle()
            return {s.subscription for s in await admin.list_subscriptions(TOPIC)}

        async with busy:
            await busy.start()
            assert await names() == {"idle", "busy", "reader"}
            clock.advance(30)
            async with grpc.aio.insecure_channel(address(broker)) as channel:
                commit = _pb.AckUpToRequest(topic=TOPIC, subscription="reader", offset=1)
                await broker_pb2_grpc.BrokerStub(channel).AckUpTo(commit)
            assert await names() == {"idle", "busy", "reader"}  # a round sees the commit
            clock.advance(29)
            assert await names() == {"idle", "busy", "reader"}
            clock.advance(1)
            assert await names() == {"busy", "reader"}
            assert expired_total(broker) == 1
            clock.advance(30)
            assert await names() == {"busy"}
            assert expired_total(broker) == 2
            clock.advance(600)
            assert await names() == {"busy"}
        lines = [r.getMessage() for r in caplog.records if "expired and deleted" in r.message]
        assert len(lines) == 2
        assert lines[0].startswith(f"{TOPIC}/idle: subscription expired and deleted: ")
        assert "for 60.0 s" in lines[0]
        assert "inactive_expiry_ms = 60000" in lines[0]


async def test_a_restart_restarts_every_idle_clock(tmp_path: Path) -> None:
    """Scenario: a subscription idle for 50 s of a 60 s expiry when the broker restarts;
    the new broker's clock is far ahead. Expected: not deleted at the restart nor 59 s
    after it; deleted one full expiry after the restart."""
    config = broker_config(
        tmp_path / "data", subscriptions=SubscriptionsConfig(inactive_expiry_ms=60_000)
    )
    clock = ManualClock()
    async with Broker(config, monotonic=clock) as broker:
        await broker.topics.create(TOPIC, 1)
        writers = [p.writer for p in broker.topics.get(TOPIC).partitions]
        await broker.subscriptions.subscribe(TOPIC, SUB, writers)
        await broker.subscriptions.expire_idle()
        clock.advance(50)
        assert await broker.subscriptions.expire_idle() == []
    clock = ManualClock(now=1_000_000.0)
    async with Broker(config, monotonic=clock) as broker:
        subs = broker.subscriptions
        assert await subs.expire_idle() == []
        clock.advance(59)
        await subs.expire_idle()
        assert [s.name for s in subs.subscriptions(TOPIC)] == [SUB]
        clock.advance(1)
        await subs.expire_idle()
        assert subs.subscriptions(TOPIC) == []
