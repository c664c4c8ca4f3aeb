"""Why a partition of a subscription is behind: the state and reason ``headrace lag`` shows.

Owns :class:`LagState` (``CAUGHT_UP | LAGGING | STALLED | NO_CONSUMER | BLOCKED``, DESIGN
section 4), :class:`Cause` (the fixed vocabulary a reason starts with), the facts one
partition is judged on (:class:`PartitionFacts`) and the rule, :func:`diagnose`. The shell
(:mod:`dispatcher.subscription`) gathers the facts from the state machine, the heartbeat's
verdict and the rate window; this module only decides.

A reason is ``"<cause>: <detail>"``; scripts match the cause, people read the detail. The
rules are tried in order and the first that applies wins, most specific and most urgent
first:

=================  ===========  ============================================================
cause              state        when
=================  ===========  ============================================================
dlq full           BLOCKED      a dead letter waits for room in a full dead-letter queue
                                (overflow ``block``)
dlq error          BLOCKED      writing a dead letter failed otherwise (e.g. the disk)
blocked on poison  BLOCKED      a record used up max_deliveries under poison policy ``block``
read error         LAGGING,     the dispatch task's last read of the log failed (a damaged
                   STALLED      segment, EIO); STALLED once that lasts the stall timeout
no progress        STALLED      records ready, a consumer with room, nothing sent or acked
                                for the stall timeout, and no read error to blame
no consumer        NO_CONSUMER  no consumer is attached (and no pull reader committed lately)
retry backoff      LAGGING      the record at the cursor waits out a nack delay or a
                                redelivery backoff
window full        LAGGING      max_unacked records are unacknowledged: nothing more is sent
                                until acks free room
consumer slow      LAGGING      otherwise: consumers are out of credit (they have not taken
                                what was sent), or records are in flight and acks trail
=================  ===========  ============================================================

Example: a consumer took records 0..999 of a subscription with ``max_unacked`` 1000 and
acks nothing; 500 more are published. No rule above "window full" applies (not blocked, no
read error, a consumer is attached, the record at the cursor is leased, not waiting), so:
LAGGING, "window full: 1000 of 1000 records in flight, 500 more wait to be sent".

Pure module: no asyncio, os or time.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

from dispatcher.lag import NO_RATES, Rates


class LagState(enum.Enum):
    """A partition's state in ``headrace lag``, worst last."""

    CAUGHT_UP = "CAUGHT_UP"
    LAGGING = "LAGGING"
    NO_CONSUMER = "NO_CONSUMER"
    STALLED = "STALLED"
    BLOCKED = "BLOCKED"

    def is_stuck(self) -> bool:
        """Whether nothing moves without someone acting (``--fail-on-stalled``)."""
        return self in (LagState.STALLED, LagState.BLOCKED)


class Cause(enum.Enum):
    """The fixed phrase a reason starts with (see the module's table)."""

    DLQ_FULL = "dlq full"
    DLQ_ERROR = "dlq error"
    BLOCKED_ON_POISON = "blocked on poison"
    READ_ERROR = "read error"
    NO_PROGRESS = "no progress"
    NO_CONSUMER = "no consumer"
    RETRY_BACKOFF = "retry backoff"
    WINDOW_FULL = "window full"
    CONSUMER_SLOW = "consumer slow"


@dataclass(frozen=True, slots=True)
class Retry:
    """The record at the cursor waits to be sent again.

    Attributes:
        offset: Its offset.
        due_in_s: Seconds until it may go again (positive).
        deliveries: How often it was sent so far.
        last_failure: Why the last delivery failed (the nack's reason, an ack timeout).
    """

    offset: int
    due_in_s: float
    deliveries: int
    last_failure: str


@dataclass(frozen=True, slots=True)
class DlqFull:
    """The dead-letter queue refused the last write: it is full under overflow ``block``."""

    entries: int
    max_entries: int


@dataclass(frozen=True, slots=True)
class PartitionFacts:
    """What one partition is judged on.

    Attributes:
        lag: Records below the head not acknowledged.
        unread: Records below the head not read (sent) yet.
        in_flight: Records sent and not acknowledged.
        consumers: Attached consumers.
        has_room: A consumer may receive a record now (credit, under max_unacked).
        held: The subscription's records counting against max_unacked.
        max_unacked: The cap on them.
        blocked: Why the partition sends nothing (the state machine's words), or ``""``.
        on_dead_letters: The block is a dead-letter write that failed (else: poison).
        dlq_full: The last dead-letter write was refused by a full queue, or ``None``.
        read_error: The dispatch task's last read failure, or ``""``.
        stalled: The heartbeat's verdict: STALLED.
        stuck_s: How long the heartbeat has seen no progress, seconds.
        retry: The record at the cursor waits for a redelivery, or ``None``.
        pull_commit_age_s: Seconds since a reader that pulls by offset (AckUpTo, e.g.
            Spark) last committed, when it counts as a consumer; else ``None``.
        rates: Ingress and ack rates.
    """

    lag: int
    unread: int = 0
    in_flight: int = 0
    consumers: int = 0
    has_room: bool = False
    held: int = 0
    max_unacked: int = 1
    blocked: str = ""
    on_dead_letters: bool = False
    dlq_full: DlqFull | None = None
    read_error: str = ""
    stalled: bool = False
    stuck_s: float = 0.0
    retry: Retry | None = None
    pull_commit_age_s: float | None = None
    rates: Rates = NO_RATES


