"""Requests that do not parse, over real gRPC on loopback: every RPC answers
INVALID_ARGUMENT naming its message type, and the broker goes on serving.

Before ``broker.rpc_handlers``, grpc answered such a request UNKNOWN (unary RPCs and
PublishStream) or INTERNAL (Subscribe). The RPCs come from the descriptors, as the fuzz
tests' do, so a new RPC is covered here too.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest
from google.protobuf.descriptor import Descriptor, FieldDescriptor

from broker.rpc_handlers import Malformed, parser
from proto import admin_pb2 as admin
from proto import broker_pb2 as pb
from tests.broker.conftest import Client
from tests.fuzz._rpcs import Rpc, all_rpcs
from wal import encode_columns

RPCS = all_rpcs()
IDS = [r.name for r in RPCS]


def bad_utf8(message: Descriptor) -> bytes | None:
    """A request whose first string field (nested ones too) holds the byte 0xff; None if
    the message has no string field."""
    for f in message.fields:
        if f.type == FieldDescriptor.TYPE_STRING:
            return bytes([f.number << 3 | 2, 1, 0xFF])
        if f.message_type is not None and (inner := bad_utf8(f.message_type)):
            return bytes([f.number << 3 | 2, len(inner)]) + inner
    return None


async def raw_call(
    client: Client, rpc: Rpc, messages: list[bytes]
) -> tuple[list[bytes], grpc.aio.AioRpcError | None]:
    """Call ``rpc`` with raw ``messages``: the responses, and the error it ended with."""
    responses: list[bytes] = []
    try:
        if rpc.method.client_streaming:
            call = client.channel.stream_stream(rpc.path, _identity, _identity)
            async for r in call(_aiter(messages), timeout=5):
                responses.append(r)
        else:
            unary = client.channel.unary_unary(rpc.path, _identity, _identity)
            responses.append(await unary(messages[0], timeout=5))
    except grpc.aio.AioRpcError as exc:
        return responses, exc
    return responses, None


def _identity(data: bytes) -> bytes:
    return data


async def _aiter(messages: list[bytes]) -> AsyncIterator[bytes]:
    for m in messages:
        yield m


#: Every (RPC, bad request) pair: one byte 0a for each, and invalid UTF-8 in the first
#: string field for each request type that has one (ListTopicsRequest has none).
BAD_REQUESTS = [
    pytest.param(rpc, request, id=f"{name}-{kind}")
    for rpc, name in zip(RPCS, IDS, strict=True)
    for kind, request in (("truncated", b"\x0a"), ("bad-utf8", bad_utf8(rpc.request)))
    if request is not None
]


def test_bad_requests_cover_every_rpc() -> None:
    assert {p.values[0] for p in BAD_REQUESTS} == set(RPCS)
    assert len(BAD_REQUESTS) > len(RPCS)  # the UTF-8 case is not silently empty


@pytest.mark.asyncio(loop_scope="function")
@pytest.mark.parametrize(("rpc", "bad"), BAD_REQUESTS)
async def test_request_that_does_not_parse_is_invalid_argument(
    client: Client, rpc: Rpc, bad: bytes
) -> None:
    """Scenario: one byte 0a (a field whose length is missing), or invalid UTF-8 in the
    first string field, sent to each RPC. Expected: INVALID_ARGUMENT whose message names
    the request type and says what to do; then ListTopics still answers."""
    _, error = await raw_call(client, rpc, [bad])
    assert error is not None
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    details = error.details() or ""
    assert details.startswith(f"request does not parse as {rpc.request.full_name}: ")
    assert "send a serialized" in details
    assert "\n" not in details
    await client.admin.ListTopics(admin.ListTopicsRequest())


@pytest.mark.asyncio(loop_scope="function")
async def test_publish_stream_answers_good_requests_before_the_bad_one(client: Client) -> None:
    """Scenario: on PublishStream, a good publish, then bytes that do not parse. Expected:
    the good one is answered (and durable: Fetch returns it), then the stream ends
    INVALID_ARGUMENT naming PublishRequest."""
    await client.admin.CreateTopic(admin.CreateTopicRequest(name="t", partitions=1))
    good = pb.PublishRequest(topic="t", partition=0, batch=encode_columns([b"v"]), request_id=7)
    publish_stream = next(r for r in RPCS if r.name == "PublishStream")
    answers, error = await raw_call(client, publish_stream, [good.SerializeToString(), b"\x0a"])
    decoded = [pb.PublishResponse.FromString(a) for a in answers]
    assert [(a.request_id, a.error_code) for a in decoded] == [(7, 0)]
    assert error is not None
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "headrace.v1.PublishRequest" in (error.details() or "")
    fetched = await client.broker.Fetch(pb.FetchRequest(topic="t", partition=0, offset=0))
    assert len(fetched.batches) == 1


@pytest.mark.asyncio(loop_scope="function")
async def test_subscribe_open_then_bad_request_ends_the_session(client: Client) -> None:
    """Scenario: Subscribe opens a subscription, then sends bytes that do not parse.
    Expected: the Subscribed answer, then INVALID_ARGUMENT naming SubscribeRequest; the
    subscription has no consumer left, so it can be opened again."""
    await client.admin.CreateTopic(admin.CreateTopicRequest(name="t", partitions=1))
    open_ = pb.SubscribeRequest(open=pb.OpenSubscription(topic="t", subscription="s"))
    subscribe = next(r for r in RPCS if r.name == "Subscribe")
    for _ in range(2):
        answers, error = await raw_call(client, subscribe, [open_.SerializeToString(), b"\x0a"])
        kinds = [pb.SubscribeResponse.FromString(a).WhichOneof("kind") for a in answers]
        assert kinds == ["subscribed"]
        assert error is not None
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "headrace.v1.SubscribeRequest" in (error.details() or "")


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        pytest.param(b"\x0a", "Wire format was corrupt", id="truncated"),
        pytest.param(b"\x0a\x01\xff", "String field had bad UTF-8", id="bad-utf8"),
    ],
)
def test_parser_returns_a_marker_not_an_exception(data: bytes, reason: str) -> None:
    """Scenario: the deserializer gets bytes that do not parse. Expected: a Malformed
    marker naming the type and the parser's reason, without its boilerplate prefix."""
    got = parser(pb.PublishRequest)(data)
    assert got == Malformed("headrace.v1.PublishRequest", reason)
    assert isinstance(got, Malformed)
    assert str(got.error()).startswith(
        f"request does not parse as headrace.v1.PublishRequest: {reason};"
    )
    assert parser(pb.PublishRequest)(b"") == pb.PublishRequest()
