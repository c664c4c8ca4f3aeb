"""Dead letters as records: what a dead-letter queue stores and how it is encoded.

Owns what goes into a dead-letter queue (:class:`DeadLetter`), what comes out
(:class:`DlqEntry`), the bookkeeping headers (``HEADER_*``, :data:`RESERVED_HEADERS`), the
pure codec between them and record batches (:func:`encode_letters`,
:func:`decode_entries`) and what a replay publishes (:func:`replay_record`, with its
``x-replay-count`` loop guard, :func:`replay_refusal`). DESIGN section 3. The queue that
stores them is :mod:`dispatcher.dead_letter_queue`.

An entry is one record: the original key, the original value cut to ``max_event_bytes``,
the dead-letter time as the record timestamp, and the original headers plus the
bookkeeping headers. Original headers that use one of those reserved names are
overwritten; ``x-replay-count`` is an original header, kept as it is. An entry whose
bookkeeping headers are missing or garbled raises :class:`DlqCorruptError` when decoded.
Imports ``wal`` and ``dispatcher.errors`` only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from dispatcher.errors import DlqCorruptError
from proto.shown import shown
from wal import RecordBatch, encode_columns

HEADER_TOPIC = "x-original-topic"
HEADER_PARTITION = "x-original-partition"
HEADER_OFFSET = "x-original-offset"
HEADER_SUBSCRIPTION = "x-original-subscription"
HEADER_TIMESTAMP = "x-original-timestamp-ms"
HEADER_ATTEMPTS = "x-delivery-attempt"
HEADER_REASON = "x-failure-reason"
HEADER_ATTEMPT_TIMES = "x-dlq-attempt-times-ms"  # comma-separated ms, oldest first
HEADER_TRUNCATED = "x-dlq-truncated"  # "1" when the value was cut, else "0"
HEADER_ORIGINAL_BYTES = "x-dlq-original-bytes"  # length of the original value
#: An original header: how often the record was replayed from a DLQ (ASCII digits).
HEADER_REPLAY_COUNT = "x-replay-count"
#: Largest replay count read from that header (the wire's uint32); larger ones are clamped.
MAX_REPLAY_COUNT = 2**32 - 1
_MAX_REPLAY_DIGITS = len(str(MAX_REPLAY_COUNT))
#: The bookkeeping headers: added to each entry, stripped from ``DlqEntry.headers``.
RESERVED_HEADERS = frozenset(
    {
        HEADER_TOPIC,
        HEADER_PARTITION,
        HEADER_OFFSET,
        HEADER_SUBSCRIPTION,
        HEADER_TIMESTAMP,
        HEADER_ATTEMPTS,
        HEADER_REASON,
        HEADER_ATTEMPT_TIMES,
        HEADER_TRUNCATED,
        HEADER_ORIGINAL_BYTES,
    }
)


Headers = tuple[tuple[str, bytes], ...]


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A record a subscription gives up on, handed to its dead-letter queue.

    Attributes:
        topic, partition, offset, subscription: Where the record came from.
        key, value: The original record's key (or ``None``) and value.
        headers: The original headers as ``(name, value)`` pairs, in order; a name may
            repeat, as it may in any record.
        timestamp_ms: The original publish time, ms since the epoch.
        attempts: How often delivery was attempted.
        reason: Why it failed (the last nack reason, "ack timeout", ...).
        attempt_times_ms: When each attempt was made, ms since the epoch, oldest first.
    """

    topic: str
    partition: int
    offset: int
    subscription: str
    key: bytes | None
    value: bytes
    headers: Headers
    timestamp_ms: int
    attempts: int
    reason: str
    attempt_times_ms: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class DlqEntry:
    """One stored dead letter, as ``peek`` returns it.

    Attributes:
        sequence: Its offset in the queue's log; ``ack_up_to`` takes it.
        topic, partition, offset, subscription: Where the record came from.
        key, value: The original key and value (the value cut when ``truncated``).
        headers: The original headers, without the bookkeeping ones.
        timestamp_ms: The original publish time, ms since the epoch.
        attempts, reason, attempt_times_ms: As in :class:`DeadLetter`.
        dead_lettered_ms: When it entered the queue, ms since the epoch.
        truncated: Whether the value was cut to ``max_event_bytes``.
        original_size: Length of the original value, bytes.
        replay_count: ``x-replay-count`` of the original headers (0 when absent or not
            digits; at most :data:`MAX_REPLAY_COUNT`).
    """

    sequence: int
    topic: str
    partition: int
    offset: int
    subscription: str
    key: bytes | None
    value: bytes
    headers: Headers
    timestamp_ms: int
    attempts: int
    reason: str
    attempt_times_ms: tuple[int, ...]
    dead_lettered_ms: int
    truncated: bool
    original_size: int
    replay_count: int


