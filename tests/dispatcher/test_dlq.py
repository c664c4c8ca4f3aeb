"""The dead-letter queue: its pure entry codec, then the queue over real files.

The codec tests need no event loop and no disk. The queue tests use real logs in
``tmp_path``, a manual wall clock, 512-byte segments where deletion matters, and
:class:`wal.FaultyFs` for failing disks. Claims checked (DESIGN section 3, "Dead-letter
queue"): every field and header survives the round trip; values are cut at
``max_event_bytes`` and flagged; each overflow policy does what it says and counts it;
removals persist before segments go, so a reopen neither resurrects nor loses entries.
"""

from __future__ import annotations

import asyncio
import errno
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
import pytest_asyncio

from dispatcher.dead_letter import (
    HEADER_ATTEMPT_TIMES,
    HEADER_PARTITION,
    HEADER_REPLAY_COUNT,
    HEADER_TOPIC,
    HEADER_TRUNCATED,
    MAX_REPLAY_COUNT,
    RESERVED_HEADERS,
    DeadLetter,
    DlqEntry,
    decode_entries,
    encode_letters,
    replay_count_of,
    replay_record,
    replay_refusal,
)
from dispatcher.dlq import DeadLetterQueue, default_log_config
from dispatcher.dlq_config import DlqConfig, OverflowPolicy, PutOutcome
from dispatcher.errors import DispatchError, DlqConfigError, DlqCorruptError, DlqFullError
from tests._helpers import ManualClock
from tests.dispatcher.test_subscription import _SlowWrites
from wal import (
    Fault,
    FaultyFs,
    FileSystem,
    LogConfig,
    RecordBatch,
    WalClosedError,
    WalError,
    WalIOError,
    decode_batch,
    encode_columns,
)

T0 = 1_700_000_000.0  # the manual clock's start, seconds since the epoch
SMALL_LOG = LogConfig(segment_bytes=512, index_interval_bytes=100)


def letter(
    i: int = 0,
    *,
    reason: str = "handler raised ValueError",
    value: bytes | None = None,
    key: bytes | None = b"k",
    headers: tuple[tuple[str, bytes], ...] = (("trace", b"t-1"),),
) -> DeadLetter:
    """A dead letter whose fields all derive from ``i``."""
    return DeadLetter(
        topic="orders",
        partition=i % 3,
        offset=1000 + i,
        subscription="billing",
        key=key,
        value=b"value-%d" % i if value is None else value,
        headers=headers,
        timestamp_ms=1_600_000_000_000 + i,
        attempts=5,
        reason=reason,
        attempt_times_ms=(1, 2, 3 + i),
    )


def decode(data: bytes) -> list[DlqEntry]:
    """Entries of one encoded batch, as the queue would read them back."""
    batch = decode_batch(data)
    assert batch is not None
    return decode_entries(batch)


# -- the codec (pure) -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "headers", "attempt_times"),
    [
        pytest.param(b"k", (("trace", b"t-1"), ("bin", b"\x00\xff")), (5, 6, 7), id="full"),
        pytest.param(None, (), (), id="no-key-no-headers-no-attempts"),
        pytest.param(b"", (("x-replay-count", b"2"),), (42,), id="empty-key-replayed"),
    ],
)
def test_round_trip_keeps_every_field(
    key: bytes | None, headers: tuple[tuple[str, bytes], ...], attempt_times: tuple[int, ...]
) -> None:
    """Scenario: two dead letters are encoded at one dead-letter time and decoded.
    Expected: each entry has the original fields, headers without bookkeeping, the
    dead-letter time, sequences 0 and 1 (the batch's offsets) and the replay count."""
    letters = [
        DeadLetter(
            topic="orders",
            partition=2,
            offset=77 + i,
            subscription="billing",
            key=key,
            value=b"payload-%d" % i,
            headers=headers,
            timestamp_ms=1_600_000_000_123,
            attempts=4,
            reason="nack: schema mismatch \u00e9",
            attempt_times_ms=attempt_times,
        )
        for i in range(2)
    ]
    entries = decode(encode_letters(letters, now_ms=1_700_000_000_456, max_event_bytes=1024))
    for i, (entry, original) in enumerate(zip(entries, letters, strict=True)):
        assert entry.sequence == i
        assert (entry.topic, entry.partition, entry.offset) == ("orders", 2, 77 + i)
        assert entry.subscription == "billing"
        assert (entry.key, entry.value) == (key, original.value)
        assert dict(entry.headers) == dict(headers)
        assert entry.timestamp_ms == 1_600_000_000_123
        assert (entry.attempts, entry.reason) == (4, "nack: schema mismatch \u00e9")
        assert entry.attempt_times_ms == attempt_times
        assert entry.dead_lettered_ms == 1_700_000_000_456
        assert (entry.truncated, entry.original_size) == (False, len(original.value))
        assert entry.replay_count == replay_count_of(dict(headers))


