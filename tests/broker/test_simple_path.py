"""The simple path over real gRPC on loopback: plain ``records`` on Publish and
PublishStream, decoded Subscribe deliveries and decoded Fetch, mixed with the binary path on
one topic; and the issue-16 defects (stream error request ids, the empty topic name,
producer ids below -1, requests over ``max_request_bytes``)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import grpc
import pytest
import pytest_asyncio

from broker.app import Broker
from client import AsyncConsumer, Message
from client.errors import from_rpc_error
from proto import admin_pb2 as admin
from proto import broker_pb2 as pb
from proto.batch import partition_for
from tests.broker.conftest import Client, broker_config, serving
from wal import decode_batch, encode_columns

pytestmark = pytest.mark.asyncio

NOW_MS = 1_700_000_000_000
MIB = 1 << 20

#: Every edge a simple-path record has: absent and empty keys, headers, unicode, 1 MiB.
RECORDS = [
    pb.Record(value=b"no key", timestamp_ms=NOW_MS + 1),
    pb.Record(key=b"", value=b"empty key", timestamp_ms=NOW_MS + 2),
    pb.Record(
        key="clé-ü".encode(),
        value="värde ✓ 値".encode(),
        headers=[pb.Header(name="trace-id", value=b"t1"), pb.Header(name="ünï", value=b"")],
        timestamp_ms=NOW_MS + 3,
    ),
    pb.Record(value=bytes(range(256)) * (MIB // 256), timestamp_ms=NOW_MS + 4),  # at the limit
    pb.Record(value=b""),  # timestamp 0: the broker's clock
]


def as_tuple(
    offset: int, key: bytes | None, value: bytes, headers: Sequence[tuple[str, bytes]], ts: int
) -> tuple[int, bytes | None, bytes, list[tuple[str, bytes]], int]:
    return offset, key, value, list(headers), ts


def expected(base: int = 0) -> list[tuple[int, bytes | None, bytes, list[tuple[str, bytes]], int]]:
    return [
        as_tuple(
            base + i,
            r.key if r.HasField("key") else None,
            r.value,
            [(h.name, h.value) for h in r.headers],
            r.timestamp_ms or NOW_MS,
        )
        for i, r in enumerate(RECORDS)
    ]


def decoded(
    records: Sequence[pb.DecodedRecord],
) -> list[tuple[int, bytes | None, bytes, list[tuple[str, bytes]], int]]:
    return [
        as_tuple(
            r.offset,
            r.key if r.HasField("key") else None,
            r.value,
            [(h.name, h.value) for h in r.headers],
            r.timestamp_ms,
        )
        for r in records
    ]


def binary(
    response: pb.FetchResponse,
) -> list[tuple[int, bytes | None, bytes, list[tuple[str, bytes]], int]]:
    out = []
    for raw in response.batches:
        batch = decode_batch(raw)
        assert batch is not None
        for offset, record in zip(batch.offsets(), batch.records(), strict=True):
            out.append(
                as_tuple(
                    offset,
                    record.key,
                    record.value,
                    list(record.headers.items()),
                    record.timestamp_ms,
                )
            )
    return out


@pytest_asyncio.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[Broker, Client]]:
    """A broker whose clock stands at :data:`NOW_MS`, with topic ``t``, and a client."""
    config = broker_config(tmp_path / "data", max_request_bytes=4 * MIB)
    async with serving(config, clock=lambda: NOW_MS) as (broker, c):
        await c.admin.CreateTopic(admin.CreateTopicRequest(name="t", partitions=1))
        yield broker, c


@pytest.fixture
def client(served: tuple[Broker, Client]) -> Client:
    return served[1]


async def fetch(
    c: Client, offset: int = 0, *, decoded: bool = False, end_offset: int = 0
) -> pb.FetchResponse:
    request = pb.FetchRequest(
        topic="t",
        partition=0,
        offset=offset,
        max_bytes=8 * MIB,
        decoded=decoded,
        end_offset=end_offset,
    )
    response: pb.FetchResponse = await c.broker.Fetch(request)
    return response


async def expect_error(call: object, code: grpc.StatusCode, *needles: str) -> str:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call  # type: ignore[misc]
    assert info.value.code() == code, info.value.details()
    details = info.value.details() or ""
    for needle in needles:
        assert needle in details, details
    return details


async def test_records_round_trip_decoded_and_binary(served: tuple[Broker, Client]) -> None:
    """Scenario: five edge-case records published as plain records, read back by a decoded
    Fetch, a binary Fetch and our Python client. Expected: all three see the same offsets,
    keys (absent vs empty), values, headers and timestamps; timestamp 0 became the
    broker's clock."""
    broker, client = served
    response = await client.broker.Publish(pb.PublishRequest(topic="t", records=RECORDS))
    assert (response.base_offset, response.last_offset) == (0, 4)
    assert decoded((await fetch(client, decoded=True)).records) == expected()
    plain = await fetch(client)
    assert binary(plain) == expected()
    assert not plain.records
    got: list[Message] = []
    async with AsyncConsumer("t", "s", broker=f"127.0.0.1:{broker.port}") as c:
        async with asyncio.timeout(10):
            while len(got) < len(RECORDS):
                got.append(await c.receive())
    seen = [
        as_tuple(m.offset, m.key, m.value, list(m.headers.items()), m.timestamp_ms) for m in got
    ]
    assert seen == expected()


