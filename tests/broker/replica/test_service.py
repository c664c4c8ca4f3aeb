"""The Replication service over real gRPC on loopback: a real broker (``broker.app``) whose
``replica_leader`` names a real :class:`~broker.replica.leader.LeaderTopic`, and its auth:
with tokens on, only the cluster's internal credential may call Replication, and that
credential may call nothing else.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import grpc
import pytest

from broker.app import Broker
from broker.auth.rules import RULES
from broker.config import SecurityConfig
from broker.replica.leader import LeaderTopic
from cluster.internal_credential import matches, new_secret
from proto import admin_pb2, broker_pb2, cluster_pb2
from proto import replication_pb2 as pb
from tests.broker.auth.test_interceptor import bearer, make_tokens
from tests.broker.conftest import broker_config
from tests.broker.replica.test_leader import TOPIC_ID, Isr, batch, fetch_request, record

SECRET = new_secret()
PERMISSION_DENIED = grpc.StatusCode.PERMISSION_DENIED
Served = tuple[Broker, LeaderTopic, grpc.aio.Channel, dict[str, str]]


class ReplicationStub:
    """The Replication service's three RPCs on ``channel`` (typed; the generated stub
    is not)."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.ReplicaFetch = channel.unary_unary(
            "/headrace.v1.Replication/ReplicaFetch",
            request_serializer=pb.ReplicaFetchRequest.SerializeToString,
            response_deserializer=pb.ReplicaFetchResponse.FromString,
        )
        self.ReplicaStream = channel.stream_stream(
            "/headrace.v1.Replication/ReplicaStream",
            request_serializer=pb.ReplicaFetchRequest.SerializeToString,
            response_deserializer=pb.ReplicaFetchResponse.FromString,
        )
        self.OffsetForLeaderEpoch = channel.unary_unary(
            "/headrace.v1.Replication/OffsetForLeaderEpoch",
            request_serializer=pb.OffsetForLeaderEpochRequest.SerializeToString,
            response_deserializer=pb.OffsetForLeaderEpochResponse.FromString,
        )


@asynccontextmanager
async def serving(tmp_path: Path, *, tokens: bool = False) -> AsyncIterator[Served]:
    """A broker with topic ``orders`` (2 partitions, 3 records in partition 0, appended
    before it leads) that it leads at epoch 1 with followers b2 and b3; with ``tokens``,
    auth on (one token, ``admin:*``) and its internal credential :data:`SECRET`."""
    printed: dict[str, str] = {}
    config = broker_config(tmp_path / "data")
    if tokens:
        path = tmp_path / "tokens.json"
        printed = make_tokens(path, {"admin": "admin:*"})
        config = config.replace(security=SecurityConfig(tokens_file=str(path)))
    async with Broker(config) as broker:
        broker.internal_credential = SECRET
        topic = await broker.topics.create("orders", 2, topic_id=TOPIC_ID)
        for i in range(3):
            await topic.partitions[0].append(batch(i))
        leader = LeaderTopic(topic, record(), "b1", lag_time_max_ms=10_000, change_isr=Isr())
        await leader.start()
        broker.replica_leader = {"orders": leader}.get
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{broker.port}") as channel:
                yield broker, leader, channel, printed
        finally:
            await leader.aclose()


@pytest.mark.asyncio
async def test_replica_fetch_and_offset_for_leader_epoch_over_grpc(tmp_path: Path) -> None:
    """Scenario: no tokens; b2 fetches both logs from 0; then asks where epoch 1 ends;
    then a topic this broker does not lead, and a log it does not have.
    Expected: partition 0's three batches byte for byte, log_end 3, epochs [(1, 3)] (the
    records were appended before b1 led);
    epoch 1 ends at 3; NOT_LEADER for the other topic (both RPCs); UNKNOWN_LOG."""
    async with serving(tmp_path) as (broker, _, channel, _):
        stub = ReplicationStub(channel)
        resp = await stub.ReplicaFetch(fetch_request("b2", {"p/0": 0, "p/1": 0}))
        assert resp.error == pb.REPLICA_ERROR_NONE
        log = broker.topics.get("orders").partitions[0].log
        assert resp.logs[0].batches == b"".join(bytes(b.buffer) for b in log.read(0))
        assert (resp.logs[0].log_end, resp.logs[1].log_end) == (3, 0)
        assert [(e.epoch, e.start_offset) for e in resp.logs[0].epochs] == [(1, 3)]
        asked = pb.OffsetForLeaderEpochRequest(
            topic="orders", topic_id=TOPIC_ID, log="p/0", epoch=1, replica_node="b2"
        )
        answer = await stub.OffsetForLeaderEpoch(asked)
        assert (answer.error, answer.epoch, answer.end_offset) == (pb.REPLICA_ERROR_NONE, 1, 3)
        other = fetch_request("b2", {"p/0": 0})
        other.topic = "payments"
        assert (await stub.ReplicaFetch(other)).error == pb.NOT_LEADER
        asked.topic = "payments"
        assert (await stub.OffsetForLeaderEpoch(asked)).error == pb.NOT_LEADER
        asked.topic, asked.log = "orders", "dlq/gone"
        assert (await stub.OffsetForLeaderEpoch(asked)).error == pb.UNKNOWN_LOG


