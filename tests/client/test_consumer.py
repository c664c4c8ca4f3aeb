"""AsyncConsumer against a real broker over real gRPC on loopback: round trips, credits,
acks and cursors, partitioning by key, reconnects across a broker restart."""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path

import grpc
import pytest

from broker.app import Broker
from broker.config import BrokerConfig
from client import (
    AsyncAdminClient,
    AsyncConsumer,
    AsyncProducer,
    ClientClosed,
    ClientError,
    Consumer,
    FailedPrecondition,
    InvalidArgument,
    Message,
    NotFound,
    Queued,
    Unavailable,
    partition_for,
)
from tests.broker.conftest import broker_config
from tests.broker.test_serve_process import free_port
from tests.client.conftest import address

pytestmark = pytest.mark.asyncio(loop_scope="function")


async def _create(broker: Broker, topic: str, partitions: int = 1) -> None:
    async with AsyncAdminClient(address(broker)) as admin:
        await admin.create_topic(topic, partitions)


async def _produce(broker: Broker, topic: str, values: list[bytes]) -> None:
    async with AsyncProducer(address(broker), linger_ms=1) as producer:
        futures = [await producer.send(topic, v) for v in values]
        await asyncio.gather(*futures)


async def _take(consumer: AsyncConsumer, n: int) -> list[Message]:
    out: list[Message] = []
    async with asyncio.timeout(10):
        while len(out) < n:
            out.append(await consumer.receive())
    return out


@pytest.mark.parametrize(
    ("setting", "value", "says"),
    [
        ("receive_queue", 0, "receive_queue must be from 1 to 2,147,483,647 records, not 0"),
        ("receive_queue", 2**32, "receive_queue must be from 1 to 2,147,483,647 records"),
        ("ack_interval_ms", -1.0, "ack_interval_ms must be a number >= 0, not -1.0"),
        ("ack_interval_ms", float("nan"), "ack_interval_ms must be a number >= 0, not nan"),
        ("initial_position", "middle", "initial_position must be earliest or latest"),
        ("consumer_name", "a\nb", "consumer_name 'a\\nb': use at most 200 printable"),
        ("consumer_name", "\x1b[2J", "consumer_name '\\x1b[2J': use at most 200 printable"),
        ("consumer_name", "x" * 201, "... (201 characters): use at most 200 printable"),
    ],
)
async def test_a_bad_setting_is_named_when_the_consumer_is_made(
    setting: str, value: object, says: str
) -> None:
    """Scenario: a consumer made with one bad setting (a credit the protocol cannot carry
    among them: it used to fail at the first open with protobuf's 'Value out of
    range'). A consumer name with a control character or over 200 characters is refused
    before anything is sent (issue 38). Expected: ValueError at construction, naming the
    setting and the value (escaped and cut: the message is one printable line)."""
    with pytest.raises(ValueError, match=re.escape(says)) as caught:
        AsyncConsumer("t", "s", **{setting: value})  # type: ignore[arg-type]
    assert str(caught.value).isprintable()


@pytest.mark.parametrize("bad", [-1.0, float("nan")])
async def test_a_negative_or_nan_receive_timeout_is_refused(broker: Broker, bad: float) -> None:
    """Scenario: receive and receive_batch with a timeout of -1 or NaN, a record ready
    (a NaN deadline would disorder the event loop's timers). Expected: ValueError naming
    timeout from both, at once; the record is still there for the next receive."""
    await _create(broker, "t")
    await _produce(broker, "t", [b"kept"])
    async with AsyncConsumer("t", "s", broker=address(broker)) as consumer:
        with pytest.raises(ValueError, match="timeout must be a number of seconds >= 0"):
            await consumer.receive(bad)
        with pytest.raises(ValueError, match="timeout must be a number of seconds >= 0"):
            await consumer.receive_batch(10, bad)
        assert (await consumer.receive(timeout=5)).value == b"kept"


