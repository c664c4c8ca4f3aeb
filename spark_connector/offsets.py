"""Offsets: Spark's JSON offsets, admission control, data-loss rules and task planning.

Role: every decision about *which* records a micro-batch or a batch read covers, as pure
functions, so they are tested without Spark, a loop or a broker. The reader feeds them the
topic's retained range per partition and acts on what they return.

A Spark offset is a JSON dict ``{"<partition>": <next offset>, "topic_id": "<id>"}``: the
first offset *not* yet covered, per partition, and the id of the topic they are offsets of
(the broker draws one when it creates a topic; see :func:`recreated`). Keys are built in
ascending partition order, the id last, always, because Spark compares offsets as JSON
text: the same positions in another key order would look like new data and run empty
batches forever. Offsets without ``topic_id`` (checkpoints written before it, or a topic
created before topics had ids) are read as ever, and no recreation is detected for them.

Worked example: partitions 0-2 retain ``[0, 100)``, ``[0, 10)``, ``[0, 0)``; a query
starts at ``{"0": 40, "1": 10, "2": 0}`` with ``maxRecordsPerTrigger = 30``. Partition 0
has 60 records waiting and the others none, so :func:`admit` gives all 30 to partition 0:
end ``{"0": 70, "1": 10, "2": 0}``. With 60 waiting on 0 and 5 on 1, partition 1 takes its
5 and partition 0 the other 25 (water-filling: no partition gets less than an equal share
unless it has less waiting). :func:`plan` then gives one task per partition with records,
or cuts large ranges when ``minPartitions`` asks for more tasks.

Pure module: imports neither ``asyncio``, ``os`` nor ``time``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from spark_connector.errors import ConnectorError
from spark_connector.options import EARLIEST, LATEST

Offsets = dict[int, int]


@dataclass(frozen=True, slots=True)
class Retained:
    """What one partition holds: offsets ``[first, head)``."""

    first: int
    head: int


@dataclass(frozen=True, slots=True)
class Loss:
    """Records a query has not read that are gone from one partition.

    Attributes:
        partition: The partition.
        expected: The offset the query would read next.
        resume: Where reading can go on (the first retained offset, or the new topic's
            first offset), or ``None`` when the partition no longer exists.
        reason: Why, in words.
    """

    partition: int
    expected: int
    resume: int | None
    reason: str


#: The key of a Spark offset that holds the topic's id.
TOPIC_ID = "topic_id"


def to_spark(offsets: Mapping[int, int], topic_id: str = "") -> dict[str, int | str]:
    """Spark's JSON form, keys in ascending partition order, then the topic's id when it
    has one (see the module docstring)."""
    out: dict[str, int | str] = {str(p): int(offsets[p]) for p in sorted(offsets)}
    if topic_id:
        out[TOPIC_ID] = topic_id
    return out


def topic_id_of(doc: Mapping[str, Any]) -> str:
    """The topic id a Spark offset records; ``""`` when it records none."""
    value = doc.get(TOPIC_ID, "")
    return value if isinstance(value, str) else ""


def from_spark(doc: Mapping[str, Any]) -> Offsets:
    """Read back the positions of an offset Spark stored (in its checkpoint) or passed in
    (its topic id is :func:`topic_id_of`'s).

    Raises:
        ConnectorError: ``doc`` is not a headrace offset (another source's checkpoint).
    """
    out: Offsets = {}
    for key, value in doc.items():
        if key == TOPIC_ID and isinstance(value, str):
            continue
        if not (isinstance(key, str) and key.isdigit()) or type(value) is not int or value < 0:
            raise ConnectorError(
                f"offset {dict(doc)!r} is not a headrace offset ({{partition: next offset}}); "
                "was this checkpoint written by another source? Use a new checkpoint location"
            )
        out[int(key)] = value
    return out


def resolve(spec: Mapping[int, int], retained: list[Retained], *, default: int) -> Offsets:
    """Turn a partition -> offset spec with ``EARLIEST``/``LATEST`` into real offsets.

    Partitions the spec does not name get ``default`` (``EARLIEST`` or ``LATEST``). Offsets
    are not clamped: one outside the retained range is reported by :func:`losses`.

    Raises:
        ConnectorError: The spec names a partition the topic does not have.
    """
    for p in spec:
        if p >= len(retained):
            raise ConnectorError(
                f"partition {p} does not exist; the topic has partitions 0-{len(retained) - 1}"
            )
    out: Offsets = {}
    for p, r in enumerate(retained):
        offset = spec.get(p, default)
        out[p] = r.first if offset == EARLIEST else r.head if offset == LATEST else offset
    return out


def losses(position: Mapping[int, int], retained: list[Retained]) -> list[Loss]:
    """Where records at or after ``position`` are gone, per partition.

    Three cases: the partition no longer exists (the topic was deleted and created with
    fewer partitions); the position is past the head (the topic was deleted and created
    again, so offsets started over); or retention deleted records below the first retained
    offset.
    """
    out = []
    for p, offset in sorted(position.items()):
        if p >= len(retained):
            out.append(Loss(p, offset, None, "the partition no longer exists"))
            continue
        r = retained[p]
        if offset > r.head:
            reason = (
                f"the head is {r.head}, below the query's position: the topic was deleted "
                "and created again, or its data was lost"
            )
            out.append(Loss(p, offset, r.first, reason))
        elif offset < r.first:
            reason = f"records {offset}-{r.first - 1} were deleted by retention"
            out.append(Loss(p, offset, r.first, reason))
    return out


def topic_changed(was: str, now: str) -> bool:
    """Whether the topic's id changed from ``was`` to ``now`` (it was deleted and created
    again); False when either is unknown (``""``)."""
    return bool(was and now and was != now)


def recreated(
    position: Mapping[int, int], was: str, now: str, retained: list[Retained]
) -> list[Loss]:
    """Every partition of ``position`` lost when the topic's id changed from ``was`` to
    ``now``: the topic was deleted and created again, so its offsets count other records
    (a position may even lie below the new head, where nothing else would notice). Reading
    can go on at the new topic's first offsets. Nothing when either id is unknown (``""``).
    """
    if not topic_changed(was, now):
        return []
    reason = f"the topic was deleted and created again (its id was {was}, now {now})"
    return [
        Loss(p, offset, retained[p].first if p < len(retained) else None, reason)
        for p, offset in sorted(position.items())
    ]


def describe(topic: str, found: list[Loss]) -> str:
    """One message for a data-loss error or warning."""
    parts = "; ".join(f"{topic}/{x.partition} at offset {x.expected}: {x.reason}" for x in found)
    return f"records the query has not read are gone ({parts})"


def skip_lost(position: Mapping[int, int], found: list[Loss]) -> Offsets:
    """``position`` moved past lost records (``failOnDataLoss=false``); partitions that no
    longer exist are dropped."""
    out = dict(position)
    for x in found:
        if x.resume is None:
            out.pop(x.partition, None)
        else:
            out[x.partition] = x.resume
    return out


def admit(start: Mapping[int, int], heads: Mapping[int, int], max_records: int | None) -> Offsets:
    """The end of the next micro-batch: every partition's head, or fewer records when
    ``max_records`` caps the batch, split fairly (water-filling; see the module docstring).

    Partitions in ``heads`` but not in ``start`` (added since) start at 0. The result has
    exactly the partitions of ``heads``; no offset moves backwards from ``start``.
    """
    begin = {p: start.get(p, 0) for p in heads}
    waiting = {p: max(0, heads[p] - begin[p]) for p in heads}
    if max_records is None or sum(waiting.values()) <= max_records:
        return {p: begin[p] + waiting[p] for p in sorted(heads)}
    take = dict.fromkeys(heads, 0)
    left = max_records
    order = sorted(heads, key=lambda p: (waiting[p], p))
    for i, p in enumerate(order):
        take[p] = min(waiting[p], left // (len(order) - i))
        left -= take[p]
    for p in sorted(heads):  # what integer division left over, one each, in order
        if left == 0:
            break
        if take[p] < waiting[p]:
            take[p] += 1
            left -= 1
    return {p: begin[p] + take[p] for p in sorted(heads)}


@dataclass(frozen=True, slots=True)
class Range:
    """Offsets ``[start, end)`` of one partition: the work of one Spark task."""

    partition: int
    start: int
    end: int

    @property
    def count(self) -> int:
        """Records in the range."""
        return self.end - self.start


def plan(
    start: Mapping[int, int], end: Mapping[int, int], min_partitions: int | None
) -> list[Range]:
    """The tasks that read ``[start, end)``: one per partition with records, or more when
    ``min_partitions`` asks for more, cutting each range in proportion to its size.

    A partition in ``end`` but not in ``start`` is read from 0. One whose end lies below
    its start (the topic was created again, under ``failOnDataLoss=false``) is read from 0
    to its end.
    """
    ranges = []
    for p in sorted(end):
        lo = start.get(p, 0)
        hi = end[p]
        if hi < lo:
            lo = 0
        if hi > lo:
            ranges.append(Range(p, lo, hi))
    total = sum(r.count for r in ranges)
    if not min_partitions or len(ranges) >= min_partitions or total == 0:
        return ranges
    out: list[Range] = []
    for r in ranges:
        pieces = min(r.count, max(1, math.ceil(r.count * min_partitions / total)))
        bounds = [r.start + r.count * i // pieces for i in range(pieces + 1)]
        out.extend(Range(r.partition, a, b) for a, b in pairwise(bounds))
    return out
