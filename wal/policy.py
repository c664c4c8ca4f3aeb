"""When to roll a segment and which segments retention may delete.

Role: the pure rules, separated from the files they govern. The caller supplies ``now`` and
the facts about each segment; these functions only decide.

Invariants:
- An empty segment never rolls (a batch larger than ``segment_bytes`` gets a segment alone).
- Retention deletes a prefix of the sealed segments, oldest first, never the active one, and
  never a segment holding an offset at or above the caller's ``floor_offset``.

Size retention follows Kafka's rule: a segment is deleted only if the log would still hold
at least ``retention_bytes`` without it, so the log never shrinks below the limit.

Example: sealed [0..100) 10 MiB, sealed [100..200) 10 MiB, active [200..) 6 MiB (26 MiB),
retention_bytes 15 MiB, floor 250: the first segment goes (26 - 10 = 16 >= 15), the second
stays (16 - 10 = 6 < 15). With floor 150 the first still goes (it ends at 100 <= 150) and
the second would be protected by the floor anyway (it holds offset 150).

Pure module: imports neither ``asyncio``, ``os`` nor ``time``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SegmentInfo:
    """What retention needs to know of one segment.

    Attributes:
        base_offset: First offset of the segment.
        next_offset: Offset just past its last record.
        size_bytes: Bytes in its ``.log`` file.
        max_timestamp_ms: Largest record timestamp in it, or ``None`` when empty.
    """

    base_offset: int
    next_offset: int
    size_bytes: int
    max_timestamp_ms: int | None


def should_roll(
    *,
    segment_size: int,
    incoming_bytes: int,
    segment_age_ms: int | None,
    segment_bytes: int,
    segment_ms: int | None,
) -> bool:
    """Whether the active segment must be sealed before ``incoming_bytes`` are appended.

    Args:
        segment_size: Bytes already in the active segment.
        incoming_bytes: Size of the batch about to be appended.
        segment_age_ms: Milliseconds since the segment's first append, or ``None``.
        segment_bytes: Roll when the segment would exceed this many bytes.
        segment_ms: Roll when the segment is at least this old, or ``None`` for never.
    """
    if segment_size == 0:
        return False
    if segment_size + incoming_bytes > segment_bytes:
        return True
    return segment_ms is not None and segment_age_ms is not None and segment_age_ms >= segment_ms


def segments_to_delete(
    segments: Sequence[SegmentInfo],
    *,
    now_ms: int,
    retention_ms: int | None,
    retention_bytes: int | None,
    floor_offset: int | None,
) -> list[int]:
    """Base offsets of the segments retention deletes, oldest first.

    Args:
        segments: Every segment, oldest first; the last is the active one.
        now_ms: Current wall-clock time, ms since the epoch.
        retention_ms: Delete segments whose newest record is older than this; ``None`` = keep.
        retention_bytes: Delete oldest segments while the log without them still holds at
            least this many bytes; ``None`` = keep.
        floor_offset: Never delete a segment holding this offset or a later one (the minimum
            cursor of the subscriptions); ``None`` = no floor.
    """
    total = sum(s.size_bytes for s in segments)
    doomed: list[int] = []
    for seg in segments[:-1]:
        if floor_offset is not None and seg.next_offset > floor_offset:
            break
        too_old = (
            retention_ms is not None
            and seg.max_timestamp_ms is not None
            and now_ms - seg.max_timestamp_ms > retention_ms
        )
        too_big = retention_bytes is not None and total - seg.size_bytes >= retention_bytes
        if not (too_old or too_big):
            break
        doomed.append(seg.base_offset)
        total -= seg.size_bytes
    return doomed
