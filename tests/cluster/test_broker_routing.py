"""Cluster mode end to end: one seed reaches the topics of every broker.

A real three-member etcd and three real ``headrace serve`` processes in cluster mode
(:mod:`tests.cluster.broker_processes`). Every client and CLI command below is given ONE
seed, broker b1, and works on three topics, one owned by each broker: the clients look
the owner up and follow the refusal (``ABORTED`` with the owner's address) by themselves.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from broker.cli import cli
from client import AsyncAdminClient, AsyncConsumer, AsyncFetcher, AsyncProducer, Message
from tests.cluster.broker_processes import cluster_brokers, read_topic
from tests.cluster.etcd_harness import EtcdCluster

pytestmark = [pytest.mark.asyncio(loop_scope="function"), pytest.mark.timeout(180)]

TOPICS = ["alpha", "beta", "gamma"]


async def headrace(seed: str, *args: str, stdin: str = "") -> Result:
    """``headrace ARGS --broker SEED`` in-process, on a worker thread (its own loop)."""
    argv = [*args, "--broker", seed]
    return await asyncio.to_thread(CliRunner().invoke, cli, argv, input=stdin)


async def test_one_seed_reaches_the_topics_of_every_broker(
    tmp_path: Path, etcd: EtcdCluster, prefix: str
) -> None:
    """Scenario: three topics created through b1, one placed on each broker; then,
    through the seed b1 only: a producer sends 20 records to each, a consumer reads each
    topic, a fetcher reads each partition, and the CLI runs produce, consume, seek, lag
    and the dead-letter commands (peek, count, ack, purge, replay) on every topic.
    Expected: each topic's owner is a different broker; every call succeeds; each topic
    holds exactly its 20 + 3 records, each once; the consumer received its 20; lag is 0
    after the CLI consumer; the dead-letter commands answer with an empty queue (the
    subscription exists on the owner, so a call that reached another broker would have
    been refused or answered NOT_FOUND)."""
    async with cluster_brokers(tmp_path, etcd, prefix) as brokers:
        seed = brokers.all[0].address
        async with AsyncAdminClient(seed) as admin:
            for topic in TOPICS:
                await admin.create_topic(topic, partitions=1)
        owners = await brokers.wait_owners(TOPICS)
        assert Counter(owners.values()) == {"b1": 1, "b2": 1, "b3": 1}

        async with AsyncProducer(seed) as producer:
            for topic in TOPICS:
                for i in range(20):
                    await producer.send(topic, f"{topic}-{i}".encode())
            await producer.flush()
        for topic in TOPICS:
            async with AsyncConsumer(topic, "lib", broker=seed) as consumer:
                got = [m.value for m in await _receive(consumer, 20)]
            assert got == [f"{topic}-{i}".encode() for i in range(20)]

        for topic in TOPICS:
            made = await headrace(seed, "produce", topic, stdin="x\ny\nz\n")
            assert made.exit_code == 0, made.output
            read = await headrace(seed, "consume", topic, "-s", "cli", "--count", "23")
            assert read.exit_code == 0, read.output
            assert len(read.stdout.split()) == 23
            lag = await headrace(seed, "lag", "-t", topic, "--json")
            assert lag.exit_code == 0, lag.output
            assert {r["subscription"]: r["lag"] for r in json.loads(lag.stdout)}["cli"] == 0
            sought = await headrace(seed, "seek", topic, "-s", "cli", "--to", "earliest")
            assert sought.exit_code == 0, sought.output
            for dlq in (
                ["dlq", "count", topic, "-s", "cli"],
                ["dlq", "peek", topic, "-s", "cli", "--json"],
                ["dlq", "ack", topic, "-s", "cli", "--up-to", "0"],
                ["dlq", "purge", topic, "-s", "cli", "--yes"],
                ["dlq", "replay", topic, "-s", "cli"],
            ):
                done = await headrace(seed, *dlq)
                assert done.exit_code == 0, (dlq, done.output)

        async with AsyncFetcher(seed) as fetcher:
            for topic in TOPICS:
                got_batches = await fetcher.fetch(topic, 0, 0)
                assert got_batches.high_water_mark == 23
        for topic in TOPICS:
            rows = (await read_topic(seed, topic))[0]
            assert [o for o, _ in rows] == list(range(23))
            values = [v for _, v in rows]
            assert values[:20] == [f"{topic}-{i}".encode() for i in range(20)]
            assert values[20:] == [b"x", b"y", b"z"]


async def _receive(consumer: AsyncConsumer, count: int) -> list[Message]:
    """``count`` messages, each acknowledged, within 30 s."""
    got: list[Message] = []
    async with asyncio.timeout(30):
        while len(got) < count:
            message = await consumer.receive()
            consumer.ack(message)
            got.append(message)
    return got
