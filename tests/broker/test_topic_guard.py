"""The cluster refusal on every topic-scoped RPC, over real gRPC on loopback.

A broker whose :class:`~cluster.ownership.Ownership` refuses every topic answers each
topic-scoped RPC of the Broker and Admin services with ``ABORTED``, the ``headrace-*``
trailers and the refusal's message (a PublishStream request: a response with
``error_code`` ABORTED and a ``Redirect``, the stream staying open), having asked with the
right ``write`` flag and done nothing: no record appended, no subscription created or
deleted, no cursor moved, no dead letter removed. The table of cases is checked against
the service descriptors, so an RPC added without a decision here fails.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest

from broker.app import Broker
from broker.config_cluster import ClusterConfig
from broker.errors import ConfigError
from cluster.ownership import Refusal, SingleBroker
from proto import admin_pb2 as admin
from proto import broker_pb2 as pb
from proto.refusal import ABORTED
from tests.broker.conftest import Client, broker_config

TOPIC = "orders"


@dataclass
class StubOwnership:
    """Refuses every topic while ``refusing`` (not-owner: b2 at 10.0.0.2:50051, epoch 3),
    and records each question asked while refusing."""

    refusing: bool = False
    asked: list[tuple[str, bool]] = field(default_factory=list)

    def refusal(self, topic: str, *, write: bool) -> Refusal | None:
        if not self.refusing:
            return None
        self.asked.append((topic, write))
        return Refusal(
            "not-owner",
            topic,
            "b2",
            "10.0.0.2:50051",
            3,
            f"topic {topic} is served by broker b2 at 10.0.0.2:50051; send the call there",
        )


def expected_trailers(topic: str = TOPIC) -> dict[str, str]:
    return {
        "headrace-refusal": "not-owner",
        "headrace-topic": topic,
        "headrace-owner-node": "b2",
        "headrace-owner-address": "10.0.0.2:50051",
        "headrace-owner-epoch": "3",
    }


def trailers_of(exc: grpc.aio.AioRpcError) -> dict[str, str]:
    return {
        k: v if isinstance(v, str) else v.decode()
        for k, v in exc.trailing_metadata() or ()
        if k.startswith("headrace-")
    }


@asynccontextmanager
async def prepared(tmp_path: Path) -> AsyncIterator[tuple[Client, StubOwnership]]:
    """A broker with topic orders (2 partitions, 3 records on partition 0), subscription
    billing at cursor 2 on partition 0, and subscription audit whose dead-letter queue
    holds offset 0; its ownership not refusing yet."""
    stub = StubOwnership()
    async with (
        Broker(broker_config(tmp_path / "data"), ownership=stub) as broker,
        grpc.aio.insecure_channel(f"127.0.0.1:{broker.port}") as channel,
    ):
        c = Client(channel)
        await c.admin.CreateTopic(admin.CreateTopicRequest(name=TOPIC, partitions=2))
        records = [pb.Record(value=b"v%d" % i) for i in range(3)]
        await c.broker.Publish(pb.PublishRequest(topic=TOPIC, partition=0, records=records))
        await c.broker.AckUpTo(
            pb.AckUpToRequest(topic=TOPIC, subscription="billing", partition=0, offset=2)
        )
        await dead_letter_first_record(c)
        yield c, stub


async def dead_letter_first_record(c: Client) -> None:
    call = c.broker.Subscribe()
    await call.write(
        pb.SubscribeRequest(
            open=pb.OpenSubscription(topic=TOPIC, subscription="audit", initial_credit=1)
        )
    )
    await call.read()  # subscribed
    delivery = (await call.read()).delivery
    nack = pb.Nack(partition=delivery.partition, begin=0, end=1, reason="bad", dead_letter=True)
    await call.write(pb.SubscribeRequest(ack=pb.Acks(nacks=[nack])))
    request = admin.CountDeadLettersRequest(topic=TOPIC, subscription="audit")
    for _ in range(200):
        if (await c.admin.CountDeadLetters(request)).count == 1:
            break
        await asyncio.sleep(0.01)
    call.cancel()
    assert (await c.admin.CountDeadLetters(request)).count == 1


async def state(c: Client) -> tuple[Any, ...]:
    """Everything a call could have changed: topics, heads, subscriptions with their
    cursors and consumers, the dead-letter queue's entries."""
    topics = sorted(t.name for t in (await c.admin.ListTopics(admin.ListTopicsRequest())).topics)
    info = await c.admin.DescribeTopic(admin.DescribeTopicRequest(name=TOPIC))
    subs = await c.admin.ListSubscriptions(admin.ListSubscriptionsRequest(topic=TOPIC))
    dlq = await c.admin.PeekDeadLetters(
        admin.PeekDeadLettersRequest(topic=TOPIC, subscription="audit")
    )
    return (
        topics,
        [(p.partition, p.head) for p in info.partitions],
        sorted(
            (s.subscription, [(p.partition, p.cursor) for p in s.partitions], list(s.consumers))
            for s in subs.subscriptions
        ),
        [(e.sequence, e.offset) for e in dlq.entries],
    )


