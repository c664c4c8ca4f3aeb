"""Refusing a bad command before it changes anything. Pure: no I/O, no clock.

Each function raises what :meth:`~dispatcher.state.SubscriptionState.handle` raises for
one kind of command, from the partitions' books alone, and returns the partition the
command is about: the state calls it first when it applies the command, and
:meth:`~dispatcher.state.SubscriptionState.check` calls it alone in the caller's task, so
a bad ack, credit or seek is refused at once, before it is queued for the dispatch task.

Example: records 0..9 of partition 0 were sent (``sent_mark`` 10). An ack of ``[5, 12)``
is refused with ``InvalidAckError`` (11 was never delivered); an ack of ``[5, 5)`` with
``InvalidSubscriptionError`` (not a range); a nack of ``[5, 6)`` with a delay of -1 s with
``InvalidSubscriptionError`` naming ``nack delay``.
"""

from __future__ import annotations

from collections.abc import Sequence

from dispatcher.errors import InvalidAckError, InvalidSubscriptionError
from dispatcher.partition_book import PartitionBook
from dispatcher.protocol import Commit, Nack, Seek, check_number


def part_of(parts: Sequence[PartitionBook], partition: int) -> PartitionBook:
    """The book of ``partition``; ``InvalidSubscriptionError`` unless it exists."""
    if not 0 <= partition < len(parts):
        raise InvalidSubscriptionError(
            "partition",
            f"{partition} does not exist; the topic has partitions 0..{len(parts) - 1}",
        )
    return parts[partition]


def check_range(
    parts: Sequence[PartitionBook], what: str, partition: int, begin: int, end: int
) -> PartitionBook:
    """An ack, release or nack (``what``) of ``[begin, end)``: a range, all delivered."""
    part = part_of(parts, partition)
    if not 0 <= begin < end:
        raise InvalidSubscriptionError(what, f"[{begin}, {end}) is not an offset range")
    if end > part.sent_mark:
        raise InvalidAckError(partition, end - 1, part.sent_mark, what)
    return part


def check_nack(parts: Sequence[PartitionBook], cmd: Nack) -> PartitionBook:
    """A nack: its range, and a delay (if any) of 0 to 86,400 s."""
    part = check_range(parts, "nack", cmd.partition, cmd.begin, cmd.end)
    if cmd.delay_s is not None:
        check_number("nack delay", cmd.delay_s, 0, 86_400, "seconds")
    return part


def check_up_to(parts: Sequence[PartitionBook], partition: int, offset: int) -> PartitionBook:
    """A cumulative ack below ``offset``: all delivered."""
    part = part_of(parts, partition)
    if offset > part.sent_mark:
        raise InvalidAckError(partition, offset - 1, part.sent_mark)
    return part


def check_commit(parts: Sequence[PartitionBook], cmd: Commit) -> PartitionBook:
    """A commit: an offset from 0 to the partition's head."""
    part = part_of(parts, cmd.partition)
    if not 0 <= cmd.offset <= cmd.head:
        raise InvalidSubscriptionError(
            "offset", f"{cmd.offset} is outside [0, {cmd.head}] on partition {part.index}"
        )
    return part


def check_seek(parts: Sequence[PartitionBook], cmd: Seek) -> None:
    """A seek: one offset per partition."""
    if len(cmd.offsets) != len(parts):
        raise InvalidSubscriptionError("seek", f"needs {len(parts)} offsets")
