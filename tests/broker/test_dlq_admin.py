"""The dead-letter queue admin calls (peek, count, ack, purge, replay) over real gRPC on
loopback, with the client library as the caller. Queues are filled directly through the
broker's subscription registry, as a subscription's poison handling would."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from broker.app import Broker
from broker.backlog import BacklogConfig, BacklogPolicy
from client import (
    AdminClient,
    AsyncAdminClient,
    AsyncConsumer,
    AsyncProducer,
    ClientError,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ReplayResult,
    ResourceExhausted,
    SkippedDeadLetter,
)
from dispatcher import DispatchConfig, DispatchPolicy
from dispatcher.dead_letter_queue import DeadLetterQueue
from dispatcher.dead_letter_records import (
    HEADER_REPLAY_COUNT,
    MAX_REPLAY_COUNT,
    RESERVED_HEADERS,
    DeadLetter,
)
from tests._helpers import eventually
from tests.broker.conftest import broker_config
from tests.client.conftest import address, read_batches
from wal import encode_columns

pytestmark = pytest.mark.asyncio(loop_scope="function")

TOPIC = "orders"
SUB = "billing"


def letter(
    offset: int,
    reason: str = "ack timeout",
    *,
    topic: str = TOPIC,
    partition: int = 0,
    key: bytes | None = None,
    value: bytes | None = None,
    headers: tuple[tuple[str, bytes], ...] = (),
) -> DeadLetter:
    """A dead letter of record ``offset`` of ``topic``/``partition``."""
    return DeadLetter(
        topic=topic,
        partition=partition,
        offset=offset,
        subscription=SUB,
        key=key,
        value=value if value is not None else f"v{offset}".encode(),
        headers=headers,
        timestamp_ms=1_700_000_000_000 + offset,
        attempts=3,
        reason=reason,
        attempt_times_ms=(1, 2, 3),
    )


async def subscribed(broker: Broker, topic: str = TOPIC, partitions: int = 2) -> None:
    """Create ``topic`` and subscription ``SUB`` on it."""
    created = await broker.topics.create(topic, partitions)
    await broker.subscriptions.subscribe(topic, SUB, [p.writer for p in created.partitions])


async def dead_letters(broker: Broker, letters: list[DeadLetter]) -> DeadLetterQueue:
    """``SUB``'s queue on ``TOPIC`` (created with 2 partitions) holding ``letters``."""
    await subscribed(broker)
    dlq = await broker.subscriptions.dead_letter_queue(TOPIC, SUB, create=True)
    assert dlq is not None
    await dlq.put(letters)
    return dlq


async def records(broker: Broker, topic: str, partition: int) -> list[tuple[Any, ...]]:
    """Every (key, value, headers) stored in a partition."""
    return [
        row
        for b in await read_batches(broker, topic, partition)
        for row in zip(b.keys(), b.values(), b.headers(), strict=True)
    ]


async def test_peek_mirrors_entries_and_filters_by_reason_and_start(broker: Broker) -> None:
    """Scenario: five dead letters with mixed reasons, one keyed with headers; peek all, by
    reason, from a sequence, with a limit. Expected: every field mirrors the letter (key
    None vs bytes, headers without bookkeeping); the reason filter is a substring match;
    from_sequence is inclusive; limit caps the answer."""
    reasons = ["ack timeout", "parse error: x", "ack timeout", "parse error: y", "nack"]
    letters = [letter(i, r) for i, r in enumerate(reasons)]
    letters[1] = letter(1, reasons[1], partition=1, key=b"k1", headers=(("trace", b"t1"),))
    await dead_letters(broker, letters)
    async with AsyncAdminClient(address(broker)) as admin:
        every = await admin.peek_dead_letters(TOPIC, SUB)
        parse = await admin.peek_dead_letters(TOPIC, SUB, reason="parse")
        later = await admin.peek_dead_letters(TOPIC, SUB, from_sequence=2)
        one = await admin.peek_dead_letters(TOPIC, SUB, from_sequence=2, limit=1)
        both = await admin.peek_dead_letters(TOPIC, SUB, from_sequence=2, reason="parse")
    assert [e.sequence for e in every] == [0, 1, 2, 3, 4]
    assert [e.reason for e in every] == reasons
    first, keyed = every[0], every[1]
    assert (first.key, first.value, dict(first.headers)) == (None, b"v0", {})
    assert (keyed.topic, keyed.partition, keyed.offset, keyed.subscription) == (TOPIC, 1, 1, SUB)
    assert (keyed.key, keyed.value, dict(keyed.headers)) == (b"k1", b"v1", {"trace": b"t1"})
    assert (keyed.attempts, keyed.attempt_times_ms, keyed.timestamp_ms) == (
        3,
        (1, 2, 3),
        1_700_000_000_001,
    )
    assert (keyed.truncated, keyed.original_size, keyed.replay_count) == (False, 2, 0)
    assert keyed.dead_lettered_ms > 1_700_000_000_000
    assert [e.sequence for e in parse] == [1, 3]
    assert [e.sequence for e in later] == [2, 3, 4]
    assert [e.sequence for e in one] == [2]
    assert [e.sequence for e in both] == [3]


