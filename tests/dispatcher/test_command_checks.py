"""Refusing a bad command before it changes anything. Pure."""

from __future__ import annotations

import pytest

from dispatcher.command_checks import check_commit, check_nack, check_range, check_seek, check_up_to
from dispatcher.errors import InvalidAckError, InvalidSubscriptionError
from dispatcher.partition_book import PartitionBook
from dispatcher.protocol import Commit, Nack, PartitionSnapshot, Seek

#: One partition with records 0..9 sent (sent_mark 10).
PARTS = [PartitionBook(0, PartitionSnapshot(0, delivered=10))]


@pytest.mark.parametrize(
    ("partition", "begin", "end", "error"),
    [
        (0, 5, 12, InvalidAckError),  # 10, 11 never delivered
        (0, 5, 5, InvalidSubscriptionError),  # not a range
        (0, -1, 3, InvalidSubscriptionError),
        (1, 0, 1, InvalidSubscriptionError),  # no such partition
        (-1, 0, 1, InvalidSubscriptionError),
    ],
)
def test_a_bad_range_is_refused(
    partition: int, begin: int, end: int, error: type[Exception]
) -> None:
    """Scenario: an ack of a range outside what was delivered, or of no range.
    Expected: the error the state would raise; the partition unchanged."""
    with pytest.raises(error):
        check_range(PARTS, "ack", partition, begin, end)
    assert PARTS[0].sent_mark == 10


def test_good_commands_pass_and_name_their_partition() -> None:
    """Scenario: an ack of [0, 10), a cumulative ack below 10, a commit at 7 (head 20), a
    nack with a 5 s delay, a seek with one offset.
    Expected: each passes and returns partition 0's book (the seek returns nothing)."""
    assert check_range(PARTS, "ack", 0, 0, 10) is PARTS[0]
    assert check_up_to(PARTS, 0, 10) is PARTS[0]
    assert check_commit(PARTS, Commit(0, 7, 20)) is PARTS[0]
    assert check_nack(PARTS, Nack(0, 3, 4, delay_s=5.0)) is PARTS[0]
    check_seek(PARTS, Seek((3,)))


@pytest.mark.parametrize(
    ("check", "error"),
    [
        (lambda: check_up_to(PARTS, 0, 11), InvalidAckError),
        (lambda: check_commit(PARTS, Commit(0, 21, 20)), InvalidSubscriptionError),
        (lambda: check_nack(PARTS, Nack(0, 3, 4, delay_s=-1.0)), InvalidSubscriptionError),
        (lambda: check_seek(PARTS, Seek((1, 2))), InvalidSubscriptionError),
    ],
    ids=["up_to_past_sent", "commit_past_head", "negative_nack_delay", "seek_offsets"],
)
def test_other_bad_commands_are_refused(check: object, error: type[Exception]) -> None:
    """Scenario: a cumulative ack past what was sent, a commit past the head, a nack
    with a negative delay, a seek with the wrong number of offsets.
    Expected: each refused with the error the state raises."""
    assert callable(check)
    with pytest.raises(error):
        check()
