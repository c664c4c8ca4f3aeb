"""Dead letters as records (dispatcher/dead_letter_records.py): the pure entry codec.

No event loop and no disk. Claims checked (DESIGN section 3, "Dead-letter queue"): every
field and header survives the round trip; values are cut at ``max_event_bytes`` and
flagged; damaged bookkeeping headers are a damaged queue; replay's loop guard holds.
"""

from __future__ import annotations

import pytest

from dispatcher.dead_letter_records import (
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
from dispatcher.errors import DispatchError, DlqCorruptError
from wal import RecordBatch, decode_batch, encode_columns


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