Call = Callable[[Client], Awaitable[Any]]


def unary(service: str, method: str, request: Any) -> Call:
    return lambda c: getattr(getattr(c, service), method)(request)


async def subscribe_open(c: Client) -> Any:
    call = c.broker.Subscribe()
    await call.write(
        pb.SubscribeRequest(open=pb.OpenSubscription(topic=TOPIC, subscription="fresh"))
    )
    try:
        return await call.read()
    finally:
        call.cancel()


SUB: dict[str, Any] = {"topic": TOPIC, "subscription": "billing"}
DLQ: dict[str, Any] = {"topic": TOPIC, "subscription": "audit"}

#: Every topic-scoped RPC: how to call it on orders, and whether it writes.
GUARDED: dict[str, tuple[Call, bool]] = {
    "Publish": (
        unary("broker", "Publish", pb.PublishRequest(
            topic=TOPIC, partition=0, records=[pb.Record(value=b"x")],
            producer_id=5, base_sequence=0)),
        True,
    ),
    "Subscribe": (subscribe_open, True),
    "Fetch": (unary("broker", "Fetch", pb.FetchRequest(topic=TOPIC, partition=0)), False),
    "AckUpTo": (
        unary("broker", "AckUpTo", pb.AckUpToRequest(
            topic=TOPIC, subscription="fresh", partition=0, offset=3)),
        True,
    ),
    "DescribeTopic": (
        unary("admin", "DescribeTopic", admin.DescribeTopicRequest(name=TOPIC)), False
    ),
    "DeleteTopic": (unary("admin", "DeleteTopic", admin.DeleteTopicRequest(name=TOPIC)), True),
    "ListSubscriptions": (
        unary("admin", "ListSubscriptions", admin.ListSubscriptionsRequest(topic=TOPIC)), False
    ),
    "DescribeSubscription": (
        unary("admin", "DescribeSubscription", admin.DescribeSubscriptionRequest(**SUB)), False
    ),
    "Seek": (unary("admin", "Seek", admin.SeekRequest(**SUB, earliest=True)), True),
    "OffsetsForTime": (
        unary("admin", "OffsetsForTime", admin.OffsetsForTimeRequest(topic=TOPIC)), False
    ),
    "PeekDeadLetters": (
        unary("admin", "PeekDeadLetters", admin.PeekDeadLettersRequest(**DLQ)), False
    ),
    "CountDeadLetters": (
        unary("admin", "CountDeadLetters", admin.CountDeadLettersRequest(**DLQ)), False
    ),
    "AckDeadLetters": (
        unary("admin", "AckDeadLetters", admin.AckDeadLettersRequest(**DLQ, up_to_sequence=99)),
        True,
    ),
    "PurgeDeadLetters": (
        unary("admin", "PurgeDeadLetters", admin.PurgeDeadLettersRequest(**DLQ)), True
    ),
    "ReplayDeadLetters": (
        unary("admin", "ReplayDeadLetters", admin.ReplayDeadLettersRequest(**DLQ)), True
    ),
    "DeleteSubscription": (
        unary("admin", "DeleteSubscription", admin.DeleteSubscriptionRequest(**SUB, force=True)),
        True,
    ),
}  # fmt: skip

#: RPCs that name no topic, and so ask nothing (cluster mode handles them otherwise).
NOT_TOPIC_SCOPED = {
    "CreateTopic": "a new name: cluster mode makes it unique through etcd, on any broker",
    "ListTopics": "every topic",
}
#: Tested on its own: a stream whose refused requests are answered in the stream.
STREAMS = {"PublishStream"}


def test_every_rpc_is_guarded_or_says_why_not() -> None:
    """Scenario: walk the Broker and Admin service descriptors. Expected: every RPC is in
    exactly one of the guarded table, the not-topic-scoped list or the stream cases (an
    RPC added to a .proto without a decision fails here), and nothing else is listed."""
    rpcs = {
        m.name
        for module in (pb, admin)
        for service in module.DESCRIPTOR.services_by_name.values()
        for m in service.methods
    }
    listed = [*GUARDED, *NOT_TOPIC_SCOPED, *STREAMS]
    assert len(listed) == len(set(listed))
    assert set(listed) == rpcs


@pytest.mark.asyncio
@pytest.mark.parametrize(("name", "write"), [(n, w) for n, (_, w) in GUARDED.items()])
async def test_a_refused_rpc_is_aborted_with_the_owner_and_does_nothing(
    tmp_path: Path, name: str, write: bool
) -> None:
    """Scenario: a broker whose ownership refuses every topic gets one topic-scoped call
    on orders (a write where it would append, create, move, remove or delete something).
    Expected: ABORTED with the refusal's message and the five headrace-* trailers; the
    ownership was asked once, for orders, with the RPC's write flag; topics, heads,
    subscriptions, cursors and dead letters are as before."""
    call, _ = GUARDED[name]
    async with prepared(tmp_path) as (c, stub):
        before = await state(c)
        stub.refusing = True
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await call(c)
        stub.refusing = False
        assert caught.value.code() == grpc.StatusCode.ABORTED
        assert caught.value.details() == (
            "topic orders is served by broker b2 at 10.0.0.2:50051; send the call there"
        )
        assert trailers_of(caught.value) == expected_trailers()
        assert stub.asked == [(TOPIC, write)]
        assert await state(c) == before


