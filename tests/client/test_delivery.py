"""Delivery rules end to end: subscription types, nacks, ack timeouts, poison records and
the dead-letter queue, over real gRPC on loopback with the real client and broker, and
delivery counts that survive a broker restart."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import pytest

from broker.app import Broker
from broker.config import BrokerConfig
from client import AsyncAdminClient, AsyncConsumer, AsyncProducer, Message
from dispatcher import DispatchConfig, DispatchPolicy, PoisonPolicy
from tests._helpers import eventually
from tests.broker.conftest import broker_config
from tests.client.conftest import address

pytestmark = pytest.mark.asyncio(loop_scope="function")


def _config(tmp_path: Path, **policy: object) -> BrokerConfig:
    defaults = DispatchPolicy(**policy)  # type: ignore[arg-type]
    return broker_config(tmp_path / "data", dispatch=DispatchConfig(defaults=defaults))


async def _setup(broker: Broker, values: list[bytes], keys: list[bytes] | None = None) -> None:
    async with AsyncAdminClient(address(broker)) as admin:
        await admin.create_topic("t", 2)
    await _produce(broker, values, keys)


async def _produce(broker: Broker, values: list[bytes], keys: list[bytes] | None = None) -> None:
    async with AsyncProducer(address(broker), linger_ms=1) as producer:
        futures = [
            await producer.send("t", v, key=keys[i] if keys else None) for i, v in enumerate(values)
        ]
        await asyncio.gather(*futures)


async def _take(consumer: AsyncConsumer, n: int, within: float = 10) -> list[Message]:
    out: list[Message] = []
    async with asyncio.timeout(within):
        while len(out) < n:
            out.append(await consumer.receive())
    return out


async def _nothing(consumer: AsyncConsumer, wait: float = 0.3) -> None:
    with pytest.raises(TimeoutError):
        await consumer.receive(timeout=wait)


def _values(messages: list[Message]) -> list[bytes]:
    return [m.value for m in messages]


async def test_shared_consumers_split_the_records_and_take_over_unacked_ones(
    tmp_path: Path,
) -> None:
    """Scenario: 200 records; two consumers on one shared subscription take all of them
    between them; one acks everything it got, the other closes without acking. Expected:
    both got records, no record went to both, and the survivor then receives the closed
    consumer's records again, flagged as redelivered."""
    async with Broker(_config(tmp_path)) as broker:
        await _setup(broker, [])
        kw = {"broker": address(broker), "type": "shared", "receive_queue": 20}
        async with AsyncConsumer("t", "s", consumer_name="a", **kw) as a:  # type: ignore[arg-type]
            b = AsyncConsumer("t", "s", consumer_name="b", **kw)  # type: ignore[arg-type]
            await b.start()
            async with AsyncProducer(address(broker), linger_ms=0) as producer:
                for i in range(200):  # one record per batch: slices are whole batches
                    await (await producer.send("t", b"%d" % i))
            got_a: list[Message] = []
            got_b: list[Message] = []
            async with asyncio.timeout(10):
                # Take from whichever has records: the broker may have sent the last ones
                # all to one consumer, so waiting on the one that got fewer can wait forever.
                while len(got_a) + len(got_b) < 200:
                    for consumer, got in ((a, got_a), (b, got_b)):
                        try:
                            batch = await consumer.receive_batch(timeout=0.1)
                        except TimeoutError:
                            continue
                        got.extend(batch)
                        if consumer is a:
                            a.ack_many(batch)
            assert got_a
            assert got_b
            assert not set(_values(got_a)) & set(_values(got_b))
            assert sorted(_values(got_a + got_b)) == sorted(b"%d" % i for i in range(200))
            await b.aclose()  # b acked nothing
            again = await _take(a, len(got_b))
            assert sorted(_values(again)) == sorted(_values(got_b))
            assert all(m.redelivery_count == 1 for m in again)