async def test_decoded_fetch_starts_inside_a_batch_and_stops_at_end_offset(
    client: Client,
) -> None:
    """Scenario: one batch of five records; Fetch from offset 2 (inside it), then from 1
    with end_offset 3. Expected: decoded answers start exactly at the requested offset (no
    records below it), while the binary answer still starts at the batch's base 0."""
    await client.broker.Publish(pb.PublishRequest(topic="t", records=RECORDS))
    inside = await fetch(client, 2, decoded=True)
    assert [r.offset for r in inside.records] == [2, 3, 4]
    assert not inside.batches
    assert (inside.high_water_mark, inside.first_offset) == (5, 0)
    bounded = await fetch(client, 1, decoded=True, end_offset=3)
    assert [r.offset for r in bounded.records] == [1, 2]
    assert [offset for offset, *_ in binary(await fetch(client, 2))] == [0, 1, 2, 3, 4]


async def test_decoded_fetch_obeys_max_bytes(client: Client) -> None:
    """Scenario: three batches of 100 KiB; a decoded Fetch with max_bytes 150 KiB.
    Expected: only the records of the batches that fit (at least one batch) come back."""
    for i in range(3):
        await client.broker.Publish(
            pb.PublishRequest(topic="t", records=[pb.Record(value=bytes([i]) * (100 << 10))])
        )
    response = await client.broker.Fetch(
        pb.FetchRequest(topic="t", partition=0, offset=0, max_bytes=150 << 10, decoded=True)
    )
    assert [r.offset for r in response.records] == [0]


async def test_both_paths_mix_on_one_topic(client: Client) -> None:
    """Scenario: a binary batch, a simple-path publish, another binary batch. Expected:
    offsets run on across both, and each reader (decoded or binary) sees every record."""
    await client.broker.Publish(pb.PublishRequest(topic="t", batch=encode_columns([b"a", b"b"])))
    await client.broker.Publish(
        pb.PublishRequest(topic="t", records=[pb.Record(key=b"k", value=b"c")])
    )
    await client.broker.Publish(pb.PublishRequest(topic="t", batch=encode_columns([b"d"])))
    values = [(r.offset, r.value) for r in (await fetch(client, decoded=True)).records]
    assert values == list(enumerate([b"a", b"b", b"c", b"d"]))
    assert [(o, v) for o, _, v, _, _ in binary(await fetch(client))] == values