def test_stored_record_carries_the_bookkeeping_headers() -> None:
    """Scenario: one dead letter is encoded. Expected: the raw record has the original
    headers plus every x-original-* / x-dlq-* header, in ASCII, and the dead-letter time
    as its timestamp."""
    batch = decode_batch(encode_letters([letter(4)], now_ms=99, max_event_bytes=1024))
    assert batch is not None
    assert batch.timestamps().tolist() == [99]
    assert batch.headers()[0] == {
        "trace": b"t-1",
        "x-original-topic": b"orders",
        "x-original-partition": b"1",
        "x-original-offset": b"1004",
        "x-original-subscription": b"billing",
        "x-original-timestamp-ms": b"1600000000004",
        "x-delivery-attempt": b"5",
        "x-failure-reason": b"handler raised ValueError",
        "x-dlq-attempt-times-ms": b"1,2,7",
        "x-dlq-truncated": b"0",
        "x-dlq-original-bytes": b"7",
    }


@pytest.mark.parametrize(
    ("size", "truncated"),
    [
        pytest.param(0, False, id="empty"),
        pytest.param(63, False, id="one-under"),
        pytest.param(64, False, id="exactly-max"),
        pytest.param(65, True, id="one-over"),
        pytest.param(1000, True, id="far-over"),
    ],
)
def test_value_is_cut_at_max_event_bytes(size: int, truncated: bool) -> None:
    """Scenario: a value of ``size`` bytes with max_event_bytes=64. Expected: at or under
    64 it is kept whole and not flagged; over 64 its first 64 bytes are kept, it is flagged
    truncated, and the original size is recorded."""
    value = bytes(i % 251 for i in range(size))
    (entry,) = decode(encode_letters([letter(value=value)], now_ms=1, max_event_bytes=64))
    assert entry.value == value[:64]
    assert entry.truncated is truncated
    assert entry.original_size == size


def test_reserved_names_in_original_headers_are_overwritten() -> None:
    """Scenario: the original record already has an ``x-original-topic`` header (it was
    forged or copied). Expected: the entry's topic is the real one and the forged header
    is not among the entry's headers; other headers stay."""
    forged = letter(headers=(("x-original-topic", b"forged"), ("keep", b"1")))
    (entry,) = decode(encode_letters([forged], now_ms=1, max_event_bytes=64))
    assert entry.topic == "orders"
    assert entry.headers == (("keep", b"1"),)


def _valid_headers() -> dict[str, bytes]:
    batch = decode_batch(encode_letters([letter()], now_ms=1, max_event_bytes=64))
    assert batch is not None
    return batch.headers()[0]


@pytest.mark.parametrize("missing", sorted(RESERVED_HEADERS))
def test_record_missing_a_bookkeeping_header_is_a_damaged_queue(missing: str) -> None:
    """Scenario: a stored record lacks one bookkeeping header. Expected: DlqCorruptError
    (a DispatchError) naming the header and the entry's sequence, not a silent entry."""
    headers = _valid_headers()
    del headers[missing]
    with pytest.raises(DlqCorruptError) as info:
        decode(encode_columns([b"v"], headers=[headers]))
    assert info.value.header == missing
    assert info.value.sequence == 0
    assert missing in str(info.value)
    assert isinstance(info.value, DispatchError)


@pytest.mark.parametrize(
    ("name", "raw"),
    [
        pytest.param(HEADER_PARTITION, b"two", id="partition-not-int"),
        pytest.param(HEADER_ATTEMPT_TIMES, b"1,,2", id="attempt-times-hole"),
        pytest.param(HEADER_TRUNCATED, b"yes", id="truncated-not-flag"),
        pytest.param(HEADER_TOPIC, b"\xff\xfe", id="topic-not-utf8"),
    ],
)
def test_record_with_a_garbled_bookkeeping_header_is_a_damaged_queue(name: str, raw: bytes) -> None:
    """Scenario: a stored record has a bookkeeping header whose value cannot be parsed.
    Expected: DlqCorruptError naming the header."""
    headers = {**_valid_headers(), name: raw}
    with pytest.raises(DlqCorruptError, match=name):
        decode(encode_columns([b"v"], headers=[headers]))


def test_plain_record_without_headers_is_a_damaged_queue() -> None:
    """Scenario: the queue's log holds a record written by something else, with no
    headers at all. Expected: DlqCorruptError, not an entry with made-up fields."""
    with pytest.raises(DlqCorruptError, match="x-original-"):
        decode(encode_columns([b"stray"]))


@pytest.mark.parametrize(
    ("raw", "count"),
    [
        pytest.param(None, 0, id="absent"),
        pytest.param(b"0", 0, id="zero"),
        pytest.param(b"2", 2, id="two"),
        pytest.param(b"", 0, id="empty"),
        pytest.param(b"-1", 0, id="negative"),
        pytest.param(b"x", 0, id="garbage"),
        pytest.param(b" 7", 0, id="leading-space"),
        pytest.param("\u0663".encode(), 0, id="non-ascii-digit"),
        pytest.param(b"4294967295", MAX_REPLAY_COUNT, id="uint32-max"),
        pytest.param(b"4294967296", MAX_REPLAY_COUNT, id="uint32-max-plus-one-clamped"),
        pytest.param(b"9" * 5000, MAX_REPLAY_COUNT, id="5000-digits-clamped"),
        pytest.param(b"0" * 5000 + b"5", 5, id="5000-leading-zeros"),
        pytest.param(b"0" * 5000, 0, id="5000-zeros"),
    ],
)
def test_replay_count_reads_ascii_digits_only(raw: bytes | None, count: int) -> None:
    """Scenario: an original record's x-replay-count is absent, digits, garbage or
    hostile (more digits than int() takes, more than a uint32 holds).
    Expected: digits give their value, clamped to MAX_REPLAY_COUNT; anything else counts
    as 0 (a replay rewrites it); nothing raises."""
    headers = {} if raw is None else {HEADER_REPLAY_COUNT: raw}
    assert replay_count_of(headers) == count