@pytest.mark.parametrize("max_messages", [0, -5])
async def test_receive_batch_refuses_a_max_below_one(broker: Broker, max_messages: int) -> None:
    """Scenario: receive_batch(0) and (-5) with a record ready. Expected: ValueError naming
    max_messages, at once; the record is still there for the next receive."""
    await _create(broker, "t")
    await _produce(broker, "t", [b"kept"])
    async with AsyncConsumer("t", "s", broker=address(broker)) as consumer:
        with pytest.raises(ValueError, match="max_messages must be at least 1"):
            await consumer.receive_batch(max_messages, timeout=5)
        assert (await consumer.receive(timeout=5)).value == b"kept"


async def test_round_trip_values_keys_headers_and_time(broker: Broker) -> None:
    await _create(broker, "t")
    async with AsyncProducer(address(broker)) as producer:
        meta = await producer.publish(
            "t", b"v1", key=b"k1", headers={"h": b"x"}, timestamp_ms=1_700_000_000_123
        )
    async with AsyncConsumer("t", "s", broker=address(broker)) as consumer:
        (msg,) = await _take(consumer, 1)
    assert (msg.topic, msg.partition, msg.offset) == ("t", 0, meta.offset)
    assert (msg.value, msg.key, msg.headers) == (b"v1", b"k1", {"h": b"x"})
    assert msg.timestamp_ms == 1_700_000_000_123
    assert msg.publish_time.year == 2023
    assert msg.redelivery_count == 0


async def test_many_records_arrive_in_order_and_acks_move_the_cursor(tmp_path: Path) -> None:
    """5,000 records through a broker whose max_unacked is 1,000: only the consumer's
    acks let the rest come, and afterwards the cursor is at the head."""
    async with Broker(broker_config(tmp_path / "data", max_unacked=1_000)) as broker:
        await _create(broker, "t")
        values = [b"%05d" % i for i in range(5_000)]
        await _produce(broker, "t", values)
        got: list[Message] = []
        async with AsyncConsumer("t", "s", broker=address(broker), receive_queue=300) as c:
            async with asyncio.timeout(10):
                async for m in c:
                    got.append(m)
                    c.ack(m)
                    if len(got) == 5_000:
                        break
        assert [m.value for m in got] == values
        async with AsyncAdminClient(address(broker)) as admin:
            info = await admin.describe_subscription("t", "s")
        assert [(p.cursor, p.head, p.lag, p.in_flight) for p in info.partitions] == [
            (5_000, 5_000, 0, 0)
        ]


async def test_ack_many_acks_whole_batches_and_keeps_holes(tmp_path: Path) -> None:
    """Scenario: 3,000 records over 3 partitions, max_unacked 500; every receive_batch is
    acked with one ack_many, except that offsets 10-19 of partition 0 are never acked.
    Expected: all 3,000 arrive (the cap is released by the acks), then the cursors are
    partition 0 at 10 with its lag exactly the 10 holes, the others at their heads; a
    second consumer gets exactly the 10 holes, marked redelivered."""
    async with Broker(broker_config(tmp_path / "data", max_unacked=500)) as broker:
        await _create(broker, "t", 3)
        # 5,000 B batches of 250 records, to the 3 partitions in turn: 1,000 records each.
        async with AsyncProducer(address(broker), batch_max_bytes=5_000) as producer:
            await (await producer.send_many("t", [b"%04d" % i for i in range(3000)]))
        seen = 0
        async with AsyncConsumer("t", "s", broker=address(broker)) as consumer:
            async with asyncio.timeout(10):
                while seen < 3000:
                    batch = await consumer.receive_batch(400)
                    seen += len(batch)
                    consumer.ack_many(
                        m for m in batch if not (m.partition == 0 and 10 <= m.offset < 20)
                    )
        async with AsyncAdminClient(address(broker)) as admin:
            info = await admin.describe_subscription("t", "s")
        assert [(p.head, p.cursor, p.lag) for p in info.partitions] == [
            (1000, 10, 10),
            (1000, 1000, 0),
            (1000, 1000, 0),
        ]
        async with AsyncConsumer("t", "s", broker=address(broker)) as again:
            holes = await _take(again, 10)
        assert [(m.partition, m.offset, m.redelivery_count) for m in holes] == [
            (0, o, 1) for o in range(10, 20)
        ]


