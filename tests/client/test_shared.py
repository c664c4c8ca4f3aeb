"""Shared connections (client._shared): the consumers of one event loop that connect alike
ride one TCP connection, counted by the kernel's own socket table; a broker's lower stream
limit moves consumers to new connections instead of failing them; the last consumer
closed closes the connection."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest

from broker.app import Broker
from broker.limits import LimitsConfig
from client import AsyncAdminClient, AsyncConsumer, AsyncProducer, Message, _shared
from client._channel import aio_channel
from tests.broker.conftest import broker_config
from tests.client.conftest import address

pytestmark = pytest.mark.asyncio(loop_scope="function")

_ESTABLISHED = "01"


def connections_to(port: int) -> int:
    """Established TCP connections whose server end is ``port`` (the broker runs in this
    process, so its ends of every client connection are in this network namespace)."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except FileNotFoundError:
            continue
        for row in rows:
            fields = row.split()
            local_port = int(fields[1].rsplit(":", 1)[1], 16)
            if local_port == port and fields[3] == _ESTABLISHED:
                count += 1
    return count


async def _until_connections(port: int, expected: int, timeout_s: float = 10.0) -> None:
    """Wait until ``port`` has ``expected`` established connections (a closed channel's
    socket goes away a moment after ``close`` returns)."""
    async with asyncio.timeout(timeout_s):
        while connections_to(port) != expected:  # noqa: ASYNC110 - the kernel tells no one
            await asyncio.sleep(0.02)


def _pool_channels() -> list[list[_shared._Shared]]:
    """The shared channels of the running loop, by key."""
    pool = _shared._POOLS.get(asyncio.get_running_loop())
    return [] if pool is None else list(pool.channels.values())


async def _topic_with(broker: Broker, topic: str, values: list[bytes]) -> None:
    async with AsyncAdminClient(address(broker)) as admin:
        await admin.create_topic(topic, 1)
    async with AsyncProducer(address(broker)) as producer:
        for value in values:
            await producer.publish(topic, value)


async def _values(consumer: AsyncConsumer, n: int) -> list[bytes]:
    out: list[Message] = []
    async with asyncio.timeout(10):
        while len(out) < n:
            out.append(await consumer.receive())
    consumer.ack_many(out)
    return [m.value for m in out]


async def test_consumers_of_one_loop_share_one_connection(broker: Broker) -> None:
    """Scenario: five consumers, each on its own subscription of one topic, default
    settings; then four of them close; then the last. Expected: one connection while all
    five receive everything; the last one keeps receiving after the others closed; no
    connection after the last closes."""
    await _topic_with(broker, "t", [b"a", b"b"])
    await _until_connections(broker.port, 0)
    consumers = [AsyncConsumer("t", f"s{i}", broker=address(broker)) for i in range(5)]
    await asyncio.gather(*(c.start() for c in consumers))
    assert connections_to(broker.port) == 1
    for consumer in consumers:
        assert await _values(consumer, 2) == [b"a", b"b"]
    for consumer in consumers[:4]:
        await consumer.aclose()
    async with AsyncProducer(address(broker)) as producer:
        await producer.publish("t", b"c")
    assert await _values(consumers[4], 1) == [b"c"]
    await consumers[4].aclose()
    await _until_connections(broker.port, 0)


async def test_different_settings_or_a_given_channel_do_not_share(broker: Broker) -> None:
    """Scenario: two consumers alike, one with another reconnect cap, one on a channel of
    its own making. Expected: three connections: the two alike share, the others not."""
    await _topic_with(broker, "t", [b"a"])
    await _until_connections(broker.port, 0)
    alike = [AsyncConsumer("t", f"s{i}", broker=address(broker)) for i in range(2)]
    other = AsyncConsumer("t", "s2", broker=address(broker), reconnect_backoff_max_s=0.5)
    async with aio_channel(address(broker)) as own_channel:
        given = AsyncConsumer("t", "s3", channel=own_channel)
        consumers = [*alike, other, given]
        await asyncio.gather(*(c.start() for c in consumers))
        assert connections_to(broker.port) == 3
        for consumer in consumers:
            assert await _values(consumer, 1) == [b"a"]
            await consumer.aclose()
    await _until_connections(broker.port, 0)