@pytest.mark.parametrize("raw", [b"9" * 5000, b"4294967296", b"4294967295"])
def test_hostile_replay_count_decodes_and_is_refused(raw: bytes) -> None:
    """Scenario: a dead-lettered record whose producer set x-replay-count to a huge value.
    Expected: the entry decodes (the queue stays readable), its count is clamped to the
    uint32 maximum, replay is refused by the loop guard, and a replay record would never
    carry a count past the maximum."""
    (entry,) = decode(
        encode_letters([letter(headers=((HEADER_REPLAY_COUNT, raw),))], 1, max_event_bytes=64)
    )
    assert entry.replay_count == MAX_REPLAY_COUNT
    refusal = replay_refusal(entry, max_replays=3)
    assert refusal is not None
    assert f"replayed {MAX_REPLAY_COUNT} times" in refusal
    _, _, headers = replay_record(entry)
    assert headers == [(HEADER_REPLAY_COUNT, b"%d" % MAX_REPLAY_COUNT)]


@pytest.mark.parametrize(
    ("original", "expected"),
    [
        pytest.param((), b"1", id="first-replay"),
        pytest.param(((HEADER_REPLAY_COUNT, b"2"),), b"3", id="third-replay"),
        pytest.param(((HEADER_REPLAY_COUNT, b"junk"),), b"1", id="garbage-restarts"),
    ],
)
def test_replay_record_increments_the_replay_count(
    original: tuple[tuple[str, bytes], ...], expected: bytes
) -> None:
    """Scenario: an entry is turned back into a record to publish. Expected: the original
    key and value, the original headers (no bookkeeping) with x-replay-count incremented."""
    (entry,) = decode(
        encode_letters([letter(headers=(("trace", b"t"), *original))], 1, max_event_bytes=64)
    )
    key, value, headers = replay_record(entry)
    assert (key, value) == (b"k", b"value-0")
    assert headers == [("trace", b"t"), (HEADER_REPLAY_COUNT, expected)]
    assert not RESERVED_HEADERS & {name for name, _ in headers}


def test_repeated_header_names_survive_the_queue_and_replay() -> None:
    """Scenario: a record with the header ``h`` twice (1 then 2) and ``x-replay-count``
    between them is dead-lettered. Expected: the entry keeps both values of ``h`` in order
    (a map would keep only 2), and the replay record carries both, then one incremented
    ``x-replay-count``."""
    original = (("h", b"1"), (HEADER_REPLAY_COUNT, b"1"), ("h", b"2"))
    (entry,) = decode(encode_letters([letter(headers=original)], 1, max_event_bytes=64))
    assert entry.headers == original
    assert entry.replay_count == 1
    _, _, headers = replay_record(entry)
    assert headers == [("h", b"1"), ("h", b"2"), (HEADER_REPLAY_COUNT, b"2")]


@pytest.mark.parametrize(
    ("replays", "max_replays", "allowed"),
    [
        pytest.param(0, 3, True, id="never-replayed"),
        pytest.param(2, 3, True, id="one-below-guard"),
        pytest.param(3, 3, False, id="at-guard"),
        pytest.param(7, 3, False, id="over-guard"),
        pytest.param(0, 0, False, id="replays-forbidden"),
    ],
)
def test_replay_loop_guard(replays: int, max_replays: int, allowed: bool) -> None:
    """Scenario: an entry already replayed ``replays`` times, with ``max_replays``.
    Expected: replayable below the guard; at or over it a reason naming max_replays."""
    headers = ((HEADER_REPLAY_COUNT, b"%d" % replays),)
    (entry,) = decode(encode_letters([letter(headers=headers)], 1, max_event_bytes=64))
    refusal = replay_refusal(entry, max_replays)
    if allowed:
        assert refusal is None
    else:
        assert refusal is not None
        assert f"max_replays={max_replays}" in refusal


def test_truncated_entry_is_not_replayable() -> None:
    """Scenario: an entry whose value was cut. Expected: replay is refused, saying the
    payload was truncated and from what size to what size."""
    (entry,) = decode(encode_letters([letter(value=b"x" * 100)], 1, max_event_bytes=10))
    refusal = replay_refusal(entry, max_replays=3)
    assert refusal is not None
    assert "truncated from 100 to 10 bytes" in refusal