async def test_acks_of_a_broken_session_are_dropped(broker: Broker) -> None:
    """A message from an earlier session (another epoch) is not acked by ack_many: the
    broker redelivers it rather than the consumer acking it on the wrong session."""
    await _create(broker, "t")
    await _produce(broker, "t", [b"a", b"b"])
    async with AsyncConsumer("t", "s", broker=address(broker)) as consumer:
        a, b = await _take(consumer, 2)
        stale = Message((a[0], a[1], a[2], a[3], a[4], a[5] - 1))
        consumer.ack_many([stale, b])
    async with AsyncAdminClient(address(broker)) as admin:
        info = await admin.describe_subscription("t", "s")
    assert (info.partitions[0].cursor, info.partitions[0].lag) == (0, 1)


async def test_unacked_records_are_redelivered_to_the_next_consumer(broker: Broker) -> None:
    await _create(broker, "t")
    await _produce(broker, "t", [b"a", b"b", b"c"])
    async with AsyncConsumer("t", "s", broker=address(broker)) as first:
        a, _b, _c = await _take(first, 3)
        first.ack(a)
    async with AsyncConsumer("t", "s", broker=address(broker)) as second:
        again = await _take(second, 2)
    assert [(m.value, m.redelivery_count) for m in again] == [(b"b", 1), (b"c", 1)]


async def test_cumulative_ack(broker: Broker) -> None:
    await _create(broker, "t")
    await _produce(broker, "t", [b"a", b"b", b"c"])
    async with AsyncConsumer("t", "s", broker=address(broker)) as consumer:
        got = await _take(consumer, 3)
        consumer.ack_cumulative(got[1])
    async with AsyncAdminClient(address(broker)) as admin:
        info = await admin.describe_subscription("t", "s")
    assert info.partitions[0].cursor == 2


async def test_acks_may_be_awaited_and_close_is_aclose(broker: Broker) -> None:
    """Scenario: an application written as ``await consumer.ack(m)`` (the async style),
    awaiting ack, ack_many, ack_cumulative and nack, and closing the consumer and the
    producer with ``close()`` instead of ``aclose()``. Expected: every await returns
    None at once; the broker got the acks (cursor past the acked records, only the
    nacked one comes back, marked redelivered) and both clients are closed."""
    await _create(broker, "t")
    producer = AsyncProducer(address(broker), linger_ms=1)
    await asyncio.gather(*[await producer.send("t", v) for v in (b"a", b"b", b"c", b"d", b"e")])
    await producer.close()
    with pytest.raises(ClientClosed):
        await producer.send("t", b"late")
    consumer = AsyncConsumer("t", "s", broker=address(broker))
    await consumer.start()
    a, b, c, d, e = await _take(consumer, 5)
    await consumer.ack_cumulative(b)
    await consumer.ack(c)
    await consumer.nack(d, delay=0, reason="awaited")
    await consumer.ack_many([e])
    queued = consumer.ack(a)  # acked already (cumulatively): nothing new for the broker
    assert isinstance(queued, Queued)
    assert repr(queued) == "<ack queued>"
    await consumer.close()
    with pytest.raises(ClientClosed):
        consumer.ack(e)
    async with AsyncConsumer("t", "s", broker=address(broker)) as again:
        (back,) = await _take(again, 1)
        again.ack(back)
    assert (back.value, back.redelivery_count) == (b"d", 1)
    async with AsyncAdminClient(address(broker)) as admin:
        info = await admin.describe_subscription("t", "s")
    assert (info.partitions[0].cursor, info.partitions[0].lag) == (5, 0)


async def test_keys_pick_partitions_and_order_holds_per_partition(broker: Broker) -> None:
    await _create(broker, "t", partitions=3)
    async with AsyncProducer(address(broker), linger_ms=1) as producer:
        futures = [await producer.send("t", b"%d" % i, key=b"k%d" % (i % 7)) for i in range(700)]
        await asyncio.gather(*futures)
    async with AsyncConsumer("t", "s", broker=address(broker)) as consumer:
        got = await _take(consumer, 700)
    for m in got:
        assert m.key is not None
        assert m.partition == partition_for(m.key, 3)
    for key in {m.key for m in got}:
        seq = [int(m.value) for m in got if m.key == key]
        assert seq == sorted(seq)  # per key (hence per partition) order