async def subscribe(
    client: Client, requests: asyncio.Queue[pb.SubscribeRequest | None]
) -> grpc.aio.StreamStreamCall[pb.SubscribeRequest, pb.SubscribeResponse]:
    async def feed() -> AsyncIterator[pb.SubscribeRequest]:
        while (request := await requests.get()) is not None:
            yield request

    call: grpc.aio.StreamStreamCall[pb.SubscribeRequest, pb.SubscribeResponse]
    call = client.broker.Subscribe(feed())
    return call


async def test_decoded_subscribe_delivers_records_and_acks_move_the_cursor(
    client: Client,
) -> None:
    """Scenario: records from both paths, a Subscribe opened with ``decoded`` and ack
    ranges sent back. Expected: deliveries carry decoded records of [from, to) and an
    empty batch; after the acks the subscription's cursor is at the head."""
    await client.broker.Publish(pb.PublishRequest(topic="t", records=RECORDS))
    await client.broker.Publish(pb.PublishRequest(topic="t", batch=encode_columns([b"bin"])))
    requests: asyncio.Queue[pb.SubscribeRequest | None] = asyncio.Queue()
    requests.put_nowait(
        pb.SubscribeRequest(
            open=pb.OpenSubscription(topic="t", subscription="s", initial_credit=100, decoded=True)
        )
    )
    call = await subscribe(client, requests)
    got: list[pb.DecodedRecord] = []
    async with asyncio.timeout(10):
        async for response in call:
            if response.WhichOneof("kind") != "delivery":
                continue
            d = response.delivery
            assert d.batch == b""
            assert [r.offset for r in d.records] == list(range(d.from_offset, d.to_offset))
            got += d.records
            requests.put_nowait(
                pb.SubscribeRequest(
                    ack=pb.Acks(
                        ranges=[pb.OffsetRange(partition=0, begin=d.from_offset, end=d.to_offset)]
                    )
                )
            )
            if len(got) == 6:
                break
    assert decoded(got[:5]) == expected()
    assert got[5].value == b"bin"
    requests.put_nowait(None)
    async with asyncio.timeout(10):
        while True:
            info = await client.admin.DescribeSubscription(
                admin.DescribeSubscriptionRequest(topic="t", subscription="s")
            )
            if info.partitions[0].cursor == 6:
                break
            await asyncio.sleep(0.02)
    call.cancel()


async def test_publish_stream_takes_records_and_echoes_request_ids_on_errors(
    client: Client,
) -> None:
    """Scenario: a PublishStream with a simple-path request (id 7), a request to a missing
    topic (id 8) and one with both batch and records (id 9). Expected: the good one is
    appended, and each error response carries its request's id and a message."""
    requests = [
        pb.PublishRequest(topic="t", request_id=7, records=[pb.Record(value=b"x")]),
        pb.PublishRequest(topic="nope", request_id=8, records=[pb.Record(value=b"y")]),
        pb.PublishRequest(
            topic="t", request_id=9, batch=encode_columns([b"z"]), records=[pb.Record(value=b"z")]
        ),
    ]
    responses = [r async for r in client.broker.PublishStream(iter(requests))]
    assert [r.request_id for r in responses] == [7, 8, 9]
    assert responses[0].error_code == 0
    assert responses[0].last_offset == 0
    assert responses[1].error_code == grpc.StatusCode.NOT_FOUND.value[0]
    assert "'nope'" in responses[1].error_message
    assert "topics create nope" in responses[1].error_message
    assert responses[2].error_code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert "batch, records" in responses[2].error_message