async def test_a_lower_stream_limit_moves_consumers_to_new_connections(tmp_path: Path) -> None:
    """Scenario: a broker with ``max_streams_per_connection = 2``; five consumers made
    alike. Expected: every one starts and receives (none sees the refusal), on three
    connections (2 + 2 + 1)."""
    config = broker_config(tmp_path / "data", limits=LimitsConfig(max_streams_per_connection=2))
    async with Broker(config) as broker:
        await _topic_with(broker, "t", [b"a"])
        await _until_connections(broker.port, 0)
        consumers = [AsyncConsumer("t", f"s{i}", broker=address(broker)) for i in range(5)]
        for consumer in consumers:  # one at a time: each refusal is met by the next
            await consumer.start()
        assert connections_to(broker.port) == 3
        for consumer in consumers:
            assert await _values(consumer, 1) == [b"a"]
            await consumer.aclose()
        await _until_connections(broker.port, 0)


async def test_a_full_connection_makes_the_next_consumer_open_another(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Scenario: at most two consumers a connection (``MAX_PER_CHANNEL``); five
    consumers started together. Expected: three connections, everything received."""
    monkeypatch.setattr(_shared, "MAX_PER_CHANNEL", 2)
    await _topic_with(broker, "t", [b"a"])
    await _until_connections(broker.port, 0)
    consumers = [AsyncConsumer("t", f"s{i}", broker=address(broker)) for i in range(5)]
    await asyncio.gather(*(c.start() for c in consumers))
    assert connections_to(broker.port) == 3
    for consumer in consumers:
        assert await _values(consumer, 1) == [b"a"]
    await asyncio.gather(*(c.aclose() for c in consumers))
    await _until_connections(broker.port, 0)


async def test_consumers_coming_and_going_never_lose_their_connection(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Scenario: three consumers a connection at most; 40 steps in a seeded random order,
    each starting a new consumer or closing a running one (several at once), and after
    each step every running consumer receives the record just published. Expected: no
    consumer ever misses one (its channel was never closed under it); every shared
    channel holds one to three of them, one connection each; none after the last close."""
    monkeypatch.setattr(_shared, "MAX_PER_CHANNEL", 3)
    rng = random.Random(20261129)
    await _topic_with(broker, "t", [])
    await _until_connections(broker.port, 0)
    running: list[AsyncConsumer] = []
    async with AsyncProducer(address(broker)) as producer:
        for step in range(40):
            if running and (len(running) >= 9 or rng.random() < 0.4):
                leaving = rng.sample(running, rng.randint(1, len(running)))
                running = [c for c in running if c not in leaving]
                await asyncio.gather(*(c.aclose() for c in leaving))
            else:
                joining = [
                    AsyncConsumer(
                        "t", f"s{step}-{i}", broker=address(broker), initial_position="latest"
                    )
                    for i in range(rng.randint(1, 3))
                ]
                await asyncio.gather(*(c.start() for c in joining))
                running += joining
            value = f"r{step}".encode()
            await producer.publish("t", value)
            for consumer in running:
                assert await _values(consumer, 1) == [value], f"step {step}"
            held = [e.users for entries in _pool_channels() for e in entries]
            assert sum(held) == len(running), held
            assert all(1 <= n <= 3 for n in held), held
            await _until_connections(broker.port, 1 + len(held))  # + the producer's
    await asyncio.gather(*(c.aclose() for c in running))
    await _until_connections(broker.port, 0)


async def test_shared_consumers_all_come_back_after_a_broker_restart(tmp_path: Path) -> None:
    """Scenario: three consumers share a connection; the broker stops and starts again on
    the same port; a record is published after. Expected: each of them receives it, on
    one new connection."""
    config = broker_config(tmp_path / "data")
    async with Broker(config) as first:
        port = first.port
        await _topic_with(first, "t", [b"a"])
        consumers = [
            AsyncConsumer("t", f"s{i}", broker=address(first), reconnect_backoff_max_s=0.1)
            for i in range(3)
        ]
        await asyncio.gather(*(c.start() for c in consumers))
        for consumer in consumers:
            assert await _values(consumer, 1) == [b"a"]
        await asyncio.sleep(0.1)  # the acks reach the broker before it stops
    async with Broker(config.replace(listen=f"127.0.0.1:{port}")) as second:
        async with AsyncProducer(address(second)) as producer:
            await producer.publish("t", b"b")
        for consumer in consumers:
            got = await _values(consumer, 1)
            assert got in ([b"b"], [b"a"])  # "a" again if its ack was lost: at least once
            if got == [b"a"]:
                assert await _values(consumer, 1) == [b"b"]
        assert connections_to(port) == 1
        await asyncio.gather(*(c.aclose() for c in consumers))