async def test_latest_skips_the_backlog(broker: Broker) -> None:
    await _create(broker, "t")
    await _produce(broker, "t", [b"old"])
    async with AsyncConsumer(
        "t", "s", broker=address(broker), initial_position="latest"
    ) as consumer:
        await _produce(broker, "t", [b"new"])
        (msg,) = await _take(consumer, 1)
    assert msg.value == b"new"


async def test_open_errors_are_raised(broker: Broker) -> None:
    await _create(broker, "t")
    with pytest.raises(NotFound, match="topic 'nope' does not exist"):
        async with AsyncConsumer("nope", "s", broker=address(broker)):
            pass
    with pytest.raises(InvalidArgument, match="not a valid subscription name"):
        async with AsyncConsumer("t", "bad name", broker=address(broker)):
            pass
    async with AsyncConsumer("t", "s", broker=address(broker), type="shared"):
        pass
    with pytest.raises(InvalidArgument, match="is shared, not exclusive"):
        async with AsyncConsumer("t", "s", broker=address(broker)):
            pass
    with pytest.raises(InvalidArgument, match="is at_least_once, not at_most_once"):
        async with AsyncConsumer(
            "t", "s", broker=address(broker), type="shared", mode="at_most_once"
        ):
            pass
    with pytest.raises(ValueError, match="type must be one of"):
        AsyncConsumer("t", "s", type="fanout")
    with pytest.raises(ValueError, match="mode must be"):
        AsyncConsumer("t", "s", mode="exactly_once")
    async with AsyncConsumer("t", "held", broker=address(broker), consumer_name="one"):
        with pytest.raises(FailedPrecondition, match="'one' holds it"):
            async with AsyncConsumer("t", "held", broker=address(broker)):
                pass


async def test_reconnects_across_a_broker_restart_and_resumes_at_the_cursor(
    tmp_path: Path,
) -> None:
    config: BrokerConfig = broker_config(tmp_path / "data")
    first = Broker(config)
    await first.start()
    port = first.port
    config = config.replace(listen=f"127.0.0.1:{port}")
    await _create(first, "t")
    await _produce(first, "t", [b"%d" % i for i in range(10)])
    consumer = AsyncConsumer("t", "s", broker=f"127.0.0.1:{port}")
    try:
        got = await _take(consumer, 10)
        for m in got[:6]:
            consumer.ack(m)
        await asyncio.sleep(0.1)  # the acks reach the broker; it saves them on shutdown
        await first.aclose()
        consumer.ack(got[6])  # after the break: dropped, 6 comes again
        second = Broker(config)
        await second.start()
        try:
            await _produce(second, "t", [b"10"])
            again = await _take(consumer, 5)
            assert [m.value for m in again] == [b"6", b"7", b"8", b"9", b"10"]
            # 6..9 were delivered before the restart, and delivery counts survive it
            assert [m.redelivery_count for m in again] == [1, 1, 1, 1, 0]
        finally:
            await consumer.aclose()
            await second.aclose()
    finally:
        await consumer.aclose()
        await first.aclose()


async def test_a_sync_consumer_never_hands_out_what_it_read_ahead_before_a_restart(
    tmp_path: Path,
) -> None:
    """Scenario: a blocking Consumer takes record 0 of 10 (1-9 are then in its
    read-ahead); the broker restarts and the consumer opens its next session. Expected:
    the next ten receives give 0-9 as that session delivers them again (each with a
    redelivery count of 1), never the read-ahead's copies of 1-9 from the broken
    session (count 0), whose acks the broker would not take."""
    config: BrokerConfig = broker_config(tmp_path / "data")
    first = Broker(config)
    await first.start()
    config = config.replace(listen=f"127.0.0.1:{first.port}")
    await _create(first, "t")
    await _produce(first, "t", [b"%d" % i for i in range(10)])
    consumer = await asyncio.to_thread(
        Consumer, "t", "s", broker=config.listen, reconnect_backoff_max_s=0.2
    )
    try:
        assert (await asyncio.to_thread(consumer.receive, 10)).value == b"0"
        broken = consumer._consumer.epoch
        await first.aclose()
        async with Broker(config):
            async with asyncio.timeout(10):
                while consumer._consumer.epoch == broken:  # noqa: ASYNC110 - another loop's
                    await asyncio.sleep(0.01)

            def take_ten() -> list[tuple[bytes, int]]:
                got = [consumer.receive(timeout=10) for _ in range(10)]
                return [(m.value, m.redelivery_count) for m in got]

            assert await asyncio.to_thread(take_ten) == [(b"%d" % i, 1) for i in range(10)]
    finally:
        await asyncio.to_thread(consumer.close)
        await first.aclose()