async def test_publish_needs_exactly_one_of_batch_and_records(client: Client) -> None:
    """Scenario: a Publish with both, with neither (an empty records list is the same on
    the wire), and with a negative timestamp. Expected: INVALID_ARGUMENT naming the
    fields; nothing appended."""
    both = pb.PublishRequest(topic="t", batch=encode_columns([b"a"]), records=[pb.Record()])
    await expect_error(
        client.broker.Publish(both),
        grpc.StatusCode.INVALID_ARGUMENT,
        "batch",
        "records",
        "exactly one",
    )
    await expect_error(
        client.broker.Publish(pb.PublishRequest(topic="t", records=[])),
        grpc.StatusCode.INVALID_ARGUMENT,
        "batch, records",
        "both are empty",
    )
    negative = pb.Record(value=b"v", timestamp_ms=-5)
    await expect_error(
        client.broker.Publish(pb.PublishRequest(topic="t", records=[negative])),
        grpc.StatusCode.INVALID_ARGUMENT,
        "records[0].timestamp_ms",
    )
    assert (await fetch(client)).high_water_mark == 0


async def test_empty_topic_name_is_invalid_argument_and_not_found_names_the_topic(
    client: Client,
) -> None:
    """Scenario: Publish, Fetch and Subscribe to topic ''; Publish to a missing topic.
    Expected: INVALID_ARGUMENT "topic name is empty" (no advice to create a nameless
    topic); NOT_FOUND whose advice names the topic."""
    record = [pb.Record(value=b"x")]
    await expect_error(
        client.broker.Publish(pb.PublishRequest(topic="", records=record)),
        grpc.StatusCode.INVALID_ARGUMENT,
        "topic name is empty",
    )
    await expect_error(
        client.broker.Fetch(pb.FetchRequest(topic="")),
        grpc.StatusCode.INVALID_ARGUMENT,
        "topic name is empty",
    )
    opening = pb.SubscribeRequest(open=pb.OpenSubscription(topic="", subscription="s"))
    call = client.broker.Subscribe(iter([opening]))
    with pytest.raises(grpc.aio.AioRpcError) as info:
        async for _ in call:
            pass
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "topic name is empty" in (info.value.details() or "")
    details = await expect_error(
        client.broker.Publish(pb.PublishRequest(topic="missing", records=record)),
        grpc.StatusCode.NOT_FOUND,
        "headrace topics create missing --partitions N",
    )
    assert "'missing'" in details