@pytest.mark.asyncio
async def test_only_the_internal_credential_calls_replication(tmp_path: Path) -> None:
    """Scenario: tokens on; ReplicaFetch with an admin:* user token, with no token, with a
    wrong hri_ secret, and with the internal credential; then ReplicaStream likewise.
    Expected: PERMISSION_DENIED naming the broker-to-broker rule; UNAUTHENTICATED;
    UNAUTHENTICATED; served (its batches); the stream the same."""
    async with serving(tmp_path, tokens=True) as (_, _, channel, printed):
        stub = ReplicationStub(channel)
        request = fetch_request("b2", {"p/0": 0})
        with pytest.raises(grpc.aio.AioRpcError) as user:
            await stub.ReplicaFetch(request, metadata=bearer(printed["admin"]))
        assert user.value.code() is PERMISSION_DENIED
        assert "only the cluster's internal credential" in (user.value.details() or "")
        for metadata in ((), bearer(new_secret())):
            with pytest.raises(grpc.aio.AioRpcError) as anonymous:
                await stub.ReplicaFetch(request, metadata=metadata)
            assert anonymous.value.code() is grpc.StatusCode.UNAUTHENTICATED
        resp = await stub.ReplicaFetch(request, metadata=bearer(SECRET))
        assert resp.error == pb.REPLICA_ERROR_NONE
        assert len(resp.logs[0].batches) > 0
        # ReplicaStream, the followers' way: the same rule.
        with pytest.raises(grpc.aio.AioRpcError) as user:
            async for _ in stub.ReplicaStream(iter([request]), metadata=bearer(printed["admin"])):
                pass
        assert user.value.code() is PERMISSION_DENIED
        with pytest.raises(grpc.aio.AioRpcError) as anonymous:
            async for _ in stub.ReplicaStream(iter([request])):
                pass
        assert anonymous.value.code() is grpc.StatusCode.UNAUTHENTICATED
        answers = [a async for a in stub.ReplicaStream(iter([request]), metadata=bearer(SECRET))]
        assert [a.error for a in answers] == [pb.REPLICA_ERROR_NONE]
        assert len(answers[0].logs[0].batches) > 0


def _shape(method: str) -> tuple[bool, bool]:
    """(request streaming, response streaming) of a full method name."""
    service, name = method.lstrip("/").split("/")
    for module in (broker_pb2, admin_pb2, cluster_pb2, pb):
        for desc in module.DESCRIPTOR.services_by_name.values():
            if desc.full_name == service:
                m = desc.methods_by_name[name]
                return m.client_streaming, m.server_streaming
    raise AssertionError(method)


async def _call(
    channel: grpc.aio.Channel, method: str, metadata: tuple[tuple[str, str], ...]
) -> None:
    """Call ``method`` with one empty request; raise its error."""
    streaming_in, streaming_out = _shape(method)
    ident = {"request_serializer": lambda b: b, "response_deserializer": lambda b: b}
    if streaming_in:
        call = channel.stream_stream(method, **ident)(iter([b""]), metadata=metadata)
        async for _ in call:
            pass
    elif streaming_out:
        async for _ in channel.unary_stream(method, **ident)(b"", metadata=metadata):
            pass
    else:
        await channel.unary_unary(method, **ident)(b"", metadata=metadata)


@pytest.mark.asyncio
async def test_the_internal_credential_is_refused_on_every_other_rpc(tmp_path: Path) -> None:
    """Scenario: tokens on; every RPC of the authorization table that is not a Replication
    one, called with the internal credential.
    Expected: each ends PERMISSION_DENIED saying the credential may call only the
    Replication service (at least 20 RPCs tried); the admin token still lists topics."""
    async with serving(tmp_path, tokens=True) as (_, _, channel, printed):
        others = [m for m, rule in RULES.items() if not rule.internal]
        assert len(others) >= 20
        for method in others:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await _call(channel, method, bearer(SECRET))
            assert refused.value.code() is PERMISSION_DENIED, method
            assert "may call only the Replication service" in (refused.value.details() or "")
        admin = channel.unary_unary(
            "/headrace.v1.Admin/ListTopics",
            request_serializer=admin_pb2.ListTopicsRequest.SerializeToString,
            response_deserializer=admin_pb2.ListTopicsResponse.FromString,
        )
        listed = await admin(admin_pb2.ListTopicsRequest(), metadata=bearer(printed["admin"]))
        assert [t.name for t in listed.topics] == ["orders"]


def test_matches_is_exact() -> None:
    """Scenario: the credential compared with itself, another, a prefix, a user token and
    no secret. Expected: only itself matches."""
    assert matches(SECRET, SECRET)
    assert not matches(new_secret(), SECRET)
    assert not matches(SECRET[:-1], SECRET)
    assert not matches("hr_000000000000_" + "A" * 43, SECRET)
    assert not matches(SECRET, None)