async def test_failover_standby_takes_over_in_order(tmp_path: Path) -> None:
    """Scenario: two consumers on a failover subscription; the first one is active, acks
    the first 10 records of partition 0 and leaves. Expected: the standby received nothing
    while it was standby, then gets the rest of each partition in offset order."""
    async with Broker(_config(tmp_path)) as broker:
        await _setup(broker, [b"%d" % i for i in range(60)])
        kw = {"broker": address(broker), "type": "failover"}
        active = AsyncConsumer("t", "f", consumer_name="one", **kw)  # type: ignore[arg-type]
        first = await _take(active, 60)
        async with AsyncConsumer("t", "f", consumer_name="two", **kw) as standby:  # type: ignore[arg-type]
            await _nothing(standby)
            p0 = [m for m in first if m.partition == 0][:10]
            active.ack_many(p0)
            await active.aclose()
            rest = await _take(standby, 50)
            assert {(m.partition, m.offset) for m in rest}.isdisjoint(
                (m.partition, m.offset) for m in p0
            )
            for partition in (0, 1):
                offsets = [m.offset for m in rest if m.partition == partition]
                assert offsets == sorted(offsets)
            assert all(m.redelivery_count == 1 for m in rest)


async def test_key_shared_keeps_each_key_on_one_consumer(tmp_path: Path) -> None:
    """Scenario: 300 records over 12 keys on a key_shared subscription with three
    consumers (all attached before the records are published) that ack what they get.
    Expected: every record arrives once, each key goes to exactly one consumer, and per key
    the offsets arrive in order."""
    keys = [b"k%d" % (i % 12) for i in range(300)]
    async with Broker(_config(tmp_path)) as broker:
        await _setup(broker, [])
        kw = {"broker": address(broker), "type": "key_shared", "receive_queue": 50}
        consumers = [
            AsyncConsumer("t", "k", consumer_name=f"c{i}", **kw)  # type: ignore[arg-type]
            for i in range(3)
        ]
        for c in consumers:
            await c.start()
        await _produce(broker, [b"%d" % i for i in range(300)], keys)
        owner: dict[bytes, int] = {}
        seen: dict[bytes, list[tuple[int, int]]] = {}
        total = 0
        async with asyncio.timeout(15):
            while total < 300:
                for i, c in enumerate(consumers):
                    try:
                        batch = await c.receive_batch(timeout=0.05)
                    except TimeoutError:
                        continue
                    c.ack_many(batch)
                    total += len(batch)
                    for m in batch:
                        assert m.key is not None
                        assert owner.setdefault(m.key, i) == i, f"{m.key!r} moved"
                        seen.setdefault(m.key, []).append((m.partition, m.offset))
        for c in consumers:
            await c.aclose()
        assert total == 300
        assert len(owner) == 12
        for positions in seen.values():
            assert positions == sorted(positions)


async def test_key_shared_a_consumer_that_stops_reading_holds_up_only_its_own_keys(
    tmp_path: Path,
) -> None:
    """Scenario: two key_shared consumers; one takes nothing after its first two records
    (its credit runs out), the other reads on. 1,200 records over 24 keys, one batch each,
    so the stopped consumer's records lie far more than one read (64 batches) behind the
    head. Expected: the reading consumer gets every record of every key it owns, in order
    per key; the records of the stopped one's keys wait for it."""
    keys = [b"k%d" % (i % 24) for i in range(1_200)]
    async with Broker(_config(tmp_path)) as broker:
        async with AsyncAdminClient(address(broker)) as admin:
            await admin.create_topic("t", 1)
        kw = {"broker": address(broker), "type": "key_shared"}
        stopped = AsyncConsumer("t", "k", consumer_name="stopped", receive_queue=2, **kw)  # type: ignore[arg-type]
        reading = AsyncConsumer("t", "k", consumer_name="reading", **kw)  # type: ignore[arg-type]
        await stopped.start()
        await reading.start()
        async with AsyncProducer(address(broker), linger_ms=0) as producer:
            for i, key in enumerate(keys):
                await producer.publish("t", b"%d" % i, key=key)
        got: dict[bytes, list[int]] = {}
        async with asyncio.timeout(20):
            while True:
                try:
                    batch = await reading.receive_batch(timeout=1.0)
                except TimeoutError:
                    break
                reading.ack_many(batch)
                for m in batch:
                    assert m.key is not None
                    got.setdefault(m.key, []).append(m.offset)
        expected = sum(1 for k in keys if k in got)
        assert got, "the reading consumer owns no key (2 ** -24 odds): rerun"
        assert sum(len(offsets) for offsets in got.values()) == expected
        for key, offsets in got.items():
            assert offsets == [i for i, k in enumerate(keys) if k == key]
        assert len(got) < 24  # the stopped consumer owns some keys: they waited
        await reading.aclose()
        await stopped.aclose()