async def test_producer_ids_below_minus_one_are_refused(client: Client) -> None:
    """Scenario: batches with producer ids -7, -1 and 5. Expected: -7 gets
    INVALID_ARGUMENT naming producer_id; -1 (not idempotent) and 5 are appended."""
    await expect_error(
        client.broker.Publish(
            pb.PublishRequest(topic="t", batch=encode_columns([b"a"], producer_id=-7))
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        "producer_id",
        "-7",
        "use -1",
    )
    for producer_id, sequence in ((-1, -1), (5, 0)):
        batch = encode_columns([b"a"], producer_id=producer_id, base_sequence=sequence)
        await client.broker.Publish(pb.PublishRequest(topic="t", batch=batch))
    assert (await fetch(client)).high_water_mark == 2


async def test_requests_over_max_request_bytes_name_the_setting(tmp_path: Path) -> None:
    """Scenario: a broker with max_request_bytes 64 KiB; a 100 KiB Publish, the same on a
    PublishStream, a Subscribe whose open is 100 KiB; then a Publish just under the limit.
    Expected: RESOURCE_EXHAUSTED for all three (from gRPC: the setting is the transport's
    limit), which the client's translation restates naming the size, the limit and
    `[broker] max_request_bytes`; the one under the limit is appended."""
    limit = 64 << 10
    config = broker_config(tmp_path / "data", max_request_bytes=limit)
    async with serving(config) as (_, c):
        await c.admin.CreateTopic(admin.CreateTopicRequest(name="t", partitions=1))
        big = pb.PublishRequest(topic="t", records=[pb.Record(value=bytes(100 << 10))])
        needles = ("[broker] max_request_bytes", f"limit of {limit} bytes", str(big.ByteSize()))
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await c.broker.Publish(big)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert all(n in str(from_rpc_error(info.value)) for n in needles)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            async for _ in c.broker.PublishStream(iter([big])):
                pass
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert all(n in str(from_rpc_error(info.value)) for n in needles)
        opening = pb.SubscribeRequest(
            open=pb.OpenSubscription(topic="t", subscription="s", consumer_name="c" * (100 << 10))
        )
        with pytest.raises(grpc.aio.AioRpcError) as info:
            async for _ in c.broker.Subscribe(iter([opening])):
                pass
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "[broker] max_request_bytes" in str(from_rpc_error(info.value))
        fits = pb.PublishRequest(topic="t", records=[pb.Record(value=bytes(limit - 100))])
        assert fits.ByteSize() <= limit
        assert (await c.broker.Publish(fits)).last_offset == 0


async def test_decoded_readers_see_duplicate_header_names_of_a_binary_batch(
    client: Client,
) -> None:
    """Scenario: a binary batch whose record carries header ``h`` twice (and ``x``), and
    the same record on the simple path. Expected: a decoded Fetch returns all three
    headers of each in their stored order."""
    pairs = [("h", b"1"), ("x", b"2"), ("h", b"3")]
    batch = encode_columns([b"v"], headers=[pairs])
    await client.broker.Publish(pb.PublishRequest(topic="t", batch=batch))
    simple = pb.Record(value=b"v", headers=[pb.Header(name=n, value=v) for n, v in pairs])
    await client.broker.Publish(pb.PublishRequest(topic="t", records=[simple]))
    records = (await fetch(client, decoded=True)).records
    assert len(records) == 2
    for record in records:
        assert [(h.name, h.value) for h in record.headers] == pairs


async def test_simple_path_retries_with_a_producer_id_are_answered_as_duplicates(
    client: Client,
) -> None:
    """Scenario: simple-path Publishes to partition 0 with producer id 42: three records
    at sequence 0, the same request again (a retry after a lost response), then two at
    sequence 3, then one at sequence 9 (a gap). Expected: the retry is answered
    duplicate with the first offsets and appends nothing; sequence 3 follows at offset
    3; the gap is FAILED_PRECONDITION; the log holds the five records once, and its
    batches carry producer id 42 with sequences 0 and 3."""

    def publish(values: list[bytes], sequence: int) -> pb.PublishRequest:
        records = [pb.Record(value=v, timestamp_ms=NOW_MS) for v in values]
        return pb.PublishRequest(
            topic="t", partition=0, records=records, producer_id=42, base_sequence=sequence
        )

    first = await client.broker.Publish(publish([b"a", b"b", b"c"], 0))
    again = await client.broker.Publish(publish([b"a", b"b", b"c"], 0))
    assert (first.base_offset, first.last_offset, first.duplicate) == (0, 2, False)
    assert (again.base_offset, again.last_offset, again.duplicate) == (0, 2, True)
    more = await client.broker.Publish(publish([b"d", b"e"], 3))
    assert (more.base_offset, more.last_offset, more.duplicate) == (3, 4, False)
    await expect_error(
        client.broker.Publish(publish([b"z"], 9)),
        grpc.StatusCode.FAILED_PRECONDITION,
        "producer 42",
        "expected 5",
    )
    response = await fetch(client)
    assert [v for _, _, v, _, _ in binary(response)] == [b"a", b"b", b"c", b"d", b"e"]
    headers = [decode_batch(raw) for raw in response.batches]
    assert [(b.producer_id, b.base_sequence) for b in headers if b is not None] == [
        (42, 0),
        (42, 3),
    ]


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"producer_id": 7}, "base_sequence"),
        ({"base_sequence": 0}, "producer_id"),
        ({"producer_id": -1, "base_sequence": 0}, "producer_id"),
        ({"producer_id": 7, "base_sequence": -2}, "base_sequence"),
        ({"producer_id": 7, "base_sequence": 2**31 - 1}, "base_sequence"),
        ({"producer_id": 7, "base_sequence": 0, "partition": -1}, "partition"),
    ],
)
async def test_a_bad_simple_path_sequence_is_refused_naming_the_field(
    client: Client, fields: dict[str, int], named: str
) -> None:
    """Scenario: simple-path Publishes of two records with one of producer_id or
    base_sequence alone, a negative id or sequence, a last sequence past 2^31 - 1, or
    partition -1. Expected: INVALID_ARGUMENT naming the field; nothing appended."""
    request = pb.PublishRequest(
        topic="t", partition=0, records=[pb.Record(value=b"x"), pb.Record(value=b"y")]
    )
    for name, value in fields.items():
        setattr(request, name, value)
    await expect_error(client.broker.Publish(request), grpc.StatusCode.INVALID_ARGUMENT, named)
    assert (await fetch(client)).high_water_mark == 0