@pytest.mark.parametrize(
    ("field", "value"),
    [
        pytest.param("max_entries", 0, id="max_entries-zero"),
        pytest.param("max_entries", True, id="max_entries-bool"),
        pytest.param("max_entries", 1.5, id="max_entries-float"),
        pytest.param("max_age_s", 0.0, id="max_age-zero"),
        pytest.param("max_age_s", -1.0, id="max_age-negative"),
        pytest.param("max_age_s", float("inf"), id="max_age-inf"),
        pytest.param("max_age_s", float("nan"), id="max_age-nan"),
        pytest.param("max_age_s", "1d", id="max_age-str"),
        pytest.param("overflow", "drop_oldest", id="overflow-str"),
        pytest.param("max_event_bytes", 0, id="max_event_bytes-zero"),
        pytest.param("max_event_bytes", 255 * 2**20 + 1, id="max_event_bytes-over"),
        pytest.param("max_replays", -1, id="max_replays-negative"),
        pytest.param("max_replays", 2**32, id="max_replays-over-uint32"),
    ],
)
def test_config_rejects_bad_values(field: str, value: object) -> None:
    """Scenario: a DlqConfig with one bad field. Expected: a ValueError (DlqConfigError)
    whose message names the field, the value and what is allowed."""
    with pytest.raises(ValueError, match=field) as info:
        DlqConfig(**{field: value})  # type: ignore[arg-type]
    assert isinstance(info.value, DlqConfigError)
    assert info.value.field == field
    assert repr(value) in str(info.value)
    assert "must be" in str(info.value)


@pytest.mark.parametrize(
    "kwargs",
    [
        pytest.param({"max_entries": 1}, id="one-entry"),
        pytest.param({"max_age_s": None}, id="keep-forever"),
        pytest.param({"max_age_s": 1}, id="int-age"),
        pytest.param({"max_event_bytes": 1}, id="one-byte-events"),
        pytest.param({"max_event_bytes": 255 * 2**20}, id="largest-events"),
        pytest.param({"max_replays": 0}, id="no-replays"),
        pytest.param({"max_replays": 2**32 - 1}, id="most-replays"),
        pytest.param({"overflow": OverflowPolicy.BLOCK}, id="block"),
    ],
)
def test_config_accepts_boundary_values(kwargs: dict[str, object]) -> None:
    """Scenario: a DlqConfig at the edge of each range. Expected: it is accepted and
    keeps the value."""
    cfg = DlqConfig(**kwargs)  # type: ignore[arg-type]
    assert {name: getattr(cfg, name) for name in kwargs} == kwargs


def test_config_defaults() -> None:
    """Scenario: DlqConfig(). Expected: the documented defaults."""
    cfg = DlqConfig()
    assert cfg == DlqConfig(100_000, 7 * 24 * 3600.0, OverflowPolicy.DROP_OLDEST, 1 << 20, 3)
    assert PutOutcome.STORED.is_stored()
    assert not PutOutcome.REJECTED.is_stored()
    log = default_log_config()  # every subscription has a queue, read by admin calls only
    assert (log.tail_cache_bytes, log.max_record_bytes) == (0, 256 << 20)


# -- the queue over real files ----------------------------------------------------------

asyncio_test = pytest.mark.asyncio(loop_scope="function")


@pytest.fixture
def dlq_dir(tmp_path: Path) -> str:
    """The directory of one subscription's dead-letter queue."""
    return str(tmp_path / "dlq" / "orders" / "billing")


@pytest.fixture
def clock() -> ManualClock:
    """A manual wall clock at T0."""
    return ManualClock(T0)


@pytest_asyncio.fixture
async def dlq(dlq_dir: str, clock: ManualClock) -> AsyncIterator[DeadLetterQueue]:
    """A queue with default settings, small segments and the manual clock."""
    queue = await DeadLetterQueue.open(dlq_dir, DlqConfig(), clock=clock, log_config=SMALL_LOG)
    yield queue
    await queue.aclose()


async def put_each(queue: DeadLetterQueue, ids: range) -> None:
    """Store one letter per id, one put each (so sequence == position in ``ids``)."""
    for i in ids:
        assert await queue.put([letter(i)]) is PutOutcome.STORED


def segment_bases(dlq_dir: str) -> list[int]:
    """Base offsets of the queue log's segments on disk."""
    names = os.listdir(os.path.join(dlq_dir, "log"))
    return sorted(int(n[:-4]) for n in names if n.endswith(".log"))


@asyncio_test
async def test_put_is_peeked_in_order(dlq: DeadLetterQueue, clock: ManualClock) -> None:
    """Scenario: three puts, the clock moving 1 s between them. Expected: count 3,
    sequences 0..2, each entry's original offset and dead-letter time (ms), events_total 3."""
    for i in range(3):
        assert await dlq.put([letter(i)]) is PutOutcome.STORED
        clock.advance(1)
    entries = await dlq.peek()
    assert dlq.count() == dlq.entries == 3
    assert (dlq.first_sequence, dlq.next_sequence) == (0, 3)
    assert [e.sequence for e in entries] == [0, 1, 2]
    assert [e.offset for e in entries] == [1000, 1001, 1002]
    assert [e.dead_lettered_ms for e in entries] == [int(T0 * 1000) + 1000 * i for i in range(3)]
    assert dlq.events_total == 3
    assert await dlq.put([]) is PutOutcome.STORED
    assert dlq.count() == 3