async def test_nack_with_a_delay_comes_back_later_with_its_count(tmp_path: Path) -> None:
    """Scenario: a record is nacked with a 0.3 s delay. Expected: it does not come back
    before the delay, then comes back with redelivery_count 1."""
    async with Broker(_config(tmp_path)) as broker:
        await _setup(broker, [b"x"])
        async with AsyncConsumer("t", "n", broker=address(broker), ack_interval_ms=0) as c:
            (m,) = await _take(c, 1)
            loop = asyncio.get_running_loop()
            started = loop.time()
            c.nack(m, delay=0.3, reason="db down")
            (again,) = await _take(c, 1)
            assert loop.time() - started >= 0.25
            assert (again.value, again.redelivery_count) == (b"x", 1)
            c.ack(again)
        with pytest.raises(ValueError, match="delay must be from 0"):
            c.nack(m, delay=-1)


async def test_an_unacked_record_is_sent_again_after_the_ack_timeout(tmp_path: Path) -> None:
    """Scenario: ack timeout 0.2 s, backoff 0.05 s; a consumer receives a record and does
    not ack it. Expected: it comes again (count 1), then again (count 2); the broker counts
    ack timeouts."""
    config = _config(tmp_path, ack_timeout_s=0.2, backoff_initial_s=0.05, backoff_jitter=0.0)
    async with Broker(config) as broker:
        await _setup(broker, [b"slow"])
        async with AsyncConsumer("t", "a", broker=address(broker)) as c:
            got = await _take(c, 3, within=5)
            assert [m.redelivery_count for m in got] == [0, 1, 2]
            c.ack(got[-1])
        broker.subscriptions.heartbeat_round()
        (sample,) = broker.subscriptions.samples()
        assert sample.ack_timeouts >= 2
        assert sample.redelivered >= 2


@pytest.mark.parametrize("policy", list(PoisonPolicy))
async def test_poison_records_after_max_deliveries(tmp_path: Path, policy: PoisonPolicy) -> None:
    """Scenario: max_deliveries 2; the consumer nacks record "bad" every time and acks the
    others; once "bad" is poison, "ok3" is published. Expected by policy: dead_letter moves
    "bad" to the DLQ (with its attempts and the nack reason) and "ok3" flows; drop acks it
    and "ok3" flows; block stops the partition (BLOCKED in lag, with the reason) and "ok3"
    is not delivered."""
    config = _config(
        tmp_path, max_deliveries=2, poison=policy, backoff_initial_s=0.01, backoff_jitter=0.0
    )
    async with Broker(config) as broker:
        async with AsyncAdminClient(address(broker)) as admin:
            await admin.create_topic("t", 1)
            async with AsyncProducer(address(broker), linger_ms=0) as producer:
                for v in (b"ok1", b"bad", b"ok2"):
                    await (await producer.send("t", v))
                received: Counter[bytes] = Counter()
                c = AsyncConsumer("t", "p", broker=address(broker), ack_interval_ms=0)
                async with c, asyncio.timeout(10):
                    while sum(received.values()) < 4:
                        m = await c.receive()
                        received[m.value] += 1
                        if m.value == b"bad":
                            c.nack(m, delay=0, reason="cannot parse")
                        else:
                            c.ack(m)
                    assert received == Counter({b"ok1": 1, b"bad": 2, b"ok2": 1})
                    sub = broker.subscriptions.get("t", "p")
                    if policy is PoisonPolicy.BLOCK:
                        await eventually(lambda: bool(sub.state.blocked(0)))
                    else:
                        await eventually(lambda: sub.state.cursor(0) == 3)
                    await (await producer.send("t", b"ok3"))
                    if policy is PoisonPolicy.BLOCK:
                        await _nothing(c, 0.3)
                        (part,) = (await admin.describe_subscription("t", "p")).partitions
                        assert part.state == "BLOCKED"
                        assert "offset 1 failed 2 deliveries" in part.reason
                        return
                    (m,) = await _take(c, 1)
                    assert m.value == b"ok3"
        dlq = await broker.subscriptions.dead_letter_queue("t", "p", create=False)
        if policy is PoisonPolicy.DROP:
            assert dlq is None or dlq.count() == 0
            return
        assert dlq is not None
        (entry,) = await dlq.peek()
        assert (entry.value, entry.offset, entry.attempts) == (b"bad", 1, 2)
        assert entry.reason == "cannot parse"
        assert len(entry.attempt_times_ms) == 2


