"""A dead-letter queue's settings and its put outcomes (pure).

Owns :class:`DlqConfig` (validated on construction: a wrong value raises
:class:`~dispatcher.errors.DlqConfigError` naming the field and what is allowed),
:class:`OverflowPolicy` (what a full queue does) and :class:`PutOutcome` (what a put did).
A full queue under ``BLOCK`` raises :class:`~dispatcher.errors.DlqFullError`. The queue
that applies them is :mod:`dispatcher.dead_letter_queue`; the broker's config file builds a
:class:`DlqConfig` from ``[dlq]``. DESIGN section 3.

Example: ``DlqConfig(max_entries=0)`` raises ``DlqConfigError("max_entries", 0, "must be an
integer of at least 1")``; ``DlqConfig(max_replays=0)`` is valid and forbids every replay.

Pure: imports neither ``asyncio``, ``os`` nor ``time``; imports the pure
``dispatcher.errors`` and ``dispatcher.dead_letter_records`` only.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

from dispatcher.dead_letter_records import MAX_REPLAY_COUNT
from dispatcher.errors import DlqConfigError

_MIB = 1 << 20
#: The largest ``max_event_bytes``: 1 MiB under the WAL's largest record, for key and headers.
MAX_EVENT_BYTES_LIMIT = 255 * _MIB


class OverflowPolicy(enum.Enum):
    """What ``put`` does when new entries would take the queue past ``max_entries``.

    - ``DROP_OLDEST`` (default): store them, then evict the oldest entries down to
      ``max_entries`` (counted in ``evicted_total``). The evicted records are lost.
    - ``REJECT``: store none of them and return :attr:`PutOutcome.REJECTED` (counted in
      ``rejected_total``); the subscription applies its fallback.
    - ``BLOCK``: store none of them and raise :class:`~dispatcher.errors.DlqFullError`;
      the subscription keeps the records unacknowledged until someone acks, purges or
      replays the queue.
    """

    DROP_OLDEST = "drop_oldest"
    REJECT = "reject"
    BLOCK = "block"


class PutOutcome(enum.Enum):
    """What :meth:`DeadLetterQueue.put` did with the letters."""

    STORED = "stored"
    REJECTED = "rejected"

    def is_stored(self) -> bool:
        """Whether the letters are durable in the queue (the originals may be acked)."""
        return self is PutOutcome.STORED


@dataclass(frozen=True, slots=True)
class DlqConfig:
    """Settings of one dead-letter queue.

    Attributes:
        max_entries: Most entries held, count. Default 100 000; at least 1.
        max_age_s: Entries dead-lettered longer ago than this are removed by ``expire``,
            seconds. Default 7 days; ``None`` keeps them forever.
        overflow: What a full queue does; see :class:`OverflowPolicy`. Default
            ``DROP_OLDEST``.
        max_event_bytes: Values longer than this are cut to it and flagged ``truncated``,
            bytes. Default 1 MiB; from 1 to 255 MiB.
        max_replays: An entry whose ``x-replay-count`` has reached this is not replayed
            again (the loop guard), count. Default 3; 0 forbids every replay; at most
            ``MAX_REPLAY_COUNT`` (2**32 - 1), where a clamped count stops.
    """

    max_entries: int = 100_000
    max_age_s: float | None = 7 * 24 * 3600.0
    overflow: OverflowPolicy = OverflowPolicy.DROP_OLDEST
    max_event_bytes: int = _MIB
    max_replays: int = 3

    def __post_init__(self) -> None:
        _check_int("max_entries", self.max_entries, 1, None)
        _check_int("max_event_bytes", self.max_event_bytes, 1, MAX_EVENT_BYTES_LIMIT)
        _check_int("max_replays", self.max_replays, 0, MAX_REPLAY_COUNT)
        age = self.max_age_s
        if age is not None and (
            isinstance(age, bool)
            or not isinstance(age, int | float)
            or not math.isfinite(age)
            or age <= 0
        ):
            raise DlqConfigError(
                "max_age_s", age, "must be a positive finite number of seconds, or None"
            )
        if not isinstance(self.overflow, OverflowPolicy):
            allowed = ", ".join(p.value for p in OverflowPolicy)
            raise DlqConfigError("overflow", self.overflow, f"must be one of {allowed}")


def _check_int(field: str, value: object, lo: int, hi: int | None) -> None:
    if (
        not isinstance(value, int)
        or isinstance(value, bool)
        or value < lo
        or (hi is not None and value > hi)
    ):
        span = f"from {lo} to {hi}" if hi is not None else f"of at least {lo}"
        raise DlqConfigError(field, value, f"must be an integer {span}")
