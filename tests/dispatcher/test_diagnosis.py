"""dispatcher.diagnosis: which state and reason a partition gets, from plain facts (no loop,
no disk, no clock)."""

from __future__ import annotations

import dataclasses

import pytest

from dispatcher.diagnosis import (
    RULES,
    Cause,
    DlqFull,
    LagState,
    PartitionFacts,
    Retry,
    diagnose,
)
from dispatcher.lag import Rates, Trend

#: A partition with a consumer that keeps up: 5 records in flight, room for more.
HEALTHY = PartitionFacts(
    lag=5,
    unread=0,
    in_flight=5,
    consumers=1,
    has_room=True,
    held=5,
    max_unacked=100,
    rates=Rates(20.0, 19.5, Trend.STEADY, 10.0),
)


def with_(**changes: object) -> PartitionFacts:
    return dataclasses.replace(HEALTHY, **changes)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("facts", "state", "reason"),
    [
        (with_(lag=0), LagState.CAUGHT_UP, ""),
        (
            with_(consumers=0),
            LagState.NO_CONSUMER,
            "no consumer: 5 records wait for a consumer",
        ),
        (
            with_(consumers=0, lag=1),
            LagState.NO_CONSUMER,
            "no consumer: 1 record waits for a consumer",
        ),
        (
            with_(held=100, in_flight=100, lag=101, unread=1),
            LagState.LAGGING,
            "window full: 100 of 100 records in flight, 1 more waits to be sent",
        ),
        (
            with_(in_flight=1, unread=1, lag=2),
            LagState.LAGGING,
            "consumer slow: 1 record in flight, 1 waits to be sent; acks 19.5/s vs 20.0/s "
            "published",
        ),
        (
            with_(held=100, in_flight=100, lag=150, unread=50),
            LagState.LAGGING,
            "window full: 100 of 100 records in flight, 50 more wait to be sent",
        ),
        (
            with_(has_room=False, unread=3, lag=8),
            LagState.LAGGING,
            "consumer slow: the consumers hold no credit (they have not taken what was "
            "sent); 5 records in flight, 3 wait to be sent",
        ),
        (
            HEALTHY,
            LagState.LAGGING,
            "consumer slow: 5 records in flight, 0 wait to be sent; acks 19.5/s vs 20.0/s "
            "published",
        ),
        (
            with_(consumers=0, pull_commit_age_s=12.0),
            LagState.LAGGING,
            "consumer slow: 5 records not yet committed by a reader that keeps its own "
            "position (AckUpTo, e.g. Spark); last commit 12 s ago",
        ),
        (
            with_(retry=Retry(7, 28.25, 2, "bad payload")),
            LagState.LAGGING,
            "retry backoff: offset 7 goes out again in 28.2 s (sent 2 times; last "
            "failure: bad payload)",
        ),
        (
            with_(blocked="offset 7 failed 1 deliveries (poison policy block); seek past it"),
            LagState.BLOCKED,
            "blocked on poison: offset 7 failed 1 deliveries (poison policy block); seek past it",
        ),
        (
            with_(
                blocked="dead-letter queue write failed ...",
                on_dead_letters=True,
                dlq_full=DlqFull(5, 5),
            ),
            LagState.BLOCKED,
            "dlq full: the dead-letter queue holds 5 of 5 entries (overflow=block); nothing "
            "on this partition is acknowledged until `headrace dlq ack|purge|replay` makes "
            "room",
        ),
        (
            with_(
                blocked="dead-letter queue write failed for offset 3 (EIO)", on_dead_letters=True
            ),
            LagState.BLOCKED,
            "dlq error: dead-letter queue write failed for offset 3 (EIO)",
        ),
        (
            with_(read_error="CRC mismatch at offset 40", unread=10, lag=10),
            LagState.LAGGING,
            "read error: CRC mismatch at offset 40; 10 records wait",
        ),
        (
            with_(read_error="EIO", unread=10, lag=10, stalled=True, stuck_s=12.0),
            LagState.STALLED,
            "read error: EIO; 10 records wait, nothing sent or acknowledged for 12.0 s",
        ),
        (
            with_(unread=10, lag=10, stalled=True, stuck_s=12.0),
            LagState.STALLED,
            "no progress: 10 records are ready and a consumer has room, but nothing was "
            "sent or acknowledged for 12.0 s",
        ),
    ],
    ids=lambda v: v.value if isinstance(v, LagState) else None,
)
def test_each_state_and_reason(facts: PartitionFacts, state: LagState, reason: str) -> None:
    """Each rule of the module's table, alone: the state and the full reason."""
    found = diagnose(facts)
    assert (found.state, found.reason) == (state, reason)


def test_every_reason_starts_with_its_cause() -> None:
    """Every state but CAUGHT_UP has a reason that starts with a vocabulary phrase and a
    colon; the vocabulary is the one documented."""
    phrases = {c.value for c in Cause}
    assert phrases == {
        "dlq full", "dlq error", "blocked on poison", "read error", "no progress",
        "no consumer", "retry backoff", "window full", "consumer slow",
    }  # fmt: skip
    for facts in (HEALTHY, with_(consumers=0), with_(held=100), with_(stalled=True, unread=1)):
        found = diagnose(facts)
        assert found.cause is not None
        assert found.reason.startswith(found.cause.value + ": ")


@pytest.mark.parametrize(
    ("facts", "cause"),
    [
        # a block beats everything: nothing moves until someone acts
        (with_(blocked="x", consumers=0, read_error="EIO", held=100), Cause.BLOCKED_ON_POISON),
        # a read error explains a stall better than "no progress"
        (with_(read_error="EIO", stalled=True, unread=3), Cause.READ_ERROR),
        # STALLED outranks the lack of a consumer only when records are ready
        (with_(stalled=True, unread=0, consumers=0), Cause.NO_CONSUMER),
        # with no consumer, a backoff or a full window is beside the point
        (with_(consumers=0, retry=Retry(1, 5.0, 1, ""), held=100), Cause.NO_CONSUMER),
        # the record at the cursor waiting is more specific than a full window
        (with_(retry=Retry(1, 5.0, 1, ""), held=100), Cause.RETRY_BACKOFF),
        (with_(held=100, has_room=False), Cause.WINDOW_FULL),
    ],
)
def test_precedence(facts: PartitionFacts, cause: Cause) -> None:
    """When several causes hold, the most specific and most urgent wins."""
    assert diagnose(facts).cause is cause


def test_stuck_states_and_the_rule_table() -> None:
    """STALLED and BLOCKED need someone to act; the rules are tried in table order."""
    assert {s for s in LagState if s.is_stuck()} == {LagState.STALLED, LagState.BLOCKED}
    assert [r.__name__ for r in RULES] == [
        "_blocked", "_read_error", "_no_progress", "_no_consumer", "_retry_backoff",
        "_window_full",
    ]  # fmt: skip
