"""Routing: every client finds each topic's owner from one seed and follows refusals.

Real brokers on loopback (:mod:`tests.client.static_cluster`: the real topic guard, the
ABORTED refusal with its trailers, the Cluster service; a dict instead of etcd), real
gRPC, the real client classes.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import re
import weakref
from pathlib import Path
from typing import Any

import grpc
import pytest

from broker.app import Broker
from client import (
    AsyncAdminClient,
    AsyncConsumer,
    AsyncFetcher,
    AsyncProducer,
    Fetcher,
    PublishOutcome,
)
from client._async._routing import Link, Router
from client._connection import ConnectionSettings
from client._routes import RouteTable, Step
from client._seeds import parse_brokers
from client.errors import Refused, Unavailable
from proto import admin_pb2 as _admin
from proto import cluster_pb2 as _cluster
from proto.refusal import Redirection
from tests.broker.test_serve_process import free_port
from tests.client.conftest import address, read_batches, read_partition
from tests.client.static_cluster import static_cluster

# -- seeds and the route table: pure -----------------------------------------------------


@pytest.mark.parametrize(
    ("broker", "seeds"),
    [
        ("127.0.0.1:50051", ("127.0.0.1:50051",)),
        ("a:1,b:2", ("a:1", "b:2")),
        (" a:1 , b:2 ,", ("a:1", "b:2")),
        ("a:1,a:1,[::1]:3", ("a:1", "[::1]:3")),
        (["a:1", "b:2,c:3"], ("a:1", "b:2", "c:3")),
    ],
)
def test_parse_brokers(broker: str | list[str], seeds: tuple[str, ...]) -> None:
    """One address, a comma-separated list (blanks and repeats dropped) or a sequence
    give the seeds in order."""
    assert parse_brokers(broker) == seeds


@pytest.mark.parametrize(
    ("broker", "message"),
    [
        ("a:1,b", "broker entry 2 of 2, 'b', is not HOST:PORT: it has no :PORT"),
        ("garbage", "broker 'garbage' is not HOST:PORT"),
        ("a:1,h:99999", "entry 2 of 2, 'h:99999'"),
        (",", "broker names no HOST:PORT"),
    ],
)
def test_parse_brokers_names_the_bad_entry(broker: str, message: str) -> None:
    """A bad entry raises ValueError naming it and its place in the list."""
    with pytest.raises(ValueError, match="HOST:PORT") as caught:
        parse_brokers(broker)
    assert message in str(caught.value)


def test_a_client_names_the_bad_seed() -> None:
    """A client made with a bad seed raises ValueError naming it, before any call."""
    with pytest.raises(ValueError, match="'nope'"):
        AsyncAdminClient("127.0.0.1:1,nope")


def _refused(reason: str, topic: str, owner: str = "") -> Refused:
    return Refused("refused", redirection=Redirection(reason, topic, "n", owner, 2))


def test_route_table_follows_a_refusal() -> None:
    """Uncached topics go to the first seed; not-owner with an address caches it (NOW);
    a refusal naming the broker just called, or any other reason, says LOOKUP and drops
    the route."""
    table = RouteTable("a:1,b:2")
    assert table.address("t") == "a:1"
    assert table.after("t", "a:1", _refused("not-owner", "t", "c:3"), retry=False) is Step.NOW
    assert table.address("t") == "c:3"
    assert table.after("t", "c:3", _refused("not-owner", "t", "c:3"), retry=False) is Step.LOOKUP
    assert table.address("t") == "a:1"
    assert table.after("t", "a:1", _refused("offline", "t"), retry=False) is Step.LOOKUP


def test_route_table_moves_between_seeds() -> None:
    """A seed that cannot be reached moves the table to the next one at once; with a
    single seed an unknown outcome is retried only when the call allows it."""
    table = RouteTable("a:1,b:2")
    down = Unavailable("failed to connect to all addresses", grpc.StatusCode.UNAVAILABLE)
    assert table.after(None, "a:1", down, retry=False) is Step.NOW
    assert table.home == "b:2"
    single = RouteTable("a:1")
    assert single.after(None, "a:1", down, retry=False) is Step.RAISE
    assert single.after(None, "a:1", down, retry=True) is Step.BACKOFF


def test_route_table_learns_a_lookup() -> None:
    """Online routes are cached (the answering node's own by the address asked); absent
    topics are reported; the broker that answered becomes home."""
    table = RouteTable("a:1,b:2,c:3")
    response = _cluster.LookupResponse(
        node_id="n1",
        routes=[
            _cluster.TopicRoute(topic="x", owner_node="n2", owner_address="c:3", online=True),
            _cluster.TopicRoute(topic="y", owner_node="n1", owner_address="h:9", online=True),
            _cluster.TopicRoute(topic="z", state="absent"),
        ],
    )
    assert table.learn_lookup("b:2", response) == ["z"]
    assert table.home == "b:2"
    assert (table.address("x"), table.address("y"), table.address("z")) == ("c:3", "b:2", "b:2")


def test_a_lookup_naming_an_offline_topic_asks_the_next_seed_next() -> None:
    """Scenario: seeds a, b, c; b answers a Lookup in which topic w is not served (its
    leader cut off from etcd still names itself, or an election is under way). Expected:
    w's route is dropped and the next Lookup asks c first, then a, then b: b's own view
    may be the stale one. Another answer that is all online makes its broker home again."""
    table = RouteTable("a:1,b:2,c:3")
    offline = _cluster.LookupResponse(
        node_id="n2",
        routes=[_cluster.TopicRoute(topic="w", owner_node="n2", state="ready", online=False)],
    )
    assert table.learn_lookup("b:2", offline) == []
    assert table.lookup_order() == ["c:3", "a:1", "b:2"]
    assert table.address("w") == "c:3"
    online = _cluster.LookupResponse(
        node_id="n3",
        routes=[_cluster.TopicRoute(topic="w", owner_node="n1", owner_address="a:1", online=True)],
    )
    assert table.learn_lookup("c:3", online) == []
    assert table.home == "c:3"
    assert table.address("w") == "a:1"


# -- a single broker: nothing changes ---------------------------------------------------


@pytest.mark.asyncio
async def test_single_broker_makes_no_lookup(broker: Broker) -> None:
    """Against one broker every client works as before and never calls Lookup (the
    routers' counters stay 0): zero extra round trips."""
    seed = address(broker)
    async with AsyncAdminClient(seed) as admin:
        await admin.create_topic("solo")
        async with AsyncProducer(seed) as producer:
            await (await producer.send("solo", b"v"))
        async with AsyncFetcher(seed) as fetcher:
            got = await fetcher.fetch("solo", 0, 0)
            await fetcher.ack_up_to("solo", "s", 0, 1)
        async with AsyncConsumer("solo", "c", broker=seed) as consumer:
            message = await consumer.receive(timeout=10)
            consumer.ack(message)
        await admin.describe_subscription("solo", "c")
        routers = [admin.router, producer.router, fetcher.router, consumer.router]
        assert [r.table.lookups for r in routers] == [0, 0, 0, 0]
    assert got.high_water_mark == 1
    assert message.value == b"v"


# -- two brokers through one seed -------------------------------------------------------


@pytest.mark.asyncio
async def test_every_client_reaches_each_owner_through_one_seed(tmp_path: Path) -> None:
    """Topics owned by b1 and by b2; every client is given b1 only. Produce (unary and
    pipelined), consume with acks, fetch and ack_up_to, seek, lag and the DLQ calls all
    reach the owner: the records are in the owner's log only, the subscription and its
    cursor live on the owner."""
    async with static_cluster(tmp_path) as cluster:
        await cluster.create("on1", "b1")
        await cluster.create("on2", "b2")
        seed = cluster.address("b1")
        async with AsyncProducer(seed) as unary, AsyncProducer(seed, max_in_flight=4) as piped:
            for topic in ("on1", "on2"):
                await (await unary.send(topic, b"u-" + topic.encode()))
                await (await piped.send(topic, b"p-" + topic.encode()))
        for node, topic in (("b1", "on1"), ("b2", "on2")):
            values = [v for _, v, _ in await read_partition(cluster.brokers[node], topic, 0)]
            assert values == [b"u-" + topic.encode(), b"p-" + topic.encode()]

        async with AsyncConsumer("on2", "sub", broker=seed) as consumer:
            got = [await consumer.receive(timeout=10) for _ in range(2)]
            for m in got:
                consumer.ack(m)
        assert [m.value for m in got] == [b"u-on2", b"p-on2"]

        async with AsyncFetcher(seed) as fetcher:
            fetched = await fetcher.fetch("on2", 0, 0)
            assert fetched.high_water_mark == 2
            assert await fetcher.ack_up_to("on2", "spark", 0, 2) == 2

        async with AsyncAdminClient(seed) as admin:
            info = await admin.describe_subscription("on2", "sub")
            assert [p.cursor for p in info.partitions] == [2]
            sought = await admin.seek("on2", "sub", earliest=True)
            assert [p.cursor for p in sought.partitions] == [0]
            lag = await admin.list_subscriptions("on2")
            assert {s.subscription for s in lag} == {"sub", "spark"}
            assert await admin.count_dead_letters("on2", "sub") == 0
            assert await admin.peek_dead_letters("on2", "sub") == []
            assert await admin.purge_dead_letters("on2", "sub") == 0
            assert (await admin.describe_topic("on2")).name == "on2"
        assert cluster.map.lookups == {}  # every owner was found from a refusal alone


@pytest.mark.asyncio
@pytest.mark.parametrize("max_in_flight", [1, 4])
async def test_a_stale_route_recovers_by_itself(tmp_path: Path, max_in_flight: int) -> None:
    """A producer (unary, and pipelined on a PublishStream left open to b2) and a fetcher
    cached moving -> b2; the topic moves to b1 (the map changes): their next calls are
    refused by b2, follow the refusal to b1 and succeed, with no error surfacing."""
    async with static_cluster(tmp_path) as cluster:
        await cluster.create("moving", "b2", also=["b1"])
        seed = cluster.address("b1")
        async with (
            AsyncProducer(seed, max_in_flight=max_in_flight) as producer,
            AsyncFetcher(seed) as fetcher,
        ):
            await (await producer.send("moving", b"first"))
            assert producer.router.table.address("moving") == cluster.address("b2")
            cluster.map.owners["moving"] = "b1"
            await (await producer.send("moving", b"second"))
            assert producer.router.table.address("moving") == cluster.address("b1")
            assert (await fetcher.fetch("moving", 0, 0)).high_water_mark == 1
        cluster.map.owners.clear()  # each broker serves its own copy to the log reader
        b1 = [v for _, v, _ in await read_partition(cluster.brokers["b1"], "moving", 0)]
        b2 = [v for _, v, _ in await read_partition(cluster.brokers["b2"], "moving", 0)]
        assert (b1, b2) == ([b"second"], [b"first"])


@pytest.mark.asyncio
@pytest.mark.parametrize("max_in_flight", [1, 4])
async def test_idempotent_producer_writes_each_record_once_across_redirects(
    tmp_path: Path, max_in_flight: int
) -> None:
    """An idempotent producer sends 600 records to a topic owned by b2 through seed b1,
    unary and pipelined: the first batches are refused by b1 and resent to b2 with the
    same producer id and sequences. b2's log holds each record exactly once, its batches'
    sequences follow each other with no gap and no repeat, and b1's copy of the topic
    stays empty."""
    async with static_cluster(tmp_path) as cluster:
        await cluster.create("once", "b2", also=["b1"])
        async with AsyncProducer(
            cluster.address("b1"), linger_ms=1, max_in_flight=max_in_flight
        ) as producer:
            futures = [await producer.send("once", b"%d" % i) for i in range(600)]
            await producer.flush()
        assert all(f.done() for f in futures)
        values = [v for _, v, _ in await read_partition(cluster.brokers["b2"], "once", 0)]
        assert values == [b"%d" % i for i in range(600)]
        cluster.map.owners.clear()  # b1 serves its own copy to the log reader
        assert await read_partition(cluster.brokers["b1"], "once", 0) == []
        batches = await read_batches(cluster.brokers["b2"], "once", 0)
        next_sequence: dict[int, int] = {}
        for b in batches:
            assert b.producer_id >= 0
            assert b.base_sequence == next_sequence.get(b.producer_id, 0)
            next_sequence[b.producer_id] = b.base_sequence + len(b.offsets())
        assert sum(next_sequence.values()) == 600


@pytest.mark.asyncio
async def test_a_dead_seed_is_skipped(tmp_path: Path) -> None:
    """The first seed listens nowhere: the admin client, producer and blocking fetcher
    go to the next seed at once and work."""
    async with static_cluster(tmp_path) as cluster:
        await cluster.create("t2", "b2")
        seeds = f"127.0.0.1:{free_port()},{cluster.address('b1')}"
        async with AsyncAdminClient(seeds, timeout_s=5) as admin:
            assert isinstance(await admin.list_topics(), list)
            assert admin.router.table.home == cluster.address("b1")
            assert (await admin.describe_topic("t2")).name == "t2"
        async with AsyncProducer(seeds, delivery_timeout_s=5) as producer:
            await (await producer.send("t2", b"x"))
        fetcher = Fetcher(seeds, timeout_s=5)
        try:
            got = await asyncio.to_thread(fetcher.fetch, "t2", 0, 0)
        finally:
            fetcher.close()
        assert got.high_water_mark == 1


@pytest.mark.asyncio
async def test_an_offline_owner_fails_at_the_deadline_with_the_refusal(tmp_path: Path) -> None:
    """A topic whose owner is offline (refused with no address) is backed off and
    looked up until the call's deadline; then the refusal is raised, naming why."""
    async with static_cluster(tmp_path) as cluster:
        await cluster.create("dark", "b1")
        cluster.map.owners["dark"] = "b9"
        cluster.map.addresses["b9"] = ""
        async with AsyncAdminClient(cluster.address("b1"), timeout_s=1) as admin:
            with pytest.raises(Refused) as caught:
                await admin.describe_topic("dark")
            assert admin.router.table.lookups >= 1
        assert caught.value.redirection.reason == "not-owner"


@pytest.mark.asyncio
async def test_a_consumer_whose_owner_dies_looks_up_and_reopens_at_the_new_owner(
    tmp_path: Path,
) -> None:
    """A consumer reads ``hop`` at its owner b2 through seed b1; b2 stops and the topic
    moves to b1 (the map). The broken stream makes the consumer look the topic up on its
    seed and reopen there: it receives the record then published at b1."""
    async with static_cluster(tmp_path) as cluster:
        await cluster.create("hop", "b2", also=["b1"])
        seed = cluster.address("b1")
        async with AsyncProducer(seed) as producer:
            await (await producer.send("hop", b"at-b2"))
        async with AsyncConsumer("hop", "c", broker=seed, connect_timeout=10) as consumer:
            first = await consumer.receive(timeout=10)
            consumer.ack(first)
            lookups = consumer.router.table.lookups
            cluster.map.owners["hop"] = "b1"
            await cluster.brokers["b2"].aclose()
            async with AsyncProducer(seed) as producer:
                await (await producer.send("hop", b"at-b1"))
            second = await consumer.receive(timeout=20)
        assert (first.value, second.value) == (b"at-b2", b"at-b1")
        assert consumer.router.table.lookups > lookups
        assert consumer.router.table.address("hop") == seed


class _AbortedCall(grpc.RpcError):
    """A failed call as gRPC raises it: a status, details and trailing metadata."""

    def __init__(self, trailers: tuple[tuple[str, str], ...]) -> None:
        self._trailers = trailers

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.ABORTED

    def details(self) -> str:
        return "not here"

    def trailing_metadata(self) -> Any:
        return self._trailers


def test_aborted_with_trailers_is_a_refusal_and_without_them_is_not() -> None:
    """ABORTED with the headrace-* trailers becomes Refused carrying them (retryable,
    its publish outcome REFUSED); ABORTED without them stays a plain ClientError."""
    from client.errors import from_rpc_error, publish_outcome

    trailers = (
        ("headrace-refusal", "not-owner"),
        ("headrace-topic", "t"),
        ("headrace-owner-node", "b2"),
        ("headrace-owner-address", "h:2"),
        ("headrace-owner-epoch", "7"),
    )
    refused = from_rpc_error(_AbortedCall(trailers))
    assert isinstance(refused, Refused)
    assert refused.redirection == Redirection("not-owner", "t", "b2", "h:2", 7)
    assert refused.retryable
    assert publish_outcome(refused, attempts=1) is PublishOutcome.REFUSED
    plain = from_rpc_error(_AbortedCall(()))
    assert not isinstance(plain, Refused)
    assert not plain.retryable


@pytest.mark.asyncio
async def test_a_batch_refused_until_its_deadline_is_not_written_and_frees_its_sequence(
    tmp_path: Path,
) -> None:
    """``late`` is given to a broker with no known address (refused, back off, look up)
    until the producer's delivery timeout: the send fails with Refused, outcome REFUSED.
    Once the map gives ``late`` to b1, the next send is written under the same producer
    id from sequence 0: the refused batch cost neither records nor sequences."""
    async with static_cluster(tmp_path) as cluster:
        await cluster.create("late", "b1")
        async with AsyncProducer(cluster.address("b1"), delivery_timeout_s=0.5) as producer:
            assert await producer.partition_count("late") == 1
            cluster.map.owners["late"] = "b9"
            cluster.map.addresses["b9"] = ""
            with pytest.raises(Refused) as caught:
                await (await producer.send("late", b"never"))
            assert caught.value.outcome is PublishOutcome.REFUSED
            cluster.map.owners["late"] = "b1"
            await (await producer.send("late", b"once"))
        [batch] = await read_batches(cluster.brokers["b1"], "late", 0)
        assert list(batch.values()) == [b"once"]
        assert batch.base_sequence == 0


def test_a_sequence_of_seeds_is_one_setting() -> None:
    """``broker`` given as a sequence is kept as one comma-separated setting (hashable:
    consumers share connections by it) and routed over in order."""
    fetcher = Fetcher(["127.0.0.1:1", "127.0.0.1:2,127.0.0.1:3"])
    try:
        assert fetcher.connection.broker == "127.0.0.1:1,127.0.0.1:2,127.0.0.1:3"
        assert fetcher.router.table.seeds == ("127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3")
        assert hash(fetcher.connection) == hash(fetcher.connection)
    finally:
        fetcher.close()


async def _failed_call_leaves_no_cycle() -> tuple[bool, bool]:
    """One routed call to a port with no broker (UNAVAILABLE, not resent), with the
    cyclic GC off; whether the router and the raised error outlive their last reference."""
    router = Router(ConnectionSettings(f"127.0.0.1:{free_port()}"))
    request = _admin.ListTopicsRequest()

    async def list_topics(link: Link, timeout_s: float) -> _admin.ListTopicsResponse:
        response: _admin.ListTopicsResponse = await link.admin.ListTopics(
            request, timeout=timeout_s
        )
        return response

    try:
        await router.call(None, list_topics, timeout_s=5.0, what="list", retry=False)
    except Unavailable as exc:
        error = weakref.ref(exc)
    await router.aclose()
    alive = weakref.ref(router)
    del router
    return alive() is not None, error() is not None


@pytest.mark.asyncio
async def test_a_failed_call_leaves_no_cycle_for_the_gc() -> None:
    """A routed call that fails (no broker at the seed) raises Unavailable; once the
    caller lets go, the router (with its channel and stubs) and the error are freed by
    reference counting alone, the cyclic GC off. A cycle through the call's frame (the
    error's traceback holds it, the frame held the error) left ~150 objects per failed
    call for a full collection to find, which then landed in whatever ran next: the
    bench's consume cell lost ~30% of its throughput so (issue 35)."""
    gc.collect()
    gc.disable()
    try:
        router_alive, error_alive = await _failed_call_leaves_no_cycle()
    finally:
        gc.enable()
    assert not router_alive
    assert not error_alive


@pytest.mark.asyncio
async def test_a_pipelined_producer_looks_a_refused_topic_up_within_a_quarter_second(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Scenario: a pipelined producer's batch of ``away`` is refused (owner b9, no
    address: back off, look up) for eight retry rounds, as a producer whose leader died
    waits for its election; then the map gives ``away`` back to b1.
    Expected: every pause before a Lookup is at most 250 ms (the router's route cap, not
    the plain 2 s one: rounds 3-7 would reach 0.4-2 s), and the batch is written at b1
    once the route is back."""
    caplog.set_level(logging.INFO, logger="client._async._accumulator")
    async with static_cluster(tmp_path) as cluster:
        await cluster.create("away", "b1")
        async with AsyncProducer(
            cluster.address("b1"), max_in_flight=4, delivery_timeout_s=30
        ) as producer:
            assert await producer.partition_count("away") == 1
            cluster.map.owners["away"] = "b9"
            cluster.map.addresses["b9"] = ""
            future = await producer.send("away", b"later")
            for _ in range(500):  # eight rounds take about 1 s; at most 10 s
                if len(_pauses(caplog)) >= 8:
                    break
                await asyncio.sleep(0.02)
            assert len(_pauses(caplog)) >= 8
            cluster.map.owners["away"] = "b1"
            await asyncio.wait_for(future, 5)
        pauses = _pauses(caplog)
        assert max(pauses) <= 0.25, pauses
        [batch] = await read_batches(cluster.brokers["b1"], "away", 0)
        assert list(batch.values()) == [b"later"]


def _pauses(caplog: pytest.LogCaptureFixture) -> list[float]:
    """The pauses the accumulator logged before sending batches again (s)."""
    found = (re.search(r"again in ([0-9.]+) s", r.getMessage()) for r in caplog.records)
    return [float(m.group(1)) for m in found if m is not None]


@pytest.mark.asyncio
async def test_a_consumer_looks_a_refused_topic_up_within_a_quarter_second(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Scenario: a consumer opens ``away`` while it is refused (owner b9, no address:
    back off, look up) for eight reconnect rounds, as a consumer whose leader died waits
    for its election; then the map gives ``away`` back to b1 and a record is published.
    Expected: every pause before a Lookup is at most 250 ms (rounds 3-7 would reach
    0.4-2 s under the plain cap), and the consumer then receives the record."""
    caplog.set_level(logging.INFO, logger="client._async._consumer_session")
    async with static_cluster(tmp_path) as cluster:
        await cluster.create("away", "b1")
        seed = cluster.address("b1")
        cluster.map.owners["away"] = "b9"
        cluster.map.addresses["b9"] = ""

        async def give_back() -> None:
            """After eight rounds (about 1 s; at most 10 s), ``away`` is b1's again."""
            for _ in range(500):
                if len(_reconnects(caplog)) >= 8:
                    break
                await asyncio.sleep(0.02)
            cluster.map.owners["away"] = "b1"

        back = asyncio.create_task(give_back())
        async with AsyncConsumer("away", "c", broker=seed, connect_timeout=30) as consumer:
            await back  # the consumer opened only once the route was back
            assert len(_reconnects(caplog)) >= 8
            async with AsyncProducer(seed) as producer:
                await (await producer.send("away", b"found"))
            got = await consumer.receive(timeout=10)
        assert got.value == b"found"
        pauses = _reconnects(caplog)
        assert max(pauses) <= 0.25, pauses


def _reconnects(caplog: pytest.LogCaptureFixture) -> list[float]:
    """The pauses a consumer logged before reconnecting (s)."""
    found = (re.search(r"reconnecting in ([0-9.]+) s", r.getMessage()) for r in caplog.records)
    return [float(m.group(1)) for m in found if m is not None]