async def test_delivery_counts_survive_a_restart(tmp_path: Path) -> None:
    """Scenario: max_deliveries 4; a record is nacked twice, delivered a third time to a
    consumer that leaves without acking (a failure too), then the broker restarts.
    Expected: after the restart it comes with redelivery_count 3, and one more nack sends
    it to the dead-letter queue (4 attempts) rather than to the consumer again."""
    config = _config(tmp_path, max_deliveries=4, backoff_initial_s=0.01, backoff_jitter=0.0)
    first = Broker(config)
    await first.start()
    config = config.replace(listen=f"127.0.0.1:{first.port}")
    try:
        await _setup(first, [b"poison"])
        async with AsyncConsumer("t", "r", broker=address(first), ack_interval_ms=0) as c:
            for expected in (0, 1):
                (m,) = await _take(c, 1)
                assert m.redelivery_count == expected
                c.nack(m, delay=0, reason=f"try {expected}")
            (m,) = await _take(c, 1)  # the third delivery, not acked
            assert m.redelivery_count == 2
    finally:
        await first.aclose()
    async with Broker(config) as second:
        async with AsyncConsumer("t", "r", broker=address(second), ack_interval_ms=0) as c:
            (m,) = await _take(c, 1)
            assert m.redelivery_count == 3
            c.nack(m, delay=0, reason="still broken")
            await _nothing(c, 0.3)
        dlq = await second.subscriptions.dead_letter_queue("t", "r", create=False)
        assert dlq is not None
        (entry,) = await dlq.peek()
        assert (entry.value, entry.attempts, entry.reason) == (b"poison", 4, "still broken")


async def test_at_most_once_never_redelivers(tmp_path: Path) -> None:
    """Scenario: an at_most_once consumer receives 5 records, acks none and leaves; a new
    consumer joins. Expected: nothing is delivered again, and the cursor is at 5."""
    async with Broker(_config(tmp_path)) as broker:
        await _setup(broker, [b"%d" % i for i in range(5)])
        kw = {"broker": address(broker), "mode": "at_most_once"}
        async with AsyncConsumer("t", "m", **kw) as c:  # type: ignore[arg-type]
            await _take(c, 5)
        async with AsyncConsumer("t", "m", **kw) as c:  # type: ignore[arg-type]
            await _nothing(c)
        async with AsyncAdminClient(address(broker)) as admin:
            info = await admin.describe_subscription("t", "m")
        assert sum(p.lag for p in info.partitions) == 0


async def test_repeated_header_names_survive_the_dead_letter_queue_and_replay(
    tmp_path: Path,
) -> None:
    """Scenario: max_deliveries 1; a record with the header ``h`` twice (1, then 2) is
    nacked once, so it is dead-lettered; an admin peeks and replays it. Expected: the
    peeked entry's ``header_list`` holds both values in order (``headers``, a map, the
    last one), and the replayed record is delivered with both, then x-replay-count 1.
    Before, the queue kept only ``h = 2``, and the replay published that."""
    config = _config(tmp_path, max_deliveries=1, backoff_initial_s=0.01, backoff_jitter=0.0)
    headers = [("h", b"1"), ("h", b"2")]
    async with Broker(config) as broker, AsyncAdminClient(address(broker)) as admin:
        await admin.create_topic("t", 1)
        async with AsyncProducer(address(broker), linger_ms=0) as producer:
            await (await producer.send("t", b"poison", headers=headers))
        async with AsyncConsumer("t", "r", broker=address(broker), ack_interval_ms=0) as c:
            (m,) = await _take(c, 1)
            assert m.header_list == headers
            c.nack(m, delay=0, reason="bad")
            await eventually(lambda: broker.subscriptions.get("t", "r").state.cursor(0) == 1)
            (entry,) = await admin.peek_dead_letters("t", "r")
            assert entry.header_list == (("h", b"1"), ("h", b"2"))
            assert dict(entry.headers) == {"h": b"2"}
            assert (await admin.replay_dead_letters("t", "r")).replayed == 1
            (again,) = await _take(c, 1)
            assert again.value == b"poison"
            assert again.header_list == [*headers, ("x-replay-count", b"1")]