@asyncio_test
@pytest.mark.parametrize(
    ("max_entries", "before", "incoming", "evicted"),
    [
        pytest.param(5, 3, 2, 0, id="fills-exactly"),
        pytest.param(5, 5, 1, 1, id="full-plus-one"),
        pytest.param(5, 4, 3, 2, id="batch-overflows"),
        pytest.param(3, 2, 5, 4, id="batch-larger-than-queue"),
    ],
)
async def test_drop_oldest_evicts_exactly_the_oldest(
    dlq_dir: str, max_entries: int, before: int, incoming: int, evicted: int
) -> None:
    """Scenario: ``before`` entries, then one put of ``incoming`` letters, max_entries as
    given, overflow drop_oldest. Expected: STORED; the queue holds the newest max_entries
    (or fewer) entries in order; evicted_total counts exactly what went."""
    config = DlqConfig(max_entries=max_entries)
    async with await DeadLetterQueue.open(dlq_dir, config, log_config=SMALL_LOG) as dlq:
        await put_each(dlq, range(before))
        outcome = await dlq.put([letter(before + i) for i in range(incoming)])
        assert outcome is PutOutcome.STORED
        total = before + incoming
        assert dlq.evicted_total == evicted
        assert dlq.count() == total - evicted
        assert [e.sequence for e in await dlq.peek()] == list(range(evicted, total))
        assert [e.offset for e in await dlq.peek()] == [1000 + i for i in range(evicted, total)]
        assert dlq.events_total == total


@asyncio_test
@pytest.mark.parametrize(
    ("before", "incoming", "stored"),
    [
        pytest.param(3, 2, True, id="fills-exactly"),
        pytest.param(5, 1, False, id="full"),
        pytest.param(4, 2, False, id="batch-does-not-fit"),
    ],
)
async def test_reject_stores_nothing_and_counts(
    dlq_dir: str, before: int, incoming: int, stored: bool
) -> None:
    """Scenario: max_entries 5, overflow reject, ``before`` entries, then a put of
    ``incoming``. Expected: if it fits, STORED; otherwise REJECTED, none of the letters
    stored, rejected_total += incoming, the queue untouched."""
    config = DlqConfig(max_entries=5, overflow=OverflowPolicy.REJECT)
    async with await DeadLetterQueue.open(dlq_dir, config, log_config=SMALL_LOG) as dlq:
        await put_each(dlq, range(before))
        outcome = await dlq.put([letter(100 + i) for i in range(incoming)])
        assert outcome.is_stored() is stored
        assert dlq.count() == before + (incoming if stored else 0)
        assert dlq.rejected_total == (0 if stored else incoming)
        assert dlq.evicted_total == 0
        assert dlq.events_total == before + (incoming if stored else 0)


@asyncio_test
async def test_block_raises_and_stores_nothing(dlq_dir: str) -> None:
    """Scenario: max_entries 2, overflow block, two entries, then a third put.
    Expected: DlqFullError (a DispatchError) naming topic/subscription, the size, and to
    ack, purge or replay; nothing stored; after an ack the same put is stored."""
    config = DlqConfig(max_entries=2, overflow=OverflowPolicy.BLOCK)
    async with await DeadLetterQueue.open(dlq_dir, config, log_config=SMALL_LOG) as dlq:
        await put_each(dlq, range(2))
        with pytest.raises(DlqFullError) as info:
            await dlq.put([letter(2)])
        message = str(info.value)
        assert "orders/billing is full at 2 entries" in message
        assert "ack, purge or replay" in message
        assert isinstance(info.value, DispatchError)
        assert (dlq.count(), dlq.next_sequence, dlq.events_total) == (2, 2, 2)
        assert (dlq.rejected_total, dlq.evicted_total) == (0, 0)
        assert await dlq.ack_up_to(0) == 1
        assert await dlq.put([letter(2)]) is PutOutcome.STORED
        assert [e.offset for e in await dlq.peek()] == [1001, 1002]


@asyncio_test
async def test_concurrent_puts_never_overfill_a_rejecting_queue(dlq_dir: str) -> None:
    """Scenario: max_entries 3, overflow reject, 2 entries; two tasks put one letter each
    at the same time. Expected: exactly one is stored and one rejected (the overflow check
    and the append are one step)."""
    config = DlqConfig(max_entries=3, overflow=OverflowPolicy.REJECT)
    async with await DeadLetterQueue.open(dlq_dir, config, log_config=SMALL_LOG) as dlq:
        await put_each(dlq, range(2))
        outcomes = await asyncio.gather(dlq.put([letter(8)]), dlq.put([letter(9)]))
        assert sorted(o.value for o in outcomes) == ["rejected", "stored"]
        assert (dlq.count(), dlq.rejected_total) == (3, 1)


@asyncio_test
async def test_peek_filters_by_reason_and_start(dlq: DeadLetterQueue) -> None:
    """Scenario: 10 entries, even ones with reason "timeout after 30 s", odd ones "nack:
    bad schema"; entries 0..1 acked. Expected: reason filters by substring; from_sequence
    starts there (never below the first sequence); limit caps; past the end is empty."""
    for i in range(10):
        reason = "timeout after 30 s" if i % 2 == 0 else "nack: bad schema"
        await dlq.put([letter(i, reason=reason)])
    await dlq.ack_up_to(1)
    assert [e.sequence for e in await dlq.peek(reason="timeout")] == [2, 4, 6, 8]
    assert [e.sequence for e in await dlq.peek(reason="schema", from_sequence=4)] == [5, 7, 9]
    assert [e.sequence for e in await dlq.peek(from_sequence=0, limit=3)] == [2, 3, 4]
    assert [e.sequence for e in await dlq.peek(from_sequence=7, limit=100)] == [7, 8, 9]
    assert (await dlq.peek(reason="timeout", limit=2))[-1].sequence == 4
    assert await dlq.peek(reason="no such reason") == []
    assert await dlq.peek(from_sequence=10) == []
    assert await dlq.peek(limit=0) == []