async def test_count_ack_inclusive_and_purge(broker: Broker) -> None:
    """Scenario: five dead letters; ack up to 1, ack up to 1 again, purge, ack an empty
    queue. Expected: the ack removes sequences 0 and 1 (inclusive) and answers 2; the
    repeat answers 0; the purge removes the 3 left; counts follow each step."""
    await dead_letters(broker, [letter(i) for i in range(5)])
    async with AsyncAdminClient(address(broker)) as admin:
        assert await admin.count_dead_letters(TOPIC, SUB) == 5
        assert await admin.ack_dead_letters(TOPIC, SUB, 1) == 2
        assert await admin.count_dead_letters(TOPIC, SUB) == 3
        assert [e.sequence for e in await admin.peek_dead_letters(TOPIC, SUB)] == [2, 3, 4]
        assert await admin.ack_dead_letters(TOPIC, SUB, 1) == 0
        assert await admin.purge_dead_letters(TOPIC, SUB) == 3
        assert await admin.count_dead_letters(TOPIC, SUB) == 0
        assert await admin.peek_dead_letters(TOPIC, SUB) == []
        assert await admin.ack_dead_letters(TOPIC, SUB, 10) == 0


async def test_subscription_without_a_queue_answers_empty(broker: Broker, tmp_path: Path) -> None:
    """Scenario: a subscription that never dead-lettered anything; every call. Expected:
    count 0, peek [], ack 0, purge 0, replay 0 with nothing remaining; no queue is made
    on disk."""
    await subscribed(broker)
    async with AsyncAdminClient(address(broker)) as admin:
        assert await admin.count_dead_letters(TOPIC, SUB) == 0
        assert await admin.peek_dead_letters(TOPIC, SUB) == []
        assert await admin.ack_dead_letters(TOPIC, SUB, 5) == 0
        assert await admin.purge_dead_letters(TOPIC, SUB) == 0
        assert await admin.replay_dead_letters(TOPIC, SUB) == ReplayResult(0, (), 0)
    assert not (tmp_path / "data" / "dlq" / TOPIC / SUB).exists()


CALLS: dict[str, Callable[[AsyncAdminClient, str, str], Awaitable[object]]] = {
    "peek": lambda a, t, s: a.peek_dead_letters(t, s),
    "count": lambda a, t, s: a.count_dead_letters(t, s),
    "ack": lambda a, t, s: a.ack_dead_letters(t, s, 0),
    "purge": lambda a, t, s: a.purge_dead_letters(t, s),
    "replay": lambda a, t, s: a.replay_dead_letters(t, s, limit=1),
}


@pytest.mark.parametrize("call", sorted(CALLS))
@pytest.mark.parametrize(
    ("topic", "sub", "words"),
    [
        (TOPIC, "nobody", f"subscription 'nobody' on topic {TOPIC!r} does not exist"),
        ("no-topic", SUB, "topic 'no-topic' does not exist; create it"),
    ],
)
async def test_unknown_subscription_is_not_found(
    broker: Broker, call: str, topic: str, sub: str, words: str
) -> None:
    """Scenario: each dead-letter call names a subscription (or topic) that does not exist.
    Expected: NOT_FOUND naming what is missing and saying how it is made."""
    await subscribed(broker)
    async with AsyncAdminClient(address(broker)) as admin:
        with pytest.raises(NotFound, match=words):
            await CALLS[call](admin, topic, sub)