# ---------------------------------------------------------------------------------------
# The entry codec (pure)


def encode_letters(letters: Sequence[DeadLetter], now_ms: int, max_event_bytes: int) -> bytes:
    """Encode dead letters into one record batch, one record each.

    Args:
        letters: The letters, at least one.
        now_ms: The dead-letter time (the records' timestamp), ms since the epoch.
        max_event_bytes: Values longer than this are cut to it and flagged truncated.

    Returns:
        The batch bytes (``base_offset`` 0; the log assigns the sequences).

    Raises:
        EmptyBatchError: ``letters`` is empty.
    """
    return encode_columns(
        [letter.value[:max_event_bytes] for letter in letters],
        keys=[letter.key for letter in letters],
        timestamps_ms=now_ms,
        headers=[_entry_headers(letter, max_event_bytes) for letter in letters],
    )


def _entry_headers(letter: DeadLetter, max_event_bytes: int) -> list[tuple[str, bytes]]:
    """The original headers in order (repeated names kept), those with a bookkeeping name
    dropped, then the bookkeeping headers: each of those names once."""
    headers = [(name, value) for name, value in letter.headers if name not in RESERVED_HEADERS]
    headers += [
        (HEADER_TOPIC, letter.topic.encode()),
        (HEADER_PARTITION, _digits(letter.partition)),
        (HEADER_OFFSET, _digits(letter.offset)),
        (HEADER_SUBSCRIPTION, letter.subscription.encode()),
        (HEADER_TIMESTAMP, _digits(letter.timestamp_ms)),
        (HEADER_ATTEMPTS, _digits(letter.attempts)),
        (HEADER_REASON, letter.reason.encode()),
        (HEADER_ATTEMPT_TIMES, b",".join(_digits(t) for t in letter.attempt_times_ms)),
        (HEADER_TRUNCATED, b"1" if len(letter.value) > max_event_bytes else b"0"),
        (HEADER_ORIGINAL_BYTES, _digits(len(letter.value))),
    ]
    return headers


def _digits(n: int) -> bytes:
    return str(int(n)).encode("ascii")


def decode_entries(batch: RecordBatch) -> list[DlqEntry]:
    """Decode every entry of a batch read from a queue's log.

    Raises:
        DlqCorruptError: a record lacks a bookkeeping header or holds a malformed one.
    """
    return [
        _decode_entry(seq, key, value, headers, ts)
        for seq, key, value, headers, ts in zip(
            batch.offsets(),
            batch.keys(),
            batch.values(),
            batch.header_lists(),
            batch.timestamps().tolist(),
            strict=True,
        )
    ]


def _decode_entry(
    seq: int, key: bytes | None, value: bytes, pairs: list[tuple[str, bytes]], ts: int
) -> DlqEntry:
    headers = dict(pairs)  # the bookkeeping names appear once each (see _entry_headers)
    return DlqEntry(
        sequence=seq,
        topic=_text(headers, HEADER_TOPIC, seq),
        partition=_integer(headers, HEADER_PARTITION, seq),
        offset=_integer(headers, HEADER_OFFSET, seq),
        subscription=_text(headers, HEADER_SUBSCRIPTION, seq),
        key=key,
        value=value,
        headers=tuple((n, v) for n, v in pairs if n not in RESERVED_HEADERS),
        timestamp_ms=_integer(headers, HEADER_TIMESTAMP, seq),
        attempts=_integer(headers, HEADER_ATTEMPTS, seq),
        reason=_text(headers, HEADER_REASON, seq),
        attempt_times_ms=_integers(headers, HEADER_ATTEMPT_TIMES, seq),
        dead_lettered_ms=ts,
        truncated=_flag(headers, HEADER_TRUNCATED, seq),
        original_size=_integer(headers, HEADER_ORIGINAL_BYTES, seq),
        replay_count=replay_count_of(headers),
    )


