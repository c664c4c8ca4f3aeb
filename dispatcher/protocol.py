"""The vocabulary of the dispatch state machine: what goes in, what comes out, what is kept.

Owns the settings (:class:`DispatchPolicy` and its enums), the persisted state of a
partition (:class:`PartitionSnapshot`, :class:`FailureRun`), the commands
:class:`~dispatcher.state.SubscriptionState` takes (``Attach`` .. ``DeadLetterFailed``, the
``Command`` union) and the actions it returns (``Send``, ``ToDeadLetter``, ``Persist``,
``Note``, the ``Action`` union). Pure data: frozen dataclasses and enums, validated on
construction where a person sets them (:class:`DispatchPolicy`, a nack's delay); the two
made per delivery, :class:`Delivery` and :class:`Send`, are named tuples.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from dispatcher.acks import Range
from dispatcher.errors import InvalidSubscriptionError
from wal import RecordBatch

#: A nack's failure reason is kept to this many characters: it is saved with the cursor on
#: every flush and goes into the dead letter's ``x-failure-reason`` header.
MAX_REASON_CHARS = 1024


class SubscriptionType(enum.Enum):
    """How a subscription shares its records among consumers."""

    EXCLUSIVE = "exclusive"
    FAILOVER = "failover"
    SHARED = "shared"
    KEY_SHARED = "key_shared"


class DeliveryMode(enum.Enum):
    """When a record counts as consumed."""

    AT_LEAST_ONCE = "at_least_once"  # when the consumer acknowledges it
    AT_MOST_ONCE = "at_most_once"  # when it is sent: no redelivery, ever


class PoisonPolicy(enum.Enum):
    """What happens to a record that reached ``max_deliveries``."""

    DEAD_LETTER = "dead_letter"  # moved to the subscription's dead-letter queue
    DROP = "drop"  # acknowledged and logged
    BLOCK = "block"  # its partition stops (BLOCKED) until a seek moves past it


@dataclass(frozen=True, slots=True)
class DispatchPolicy:
    """How one subscription delivers and redelivers.

    Attributes:
        type: Who gets which record.
        mode: At least once (acks) or at most once (the cursor moves on send).
        max_unacked: Records leased, waiting and parked at once, at most.
        ack_timeout_s: A record not acknowledged this long after it was sent is sent
            again; ``None`` waits forever (until the consumer leaves).
        backoff_initial_s: Delay before the first redelivery after an ack timeout or a nack
            without a delay; it grows by ``backoff_multiplier`` per failed delivery.
        backoff_max_s: The delay never grows past this.
        backoff_multiplier: Growth per failed delivery.
        backoff_jitter: Each delay is moved by up to this fraction, up or down, so that
            records that failed together do not come back together.
        max_deliveries: After this many deliveries a record is poison; 0 never.
        poison: What happens to a poison record.
    """

    type: SubscriptionType = SubscriptionType.EXCLUSIVE
    mode: DeliveryMode = DeliveryMode.AT_LEAST_ONCE
    max_unacked: int = 1_000
    ack_timeout_s: float | None = 30.0
    backoff_initial_s: float = 1.0
    backoff_max_s: float = 60.0
    backoff_multiplier: float = 2.0
    backoff_jitter: float = 0.2
    max_deliveries: int = 10
    poison: PoisonPolicy = PoisonPolicy.DEAD_LETTER

    def __post_init__(self) -> None:
        check_number("max_unacked", self.max_unacked, 1, 10_000_000, "records")
        if self.ack_timeout_s is not None:
            check_number("ack_timeout", self.ack_timeout_s, 0.001, 86_400, "seconds")
        check_number("backoff_initial", self.backoff_initial_s, 0, 86_400, "seconds")
        check_number("backoff_max", self.backoff_max_s, self.backoff_initial_s, 86_400, "seconds")
        check_number("backoff_multiplier", self.backoff_multiplier, 1, 100, "(a factor)")
        check_number("backoff_jitter", self.backoff_jitter, 0, 1, "(a fraction)")
        check_number("max_deliveries", self.max_deliveries, 0, 1_000_000, "(0 = unlimited)")

    def backoff_s(self, failures: int, rand: float) -> float:
        """The delay before the redelivery that follows ``failures`` failed deliveries;
        ``rand`` in ``[0, 1)`` places it in the jitter band."""
        exponent = max(0, failures - 1)
        base = self.backoff_initial_s * self.backoff_multiplier ** min(exponent, 64)
        base = min(base, self.backoff_max_s)
        return max(0.0, base * (1 + self.backoff_jitter * (2 * rand - 1)))


def check_number(name: str, value: float, low: float, high: float, unit: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        raise InvalidSubscriptionError(name, f"{value!r} is not a number")
    if not low <= value <= high:
        raise InvalidSubscriptionError(name, f"{value!r} must be from {low} to {high} {unit}")


@dataclass(frozen=True, slots=True)
class Failure:
    """An offset whose delivery failed at least once (persisted)."""

    offset: int
    deliveries: int  # times it was sent
    reason: str  # why the last delivery failed
    times_ms: tuple[int, ...]  # when each failed delivery was sent, ms since the epoch


@dataclass(frozen=True, slots=True)
class FailureRun:
    """Offsets ``[begin, end)`` that share one failure history (persisted compactly: a
    consumer that leaves returns whole leases, whose offsets all failed alike)."""

    begin: int
    end: int
    deliveries: int
    reason: str
    times_ms: tuple[int, ...]
    rejected: bool = False  # a consumer rejected them: the poison policy applies now


@dataclass(frozen=True, slots=True)
class PartitionSnapshot:
    """What is persisted of one partition."""

    cursor: int
    acked: tuple[Range, ...] = ()
    delivered: int = 0  # every offset below was sent at least once (or acknowledged)
    failures: tuple[FailureRun, ...] = ()


class Delivery(NamedTuple):
    """Records ``[from_offset, to_offset)`` of one partition, inside one encoded batch.

    ``redeliveries`` maps an offset that was sent before to how often it was sent before.

    A ``NamedTuple`` rather than a frozen dataclass, as :class:`Send` is: one of each is
    built per delivery, for every consumer of every batch, and a frozen dataclass sets
    each field through ``object.__setattr__`` (0.56 and 0.35 us here against about 0.1 for
    a tuple; ``SubscriptionState`` builds them with ``tuple.__new__``).
    """

    partition: int
    batch: bytes
    from_offset: int
    to_offset: int
    redeliveries: dict[int, int]

    @property
    def record_count(self) -> int:
        """How many records this delivery carries (``count`` is the tuple's method)."""
        return self.to_offset - self.from_offset


# -- commands -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DispatchLimits:
    """What clients may ask of the dispatcher; ``None`` means no limit (the default, for
    tests and benches). The broker sets them from its ``[limits]`` table, whose key names
    they share.

    Attributes:
        max_subscriptions_per_topic: Subscriptions one topic may have.
        max_consumers_per_subscription: Consumers attached to one subscription at once.
        max_credit_per_consumer: Records of credit one consumer may hold at once (granted
            and not yet used).
    """

    max_subscriptions_per_topic: int | None = None
    max_consumers_per_subscription: int | None = None
    max_credit_per_consumer: int | None = None


@dataclass(frozen=True, slots=True)
class Attach:
    """A consumer joins with ``credit`` records it may receive now."""

    consumer: str  # unique per session
    name: str  # stable across reconnects; key_shared hashes it
    credit: int


@dataclass(frozen=True, slots=True)
class Detach:
    """A consumer left; what it did not acknowledge is sent again."""

    consumer: str


@dataclass(frozen=True, slots=True)
class Drain:
    """A consumer is closing cleanly: send it nothing more (its credit goes to 0, and
    credit it is granted later is ignored). It keeps its leases until it acks, releases
    or leaves."""

    consumer: str


@dataclass(frozen=True, slots=True)
class Release:
    """``consumer`` gives back offsets ``[begin, end)`` of a partition that it received but
    never handed to its application: not a delivery attempt. Their delivery counts go back
    to what they were before the send, and they are sent again at once, in order. Offsets
    not leased to ``consumer`` (acked, or taken back by the ack timeout) are left alone."""

    consumer: str
    partition: int
    begin: int
    end: int


@dataclass(frozen=True, slots=True)
class Grant:
    """A consumer may receive ``credit`` more records."""

    consumer: str
    credit: int


@dataclass(frozen=True, slots=True)
class Ack:
    """Individual acks: offsets ``[begin, end)`` of a partition."""

    partition: int
    begin: int
    end: int


@dataclass(frozen=True, slots=True)
class AckUpTo:
    """A cumulative ack: every delivered offset below ``offset``."""

    partition: int
    offset: int


@dataclass(frozen=True, slots=True)
class Nack:
    """Offsets ``[begin, end)`` failed; send them again after ``delay_s`` (``None``: the
    backoff of their failure count), or, with ``dead_letter``, never: the poison policy
    applies to them now, whatever their count (AMQP's reject with requeue=false)."""

    partition: int
    begin: int
    end: int
    delay_s: float | None = None
    reason: str = ""
    dead_letter: bool = False


@dataclass(frozen=True, slots=True)
class Commit:
    """A reader that pulls by offset (Spark) processed everything below ``offset``."""

    partition: int
    offset: int
    head: int  # the partition's high-water mark


@dataclass(frozen=True, slots=True)
class Seek:
    """Move every partition to an offset (already clamped to the log), forgetting acks."""

    offsets: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Tick:
    """Time passed: expire leases whose ack timeout is up."""


@dataclass(frozen=True, slots=True)
class Fetched:
    """The batches the shell read from ``partition`` at the offset :meth:`reads` asked."""

    partition: int
    batches: Sequence[RecordBatch]


@dataclass(frozen=True, slots=True)
class Deleted:
    """Retention deleted ``partition`` below ``first_offset``."""

    partition: int
    first_offset: int


@dataclass(frozen=True, slots=True)
class DeadLettered:
    """The dead-letter queue holds ``[begin, end)`` of ``partition`` now (or rejected them
    by its overflow policy): acknowledge them."""

    partition: int
    begin: int
    end: int


@dataclass(frozen=True, slots=True)
class DeadLetterFailed:
    """Writing ``[begin, end)`` to the dead-letter queue failed: the partition is BLOCKED
    and the write is tried again later. Nothing is acknowledged."""

    partition: int
    begin: int
    end: int
    error: str


Command = (
    Attach
    | Detach
    | Drain
    | Release
    | Grant
    | Ack
    | AckUpTo
    | Nack
    | Commit
    | Seek
    | Tick
    | Fetched
    | Deleted
    | DeadLettered
    | DeadLetterFailed
)

TICK = Tick()

# -- actions ------------------------------------------------------------------------------


class Send(NamedTuple):
    """Put ``delivery`` in the outbox of ``consumer`` (a ``NamedTuple``: see
    :class:`Delivery`)."""

    consumer: str
    delivery: Delivery
    timestamp_ms: int  # the newest publish time in the batch (for dispatch latency)


@dataclass(frozen=True, slots=True)
class ToDeadLetter:
    """Write records ``[begin, end)`` of ``batch`` to the dead-letter queue, then answer
    with :class:`DeadLettered` or :class:`DeadLetterFailed`."""

    partition: int
    batch: RecordBatch
    begin: int
    end: int
    failures: tuple[Failure, ...]


@dataclass(frozen=True, slots=True)
class Persist:
    """Save the state before carrying out the actions after this one."""


@dataclass(frozen=True, slots=True)
class Note:
    """Something an operator should read in the log."""

    level: int
    message: str


Action = Send | ToDeadLetter | Persist | Note

PERSIST = Persist()