@pytest.mark.parametrize("call", sorted(CALLS))
@pytest.mark.parametrize(
    ("topic", "sub", "field"),
    [(TOPIC, "a/b", "subscription"), (TOPIC, "", "subscription"), ("a/b", SUB, "topic")],
)
async def test_invalid_names_are_invalid_argument(
    broker: Broker, call: str, topic: str, sub: str, field: str
) -> None:
    """Scenario: each dead-letter call names a subscription or topic that no valid name
    matches. Expected: INVALID_ARGUMENT naming the field and the rule, not NOT_FOUND with
    advice to create what cannot exist."""
    await subscribed(broker)
    async with AsyncAdminClient(address(broker)) as admin:
        with pytest.raises(InvalidArgument, match=f"{field}: .* is not a valid {field} name"):
            await CALLS[call](admin, topic, sub)


BAD: dict[str, tuple[Callable[[AsyncAdminClient], Awaitable[object]], str]] = {
    "peek-limit-0": (lambda a: a.peek_dead_letters(TOPIC, SUB, limit=0), "limit"),
    "peek-limit-10001": (lambda a: a.peek_dead_letters(TOPIC, SUB, limit=10_001), "10000"),
    "peek-from-negative": (lambda a: a.peek_dead_letters(TOPIC, SUB, from_sequence=-1), "from"),
    "ack-negative": (lambda a: a.ack_dead_letters(TOPIC, SUB, -1), "up_to_sequence"),
    "replay-limit-0": (lambda a: a.replay_dead_letters(TOPIC, SUB, limit=0), "limit"),
    "replay-up-to-negative": (
        lambda a: a.replay_dead_letters(TOPIC, SUB, up_to_sequence=-2),
        "up_to_sequence",
    ),
    "replay-rate-negative": (lambda a: a.replay_dead_letters(TOPIC, SUB, rate_per_s=-5), "rate"),
    "replay-rate-too-high": (
        lambda a: a.replay_dead_letters(TOPIC, SUB, rate_per_s=100_001),
        "100000",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
async def test_bad_arguments_are_invalid_argument(broker: Broker, case: str) -> None:
    """Scenario: each out-of-range argument, on an existing subscription with a queue.
    Expected: INVALID_ARGUMENT naming the field and its range; the queue is unchanged."""
    await dead_letters(broker, [letter(0)])
    call, words = BAD[case]
    async with AsyncAdminClient(address(broker)) as admin:
        with pytest.raises(InvalidArgument, match=words):
            await call(admin)
        assert await admin.count_dead_letters(TOPIC, SUB) == 1


async def test_replay_goes_to_the_original_partition_with_the_count_incremented(
    broker: Broker,
) -> None:
    """Scenario: three dead letters from partitions 1, 0 and 1, one keyed, one already
    replayed once; replay all. Expected: each is published to its original partition in
    queue order with key, value and original headers, x-replay-count 1 (or 2 for the one
    replayed before) and no bookkeeping headers; all are acked; nothing remains."""
    await dead_letters(
        broker,
        [
            letter(10, partition=1, key=b"k", headers=(("trace", b"t"),)),
            letter(11, partition=0),
            letter(12, partition=1, headers=((HEADER_REPLAY_COUNT, b"1"),)),
        ],
    )
    async with AsyncAdminClient(address(broker)) as admin:
        result = await admin.replay_dead_letters(TOPIC, SUB)
        assert result == ReplayResult(replayed=3, skipped=(), remaining=0)
        assert await admin.count_dead_letters(TOPIC, SUB) == 0
    assert await records(broker, TOPIC, 0) == [(None, b"v11", {HEADER_REPLAY_COUNT: b"1"})]
    assert await records(broker, TOPIC, 1) == [
        (b"k", b"v10", {"trace": b"t", HEADER_REPLAY_COUNT: b"1"}),
        (None, b"v12", {HEADER_REPLAY_COUNT: b"2"}),
    ]
    for _key, _value, headers in await records(broker, TOPIC, 1):
        assert not RESERVED_HEADERS & headers.keys()


@pytest.mark.parametrize("poison", ["loop-guard", "truncated"])
async def test_replay_stops_at_an_entry_it_must_skip(broker: Broker, poison: str) -> None:
    """Scenario: entries 0, 1, 3 are fine; entry 2 has x-replay-count at max_replays (or a
    truncated value); replay, then ack entry 2 and replay again. Expected: the first
    replay publishes 0 and 1, stops at 2 and reports why; 2 and 3 stay. After the ack, the
    second replay publishes 3 and empties the queue."""
    dlq = await dead_letters(broker, [letter(i) for i in range(2)])
    if poison == "loop-guard":
        count = str(dlq.config.max_replays).encode()
        bad, words = letter(2, headers=((HEADER_REPLAY_COUNT, count),)), "max_replays"
    else:
        bad, words = letter(2, value=b"x" * (dlq.config.max_event_bytes + 1)), "truncated"
    await dlq.put([bad, letter(3)])
    async with AsyncAdminClient(address(broker)) as admin:
        first = await admin.replay_dead_letters(TOPIC, SUB)
        assert (first.replayed, first.remaining) == (2, 2)
        [skipped] = first.skipped
        assert skipped.sequence == 2
        assert words in skipped.reason
        assert [e.sequence for e in await admin.peek_dead_letters(TOPIC, SUB)] == [2, 3]
        assert [v for _k, v, _h in await records(broker, TOPIC, 0)] == [b"v0", b"v1"]
        assert await admin.ack_dead_letters(TOPIC, SUB, 2) == 1
        second = await admin.replay_dead_letters(TOPIC, SUB)
    assert second == ReplayResult(1, (), 0)
    assert [v for _k, v, _h in await records(broker, TOPIC, 0)] == [b"v0", b"v1", b"v3"]


async def test_replay_limit_and_up_to_sequence(broker: Broker) -> None:
    """Scenario: five entries; replay with limit 2, then up to sequence 3, then with a
    bound below the oldest entry. Expected: 2 replayed (0, 1), then 2 (2, 3), then 0;
    entry 4 remains throughout the last step."""
    await dead_letters(broker, [letter(i) for i in range(5)])
    async with AsyncAdminClient(address(broker)) as admin:
        assert await admin.replay_dead_letters(TOPIC, SUB, limit=2) == ReplayResult(2, (), 3)
        got = await admin.replay_dead_letters(TOPIC, SUB, up_to_sequence=3)
        assert got == ReplayResult(2, (), 1)
        got = await admin.replay_dead_letters(TOPIC, SUB, up_to_sequence=3)
        assert got == ReplayResult(0, (), 1)
        assert [e.sequence for e in await admin.peek_dead_letters(TOPIC, SUB)] == [4]
    assert [v for _k, v, _h in await records(broker, TOPIC, 0)] == [b"v0", b"v1", b"v2", b"v3"]


async def test_replay_rate_limit_spaces_batches(broker: Broker) -> None:
    """Scenario: 30 entries replayed at 100 records/s (batches of 10). Expected: all 30
    replayed, taking at least 0.2 s (batches at 0, 0.1 and 0.2 s); a replay at the default
    rate of the same size is much faster (the limiter, not the disk, set the pace)."""
    dlq = await dead_letters(broker, [letter(i) for i in range(30)])
    async with AsyncAdminClient(address(broker)) as admin:
        started = time.monotonic()
        result = await admin.replay_dead_letters(TOPIC, SUB, rate_per_s=100)
        paced = time.monotonic() - started
        assert result == ReplayResult(30, (), 0)
        await dlq.put([letter(i) for i in range(30)])
        started = time.monotonic()
        assert (await admin.replay_dead_letters(TOPIC, SUB)).replayed == 30
        free = time.monotonic() - started
    assert paced >= 0.19
    assert free < paced


@pytest.mark.parametrize(
    ("gone", "words"),
    [
        ({"topic": "deleted-topic"}, "original topic 'deleted-topic' no longer exists"),
        ({"partition": 7}, "original partition 7 of topic 'orders' no longer exists"),
    ],
    ids=["topic", "partition"],
)
async def test_replay_to_a_missing_target_is_failed_precondition(
    broker: Broker, gone: dict[str, Any], words: str
) -> None:
    """Scenario: entry 0 targets a live partition, entry 1 a topic (or partition) that no
    longer exists, entry 2 a live one. Expected: FAILED_PRECONDITION naming the entry and
    how to ack past it; entry 0 was replayed and acked; 1 and 2 stay; nothing went to
    another partition."""
    await dead_letters(broker, [letter(0), letter(1, **gone), letter(2)])
    async with AsyncAdminClient(address(broker)) as admin:
        with pytest.raises(FailedPrecondition, match=words) as info:
            await admin.replay_dead_letters(TOPIC, SUB)
        assert "--up-to 1" in str(info.value)
        assert [e.sequence for e in await admin.peek_dead_letters(TOPIC, SUB)] == [1, 2]
    assert [v for _k, v, _h in await records(broker, TOPIC, 0)] == [b"v0"]
    assert await records(broker, TOPIC, 1) == []


async def test_a_second_concurrent_replay_is_refused(broker: Broker) -> None:
    """Scenario: a slow replay (5 entries at 10/s) runs; a second replay of the same queue
    starts meanwhile. Expected: the second fails with FAILED_PRECONDITION; the first
    finishes and replays all 5."""
    await dead_letters(broker, [letter(i) for i in range(5)])
    async with AsyncAdminClient(address(broker)) as admin:
        slow = asyncio.create_task(admin.replay_dead_letters(TOPIC, SUB, rate_per_s=10))
        await asyncio.sleep(0.15)
        with pytest.raises(FailedPrecondition, match="another replay"):
            await admin.replay_dead_letters(TOPIC, SUB)
        assert (await slow).replayed == 5


async def test_sync_admin_client_has_the_same_methods(broker: Broker) -> None:
    """Scenario: the blocking AdminClient, from a plain thread: count, peek, ack, replay,
    purge, and an unknown subscription. Expected: the async results, and NotFound."""
    dlq = await dead_letters(broker, [letter(i) for i in range(4)])
    count = str(dlq.config.max_replays).encode()
    await dlq.put([letter(4, headers=((HEADER_REPLAY_COUNT, count),)), letter(5)])

    def blocking() -> list[object]:
        with AdminClient(address(broker)) as admin:
            got: list[object] = [
                admin.count_dead_letters(TOPIC, SUB),
                [e.sequence for e in admin.peek_dead_letters(TOPIC, SUB, limit=2)],
                admin.ack_dead_letters(TOPIC, SUB, 0),
                admin.replay_dead_letters(TOPIC, SUB, rate_per_s=1000),
                admin.purge_dead_letters(TOPIC, SUB),
            ]
            try:
                admin.count_dead_letters(TOPIC, "nobody")
            except ClientError as exc:
                got.append(type(exc))
            return got

    got = await asyncio.to_thread(blocking)
    assert got[:3] == [6, [0, 1], 1]
    replay = got[3]
    assert isinstance(replay, ReplayResult)
    assert (replay.replayed, replay.remaining) == (3, 2)
    [skipped] = replay.skipped
    assert isinstance(skipped, SkippedDeadLetter)
    assert skipped.sequence == 4
    assert "replayed 3 times already (max_replays=3)" in skipped.reason
    assert got[4:] == [2, NotFound]


async def test_replay_obeys_the_backlog_quota_and_counts_as_published(tmp_path: Path) -> None:
    """Scenario: a backlog quota of 3 records per partition (reject_producer) and the
    subscription at offset 0; two dead letters of partition 0 are replayed, then partition
    0 is filled past its quota and a third is replayed. Expected: the first replay goes
    through and counts in headrace_published_records; the second is refused with
    RESOURCE_EXHAUSTED naming the quota, and its entry stays in the queue, unpublished."""
    backlog = BacklogConfig(quota_messages=3, policy=BacklogPolicy.REJECT_PRODUCER)
    async with Broker(broker_config(tmp_path / "data", backlog=backlog)) as broker:
        dlq = await dead_letters(broker, [letter(1), letter(2)])
        published = broker.metrics.registry.get_sample_value
        labels = {"topic": TOPIC, "partition": "0"}
        async with AsyncAdminClient(address(broker)) as admin:
            assert await admin.replay_dead_letters(TOPIC, SUB) == ReplayResult(2, (), 0)
            assert published("headrace_published_records_total", labels) == 2
            partition = broker.topics.get(TOPIC).partition(0)
            await partition.append(encode_columns([b"x", b"y"]))  # 4 unconsumed: over
            await dlq.put([letter(3)])
            with pytest.raises(ResourceExhausted, match="quota"):
                await admin.replay_dead_letters(TOPIC, SUB)
            assert await admin.count_dead_letters(TOPIC, SUB) == 1
        assert [value for _k, value, _h in await records(broker, TOPIC, 0)] == [
            b"v1",
            b"v2",
            b"x",
            b"y",
        ]


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(b"9" * 5000, id="5000-digits"),
        pytest.param(b"4294967296", id="uint32-max-plus-one"),
        pytest.param(b"-3", id="negative"),
        pytest.param(b"\xff\xfe", id="not-utf8"),
    ],
)
async def test_hostile_replay_count_leaves_the_queue_readable(tmp_path: Path, raw: bytes) -> None:
    """Scenario: a producer publishes, over gRPC, a record with x-replay-count set to a
    hostile value next to a good record; a consumer nacks both until max_deliveries (2)
    dead-letters them. Expected: peek answers both entries (the hostile count clamped to the
    uint32 maximum, or 0 for a non-number) and keeps answering; replay publishes the good
    entry, then refuses the clamped one by the loop guard (or republishes the one read as
    0); nothing answers INTERNAL."""
    dispatch = DispatchConfig(
        defaults=DispatchPolicy(max_deliveries=2, backoff_initial_s=0.01, backoff_jitter=0.0)
    )
    clamped = raw.isdigit()
    async with Broker(broker_config(tmp_path / "data", dispatch=dispatch)) as broker:
        async with AsyncAdminClient(address(broker)) as admin:
            await admin.create_topic(TOPIC, 1)
            async with AsyncProducer(address(broker), linger_ms=0) as producer:
                await (await producer.send(TOPIC, b"good"))
                await (await producer.send(TOPIC, b"evil", headers={HEADER_REPLAY_COUNT: raw}))
            consumer = AsyncConsumer(TOPIC, SUB, broker=address(broker), ack_interval_ms=0)
            async with consumer, asyncio.timeout(10):
                for _ in range(4):
                    consumer.nack(await consumer.receive(), delay=0, reason="cannot parse")
            await eventually(lambda: broker.subscriptions.get(TOPIC, SUB).state.cursor(0) == 2)
            for _ in range(2):  # the queue stays readable, not only once
                good, evil = await admin.peek_dead_letters(TOPIC, SUB)
                assert (good.value, good.replay_count) == (b"good", 0)
                assert evil.value == b"evil"
                assert evil.replay_count == (MAX_REPLAY_COUNT if clamped else 0)
                assert dict(evil.headers) == {HEADER_REPLAY_COUNT: raw}
            result = await admin.replay_dead_letters(TOPIC, SUB)
            if clamped:
                assert (result.replayed, result.remaining) == (1, 1)
                assert "max_replays" in result.skipped[0].reason
            else:
                assert result == ReplayResult(replayed=2, skipped=(), remaining=0)
            assert await admin.count_dead_letters(TOPIC, SUB) == (1 if clamped else 0)
        replayed = [(v, h) for _k, v, h in await records(broker, TOPIC, 0)][2:]
    expected = [(b"good", {HEADER_REPLAY_COUNT: b"1"})]
    if not clamped:
        expected.append((b"evil", {HEADER_REPLAY_COUNT: b"1"}))
    assert replayed == expected