@dataclass(frozen=True, slots=True)
class Diagnosis:
    """A partition's state and why."""

    state: LagState
    cause: Cause | None = None
    detail: str = ""

    @property
    def reason(self) -> str:
        """``"<cause>: <detail>"``, or ``""`` when caught up."""
        if self.cause is None:
            return ""
        return f"{self.cause.value}: {self.detail}" if self.detail else self.cause.value


CAUGHT_UP = Diagnosis(LagState.CAUGHT_UP)

_Rule = Callable[[PartitionFacts], Diagnosis | None]


def diagnose(facts: PartitionFacts) -> Diagnosis:
    """The state and reason of a partition: the first of :data:`RULES` that applies."""
    if facts.lag <= 0:
        return CAUGHT_UP
    for rule in RULES:
        found = rule(facts)
        if found is not None:
            return found
    return _consumer_slow(facts)


def _blocked(f: PartitionFacts) -> Diagnosis | None:
    if not f.blocked:
        return None
    if not f.on_dead_letters:
        return Diagnosis(LagState.BLOCKED, Cause.BLOCKED_ON_POISON, f.blocked)
    if f.dlq_full is not None:
        detail = (
            f"the dead-letter queue holds {f.dlq_full.entries} of {f.dlq_full.max_entries} "
            "entries (overflow=block); nothing on this partition is acknowledged until "
            "`headrace dlq ack|purge|replay` makes room"
        )
        return Diagnosis(LagState.BLOCKED, Cause.DLQ_FULL, detail)
    return Diagnosis(LagState.BLOCKED, Cause.DLQ_ERROR, f.blocked)


def _records(n: int) -> str:
    """``"1 record"``, ``"5 records"``."""
    return f"{n} record" if n == 1 else f"{n} records"


def _wait(n: int) -> str:
    """The verb after ``n`` records: ``"waits"`` for one, else ``"wait"``."""
    return "waits" if n == 1 else "wait"


def _read_error(f: PartitionFacts) -> Diagnosis | None:
    if not f.read_error:
        return None
    state = LagState.STALLED if f.stalled else LagState.LAGGING
    detail = f"{f.read_error}; {_records(f.lag)} {_wait(f.lag)}"
    if f.stalled:
        detail += f", nothing sent or acknowledged for {f.stuck_s:.1f} s"
    return Diagnosis(state, Cause.READ_ERROR, detail)


def _no_progress(f: PartitionFacts) -> Diagnosis | None:
    if not (f.stalled and f.unread > 0):
        return None
    detail = (
        f"{_records(f.unread)} {'is' if f.unread == 1 else 'are'} ready and a consumer has "
        f"room, but nothing was sent or "
        f"acknowledged for {f.stuck_s:.1f} s"
    )
    return Diagnosis(LagState.STALLED, Cause.NO_PROGRESS, detail)


def _no_consumer(f: PartitionFacts) -> Diagnosis | None:
    if f.consumers or f.pull_commit_age_s is not None:
        return None
    detail = f"{_records(f.lag)} {_wait(f.lag)} for a consumer"
    return Diagnosis(LagState.NO_CONSUMER, Cause.NO_CONSUMER, detail)


def _retry_backoff(f: PartitionFacts) -> Diagnosis | None:
    r = f.retry
    if r is None:
        return None
    detail = (
        f"offset {r.offset} goes out again in {r.due_in_s:.1f} s (sent {r.deliveries} "
        f"times; last failure: {r.last_failure or 'unknown'})"
    )
    return Diagnosis(LagState.LAGGING, Cause.RETRY_BACKOFF, detail)


def _window_full(f: PartitionFacts) -> Diagnosis | None:
    if f.held < f.max_unacked:
        return None
    detail = f"{f.held} of {f.max_unacked} records in flight"
    if f.unread:
        detail += f", {f.unread} more {_wait(f.unread)} to be sent"
    return Diagnosis(LagState.LAGGING, Cause.WINDOW_FULL, detail)


def _consumer_slow(f: PartitionFacts) -> Diagnosis:
    if f.consumers == 0 and f.pull_commit_age_s is not None:
        detail = (
            f"{_records(f.lag)} not yet committed by a reader that keeps its own position "
            f"(AckUpTo, e.g. Spark); last commit {f.pull_commit_age_s:.0f} s ago"
        )
    elif not f.has_room:
        detail = (
            f"the consumers hold no credit (they have not taken what was sent); "
            f"{_records(f.in_flight)} in flight, {f.unread} {_wait(f.unread)} to be sent"
        )
    else:
        detail = (
            f"{_records(f.in_flight)} in flight, {f.unread} {_wait(f.unread)} to be sent; acks "
            f"{f.rates.acked:.1f}/s vs {f.rates.ingress:.1f}/s published"
        )
    return Diagnosis(LagState.LAGGING, Cause.CONSUMER_SLOW, detail)


#: The rules in the order they are tried; "consumer slow" is what is left.
RULES: tuple[_Rule, ...] = (
    _blocked,
    _read_error,
    _no_progress,
    _no_consumer,
    _retry_backoff,
    _window_full,
)