@asyncio_test
@pytest.mark.parametrize(
    ("sequence", "removed", "first"),
    [
        pytest.param(-1, 0, 0, id="below-everything"),
        pytest.param(0, 1, 1, id="first-only"),
        pytest.param(4, 5, 5, id="inclusive"),
        pytest.param(9, 10, 10, id="last"),
        pytest.param(100, 10, 10, id="past-the-head"),
    ],
)
async def test_ack_up_to_is_inclusive(
    dlq: DeadLetterQueue, sequence: int, removed: int, first: int
) -> None:
    """Scenario: 10 entries (0..9), then ack_up_to(sequence). Expected: every entry at
    or below it is gone, the count of removed ones is returned, and acking the same again
    removes nothing."""
    await put_each(dlq, range(10))
    assert await dlq.ack_up_to(sequence) == removed
    assert dlq.first_sequence == first
    assert dlq.count() == 10 - removed
    assert [e.sequence for e in await dlq.peek()] == list(range(first, 10))
    assert await dlq.ack_up_to(sequence) == 0


@asyncio_test
async def test_a_cancelled_removal_holds_the_lock_until_its_state_write_ends(
    dlq_dir: str,
) -> None:
    """Scenario: an ack_up_to whose state write (in a thread) is slow is cancelled, and
    another ack_up_to follows at once.
    Expected: the second state write starts only after the first one ended (they share a
    temp file), and the reopened queue starts after both acks."""
    fs = _SlowWrites()
    fs.go.set()
    queue = await DeadLetterQueue.open(dlq_dir, DlqConfig(), fs=fs, log_config=SMALL_LOG)
    await put_each(queue, range(5))
    fs.go.clear()
    fs.started.clear()
    fs.events.clear()
    first = asyncio.create_task(queue.ack_up_to(1))
    await asyncio.to_thread(fs.started.wait, 5)
    first.cancel()
    second = asyncio.create_task(queue.ack_up_to(3))
    await asyncio.sleep(0.05)
    assert fs.events == ["start"]  # the second write waits
    fs.go.set()
    assert await second == 2
    with pytest.raises(asyncio.CancelledError):
        await first
    assert fs.events == ["start", "end", "start", "end"]
    await queue.aclose()
    async with await DeadLetterQueue.open(dlq_dir, DlqConfig(), log_config=SMALL_LOG) as again:
        assert again.first_sequence == 4


@asyncio_test
async def test_purge_removes_everything_and_frees_the_disk(
    dlq: DeadLetterQueue, dlq_dir: str
) -> None:
    """Scenario: 12 entries over several 512-byte segments, then purge. Expected: returns
    12, count 0, no segment holding entries is left (the active one is sealed and deleted
    too); later puts continue at sequence 12; a second purge returns 0."""
    await put_each(dlq, range(12))
    assert len(segment_bases(dlq_dir)) > 1
    assert await dlq.purge() == 12
    assert dlq.count() == 0
    assert await dlq.peek() == []
    assert segment_bases(dlq_dir) == [12]
    assert await dlq.purge() == 0
    await dlq.put([letter(99)])
    assert [(e.sequence, e.offset) for e in await dlq.peek()] == [(12, 1099)]


@asyncio_test
@pytest.mark.parametrize(
    ("elapsed_s", "expired"),
    [
        pytest.param(100.0, 0, id="oldest-exactly-max-age"),
        pytest.param(100.001, 1, id="oldest-1ms-over"),
        pytest.param(110.001, 2, id="two-over"),
        pytest.param(120.001, 3, id="all-over"),
    ],
)
async def test_expire_removes_entries_older_than_max_age(
    dlq_dir: str, clock: ManualClock, elapsed_s: float, expired: int
) -> None:
    """Scenario: max_age 100 s; entries dead-lettered at T0, T0+10 s and T0+20 s; the
    clock set to T0 + elapsed. Expected: entries more than 100 s old are removed, one
    exactly 100 s old stays; the count is returned and added to expired_total and
    evicted_total."""
    config = DlqConfig(max_age_s=100.0)
    async with await DeadLetterQueue.open(dlq_dir, config, clock=clock) as dlq:
        for i in range(3):
            clock.now = T0 + 10 * i
            await dlq.put([letter(i)])
        clock.now = T0 + elapsed_s
        assert await dlq.expire() == expired
        assert (dlq.expired_total, dlq.evicted_total) == (expired, expired)
        assert [e.offset for e in await dlq.peek()] == [1000 + i for i in range(expired, 3)]


@asyncio_test
async def test_expire_keeps_everything_without_max_age(dlq_dir: str, clock: ManualClock) -> None:
    """Scenario: max_age None, an entry ten years old. Expected: expire removes nothing."""
    config = DlqConfig(max_age_s=None)
    async with await DeadLetterQueue.open(dlq_dir, config, clock=clock) as dlq:
        await dlq.put([letter(0)])
        clock.advance(10 * 365 * 86_400)
        assert await dlq.expire() == 0
        assert dlq.count() == 1