@pytest.mark.asyncio
async def test_a_refused_stream_publish_gets_a_redirect_and_the_stream_goes_on(
    tmp_path: Path,
) -> None:
    """Scenario: on one PublishStream, a request while the ownership refuses, then one
    after it serves again. Expected: the first response has error_code ABORTED, the
    refusal's message, the request's id and a Redirect naming b2 at 10.0.0.2:50051 epoch
    3, and nothing was appended (asked with write=True); the second request on the same
    stream is appended at the head the first would have taken."""
    async with prepared(tmp_path) as (c, stub):
        before = await state(c)
        call = c.broker.PublishStream()
        request = pb.PublishRequest(topic=TOPIC, partition=0, records=[pb.Record(value=b"x")])
        stub.refusing = True
        request.request_id = 7
        await call.write(request)
        refused = await call.read()
        stub.refusing = False
        assert refused.error_code == ABORTED
        assert refused.request_id == 7
        assert refused.error_message.startswith("topic orders is served by broker b2")
        assert refused.redirect == pb.Redirect(
            reason="not-owner", topic=TOPIC, owner_node="b2", owner_address="10.0.0.2:50051",
            owner_epoch=3,
        )  # fmt: skip
        assert stub.asked == [(TOPIC, True)]
        assert await state(c) == before
        request.request_id = 8
        await call.write(request)
        served = await call.read()
        await call.done_writing()
        assert (served.error_code, served.request_id, served.base_offset) == (0, 8, 3)
        assert not served.HasField("redirect")


@pytest.mark.asyncio
@pytest.mark.parametrize("name", sorted(NOT_TOPIC_SCOPED))
async def test_calls_naming_no_topic_ask_nothing(tmp_path: Path, name: str) -> None:
    """Scenario: CreateTopic and ListTopics while the ownership refuses every topic.
    Expected: served (a new topic, the list), and the ownership was never asked."""
    calls: dict[str, Call] = {
        "CreateTopic": unary(
            "admin", "CreateTopic", admin.CreateTopicRequest(name="fresh", partitions=1)
        ),
        "ListTopics": unary("admin", "ListTopics", admin.ListTopicsRequest()),
    }
    async with prepared(tmp_path) as (c, stub):
        stub.refusing = True
        assert await calls[name](c) is not None
        assert stub.asked == []


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("call", "field"),
    [
        (unary("broker", "Publish", pb.PublishRequest(topic="", records=[pb.Record()])), "topic"),
        (unary("admin", "DescribeTopic", admin.DescribeTopicRequest(name="a/b")), "name"),
    ],
)
async def test_an_invalid_name_is_invalid_argument_not_a_refusal(
    tmp_path: Path, call: Call, field: str
) -> None:
    """Scenario: a Publish with an empty topic and a DescribeTopic of 'a/b' while the
    ownership refuses every topic. Expected: INVALID_ARGUMENT naming the field, as
    without a cluster (no broker serves a name that cannot exist)."""
    async with prepared(tmp_path) as (c, stub):
        stub.refusing = True
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await call(c)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert field in (caught.value.details() or "")
        assert trailers_of(caught.value) == {}


def test_a_broker_asks_a_single_broker_ownership_by_default(tmp_path: Path) -> None:
    """Scenario: a Broker built with no ownership. Expected: its guard asks SingleBroker,
    which never refuses (no cluster: the broker is what it was)."""
    broker = Broker(broker_config(tmp_path / "data"))
    assert isinstance(broker.guard.ownership, SingleBroker)
    assert broker.guard.ownership.refusal(TOPIC, write=True) is None


@pytest.mark.asyncio
async def test_cluster_settings_with_no_etcd_stop_the_start(tmp_path: Path) -> None:
    """Scenario: a config with [cluster] etcd and node_id whose etcd does not answer (a
    port nothing listens on), and no ownership given. Expected: start fails with a
    ConfigError (one line for serve) saying it cannot join the cluster as b1, never a
    single broker that silently ignores the cluster; the data directory was never made
    (etcd is asked first). With an ownership given, the broker is built and asks it."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{probe.getsockname()[1]}"
    cluster = ClusterConfig(etcd=(dead,), node_id="b1")
    config = broker_config(tmp_path / "data", cluster=cluster)
    broker = Broker(config)
    with pytest.raises(ConfigError, match=r"cannot join the cluster as b1: .*etcd"):
        await broker.start()
    assert broker.node is None
    assert not Path(config.data_dir).exists()
    stub = StubOwnership()
    assert Broker(config, ownership=stub).guard.ownership is stub