async def test_start_waits_for_a_broker_that_comes_up_later(tmp_path: Path) -> None:
    """Scenario: a consumer starts while nothing listens on the broker's port; the broker
    starts there 1.5 s later. Expected: ``start`` waits (instead of raising Unavailable)
    and returns once the subscription is open; a message published then is received."""
    config = broker_config(tmp_path / "d").replace(listen=f"127.0.0.1:{free_port()}")
    consumer = AsyncConsumer("late", "s", broker=config.listen, reconnect_backoff_max_s=0.2)
    starting = asyncio.ensure_future(consumer.start())
    await asyncio.sleep(1.5)
    assert not starting.done()
    async with Broker(config) as broker:
        await _create(broker, "late")
        await asyncio.wait_for(starting, 10)
        await _produce(broker, "late", [b"hello"])
        assert (await consumer.receive(timeout=10)).value == b"hello"
        await consumer.aclose()


async def test_start_gives_up_after_connect_timeout_naming_the_broker() -> None:
    """Scenario: nothing ever listens at the address; ``connect_timeout`` 0.5 s.
    Expected: ``start`` raises Unavailable after about 0.5 s (not at once, not much
    later), saying which address could not be reached for how long."""
    where = f"127.0.0.1:{free_port()}"
    consumer = AsyncConsumer("t", "s", broker=where, connect_timeout=0.5)
    started = time.monotonic()
    with pytest.raises(Unavailable, match=rf"the broker at {where} could not be reached for 0.5 s"):
        await consumer.start()
    assert 0.5 <= time.monotonic() - started < 3
    await consumer.aclose()


async def test_first_open_retries_a_dead_connection_but_not_a_refusal() -> None:
    """Scenario: the decisions on errors that end a first Subscribe (before any session
    opened), ``connect_timeout`` 5 s. Expected: a connection that died under the call
    (INTERNAL "Internal error from Core", CANCELLED, UNKNOWN: gRPC's own) is retried;
    after one, so is an exclusive subscription refused as held (the holder may be the
    session that died); without one that refusal, and NOT_FOUND, are raised at once;
    past ``connect_timeout`` a dead connection is raised as it is. (The cut itself is
    exercised over a real proxy in ``test_consumer_faults.py``; which status a cut
    yields depends on timing.)"""
    now = time.monotonic()
    held = FailedPrecondition(
        "subscription t/s is exclusive and held by another consumer",
        grpc.StatusCode.FAILED_PRECONDITION,
    )
    missing = NotFound("topic 't' does not exist", grpc.StatusCode.NOT_FOUND)
    for code in (grpc.StatusCode.INTERNAL, grpc.StatusCode.CANCELLED, grpc.StatusCode.UNKNOWN):
        consumer = AsyncConsumer("t", "s", broker="127.0.0.1:1", connect_timeout=5)
        fresh = AsyncConsumer("t", "s", broker="127.0.0.1:1", connect_timeout=5)
        try:
            assert fresh._final_error(held, now) is held
            assert fresh._final_error(missing, now) is missing
            broke = ClientError("Internal error from Core", code)
            assert consumer._final_error(broke, now) is None
            assert consumer._final_error(held, now) is None
            assert consumer._final_error(missing, now) is missing
            assert consumer._final_error(broke, now - 10) is broke
        finally:
            await consumer.aclose()
            await fresh.aclose()