def _raw(headers: Mapping[str, bytes], name: str, seq: int) -> bytes:
    raw = headers.get(name)
    if raw is None:
        raise DlqCorruptError(seq, name, "is missing")
    return raw


def _text(headers: Mapping[str, bytes], name: str, seq: int) -> str:
    try:
        return _raw(headers, name, seq).decode()
    except UnicodeDecodeError as exc:
        raise DlqCorruptError(seq, name, f"is not UTF-8 ({exc.reason})") from exc


def _integer(headers: Mapping[str, bytes], name: str, seq: int) -> int:
    raw = _raw(headers, name, seq)
    try:
        return int(raw)
    except ValueError as exc:
        raise DlqCorruptError(seq, name, f"is {shown(raw)}, not an integer") from exc


def _integers(headers: Mapping[str, bytes], name: str, seq: int) -> tuple[int, ...]:
    raw = _raw(headers, name, seq)
    try:
        return tuple(int(part) for part in raw.split(b",")) if raw else ()
    except ValueError as exc:
        raise DlqCorruptError(seq, name, f"is {shown(raw)}, not comma-separated integers") from exc


def _flag(headers: Mapping[str, bytes], name: str, seq: int) -> bool:
    raw = _raw(headers, name, seq)
    if raw not in (b"0", b"1"):
        raise DlqCorruptError(seq, name, f"is {shown(raw)}, not 0 or 1")
    return raw == b"1"


def replay_count_of(headers: Mapping[str, bytes]) -> int:
    """``x-replay-count`` of ``headers``, read as the untrusted producer input it is.

    0 when absent or not ASCII digits; a count above :data:`MAX_REPLAY_COUNT` (however many
    digits) is clamped to it, so a hostile value neither breaks the decoding of its entry
    nor overflows the wire's uint32, and the loop guard still refuses it.
    """
    raw = headers.get(HEADER_REPLAY_COUNT, b"")
    if not raw.isdigit():  # bytes.isdigit: ASCII digits only, and False when empty
        return 0
    digits = raw.lstrip(b"0")
    if len(digits) > _MAX_REPLAY_DIGITS:  # int() of 5,000 digits raises; never try
        return MAX_REPLAY_COUNT
    return min(int(digits or b"0"), MAX_REPLAY_COUNT)


def replay_refusal(entry: DlqEntry, max_replays: int) -> str | None:
    """``None`` when ``entry`` may be replayed, else why not (to show the operator)."""
    if entry.truncated:
        return (
            f"entry {entry.sequence} was truncated from {entry.original_size} to "
            f"{len(entry.value)} bytes (max_event_bytes); the rest of the payload is lost, so "
            "it cannot be replayed; handle it by hand, then ack it"
        )
    if entry.replay_count >= max_replays:
        return (
            f"entry {entry.sequence} was replayed {entry.replay_count} times already "
            f"(max_replays={max_replays}); replaying it again could loop forever; fix the "
            "consumer or the record, then ack it"
        )
    return None


def replay_record(entry: DlqEntry) -> tuple[bytes | None, bytes, list[tuple[str, bytes]]]:
    """Key, value and headers to publish ``entry`` again to its original topic.

    The headers are the original ones in order (repeated names kept), then
    ``x-replay-count`` incremented, once (any earlier one is dropped). Check
    :func:`replay_refusal` (or :meth:`DeadLetterQueue.replayable`) first.
    """
    headers = [(name, value) for name, value in entry.headers if name != HEADER_REPLAY_COUNT]
    headers.append((HEADER_REPLAY_COUNT, _digits(min(entry.replay_count + 1, MAX_REPLAY_COUNT))))
    return entry.key, entry.value, headers