@asyncio_test
async def test_full_queue_expires_before_it_rejects(dlq_dir: str, clock: ManualClock) -> None:
    """Scenario: max_entries 2, reject, max_age 60 s; two entries, then 61 s later a put.
    Expected: the expired entries make room, so the letter is STORED, not rejected."""
    config = DlqConfig(max_entries=2, overflow=OverflowPolicy.REJECT, max_age_s=60.0)
    async with await DeadLetterQueue.open(dlq_dir, config, clock=clock) as dlq:
        await put_each(dlq, range(2))
        clock.advance(61)
        assert await dlq.put([letter(2)]) is PutOutcome.STORED
        assert (dlq.rejected_total, dlq.expired_total) == (0, 2)
        assert [e.offset for e in await dlq.peek()] == [1002]


@asyncio_test
async def test_replayable_applies_the_queues_guard(dlq_dir: str) -> None:
    """Scenario: max_replays 1; one fresh entry, one replayed once, one truncated.
    Expected: only the fresh one is replayable; the others say why not."""
    config = DlqConfig(max_replays=1, max_event_bytes=16)
    async with await DeadLetterQueue.open(dlq_dir, config) as dlq:
        await dlq.put(
            [
                letter(0),
                letter(1, headers=((HEADER_REPLAY_COUNT, b"1"),)),
                letter(2, value=b"x" * 17),
            ]
        )
        fresh, replayed, cut = await dlq.peek()
        assert dlq.replayable(fresh) is None
        assert "max_replays=1" in (dlq.replayable(replayed) or "")
        assert "truncated" in (dlq.replayable(cut) or "")


# -- durability across reopen -----------------------------------------------------------


@asyncio_test
async def test_state_survives_reopen(dlq_dir: str) -> None:
    """Scenario: 10 entries over small segments, ack_up_to(3), close, reopen.
    Expected: entries 0..3 stay gone, 4..9 are all there with their fields, the count is
    6, counters start from zero, and new puts continue at sequence 10."""
    config = DlqConfig()
    async with await DeadLetterQueue.open(dlq_dir, config, log_config=SMALL_LOG) as dlq:
        await put_each(dlq, range(10))
        await dlq.ack_up_to(3)
        before = await dlq.peek()
    async with await DeadLetterQueue.open(dlq_dir, config, log_config=SMALL_LOG) as dlq:
        assert (dlq.first_sequence, dlq.next_sequence, dlq.count()) == (4, 10, 6)
        assert await dlq.peek() == before
        assert (dlq.events_total, dlq.evicted_total, dlq.rejected_total) == (0, 0, 0)
        await dlq.put([letter(10)])
        assert (await dlq.peek())[-1].sequence == 10


@asyncio_test
async def test_ack_deletes_whole_segments_below(dlq: DeadLetterQueue, dlq_dir: str) -> None:
    """Scenario: 20 entries over 512-byte segments, then ack_up_to(12). Expected: every
    segment whose entries all lie at or below 12 is gone from disk; the segment holding 13
    stays; the log's first offset is at or below 13."""
    await put_each(dlq, range(20))
    bases = segment_bases(dlq_dir)
    assert len(bases) >= 4
    await dlq.ack_up_to(12)
    kept = [b for i, b in enumerate(bases) if i + 1 == len(bases) or bases[i + 1] > 13]
    assert segment_bases(dlq_dir) == kept
    assert kept[0] <= 13
    assert [e.sequence for e in await dlq.peek()] == list(range(13, 20))


@asyncio_test
async def test_reopen_after_save_but_before_segment_delete(dlq_dir: str) -> None:
    """Scenario: the state file is saved but renaming the doomed segments fails (as if
    the broker died between the two). Expected: ack_up_to still reports the removal; the
    segments stay on disk; after reopening the acked entries stay gone and the rest stay;
    the next removal deletes the leftover segments."""
    fs = FaultyFs()
    config = DlqConfig()
    async with await DeadLetterQueue.open(dlq_dir, config, fs=fs, log_config=SMALL_LOG) as dlq:
        await put_each(dlq, range(12))
        bases = segment_bases(dlq_dir)
        fs.faults.append(Fault("rename", errno.EIO, path_contains=".log"))
        assert await dlq.ack_up_to(7) == 8
        assert segment_bases(dlq_dir) == bases
    async with await DeadLetterQueue.open(dlq_dir, config, log_config=SMALL_LOG) as dlq:
        assert (dlq.first_sequence, dlq.count()) == (8, 4)
        assert [e.offset for e in await dlq.peek()] == [1008, 1009, 1010, 1011]
        await dlq.ack_up_to(8)
        assert segment_bases(dlq_dir)[0] > 0


@asyncio_test
async def test_failed_state_save_removes_nothing(dlq_dir: str) -> None:
    """Scenario: saving the state file fails (EIO on its rename) during ack_up_to.
    Expected: WalIOError naming the state file; nothing removed now or after reopening."""
    fs = FaultyFs()
    config = DlqConfig()
    async with await DeadLetterQueue.open(dlq_dir, config, fs=fs, log_config=SMALL_LOG) as dlq:
        await put_each(dlq, range(5))
        fs.faults.append(Fault("rename", errno.EIO, path_contains="state.json"))
        with pytest.raises(WalIOError, match=r"state\.json"):
            await dlq.ack_up_to(2)
        assert (dlq.first_sequence, dlq.count()) == (0, 5)
    async with await DeadLetterQueue.open(dlq_dir, config, log_config=SMALL_LOG) as dlq:
        assert (dlq.first_sequence, dlq.count()) == (0, 5)