async def test_a_batch_with_simple_path_sequence_fields_is_refused(client: Client) -> None:
    """Scenario: a binary batch with producer_id set on the request too. Expected:
    INVALID_ARGUMENT naming producer_id and base_sequence (the batch's header carries
    its own); nothing appended."""
    request = pb.PublishRequest(topic="t", partition=0, batch=encode_columns([b"a"]))
    request.producer_id = 3
    await expect_error(
        client.broker.Publish(request),
        grpc.StatusCode.INVALID_ARGUMENT,
        "producer_id, base_sequence",
        "for `records` only",
    )
    assert (await fetch(client)).high_water_mark == 0


async def test_an_idempotent_batch_to_partition_minus_one_is_refused(client: Client) -> None:
    """Scenario: a binary batch whose header carries producer 555 at sequence 0, sent to
    partition -1, twice (a retry); then the same batch to partition 0, twice. Expected:
    both -1 sends INVALID_ARGUMENT naming partition, nothing appended (before, on a topic
    of more partitions, round robin put the retry on another one as a new batch: written
    twice); to partition 0
    the retry is a duplicate of the first."""
    batch = encode_columns([b"x"], producer_id=555, base_sequence=0)
    for _ in range(2):
        await expect_error(
            client.broker.Publish(pb.PublishRequest(topic="t", partition=-1, batch=batch)),
            grpc.StatusCode.INVALID_ARGUMENT,
            "partition",
            "producer_id 555",
        )
    assert (await fetch(client)).high_water_mark == 0
    first = await client.broker.Publish(pb.PublishRequest(topic="t", partition=0, batch=batch))
    retry = await client.broker.Publish(pb.PublishRequest(topic="t", partition=0, batch=batch))
    assert (first.duplicate, retry.duplicate, retry.base_offset) == (False, True, 0)


async def test_minus_one_sends_a_request_of_one_key_where_the_key_hashes(client: Client) -> None:
    """Scenario: a five-partition topic; simple-path requests to partition -1: three with
    the key ``alpha`` only (one of two records), then ones with an empty key, with two
    keys, and with none. Expected: every ``alpha`` request lands on crc32c(alpha) % 5
    (3), the empty key on crc32c(b"") % 5; the mixed and unkeyed ones go round robin
    (two in a row land on different partitions)."""
    await client.admin.CreateTopic(admin.CreateTopicRequest(name="keyed", partitions=5))

    async def where(*keys: bytes | None) -> int:
        records = [
            pb.Record(key=k, value=b"v") if k is not None else pb.Record(value=b"v") for k in keys
        ]
        request = pb.PublishRequest(topic="keyed", partition=-1, records=records)
        response: pb.PublishResponse = await client.broker.Publish(request)
        return response.partition

    assert partition_for(b"alpha", 5) == 3
    assert [await where(b"alpha"), await where(b"alpha", b"alpha"), await where(b"alpha")] == [
        3
    ] * 3
    assert await where(b"") == partition_for(b"", 5)
    assert await where(b"alpha", b"beta") != await where(b"alpha", b"beta")
    assert await where(None) != await where(None)
    assert await where(b"alpha", None) != await where(b"alpha", None)