@asyncio_test
@pytest.mark.parametrize(
    "fault",
    [
        # (not ENOSPC: a write that finds the disk full is cut back and does not latch)
        pytest.param(Fault("pwritev", errno.EIO, path_contains=".log"), id="write-EIO"),
        pytest.param(Fault("fdatasync", errno.EIO, path_contains=".log"), id="fdatasync-EIO"),
    ],
)
async def test_failing_disk_makes_put_raise(dlq_dir: str, fault: Fault) -> None:
    """Scenario: three entries stored, then the disk fails the next put's write or sync.
    Expected: put raises a WalError, count and peek are unchanged, events_total does not
    count it, and later puts keep failing (the log is latched). After reopening on a
    healthy disk every stored entry is intact (the failed one may be there too: it was
    never acknowledged, so showing it twice beats losing it)."""
    fs = FaultyFs()
    config = DlqConfig()
    async with await DeadLetterQueue.open(dlq_dir, config, fs=fs, log_config=SMALL_LOG) as dlq:
        await put_each(dlq, range(3))
        before = await dlq.peek()
        fs.faults.append(fault)
        with pytest.raises(WalError):
            await dlq.put([letter(3)])
        assert (dlq.count(), await dlq.peek(), dlq.events_total) == (3, before, 3)
        with pytest.raises(WalError):
            await dlq.put([letter(4)])
        assert dlq.count() == 3
    async with await DeadLetterQueue.open(dlq_dir, config, log_config=SMALL_LOG) as dlq:
        assert (await dlq.peek())[:3] == before
        assert [e.offset for e in (await dlq.peek())[3:]] in ([], [1003])


@asyncio_test
async def test_damaged_state_file_restarts_at_the_oldest_entry(dlq_dir: str) -> None:
    """Scenario: the state file is overwritten with garbage. Expected: it is kept as
    ``state.json.corrupt`` and the queue restarts at the oldest entry its log holds
    (acked entries may show again; none is lost)."""
    async with await DeadLetterQueue.open(dlq_dir, DlqConfig()) as dlq:
        await put_each(dlq, range(4))
        await dlq.ack_up_to(1)
    Path(dlq_dir, "state.json").write_bytes(b"{not json")
    async with await DeadLetterQueue.open(dlq_dir, DlqConfig()) as dlq:
        assert (dlq.first_sequence, dlq.count()) == (0, 4)
    assert Path(dlq_dir, "state.json.corrupt").read_bytes() == b"{not json"


@asyncio_test
async def test_saved_sequence_past_the_head_is_clamped_and_saved(dlq_dir: str) -> None:
    """Scenario: the state file claims first_sequence 50 but the log ends at 3 (its tail
    was lost). Expected: the queue opens empty at 3, and saves that, so entries put now
    are still there after the next reopen (not hidden below a stale 50)."""
    async with await DeadLetterQueue.open(dlq_dir, DlqConfig()) as dlq:
        await put_each(dlq, range(3))
    Path(dlq_dir, "state.json").write_bytes(b'{"version":1,"first_sequence":50}')
    async with await DeadLetterQueue.open(dlq_dir, DlqConfig()) as dlq:
        assert (dlq.first_sequence, dlq.count()) == (3, 0)
        await dlq.put([letter(3)])
    async with await DeadLetterQueue.open(dlq_dir, DlqConfig()) as dlq:
        assert [(e.sequence, e.offset) for e in await dlq.peek()] == [(3, 1003)]


@asyncio_test
async def test_closed_queue_refuses_changes(dlq_dir: str) -> None:
    """Scenario: a queue is closed twice, then used. Expected: the second close is a
    no-op; put, ack_up_to, purge and expire raise WalClosedError."""
    dlq = await DeadLetterQueue.open(dlq_dir, DlqConfig(), fs=FileSystem())
    await dlq.put([letter(0)])
    await dlq.aclose()
    await dlq.aclose()
    with pytest.raises(WalClosedError):
        await dlq.put([letter(1)])
    ops: list[Callable[[], Awaitable[int]]] = [lambda: dlq.ack_up_to(0), dlq.purge, dlq.expire]
    for op in ops:
        with pytest.raises(WalClosedError):
            await op()


def test_entries_of_a_batch_read_from_disk_keep_their_sequences() -> None:
    """Scenario: a batch whose base offset was patched to 40 (as the log does).
    Expected: decoded entries carry sequences 40 and 41."""
    data = encode_letters([letter(0), letter(1)], now_ms=5, max_event_bytes=64)
    batch = decode_batch(RecordBatch.with_base_offset(_decoded(data), 40))
    assert batch is not None
    assert [e.sequence for e in decode_entries(batch)] == [40, 41]


def _decoded(data: bytes) -> RecordBatch:
    batch = decode_batch(data)
    assert batch is not None
    return batch
