"""The dispatch state machine (dispatcher.state), pure: no event loop, no disk, no clock.

Records live in :class:`MemoryLog` (real encoded batches placed at their offsets), the
random source is fixed (``0.5`` puts the backoff jitter at zero) and every call gets its
``now``. :class:`Driver` plays the shell: it sends ``Tick``, asks :meth:`reads`, answers
each wish with ``Fetched`` from the in-memory log, and keeps every ``Send`` per consumer.

Claims checked (DESIGN section 3, "Subscriptions"; the module docstring of
``dispatcher.state``): routing per type, credit and ``max_unacked``, individual and
cumulative acks, ack timeouts with exponential backoff and jitter, nacks, poison
policies, the ``Persist`` rule, restarts from snapshots, retention, deadlines. After
every command the driver also checks the module's invariant: every offset between the
cursor and the read position is acknowledged, or held (leased, waiting or parked).
"""

from __future__ import annotations

import logging
import math
import zlib
from collections.abc import Callable, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dispatcher.errors import InvalidAckError, InvalidSubscriptionError, SubscriptionBusyError
from dispatcher.partition_book import key_slot
from dispatcher.poison import DEAD_LETTER_RETRY_S
from dispatcher.protocol import (
    TICK,
    Ack,
    AckUpTo,
    Action,
    Attach,
    Command,
    Commit,
    DeadLettered,
    DeadLetterFailed,
    Deleted,
    DeliveryMode,
    Detach,
    DispatchPolicy,
    Failure,
    FailureRun,
    Fetched,
    Grant,
    Nack,
    Note,
    PartitionSnapshot,
    Persist,
    PoisonPolicy,
    Seek,
    Send,
    SubscriptionType,
    ToDeadLetter,
)
from dispatcher.state import SubscriptionState
from wal import RecordBatch, decode_batch, encode_columns

EXCLUSIVE = SubscriptionType.EXCLUSIVE
FAILOVER = SubscriptionType.FAILOVER
SHARED = SubscriptionType.SHARED
KEY_SHARED = SubscriptionType.KEY_SHARED


def no_jitter() -> float:
    """A random source that puts every backoff exactly on its base."""
    return 0.5


# -- an in-memory log and a driver that plays the shell ----------------------------------


def make_batch(
    base: int, count: int, *, keys: Sequence[bytes | None] | None = None, ts: int = 0
) -> RecordBatch:
    """A real batch of ``count`` records at ``base``; record ``o``'s value is ``str(o)``."""
    values = [str(base + i).encode() for i in range(count)]
    first = decode_batch(encode_columns(values, keys=keys, timestamps_ms=ts))
    assert first is not None
    placed = decode_batch(first.with_base_offset(base))
    assert placed is not None
    return placed


class MemoryLog:
    """One partition's batches, in memory, read the way ``wal.Log.read`` reads."""

    def __init__(self) -> None:
        self.batches: list[RecordBatch] = []

    @property
    def head(self) -> int:
        return self.batches[-1].next_offset if self.batches else 0

    def append(
        self, count: int, *, keys: Sequence[bytes | None] | None = None, ts: int = 0
    ) -> RecordBatch:
        batch = make_batch(self.head, count, keys=keys, ts=ts)
        self.batches.append(batch)
        return batch

    def append_batches(self, batches: int, size: int = 1) -> None:
        for _ in range(batches):
            self.append(size)

    def read(self, offset: int, max_batches: int) -> list[RecordBatch]:
        """The batch holding ``offset`` (it may start before it) and those after it."""
        return [b for b in self.batches if b.next_offset > offset][:max_batches]


def offsets_of(send: Send) -> list[int]:
    return list(range(send.delivery.from_offset, send.delivery.to_offset))


class Driver:
    """A :class:`SubscriptionState` with in-memory logs, fed the way the shell feeds it."""

    def __init__(
        self,
        policy: DispatchPolicy | None = None,
        partitions: int = 1,
        *,
        random: Callable[[], float] = no_jitter,
        snapshots: Sequence[PartitionSnapshot] | None = None,
        max_batches: int = 1_000,
    ) -> None:
        snaps = list(snapshots) if snapshots is not None else [PartitionSnapshot(0)] * partitions
        self.state = SubscriptionState(snaps, policy or DispatchPolicy(), random=random)
        self.logs = [MemoryLog() for _ in snaps]
        self.now = 0.0
        self.max_batches = max_batches
        self.sends: list[Send] = []

    # commands

    def do(self, cmd: Command, now: float | None = None) -> list[Action]:
        if now is not None:
            self.now = now
        actions = self.state.handle(cmd, self.now)
        for action in actions:
            if isinstance(action, Send):
                self._check_send(action)
                self.sends.append(action)
        self.check_invariant()
        return actions

    def attach(self, consumer: str, credit: int = 1_000, name: str | None = None) -> None:
        self.do(Attach(consumer, name or consumer, credit))

    def pump(self, now: float | None = None, *, rounds: int = 200) -> list[Action]:
        """Tick, then read and feed what the state asks for, until a pass does nothing."""
        if now is not None:
            self.now = now
        out: list[Action] = []
        for _ in range(rounds):
            step = self.do(TICK)
            heads = [log.head for log in self.logs]
            moved = False
            for p, offset in self.state.reads(heads, self.now):
                before = self.state.read_position(p), self.state.set_aside_total
                step += self.do(Fetched(p, self.logs[p].read(offset, self.max_batches)))
                moved |= (self.state.read_position(p), self.state.set_aside_total) != before
            out += step
            if not step and not moved:  # as the shell: it passes again while reads progress
                return out
        raise AssertionError(f"dispatch did not settle in {rounds} passes")

    # what consumers got

    def sent_to(self, consumer: str, partition: int | None = None) -> list[int]:
        """Offsets sent to ``consumer`` (of ``partition``, or of all), in order."""
        return [
            o
            for s in self.sends
            if s.consumer == consumer and partition in (None, s.delivery.partition)
            for o in offsets_of(s)
        ]

    def sent_pairs(self, consumer: str) -> list[tuple[int, int]]:
        return [(s.delivery.partition, o) for s in self.sends if s.consumer == consumer
                for o in offsets_of(s)]  # fmt: skip

    def redeliveries(self, consumer: str | None = None) -> dict[int, int]:
        out: dict[int, int] = {}
        for s in self.sends:
            if consumer in (None, s.consumer):
                out.update(s.delivery.redeliveries)
        return out

    def take(self) -> list[Send]:
        """The sends so far, forgotten."""
        out, self.sends = self.sends, []
        return out

    # checks

    def _check_send(self, send: Send) -> None:
        d = send.delivery
        batch = decode_batch(d.batch)
        assert batch is not None
        assert batch.base_offset <= d.from_offset < d.to_offset <= batch.next_offset
        values = batch.values()
        for o in range(d.from_offset, d.to_offset):
            assert values[o - batch.base_offset] == str(o).encode()
        assert set(d.redeliveries) <= set(range(d.from_offset, d.to_offset))
        assert send.timestamp_ms == batch.max_timestamp_ms

    def check_invariant(self) -> None:
        """Every offset in [cursor, read position) is acknowledged or held, exactly once."""
        st_ = self.state
        unacked = sum(st_.lag(p, st_.read_position(p)) for p in range(st_.partition_count))
        assert unacked == st_.held, (unacked, st_.held)
        assert 0 <= sum(st_.in_flight(p) for p in range(st_.partition_count)) <= st_.held


def sends_in(actions: Sequence[Action]) -> list[Send]:
    return [a for a in actions if isinstance(a, Send)]


def kinds(actions: Sequence[Action]) -> list[str]:
    return [type(a).__name__ for a in actions]


# -- policy -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("failures", "expected"),
    [(0, 1.0), (1, 1.0), (2, 2.0), (3, 4.0), (4, 5.0), (5, 5.0), (64, 5.0), (10_000, 5.0)],
)
def test_backoff_grows_exponentially_up_to_the_cap(failures: int, expected: float) -> None:
    """Scenario: backoff_s(n) with initial 1 s, multiplier 2, max 5 s, no jitter.
    Expected: 1, 1, 2, 4, then 5 s for ever (the exponent is bounded, no overflow)."""
    policy = DispatchPolicy(backoff_initial_s=1, backoff_multiplier=2, backoff_max_s=5)
    assert policy.backoff_s(failures, 0.5) == expected


@pytest.mark.parametrize(
    ("rand", "low", "high"),
    [(0.0, 0.8, 0.8), (0.25, 0.9, 0.9), (0.5, 1.0, 1.0), (0.999_999, 1.199_999, 1.2)],
)
def test_backoff_jitter_stays_in_its_band(rand: float, low: float, high: float) -> None:
    """Scenario: backoff_s(1) with 1 s initial and 20 % jitter for random 0 .. ~1.
    Expected: 0.8 s at 0, 1 s at 0.5, just under 1.2 s at ~1: never outside +-20 %."""
    delay = DispatchPolicy(backoff_jitter=0.2).backoff_s(1, rand)
    assert low - 1e-9 <= delay <= high
    assert delay < 1.2


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_unacked": 0},
        {"max_unacked": 10_000_001},
        {"ack_timeout_s": 0.0},
        {"ack_timeout_s": math.nan},
        {"backoff_initial_s": -1.0},
        {"backoff_initial_s": 10.0, "backoff_max_s": 5.0},
        {"backoff_multiplier": 0.5},
        {"backoff_jitter": 1.5},
        {"max_deliveries": -1},
        {"max_unacked": True},
    ],
)
def test_policy_rejects_values_out_of_range(kwargs: dict[str, float]) -> None:
    """Scenario: a DispatchPolicy with one value out of its documented range.
    Expected: InvalidSubscriptionError naming the field."""
    with pytest.raises(InvalidSubscriptionError):
        DispatchPolicy(**kwargs)  # type: ignore[arg-type]


# -- exclusive ----------------------------------------------------------------------------


def test_exclusive_refuses_a_second_consumer() -> None:
    """Scenario: a second consumer attaches to an exclusive subscription.
    Expected: SubscriptionBusyError; the first keeps receiving; once it detaches, another
    may attach."""
    d = Driver(DispatchPolicy(type=EXCLUSIVE))
    d.attach("c1")
    with pytest.raises(SubscriptionBusyError):
        d.attach("c2")
    d.logs[0].append(3)
    d.pump()
    assert d.sent_to("c1") == [0, 1, 2]
    assert d.state.consumers() == ["c1"]
    d.do(Detach("c1"))
    d.attach("c2")
    assert d.state.consumers() == ["c2"]


def test_exclusive_keeps_per_partition_order() -> None:
    """Scenario: three partitions with batches of different sizes, read round robin over
    several passes with a small read size.
    Expected: each partition's records arrive once, contiguous and in offset order."""
    d = Driver(DispatchPolicy(type=EXCLUSIVE), partitions=3, max_batches=2)
    d.attach("c")
    for p, log in enumerate(d.logs):
        for i in range(6):
            log.append(1 + (i + p) % 3)
    d.pump()
    for p, log in enumerate(d.logs):
        assert d.sent_to("c", p) == list(range(log.head))
    assert all(not s.delivery.redeliveries for s in d.sends)


@pytest.mark.parametrize(
    ("credit", "batch", "sent"),
    [
        (1, 1, 1),
        (5, 1, 5),
        (5, 3, 6),  # 3, then 3 more with 2 left: credit goes to -1
        (6, 3, 6),
        (7, 3, 9),
        (1, 4, 4),  # one batch, whatever its size
        (2, 10, 10),
    ],
)
def test_credit_is_spent_whole_slices_at_a_time(credit: int, batch: int, sent: int) -> None:
    """Scenario: one consumer with ``credit``, batches of ``batch`` records, plenty of them.
    Expected: whole batches are sent while credit is positive (a slice is never split to
    fit), so credit ends between -(batch - 1) and 0; a grant lets the rest flow."""
    d = Driver(DispatchPolicy(type=EXCLUSIVE))
    d.attach("c", credit=credit)
    d.logs[0].append_batches(12, batch)
    d.pump()
    assert d.sent_to("c") == list(range(sent))
    assert -(batch - 1) <= d.state.credit("c") == credit - sent <= 0
    d.do(Grant("c", 1_000))
    d.pump()
    assert d.sent_to("c") == list(range(12 * batch))


def test_credit_is_shared_by_partitions() -> None:
    """Scenario: credit 3 over two partitions whose batches hold 2 records each, read one
    batch at a time.
    Expected: the first partition's batch goes (credit 1), then the other's (credit -1),
    and nothing more until a grant."""
    d = Driver(DispatchPolicy(type=EXCLUSIVE), partitions=2, max_batches=1)
    d.attach("c", credit=3)
    for log in d.logs:
        log.append_batches(3, 2)
    d.pump()
    assert sorted(d.sent_pairs("c")) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert d.state.credit("c") == -1


@pytest.mark.parametrize(("max_unacked", "batch", "held"), [(1, 1, 1), (4, 1, 4), (4, 3, 6)])
def test_max_unacked_caps_what_is_held(max_unacked: int, batch: int, held: int) -> None:
    """Scenario: plenty of credit, ``max_unacked`` records at most, batches of ``batch``.
    Expected: sending stops once ``held`` reaches the cap (a slice is not split, so it may
    pass the cap by less than one batch); acks free room and more flows."""
    d = Driver(DispatchPolicy(type=EXCLUSIVE, max_unacked=max_unacked))
    d.attach("c")
    d.logs[0].append_batches(10, batch)
    d.pump()
    assert d.state.held == held == len(d.sent_to("c"))
    assert held < max_unacked + batch
    assert not d.state.has_room()
    d.do(Ack(0, 0, batch))
    d.pump()
    assert d.state.held == held
    assert len(d.sent_to("c")) == held + batch


def test_max_unacked_counts_waiting_and_parked_records() -> None:
    """Scenario: max_unacked 4; four records sent; one is nacked with a delay (waiting),
    one reaches max_deliveries and goes to the dead-letter queue (parked).
    Expected: held stays 4 and no new record goes out until something is acknowledged
    or dead-lettered."""
    policy = DispatchPolicy(type=EXCLUSIVE, max_unacked=4, max_deliveries=1)
    d = Driver(policy)
    d.attach("c")
    d.logs[0].append_batches(8)
    d.pump()
    assert d.sent_to("c") == [0, 1, 2, 3]
    d.do(Nack(0, 1, 2, delay_s=100))  # 1 waits
    actions = d.do(Nack(0, 0, 1)) + d.pump(now=10)  # 0 is poison: parked
    assert [a.begin for a in actions if isinstance(a, ToDeadLetter)] == [0]
    assert d.state.held == 4
    assert d.sent_to("c") == [0, 1, 2, 3]
    d.do(DeadLettered(0, 0, 1))
    d.pump()
    assert d.sent_to("c") == [0, 1, 2, 3, 4]
    assert d.state.held == 4


# -- failover -----------------------------------------------------------------------------


def test_failover_sends_only_to_the_first_consumer() -> None:
    """Scenario: three consumers attach to a failover subscription.
    Expected: only the first receives; the standbys receive nothing, credit or not."""
    d = Driver(DispatchPolicy(type=FAILOVER), partitions=2)
    for name in ("a", "b", "c"):
        d.attach(name)
    for log in d.logs:
        log.append_batches(4, 2)
    d.pump()
    assert len(d.sent_to("a")) == 16
    assert d.sent_to("b") == d.sent_to("c") == []


def test_failover_takeover_resends_the_unacked_first_in_order() -> None:
    """Scenario: the active consumer got 0..5 in batches of two, acked 0..1 and 4..5, and
    left; 6..7 were published meanwhile.
    Expected: the standby gets 2, 3 first (redelivery count 1), then 6, 7 (new, count 0);
    the unacked records' failure is persisted before they go out again."""
    d = Driver(DispatchPolicy(type=FAILOVER))
    d.attach("a")
    d.attach("b")
    d.logs[0].append_batches(3, 2)
    d.pump()
    d.do(Ack(0, 0, 2))
    d.do(Ack(0, 4, 6))
    d.logs[0].append(2)
    d.do(Detach("a"), now=1)
    actions = d.pump()
    assert d.sent_to("b") == [2, 3, 6, 7]
    assert isinstance(actions[0], Persist)
    assert d.redeliveries("b") == {2: 1, 3: 1}
    assert d.state.consumers() == ["b"]


def test_failover_order_holds_through_two_takeovers() -> None:
    """Scenario: three consumers; the active leaves with records unacked, then the next
    leaves too, with credit limiting each pass.
    Expected: every consumer receives offsets in increasing order within each pass of
    takeover, and in the end every record was received, the leftovers with counts."""
    d = Driver(DispatchPolicy(type=FAILOVER))
    for name in ("a", "b", "c"):
        d.attach(name, credit=4)
    d.logs[0].append_batches(12)
    d.pump()
    assert d.sent_to("a") == [0, 1, 2, 3]
    d.do(Ack(0, 0, 1))
    d.do(Detach("a"))
    d.pump()
    assert d.sent_to("b") == [1, 2, 3, 4]
    assert d.redeliveries("b") == {1: 1, 2: 1, 3: 1}
    d.do(Detach("b"))
    d.pump()
    assert d.sent_to("c") == [1, 2, 3, 4]
    assert d.redeliveries("c") == {1: 2, 2: 2, 3: 2, 4: 1}
    d.do(Ack(0, 1, 5))
    d.do(Grant("c", 100))
    d.pump()
    assert d.sent_to("c") == list(range(1, 12))


def test_failover_a_returning_consumer_does_not_take_over() -> None:
    """Scenario: the active consumer a leaves and attaches again while b is active.
    Expected: b stays active (it attached before a's new session); a stands by."""
    d = Driver(DispatchPolicy(type=FAILOVER))
    d.attach("a")
    d.attach("b")
    d.do(Detach("a"))
    d.attach("a2", name="a")
    d.logs[0].append(2)
    d.pump()
    assert d.sent_to("b") == [0, 1]
    assert d.sent_to("a2") == []
    assert d.state.consumers() == ["b", "a"]


# -- shared -------------------------------------------------------------------------------


def test_shared_goes_round_robin() -> None:
    """Scenario: three consumers with credit, six batches of two records.
    Expected: batches go a, b, c, a, b, c."""
    d = Driver(DispatchPolicy(type=SHARED))
    for name in ("a", "b", "c"):
        d.attach(name)
    d.logs[0].append_batches(6, 2)
    d.pump()
    assert [s.consumer for s in d.sends] == ["a", "b", "c", "a", "b", "c"]
    assert d.sent_to("a") == [0, 1, 6, 7]


def test_shared_skips_a_consumer_without_credit() -> None:
    """Scenario: a has credit for one batch, b and c plenty; eight batches.
    Expected: a gets the first, then only b and c take turns; a grant brings a back."""
    d = Driver(DispatchPolicy(type=SHARED))
    d.attach("a", credit=2)
    d.attach("b")
    d.attach("c")
    d.logs[0].append_batches(8, 2)
    d.pump()
    assert [s.consumer for s in d.sends] == ["a", "b", "c", "b", "c", "b", "c", "b"]
    d.take()
    d.do(Grant("a", 10))
    d.logs[0].append_batches(3, 2)
    d.pump()
    assert [s.consumer for s in d.sends] == ["c", "a", "b"]


def test_shared_waits_when_nobody_has_credit() -> None:
    """Scenario: both shared consumers spent their credit.
    Expected: nothing more is read; reads() asks for nothing; a grant resumes dispatch."""
    d = Driver(DispatchPolicy(type=SHARED))
    d.attach("a", credit=1)
    d.attach("b", credit=1)
    d.logs[0].append_batches(5)
    d.pump()
    assert len(d.sends) == 2
    assert d.state.reads([5], d.now) == []
    assert d.state.ready([5], d.now) == 3
    d.do(Grant("b", 1))
    d.pump()
    assert d.sent_to("b") == [1, 2]


@pytest.mark.parametrize(
    ("order", "cursors"),
    [
        ([3, 1, 0, 2], [0, 0, 2, 4]),
        ([0, 1, 2, 3], [1, 2, 3, 4]),
        ([3, 2, 1, 0], [0, 0, 0, 4]),
        ([1, 3, 2, 0], [0, 0, 0, 4]),
        ([0, 2, 3, 1], [1, 1, 1, 4]),
    ],
)
def test_shared_individual_acks_advance_the_cursor(order: list[int], cursors: list[int]) -> None:
    """Scenario: four records sent one per batch to two shared consumers, acked one by one
    in ``order``.
    Expected: the cursor moves only over contiguous acked prefixes, as listed; the ack
    holes show in lag and in the snapshot."""
    d = Driver(DispatchPolicy(type=SHARED))
    d.attach("a")
    d.attach("b")
    d.logs[0].append_batches(4)
    d.pump()
    assert d.sent_to("a") == [0, 2]
    assert d.sent_to("b") == [1, 3]
    for offset, cursor in zip(order, cursors, strict=True):
        d.do(Ack(0, offset, offset + 1))
        assert d.state.cursor(0) == cursor
        acked = order[: order.index(offset) + 1]
        assert d.state.lag(0, 4) == 4 - len(acked)
        assert d.state.in_flight(0) == 4 - len(acked)
    assert d.state.snapshot(10) == [PartitionSnapshot(4, (), 4, ())]


def test_shared_a_leaving_consumer_hands_its_records_to_the_others() -> None:
    """Scenario: a, b, c share six one-record batches; a acks nothing and leaves.
    Expected: a's records (0, 3) go to b and c, before any newer record, with redelivery
    count 1; nothing of b's or c's is resent."""
    d = Driver(DispatchPolicy(type=SHARED))
    for name in ("a", "b", "c"):
        d.attach(name)
    d.logs[0].append_batches(6)
    d.pump()
    assert d.sent_to("a") == [0, 3]
    d.take()
    d.logs[0].append_batches(2)
    d.do(Detach("a"), now=1)
    actions = d.pump()
    assert isinstance(actions[0], Persist)
    assert [o for s in d.sends for o in offsets_of(s)] == [0, 3, 6, 7]
    assert d.redeliveries() == {0: 1, 3: 1}
    assert {s.consumer for s in d.sends} == {"b", "c"}


# -- key_shared ---------------------------------------------------------------------------


def owner_of(key: bytes | None, names: Sequence[str]) -> str:
    """Who owns ``key`` by rendezvous hashing over slots (the module's documented rule)."""
    slot = key_slot(key)
    return max(sorted(names), key=lambda n: zlib.crc32(b"%s/%d" % (n.encode(), slot)))


KEYS = [b"key-%d" % i for i in range(40)]


def key_of(offset: int, keys: Sequence[bytes | None]) -> bytes | None:
    return keys[offset % len(keys)]


def test_key_shared_a_key_always_goes_to_one_consumer() -> None:
    """Scenario: three consumers, 40 keys, 200 records in batches of 7 with mixed keys.
    Expected: every record of a key goes to the same consumer, the one rendezvous hashing
    picks; every consumer gets some keys; per key, offsets arrive in order."""
    d = Driver(DispatchPolicy(type=KEY_SHARED))
    names = ["a", "b", "c"]
    for name in names:
        d.attach(name)
    keys: list[bytes | None] = list(KEYS)
    offset = 0
    while offset < 200:
        d.logs[0].append(7, keys=[key_of(o, keys) for o in range(offset, offset + 7)])
        offset += 7
    d.pump()
    seen: dict[bytes | None, set[str]] = {}
    for name in names:
        got = d.sent_to(name)
        assert got == sorted(got)
        for o in got:
            seen.setdefault(key_of(o, keys), set()).add(name)
    assert all(len(v) == 1 for v in seen.values())
    assert all(seen[k] == {owner_of(k, names)} for k in seen)
    assert {n for v in seen.values() for n in v} == set(names)
    assert sum(len(d.sent_to(n)) for n in names) == offset


def test_key_shared_records_without_a_key_share_one_consumer() -> None:
    """Scenario: records without keys, and records with an empty key, among keyed ones.
    Expected: all of them go to the owner of slot 0, in order."""
    d = Driver(DispatchPolicy(type=KEY_SHARED))
    names = ["a", "b", "c"]
    for name in names:
        d.attach(name)
    keys: list[bytes | None] = [None, b"x", b"", b"y", None, b"z"]
    d.logs[0].append(12, keys=[key_of(o, keys) for o in range(12)])
    d.pump()
    nobody = owner_of(None, names)
    assert key_slot(None) == key_slot(b"") == 0
    assert [o for o in d.sent_to(nobody) if key_of(o, keys) in (None, b"")] == [0, 2, 4, 6, 8, 10]
    for name in set(names) - {nobody}:
        assert all(key_of(o, keys) not in (None, b"") for o in d.sent_to(name))


def test_key_shared_a_consumer_without_credit_holds_only_its_keys() -> None:
    """Scenario: two consumers; the owner of key X has no credit left.
    Expected: X's records wait (held, counted), the other key flows; a grant sends X's
    records in order, as first deliveries."""
    names = ["a", "b"]
    x, y = _keys_owned_by(names, "a", 1)[0], _keys_owned_by(names, "b", 1)[0]
    d = Driver(DispatchPolicy(type=KEY_SHARED))
    d.attach("a", credit=1)
    d.attach("b")
    d.logs[0].append(6, keys=[x, y, x, y, x, y])
    d.pump()
    assert d.sent_to("a") == [0]
    assert d.sent_to("b") == [1, 3, 5]
    assert d.state.held == 6
    d.do(Grant("a", 10))
    d.pump()
    assert d.sent_to("a") == [0, 2, 4]
    assert d.redeliveries() == {}


def _keys_owned_by(names: Sequence[str], who: str, count: int) -> list[bytes]:
    out = [k for k in (b"k%d" % i for i in range(1_000)) if owner_of(k, names) == who]
    assert len(out) >= count
    return out[:count]


def test_key_shared_waiting_records_set_aside_do_not_hold_back_new_ones() -> None:
    """Scenario: key_shared, reads of one batch; a alone got records 0..2 of keys that
    move to b; b joins with no credit; a nacks 0..2, so they wait for b; record 3, of a
    key a keeps, arrives.
    Expected: one settling of dispatch sends 3 to a: each pass that sets waiting records
    aside for b counts as progress, so the reads go on past them to the new record."""
    moving = _keys_owned_by(["a", "b"], "b", 3)
    staying = _keys_owned_by(["a", "b"], "a", 1)[0]
    d = Driver(DispatchPolicy(type=KEY_SHARED), max_batches=1)
    d.attach("a")
    for key in moving:
        d.logs[0].append(1, keys=[key])
    d.pump()
    d.attach("b", credit=0)
    d.do(Nack(0, 0, 3, delay_s=0))
    d.logs[0].append(1, keys=[staying])
    d.pump()
    assert d.sent_to("a") == [0, 1, 2, 3]
    assert d.sent_to("b") == []
    assert d.state.set_aside_total == 3


def test_key_shared_a_joining_consumer_waits_for_older_records_of_its_keys() -> None:
    """Scenario: a alone got records 0..7 of keys that will move to b (and of keys that
    stay with a), unacked; b joins; 8..15 with the same keys are published.
    Expected: a gets its own new records at once; b's are held (counted) until everything
    below b's arrival position (8) is acknowledged, then flow in order, as first
    deliveries (redelivery count 0)."""
    moving = _keys_owned_by(["a", "b"], "b", 2)
    staying = _keys_owned_by(["a", "b"], "a", 2)
    keys: list[bytes | None] = [moving[0], staying[0], moving[1], staying[1]]
    d = Driver(DispatchPolicy(type=KEY_SHARED))
    d.attach("a")
    d.logs[0].append(8, keys=[key_of(o, keys) for o in range(8)])
    d.pump()
    assert d.sent_to("a") == list(range(8))
    d.attach("b")
    d.logs[0].append(8, keys=[key_of(o, keys) for o in range(8, 16)])
    d.pump(now=1)
    assert d.sent_to("a") == [*range(8), 9, 11, 13, 15]
    assert d.sent_to("b") == []
    assert d.state.held == 16
    d.do(Ack(0, 0, 7))  # 7 is still out: b waits
    d.pump(now=2)
    assert d.sent_to("b") == []
    d.do(Ack(0, 7, 8))
    d.pump(now=3)
    assert d.sent_to("b") == [8, 10, 12, 14]
    assert d.redeliveries() == {}


def test_key_shared_a_set_aside_record_of_a_moved_key_waits_for_the_older_one() -> None:
    """Scenario: a (credit for one record) and c; one read of records 0 (key X, a's), 1
    (key Y, c's), 2 (key X): 0 goes to a, 1 to c, 2 is set aside for a (no credit); b
    joins and now owns X. Expected: b does not get 2 while 0 is unacknowledged at a (X's
    order; found by a chaos run, where a record read before a consumer joined went to it
    at once); once 0 is acked, 2 goes to b as a first delivery."""
    x = next(
        k
        for k in (b"k%d" % i for i in range(1_000))
        if owner_of(k, ["a", "c"]) == "a" and owner_of(k, ["a", "b", "c"]) == "b"
    )
    y = _keys_owned_by(["a", "b", "c"], "c", 1)[0]
    d = Driver(DispatchPolicy(type=KEY_SHARED))
    d.attach("a", credit=1)
    d.attach("c")
    d.logs[0].append(3, keys=[x, y, x])
    d.pump()
    assert (d.sent_to("a"), d.sent_to("c")) == ([0], [1])
    assert d.state.set_aside_total == 1
    d.attach("b")
    d.pump(now=1)
    assert d.sent_to("b") == []
    d.do(Ack(0, 1, 2))  # c's ack: 0 is still out at a
    d.pump(now=2)
    assert d.sent_to("b") == []
    d.do(Ack(0, 0, 1))
    d.pump(now=3)
    assert d.sent_to("b") == [2]
    assert d.redeliveries() == {}


def test_key_shared_held_records_are_not_poison() -> None:
    """Scenario: as above, with max_deliveries 1: the joining consumer's records were held
    while later records of other keys were sent.
    Expected: once released they are sent (their first delivery), not dead-lettered."""
    moving = _keys_owned_by(["a", "b"], "b", 1)[0]
    staying = _keys_owned_by(["a", "b"], "a", 1)[0]
    d = Driver(DispatchPolicy(type=KEY_SHARED, max_deliveries=1))
    d.attach("a")
    d.logs[0].append(2, keys=[moving, staying])
    d.pump()
    d.attach("b")
    d.logs[0].append(2, keys=[moving, staying])
    d.pump()
    d.do(Ack(0, 0, 2))
    actions = d.pump()
    assert not [a for a in actions if isinstance(a, ToDeadLetter)]
    assert d.sent_to("b") == [2]
    assert d.redeliveries() == {}


def test_key_shared_a_nacked_record_of_a_moved_key_goes_to_the_new_owner_first() -> None:
    """Scenario: a got record 0 of key X; b joins and now owns X; 1 (key X) is published;
    a nacks 0.
    Expected: 0 goes to b (it is below b's arrival position), and b's newer record 1 only
    follows once 0 is acknowledged: X's order holds."""
    x = _keys_owned_by(["a", "b"], "b", 1)[0]
    d = Driver(DispatchPolicy(type=KEY_SHARED))
    d.attach("a")
    d.logs[0].append(1, keys=[x])
    d.pump()
    d.attach("b")
    d.logs[0].append(1, keys=[x])
    d.pump()
    d.do(Nack(0, 0, 1, delay_s=0))
    d.pump()
    assert d.sent_to("b") == [0]
    assert d.redeliveries("b") == {0: 1}
    d.do(Ack(0, 0, 1))
    d.pump()
    assert d.sent_to("b") == [0, 1]


def test_key_shared_a_leaving_consumer_keys_move_and_its_records_come_first() -> None:
    """Scenario: a, b, c share 30 records of 10 keys; b leaves with its records unacked;
    30 more records of the same keys follow.
    Expected: b's keys move to a and c; b's old records are resent (count 1) before any
    newer record of the same key; every key's offsets reach its new owner in order."""
    names = ["a", "b", "c"]
    keys: list[bytes | None] = [b"key-%d" % i for i in range(10)]
    d = Driver(DispatchPolicy(type=KEY_SHARED))
    for name in names:
        d.attach(name)
    d.logs[0].append(30, keys=[key_of(o, keys) for o in range(30)])
    d.pump()
    left = d.sent_to("b")
    assert left
    acked_by_others = [o for o in range(30) if o not in left]
    for o in acked_by_others:
        d.do(Ack(0, o, o + 1))
    d.take()
    d.do(Detach("b"), now=1)
    d.logs[0].append(30, keys=[key_of(o, keys) for o in range(30, 60)])
    d.pump()
    assert d.redeliveries() == dict.fromkeys(left, 1)
    for name in ("a", "c"):
        got = d.sent_to(name)
        per_key: dict[bytes | None, list[int]] = {}
        for o in got:
            per_key.setdefault(key_of(o, keys), []).append(o)
            assert owner_of(key_of(o, keys), ["a", "c"]) == name
        assert all(v == sorted(v) for v in per_key.values())
    assert sorted(d.sent_to("a") + d.sent_to("c")) == sorted(left + list(range(30, 60)))


# -- at most once -------------------------------------------------------------------------


def test_at_most_once_acks_on_send() -> None:
    """Scenario: at_most_once; five records sent.
    Expected: the cursor is past them at once; nothing is in flight or held; nothing is
    sent again after the consumer leaves, after a nack, or after any ack timeout."""
    d = Driver(DispatchPolicy(type=EXCLUSIVE, mode=DeliveryMode.AT_MOST_ONCE, ack_timeout_s=1))
    d.attach("a")
    d.logs[0].append_batches(5)
    d.pump()
    assert d.sent_to("a") == [0, 1, 2, 3, 4]
    assert d.state.cursor(0) == 5
    assert d.state.in_flight(0) == d.state.held == 0
    assert d.do(Nack(0, 0, 5)) == []
    d.do(Detach("a"))
    d.attach("b")
    d.pump(now=100)
    assert d.sent_to("b") == []
    assert d.state.next_deadline() is None
    assert d.state.snapshot(10) == [PartitionSnapshot(5, (), 5, ())]


def test_at_most_once_is_limited_by_credit_only() -> None:
    """Scenario: at_most_once with max_unacked 2 and credit 4.
    Expected: four records go out (nothing is held, so the cap never binds)."""
    policy = DispatchPolicy(type=SHARED, mode=DeliveryMode.AT_MOST_ONCE, max_unacked=2)
    d = Driver(policy)
    d.attach("a", credit=4)
    d.logs[0].append_batches(10)
    d.pump()
    assert d.sent_to("a") == [0, 1, 2, 3]


# -- acks ---------------------------------------------------------------------------------


def _sent(n: int, batch: int = 1, policy: DispatchPolicy | None = None) -> Driver:
    """A driver whose exclusive consumer "c" got ``n`` batches of ``batch`` records at t=0."""
    d = Driver(policy or DispatchPolicy(type=EXCLUSIVE))
    d.attach("c")
    d.logs[0].append_batches(n, batch)
    d.pump()
    return d


def test_out_of_order_acks_leave_holes_until_filled() -> None:
    """Scenario: ten records sent; acks of [5, 8), [2, 3), then [0, 2), then [3, 5).
    Expected: the cursor stops at each hole; the snapshot shows the ranges above it and
    the delivered mark; filling the holes moves the cursor to 8."""
    d = _sent(10)
    d.do(Ack(0, 5, 8))
    d.do(Ack(0, 2, 3))
    assert d.state.cursor(0) == 0
    assert d.state.snapshot(10) == [PartitionSnapshot(0, ((2, 3), (5, 8)), 10, ())]
    d.do(Ack(0, 0, 2))
    assert d.state.cursor(0) == 3
    d.do(Ack(0, 3, 5))
    assert d.state.cursor(0) == 8
    assert d.state.in_flight(0) == 2
    assert d.state.lag(0, 10) == 2
    assert d.state.acked_total == 8


@pytest.mark.parametrize(
    ("offset", "cursor", "in_flight"),
    [(0, 0, 10), (1, 1, 9), (4, 4, 6), (10, 10, 0)],
)
def test_cumulative_ack(offset: int, cursor: int, in_flight: int) -> None:
    """Scenario: ten records sent; AckUpTo(offset).
    Expected: every offset below ``offset`` is acknowledged."""
    d = _sent(10)
    d.do(AckUpTo(0, offset))
    assert d.state.cursor(0) == cursor
    assert d.state.in_flight(0) == in_flight


def test_cumulative_ack_merges_with_ranges_above() -> None:
    """Scenario: [6, 8) acked, then AckUpTo(6).
    Expected: the cursor jumps to 8."""
    d = _sent(10)
    d.do(Ack(0, 6, 8))
    d.do(AckUpTo(0, 6))
    assert d.state.cursor(0) == 8


@pytest.mark.parametrize(
    "cmd",
    [Ack(0, 0, 11), Ack(0, 10, 11), Ack(0, 50, 60), AckUpTo(0, 11), Nack(0, 9, 11)],
)
def test_acks_of_offsets_never_sent_are_refused(cmd: Command) -> None:
    """Scenario: offsets 0..9 were sent; an ack (or nack) reaches offset 10 or beyond.
    Expected: InvalidAckError, and nothing changes."""
    d = _sent(10)
    with pytest.raises(InvalidAckError):
        d.do(cmd)
    assert d.state.cursor(0) == 0
    assert d.state.in_flight(0) == 10


@pytest.mark.parametrize("cmd", [Ack(0, 9, 10), AckUpTo(0, 10), Ack(0, 0, 10)])
def test_acks_up_to_the_last_sent_offset_are_accepted(cmd: Command) -> None:
    """Scenario: offsets 0..9 were sent; an ack ends exactly at 10.
    Expected: accepted."""
    d = _sent(10)
    d.do(cmd)
    assert d.state.in_flight(0) < 10


@pytest.mark.parametrize(
    "cmd",
    [
        Ack(0, 5, 5),
        Ack(0, 5, 4),
        Ack(0, -1, 2),
        Ack(3, 0, 1),
        Ack(-1, 0, 1),
        AckUpTo(2, 1),
        Nack(0, 3, 3),
        Nack(0, -2, 1),
        Nack(5, 0, 1),
        Nack(0, 0, 1, delay_s=-1),
        Nack(0, 0, 1, delay_s=math.nan),
        Commit(0, 11, 10),
        Commit(0, -1, 10),
        Commit(4, 0, 10),
        Deleted(9, 3),
        DeadLettered(9, 0, 1),
        Seek((0, 0)),
    ],
)
def test_bad_requests_are_refused(cmd: Command) -> None:
    """Scenario: an empty or negative range, an unknown partition, a negative or NaN nack
    delay, a commit outside [0, head], or a seek with the wrong number of offsets.
    Expected: InvalidSubscriptionError, and nothing changes."""
    d = _sent(10)
    with pytest.raises(InvalidSubscriptionError):
        d.do(cmd)
    assert d.state.in_flight(0) == 10


def test_acks_below_the_cursor_and_repeats_are_harmless() -> None:
    """Scenario: the same range acked twice, then a cumulative ack below the cursor.
    Expected: counted once; the cursor never moves back."""
    d = _sent(5)
    d.do(Ack(0, 0, 3))
    d.do(Ack(0, 0, 3))
    d.do(AckUpTo(0, 1))
    assert d.state.cursor(0) == 3
    assert d.state.acked_total == 3


def test_commit_acks_unsent_offsets_and_moves_the_read_position() -> None:
    """Scenario: a pull reader (Spark) commits offset 50 of a 100-record partition that
    no consumer received.
    Expected: the cursor and read position are 50; a consumer that attaches gets 50..99
    as first deliveries; a commit below the cursor changes nothing."""
    d = Driver(DispatchPolicy(type=SHARED))
    d.logs[0].append_batches(10, 10)
    d.do(Commit(0, 50, 100))
    assert d.state.cursor(0) == d.state.read_position(0) == 50
    assert d.state.lag(0, 100) == 50
    d.do(Commit(0, 20, 100))
    assert d.state.cursor(0) == 50
    d.attach("a")
    d.pump()
    assert d.sent_to("a") == list(range(50, 100))
    assert d.redeliveries() == {}


def test_commit_acks_leased_records_below_it() -> None:
    """Scenario: ten records leased to a consumer; a commit at 6.
    Expected: 0..5 are acknowledged (no longer in flight), 6..9 stay leased."""
    d = _sent(10)
    d.do(Commit(0, 6, 10))
    assert d.state.cursor(0) == 6
    assert d.state.in_flight(0) == 4


def test_snapshot_keeps_cursor_ranges_delivered_mark_and_failures() -> None:
    """Scenario: ten records sent at t=2; [3, 5) acked; 7 nacked with reason "bad".
    Expected: snapshot() holds cursor 0, the range, delivered mark 10 and the failure of 7
    with its count, reason and send time (ms)."""
    d = Driver(DispatchPolicy(type=EXCLUSIVE))
    d.attach("c")
    d.logs[0].append_batches(10)
    d.pump(now=2)
    d.do(Ack(0, 3, 5))
    d.do(Nack(0, 7, 8, reason="bad", delay_s=60))
    assert d.state.snapshot(10) == [
        PartitionSnapshot(0, ((3, 5),), 10, (FailureRun(7, 8, 1, "bad", (2000,)),))
    ]


def test_snapshot_with_few_ranges_does_not_lose_acked_records() -> None:
    """Scenario: acks leave four ranges above the cursor; a snapshot keeps only two of
    them; then every hole is acknowledged.
    Expected: the snapshot lists the two lowest ranges (the rest are resent after a
    restart), and the running subscription still reaches cursor 10: the records of the
    ranges left out of the snapshot are neither lost nor stuck."""
    d = _sent(10)
    for o in (1, 3, 5, 7):
        d.do(Ack(0, o, o + 1))
    snap = d.state.snapshot(2)
    assert snap == [PartitionSnapshot(0, ((1, 2), (3, 4)), 10, ())]
    for o in (0, 2, 4, 6, 8, 9):
        d.do(Ack(0, o, o + 1))
    assert d.state.cursor(0) == 10
    assert d.state.held == 0


# -- ack timeout --------------------------------------------------------------------------


TIMEOUT_POLICY = DispatchPolicy(
    type=EXCLUSIVE,
    ack_timeout_s=10,
    backoff_initial_s=1,
    backoff_multiplier=2,
    backoff_max_s=5,
    backoff_jitter=0.2,
)


def test_an_expired_lease_waits_the_backoff_then_is_resent() -> None:
    """Scenario: three records sent at t=0, ack timeout 10 s, backoff 1 s, no jitter.
    Expected: nothing happens at 9.999; at 10 the lease expires (3 ack timeouts counted),
    the records wait until exactly 11, then go out again with redelivery count 1."""
    d = _sent(1, 3, TIMEOUT_POLICY)
    assert d.state.next_deadline() == 10
    d.pump(now=9.999)
    assert d.state.in_flight(0) == 3
    d.pump(now=10)
    assert d.state.ack_timeouts_total == 3
    assert d.state.in_flight(0) == 0
    assert d.state.held == 3
    assert d.state.next_deadline() == 11
    d.take()
    d.pump(now=10.999)
    assert d.sends == []
    d.pump(now=11)
    assert d.sent_to("c") == [0, 1, 2]
    assert d.redeliveries() == {0: 1, 1: 1, 2: 1}
    assert d.state.next_deadline() == 21
    assert d.state.redelivered_total == 3


@pytest.mark.parametrize(
    ("rand", "wait"),
    [(0.0, 0.8), (0.5, 1.0), (0.999_999, 1.199_999_6)],
)
def test_ack_timeout_backoff_jitter_bounds(rand: float, wait: float) -> None:
    """Scenario: a lease expires at t=10 with 20 % jitter and random fixed at 0, 0.5, ~1.
    Expected: the record is ready at 10 + 0.8, 10 + 1 and just under 10 + 1.2; not a hair
    before."""
    d = Driver(TIMEOUT_POLICY, random=lambda: rand)
    d.attach("c")
    d.logs[0].append(1)
    d.pump()
    d.take()
    d.pump(now=10)
    ready = d.state.next_deadline()
    assert ready == pytest.approx(10 + wait, abs=1e-6)
    assert ready is not None
    assert ready < 11.2
    d.pump(now=ready - 1e-6)
    assert d.sends == []
    d.pump(now=ready)
    assert d.sent_to("c") == [0]


def test_repeated_timeouts_back_off_exponentially_up_to_the_cap() -> None:
    """Scenario: a record is never acknowledged; each resend times out again.
    Expected: it waits 1, 2, 4, 5, 5 s (initial, x2, ..., capped at backoff_max) and its
    redelivery count grows by one each time."""
    d = _sent(1, 1, TIMEOUT_POLICY)
    sent_at = 0.0
    waits = []
    for attempt in range(1, 6):
        expired = sent_at + 10
        d.pump(now=expired)
        ready = d.state.next_deadline()
        assert ready is not None
        waits.append(ready - expired)
        d.take()
        d.pump(now=ready)
        assert d.redeliveries() == {0: attempt}
        sent_at = ready
    assert waits == [1, 2, 4, 5, 5]
    assert d.state.ack_timeouts_total == 5


def test_a_late_ack_removes_the_waiting_record() -> None:
    """Scenario: the lease of 0..2 expires at t=10; the consumer acks 1 at 10.5.
    Expected: at 11 only 0 and 2 are resent; 1 is acknowledged, not resent."""
    d = _sent(1, 3, TIMEOUT_POLICY)
    d.pump(now=10)
    d.do(Ack(0, 1, 2), now=10.5)
    d.take()
    d.pump(now=11)
    assert d.sent_to("c") == [0, 2]
    d.do(Ack(0, 0, 3))
    assert d.state.cursor(0) == 3
    assert d.state.held == 0


def test_only_the_unacked_part_of_a_lease_times_out() -> None:
    """Scenario: five records in one lease; 0..1 and 3 acked; the lease expires.
    Expected: two ack timeouts (2 and 4), and only they are resent."""
    d = _sent(1, 5, TIMEOUT_POLICY)
    d.do(Ack(0, 0, 2))
    d.do(Ack(0, 3, 4))
    d.pump(now=10)
    assert d.state.ack_timeouts_total == 2
    d.take()
    d.pump(now=11)
    assert d.sent_to("c") == [2, 4]


def test_no_ack_timeout_means_leases_never_expire() -> None:
    """Scenario: ack_timeout_s None; a record is sent and time passes.
    Expected: no deadline, no redelivery, ever."""
    d = _sent(1, 1, DispatchPolicy(ack_timeout_s=None))
    assert d.state.next_deadline() is None
    d.take()
    d.pump(now=1e9)
    assert d.sends == []
    assert d.state.in_flight(0) == 1


# -- nack ---------------------------------------------------------------------------------


def test_nack_with_a_delay_is_ready_exactly_then() -> None:
    """Scenario: record 0 nacked at t=1 with a 5 s delay.
    Expected: ready at exactly 6: not sent at 5.999, sent at 6 with count 1."""
    d = _sent(1)
    d.do(Nack(0, 0, 1, delay_s=5), now=1)
    assert d.state.next_deadline() == 6
    assert d.state.ready([1], 5.999) == 0
    assert d.state.ready([1], 6) == 1
    d.take()
    d.pump(now=5.999)
    assert d.sends == []
    d.pump(now=6)
    assert d.sent_to("c") == [0]
    assert d.redeliveries() == {0: 1}
    assert d.state.nacked_total == 1


def test_nack_with_zero_delay_is_ready_now() -> None:
    """Scenario: a nack with delay 0.
    Expected: the record goes out again in the same pass."""
    d = _sent(1)
    d.do(Nack(0, 0, 1, delay_s=0), now=3)
    d.take()
    d.pump()
    assert d.sent_to("c") == [0]


def test_nack_without_a_delay_waits_the_backoff() -> None:
    """Scenario: record 0 nacked at t=2 without a delay; backoff 1 s, then 2 s.
    Expected: ready at 3; nacked again at 4 it waits 2 s (its second failure)."""
    d = _sent(1, 1, TIMEOUT_POLICY)
    d.do(Nack(0, 0, 1), now=2)
    assert d.state.next_deadline() == 3
    d.pump(now=3)
    d.do(Nack(0, 0, 1), now=4)
    assert d.state.next_deadline() == 6


def test_nack_of_part_of_a_lease_leaves_the_rest_leased() -> None:
    """Scenario: five records in one lease; [1, 3) nacked with a delay.
    Expected: 0, 3 and 4 stay in flight with their deadline; 1 and 2 wait; the lease's
    remainder still expires at the ack timeout."""
    d = _sent(1, 5, TIMEOUT_POLICY)
    d.do(Nack(0, 1, 3, delay_s=100), now=1)
    assert d.state.in_flight(0) == 3
    assert d.state.held == 5
    assert d.state.next_deadline() == 10
    d.pump(now=10)
    assert d.state.ack_timeouts_total == 3
    d.take()
    d.pump(now=11)
    assert d.sent_to("c") == [0, 3, 4]


def test_nack_of_records_not_leased_is_ignored() -> None:
    """Scenario: a nack of a record already acknowledged, and of one already waiting.
    Expected: nothing changes; the waiting record keeps its ready time."""
    d = _sent(3)
    d.do(Ack(0, 0, 1))
    d.do(Nack(0, 1, 2, delay_s=10))
    d.do(Nack(0, 0, 2, delay_s=1))
    assert d.state.next_deadline() == 10
    assert d.state.cursor(0) == 1
    assert d.state.nacked_total == 1


def test_nack_reason_is_kept_and_defaulted() -> None:
    """Scenario: one record nacked with reason "bad json", another without a reason.
    Expected: the snapshot's failures carry "bad json" and "nacked by the consumer"."""
    d = _sent(2)
    d.do(Nack(0, 0, 1, delay_s=60, reason="bad json"))
    d.do(Nack(0, 1, 2, delay_s=60))
    runs = d.state.snapshot(10)[0].failures
    assert [(r.begin, r.reason) for r in runs] == [(0, "bad json"), (1, "nacked by the consumer")]


def test_a_long_nack_reason_is_cut_to_its_first_1024_characters() -> None:
    """Scenario: a record nacked with a 5,000-character reason (a client may send up to
    the request size limit; the reason is saved with the cursor on every flush).
    Expected: the failure keeps the first 1,024 characters."""
    d = _sent(1)
    reason = "".join(chr(ord("a") + i % 26) for i in range(5_000))
    d.do(Nack(0, 0, 1, delay_s=60, reason=reason))
    assert d.state.snapshot(10)[0].failures[0].reason == reason[:1024]


# -- persist ------------------------------------------------------------------------------


def test_the_first_redelivery_after_a_failure_is_preceded_by_persist() -> None:
    """Scenario: two records nacked; redelivered; then nacked again and redelivered.
    Expected: each redelivery pass starts with Persist (before its Send); a pass with only
    first deliveries has none."""
    d = _sent(2)
    d.do(Nack(0, 0, 2, delay_s=0))
    actions = d.pump()
    assert kinds(actions) == ["Persist", "Send", "Send"]
    d.logs[0].append(1)
    assert kinds(d.pump()) == ["Send"]
    d.do(Nack(0, 0, 1, delay_s=0))
    assert kinds(d.pump())[:2] == ["Persist", "Send"]


def test_a_redelivery_is_saved_again_though_its_failure_was_saved() -> None:
    """Scenario: a record nacked; the shell takes a snapshot (saves) before it goes out
    again.
    Expected: the redelivery still starts with Persist: the save held its failure, not the
    count of the send that follows."""
    d = _sent(1)
    d.do(Nack(0, 0, 1, delay_s=0))
    d.state.snapshot(10)
    assert kinds(d.pump()) == ["Persist", "Send"]
    assert d.state.snapshot(10)[0].failures[0].deliveries == 2


def test_every_redelivery_pass_persists_and_first_deliveries_do_not() -> None:
    """Scenario: two records nacked with different delays, so they go out again in two
    passes; then a new record.
    Expected: each redelivery pass starts with Persist; the new record's pass has none."""
    d = _sent(2)
    d.do(Nack(0, 0, 1, delay_s=1))
    d.do(Nack(0, 1, 2, delay_s=2))
    assert kinds(d.pump(now=1)) == ["Persist", "Send"]
    assert kinds(d.pump(now=2)) == ["Persist", "Send"]
    d.logs[0].append(1)
    assert kinds(d.pump(now=3)) == ["Send"]


# -- poison records -----------------------------------------------------------------------


def _poisoned(policy: PoisonPolicy, *, partitions: int = 1, records: int = 3) -> Driver:
    """Record 1 of partition 0 failed twice (max_deliveries 2), at t=0 and t=1, and is
    routed again at t=2; partition 0 holds ``records`` one-record batches."""
    d = Driver(DispatchPolicy(type=EXCLUSIVE, max_deliveries=2, poison=policy), partitions)
    d.attach("c")
    for log in d.logs:
        log.append_batches(records)
    d.pump()
    d.do(Nack(0, 1, 2, delay_s=0, reason="boom"))
    d.pump(now=1)
    d.do(Nack(0, 1, 2, delay_s=1, reason="boom again"))
    return d


def test_dead_letter_policy_parks_and_writes_the_record() -> None:
    """Scenario: max_deliveries 2; record 1 failed twice; policy dead_letter.
    Expected: ToDeadLetter with its 2 attempts, the last reason and both attempt times;
    the record is parked (held, not sent); DeadLettered acknowledges it."""
    d = _poisoned(PoisonPolicy.DEAD_LETTER)
    d.take()
    actions = d.pump(now=2)
    assert d.sends == []
    letters = [a for a in actions if isinstance(a, ToDeadLetter)]
    assert len(letters) == 1
    letter = letters[0]
    assert (letter.partition, letter.begin, letter.end) == (0, 1, 2)
    assert letter.batch.base_offset <= 1 < letter.batch.next_offset
    assert letter.failures == (Failure(1, 2, "boom again", (0, 1000)),)
    assert d.state.held == 3  # 0 and 2 leased, 1 parked
    assert d.state.in_flight(0) == 2
    assert d.state.blocked(0) == ""
    d.do(Ack(0, 0, 1))
    d.do(Ack(0, 2, 3))
    d.do(DeadLettered(0, 1, 2))
    assert d.state.cursor(0) == 3
    assert d.state.held == 0
    assert d.state.dead_lettered_total == 1


def test_failed_dead_letter_write_blocks_the_partition_and_is_retried() -> None:
    """Scenario: the dead-letter write of record 1 fails at t=2; new records arrive on both
    partitions.
    Expected: partition 0 is BLOCKED (reason given, error Note), sends nothing, and its
    write is tried again DEAD_LETTER_RETRY_S later (a new ToDeadLetter, not before);
    partition 1 keeps flowing; success unblocks partition 0 and its records flow."""
    d = _poisoned(PoisonPolicy.DEAD_LETTER, partitions=2)
    d.pump(now=2)
    d.take()
    actions = d.do(DeadLetterFailed(0, 1, 2, "disk full"))
    assert [a.level for a in actions if isinstance(a, Note)] == [logging.ERROR]
    assert "disk full" in d.state.blocked(0)
    assert d.state.blocked(1) == ""
    assert d.state.next_deadline() == 2 + DEAD_LETTER_RETRY_S
    for log in d.logs:
        log.append_batches(2)
    assert not [a for a in d.pump(now=2.5) if isinstance(a, ToDeadLetter)]
    assert d.sent_to("c", 0) == []
    assert d.sent_to("c", 1) == [3, 4]
    assert d.state.ready([5, 5], 2.5) == 0
    assert not [a for a in d.pump(now=2.999) if isinstance(a, ToDeadLetter)]
    retry = [a for a in d.pump(now=2 + DEAD_LETTER_RETRY_S) if isinstance(a, ToDeadLetter)]
    assert [(a.partition, a.begin, a.end) for a in retry] == [(0, 1, 2)]
    assert d.sent_to("c", 0) == []
    d.do(DeadLettered(0, 1, 2))
    assert d.state.blocked(0) == ""
    d.pump()
    assert d.sent_to("c", 0) == [3, 4]


def test_drop_policy_acks_the_record_with_a_note() -> None:
    """Scenario: record 1 reached max_deliveries; policy drop.
    Expected: acknowledged, counted as dropped, a warning Note; nothing is dead-lettered
    and the partition keeps flowing."""
    d = _poisoned(PoisonPolicy.DROP)
    d.take()
    actions = d.pump(now=2)
    notes = [a for a in actions if isinstance(a, Note)]
    assert [n.level for n in notes] == [logging.WARNING]
    assert "offset 1" in notes[0].message
    assert not [a for a in actions if isinstance(a, ToDeadLetter)]
    assert d.sends == []
    assert d.state.dropped_total == 1
    d.do(Ack(0, 0, 1))
    assert d.state.cursor(0) == 2
    d.logs[0].append(1)
    d.pump()
    assert d.sent_to("c") == [3]


def test_block_policy_stops_the_partition_until_a_seek() -> None:
    """Scenario: record 1 of partition 0 reached max_deliveries; policy block; new records
    arrive on both partitions.
    Expected: partition 0 is BLOCKED (error Note) and sends nothing, not even later
    records; partition 1 continues; a seek past the record unblocks partition 0."""
    d = _poisoned(PoisonPolicy.BLOCK, partitions=2)
    d.take()
    actions = d.pump(now=2)
    assert [a.level for a in actions if isinstance(a, Note)] == [logging.ERROR]
    assert "offset 1" in d.state.blocked(0)
    for log in d.logs:
        log.append_batches(2)
    d.pump(now=3)
    assert d.sent_to("c", 0) == []
    assert d.sent_to("c", 1) == [3, 4]
    assert d.state.next_deadline() is not None  # leases of partition 1
    d.do(Seek((2, 5)))
    assert d.state.blocked(0) == ""
    d.pump(now=4)
    assert d.sent_to("c", 0) == [2, 3, 4]


def test_block_policy_an_ack_of_the_record_unblocks() -> None:
    """Scenario: partition blocked on poison record 1; the operator acks past it.
    Expected: the partition is unblocked and what follows flows."""
    d = _poisoned(PoisonPolicy.BLOCK)
    d.pump(now=2)
    d.logs[0].append(1)
    d.do(AckUpTo(0, 2))
    assert d.state.blocked(0) == ""
    d.take()
    d.pump(now=3)
    assert d.sent_to("c") == [3]


@pytest.mark.parametrize("max_deliveries", [1, 2, 3, 5])
def test_a_record_is_poison_after_exactly_max_deliveries(max_deliveries: int) -> None:
    """Scenario: a record is nacked after every delivery.
    Expected: it is delivered exactly ``max_deliveries`` times, then dead-lettered with
    that many attempts (one attempt time each)."""
    d = Driver(DispatchPolicy(max_deliveries=max_deliveries))
    d.attach("c")
    d.logs[0].append(1)
    letters: list[ToDeadLetter] = []
    t = 0.0
    d.pump(now=t)
    while not letters:
        assert len(d.sends) <= max_deliveries
        t += 1
        d.do(Nack(0, 0, 1, delay_s=0), now=t)
        letters = [a for a in d.pump() if isinstance(a, ToDeadLetter)]
    assert len(d.sends) == max_deliveries
    (failure,) = letters[0].failures
    assert failure.deliveries == max_deliveries
    assert len(failure.times_ms) == max_deliveries


def test_unlimited_deliveries_never_poison() -> None:
    """Scenario: max_deliveries 0; a record is nacked twenty times.
    Expected: it is sent 21 times, never dead-lettered."""
    d = Driver(DispatchPolicy(max_deliveries=0))
    d.attach("c")
    d.logs[0].append(1)
    d.pump()
    for i in range(20):
        d.do(Nack(0, 0, 1, delay_s=0), now=i)
        assert not [a for a in d.pump() if isinstance(a, ToDeadLetter)]
    assert len(d.sends) == 21
    assert d.redeliveries() == {0: 20}


# -- restart ------------------------------------------------------------------------------


def _restart(d: Driver, *, max_ranges: int = 100) -> Driver:
    """A new state from ``d``'s snapshot, with the same logs, policy and read size (a
    broker restart)."""
    fresh = Driver(
        d.state.policy, snapshots=d.state.snapshot(max_ranges), max_batches=d.max_batches
    )
    fresh.logs = d.logs
    fresh.now = d.now
    return fresh


def test_delivery_counts_survive_a_restart() -> None:
    """Scenario: max_deliveries 3; a record failed twice (t=0, t=1), then the broker
    restarts; it is sent once more at t=5 and fails again.
    Expected: after the restart it goes out with redelivery count 2, and after that third
    failure it is dead-lettered with 3 attempts, their times, and the last reason."""
    d = Driver(DispatchPolicy(max_deliveries=3))
    d.attach("c")
    d.logs[0].append(1)
    d.pump()
    d.do(Nack(0, 0, 1, delay_s=0, reason="one"))
    d.pump(now=1)
    d.do(Nack(0, 0, 1, delay_s=0, reason="two"))
    d = _restart(d)
    d.attach("c2")
    d.pump(now=5)
    assert d.sent_to("c2") == [0]
    assert d.redeliveries() == {0: 2}
    d.do(Nack(0, 0, 1, delay_s=0, reason="three"), now=6)
    letters = [a for a in d.pump() if isinstance(a, ToDeadLetter)]
    assert [a.failures for a in letters] == [(Failure(0, 3, "three", (0, 1000, 5000)),)]


def test_ack_holes_survive_a_restart() -> None:
    """Scenario: ten records sent, [2, 4) and [6, 9) acked, then a restart.
    Expected: only 0, 1, 4, 5 and 9 are sent again, each with redelivery count 1 (the
    delivered mark says they went out before)."""
    d = _sent(10)
    d.do(Ack(0, 2, 4))
    d.do(Ack(0, 6, 9))
    d = _restart(d)
    d.attach("c")
    actions = d.pump()
    assert d.sent_to("c") == [0, 1, 4, 5, 9]
    assert d.redeliveries() == dict.fromkeys([0, 1, 4, 5, 9], 1)
    assert "ToDeadLetter" not in kinds(actions)


def test_delivered_mark_survives_a_restart_only_where_records_went_out() -> None:
    """Scenario: five records of ten sent, then a restart.
    Expected: 0..4 come back with count 1, 5..9 are first deliveries."""
    d = Driver(DispatchPolicy())
    d.attach("c", credit=5)
    d.logs[0].append_batches(10)
    d.pump()
    d = _restart(d)
    d.attach("c")
    d.pump()
    assert d.sent_to("c") == list(range(10))
    assert d.redeliveries() == dict.fromkeys(range(5), 1)


def test_a_restart_resends_ack_ranges_left_out_of_the_snapshot() -> None:
    """Scenario: four ack ranges above the cursor; the snapshot keeps two; restart.
    Expected: the records of the two dropped ranges are sent again (never skipped)."""
    d = _sent(10)
    for o in (1, 3, 5, 7):
        d.do(Ack(0, o, o + 1))
    d = _restart(d, max_ranges=2)
    d.attach("c")
    d.pump()
    assert d.sent_to("c") == [0, 2, 4, 5, 6, 7, 8, 9]


def test_a_record_that_keeps_crashing_the_broker_reaches_max_deliveries() -> None:
    """Scenario: max_deliveries 3; a record goes out, then the broker crashes before any
    ack, and again after every resend. What is on disk is only what the machine asked to
    save (Persist), plus one save after the first send (the flusher).
    Expected: each resend after a restart is saved before it goes out, so the counts the
    consumer sees grow (1, then 2) instead of repeating, and after the third send the
    record is dead-lettered with 3 attempts."""
    d = Driver(DispatchPolicy(max_deliveries=3))
    d.attach("c")
    d.logs[0].append(1)
    d.pump()
    disk = d.state.snapshot(10)  # the flusher saved the delivered mark
    logs, seen, letters = d.logs, [], []
    for _ in range(3):
        d = Driver(d.state.policy, snapshots=disk)  # the crash: only the disk survives
        d.logs = logs
        d.attach("c")
        actions = d.pump()
        if any(isinstance(a, Persist) for a in actions):
            disk = d.state.snapshot(10)
        seen.append(d.redeliveries())
        letters = [a for a in actions if isinstance(a, ToDeadLetter)]
    assert seen == [{0: 1}, {0: 2}, {}]
    assert [f.deliveries for a in letters for f in a.failures] == [3]


def test_acked_runs_longer_than_a_read_do_not_hold_back_the_records_after_them() -> None:
    """Scenario: ten records sent, [2, 9) acked, restart; each read returns at most two
    batches, and the consumer acks nothing.
    Expected: 0, 1 and 9 are sent again: the read position moves over the acked batches,
    so the one unacked record behind them is not left waiting for the cursor."""
    d = _sent(10)
    d.do(Ack(0, 2, 9))
    d = _restart(d)
    d.max_batches = 2
    d.attach("c")
    d.pump()
    assert d.sent_to("c") == [0, 1, 9]
    assert d.state.read_position(0) == 10


def test_a_read_made_stale_by_a_seek_back_sends_nothing_new() -> None:
    """Scenario: ten records sent; five more arrive; the shell asks where to read (offset
    10), then a seek back to 2 lands before the read's result does (the shell awaited a
    save in between).
    Expected: the stale batches send nothing and leave the read position at 2; the next
    pass sends 2 to 14 in order, so nothing is skipped."""
    d = _sent(10)
    d.logs[0].append_batches(5)
    assert d.state.reads([d.logs[0].head], d.now) == [(0, 10)]
    d.do(Seek((2,)))
    d.take()
    assert kinds(d.do(Fetched(0, d.logs[0].read(10, 100)))) == []
    assert d.state.read_position(0) == 2
    d.pump()
    assert d.sent_to("c") == list(range(2, 15))


def test_failures_in_a_snapshot_below_the_cursor_are_forgotten() -> None:
    """Scenario: a snapshot whose failure runs start below its cursor.
    Expected: only the offsets at or above the cursor keep their counts."""
    snap = PartitionSnapshot(5, (), 8, (FailureRun(3, 7, 2, "x", (1, 2)),))
    d = Driver(DispatchPolicy(), snapshots=[snap])
    d.logs[0].append_batches(8)
    d.attach("c")
    d.pump()
    assert d.sent_to("c") == [5, 6, 7]
    assert d.redeliveries() == {5: 2, 6: 2, 7: 1}


# -- retention, seek ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("acked", "first", "lost"),
    [((), 6, 6), (((2, 4),), 6, 4), (((0, 6),), 6, 0), (((1, 9),), 6, 1)],
)
def test_deleted_skips_forward_with_a_note(
    acked: tuple[tuple[int, int], ...], first: int, lost: int
) -> None:
    """Scenario: ten records sent, ``acked`` acknowledged; retention deleted below ``first``.
    Expected: a warning Note counting the ``lost`` unacknowledged records; the cursor is at
    least ``first`` and nothing below it is held or resent."""
    d = _sent(10)
    for begin, end in acked:
        d.do(Ack(0, begin, end))
    actions = d.do(Deleted(0, first))
    (note,) = actions
    assert isinstance(note, Note)
    assert note.level == logging.WARNING
    assert f"{lost} records below offset {first}" in note.message
    assert d.state.cursor(0) >= first
    assert d.state.in_flight(0) == 10 - first - sum(max(0, e - max(b, first)) for b, e in acked)


def test_deleted_ahead_of_the_read_position_moves_it() -> None:
    """Scenario: nothing was read; retention deleted below 40 of 50.
    Expected: cursor and read position 40; a consumer gets 40..49 as first deliveries."""
    d = Driver(DispatchPolicy())
    d.logs[0].append_batches(5, 10)
    d.do(Deleted(0, 40))
    assert d.state.cursor(0) == d.state.read_position(0) == 40
    d.attach("c")
    d.pump()
    assert d.sent_to("c") == list(range(40, 50))
    assert d.redeliveries() == {}


def test_seek_back_resends_with_counts_and_forgets_acks() -> None:
    """Scenario: ten records sent and 0..5 acked; seek back to 2.
    Expected: nothing is in flight; 2..9 are sent again (count 1), acks above 2 forgotten."""
    d = _sent(10)
    d.do(Ack(0, 0, 6))
    d.do(Seek((2,)))
    assert d.state.cursor(0) == d.state.read_position(0) == 2
    assert d.state.in_flight(0) == 0
    d.take()
    d.pump()
    assert d.sent_to("c") == list(range(2, 10))
    assert d.redeliveries() == dict.fromkeys(range(2, 10), 1)


def test_seek_forward_skips() -> None:
    """Scenario: three of ten records sent; seek to 8.
    Expected: only 8 and 9 go out next, as first deliveries."""
    d = Driver(DispatchPolicy())
    d.attach("c", credit=3)
    d.logs[0].append_batches(10)
    d.pump()
    d.do(Seek((8,)))
    d.do(Grant("c", 10))
    d.take()
    d.pump()
    assert d.sent_to("c") == [8, 9]
    assert d.redeliveries() == {}


# -- deadlines, reads, misc ---------------------------------------------------------------


def test_next_deadline_is_the_earliest_lease_or_ready_time() -> None:
    """Scenario: leases sent at t=0 and t=3 (timeout 10 s); then a nack with delay 2 s at
    t=1; then everything acknowledged.
    Expected: 10, then 3 (the nack), then 13 once 0 is acked, then None."""
    d = Driver(TIMEOUT_POLICY)
    assert d.state.next_deadline() is None
    d.attach("c")
    d.logs[0].append(2)
    d.pump(now=0)
    d.logs[0].append(1)
    d.pump(now=3)
    assert d.state.next_deadline() == 10
    d.do(Nack(0, 1, 2, delay_s=2), now=1)
    assert d.state.next_deadline() == 3
    d.do(Ack(0, 0, 2))
    assert d.state.next_deadline() == 13
    d.do(Ack(0, 2, 3))
    assert d.state.next_deadline() is None


def test_reads_asks_for_waiting_records_before_new_ones() -> None:
    """Scenario: records 0..9 sent in one-record batches; 3 nacked; 10..11 published.
    Expected: reads() asks partition 0 from 3 (the ready waiting record), and with one
    batch per read the pass resends 3 before anything new."""
    d = _sent(10)
    d.do(Nack(0, 3, 4, delay_s=0))
    d.logs[0].append_batches(2)
    assert d.state.reads([12], d.now) == [(0, 3)]
    d.max_batches = 1
    d.take()
    d.pump()
    assert d.sent_to("c") == [3, 10, 11]


def test_reads_is_empty_without_consumers_and_rotates_partitions() -> None:
    """Scenario: two partitions with new records; no consumer, then one.
    Expected: no reads without a consumer; with one, both partitions are asked for, and
    the first one asked alternates between calls."""
    d = Driver(DispatchPolicy(), partitions=2)
    for log in d.logs:
        log.append(1)
    assert d.state.reads([1, 1], 0) == []
    d.attach("c")
    first = d.state.reads([1, 1], 0)
    second = d.state.reads([1, 1], 0)
    assert sorted(first) == sorted(second) == [(0, 0), (1, 0)]
    assert first[0] != second[0]


def test_grant_and_detach_of_unknown_consumers_are_ignored() -> None:
    """Scenario: a grant to, and a detach of, a consumer that is not attached.
    Expected: no error, no action."""
    d = Driver(DispatchPolicy(type=SHARED))
    assert d.do(Grant("ghost", 5)) == []
    assert d.do(Detach("ghost")) == []


def test_send_carries_the_batch_publish_time() -> None:
    """Scenario: a batch whose records were published at ms 1234.
    Expected: the Send's timestamp_ms is the batch's newest publish time."""
    d = Driver(DispatchPolicy())
    d.attach("c")
    d.logs[0].append(2, ts=1234)
    d.pump()
    assert [s.timestamp_ms for s in d.sends] == [1234]


def test_held_key_shared_records_are_first_deliveries_after_a_restart() -> None:
    """Scenario: a joining key_shared consumer's record is held (never sent) while a later
    record of another key goes out; the broker restarts before it is released.
    Expected: after the restart it goes out as a first delivery (count 0), while the
    record that did go out before comes back with count 1."""
    moving = _keys_owned_by(["a", "b"], "b", 1)[0]
    staying = _keys_owned_by(["a", "b"], "a", 1)[0]
    d = Driver(DispatchPolicy(type=KEY_SHARED))
    d.attach("a")
    d.logs[0].append(1, keys=[staying])
    d.pump()
    d.attach("b")
    d.logs[0].append(2, keys=[moving, staying])
    d.pump()
    assert d.sent_to("a") == [0, 2]
    d.do(Ack(0, 0, 1))
    d = _restart(d)
    d.attach("a")
    d.attach("b")
    d.pump()
    assert d.sent_to("b") == [1]
    assert d.sent_to("a") == [2]
    assert d.redeliveries() == {2: 1}


def test_a_dead_letter_failure_after_a_seek_does_not_block() -> None:
    """Scenario: a poison record's dead-letter write is under way when a seek moves the
    partition back; then the write fails.
    Expected: the partition is not blocked (nothing is parked any more) and its records
    flow again from the seek position."""
    d = _poisoned(PoisonPolicy.DEAD_LETTER)
    d.pump(now=2)
    d.do(Seek((0,)))
    d.do(DeadLetterFailed(0, 1, 2, "disk full"))
    assert d.state.blocked(0) == ""
    d.take()
    d.pump(now=3)
    assert d.sent_to("c") == [0, 1, 2]


def test_a_dead_letter_failure_after_an_ack_does_not_block() -> None:
    """Scenario: a poison record's dead-letter write is under way when the operator acks
    past it; then the write fails.
    Expected: the partition is not blocked: the record is acknowledged already."""
    d = _poisoned(PoisonPolicy.DEAD_LETTER)
    d.pump(now=2)
    d.do(AckUpTo(0, 3))
    d.do(DeadLetterFailed(0, 1, 2, "disk full"))
    assert d.state.blocked(0) == ""
    d.logs[0].append(1)
    d.take()
    d.pump(now=3)
    assert d.sent_to("c") == [3]


@pytest.mark.parametrize("kind", [SHARED, FAILOVER])
def test_records_nobody_has_credit_for_set_no_deadline(kind: SubscriptionType) -> None:
    """Scenario: two consumers; the one receiving leaves while every consumer that may
    receive has spent its credit, so its records wait with nobody to take them.
    Expected: reads() asks for nothing and next_deadline() is the next lease expiry, not
    a time already past (which would make the shell spin until a grant); a grant makes
    them ready and they go out."""
    d = Driver(DispatchPolicy(type=kind, ack_timeout_s=30))
    d.attach("a", credit=1)
    d.attach("b", credit=1 if kind is SHARED else 0)
    d.logs[0].append_batches(4)
    d.pump()
    d.do(Detach("a"), now=1)
    deadline = 30 if kind is SHARED else None
    assert d.state.next_deadline() == deadline
    assert d.state.reads([4], 1) == []
    d.do(Grant("b", 10))
    assert d.state.next_deadline() == 1
    d.pump()
    assert d.sent_to("b") == ([1, 0, 2, 3] if kind is SHARED else [0, 1, 2, 3])


# -- every record is delivered, whatever happens (hypothesis) -----------------------------


_STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("publish"), st.integers(0, 1), st.integers(1, 8)),
        st.tuples(st.just("ack"), st.integers(0, 1), st.integers(0, 12)),
        st.tuples(st.just("nack"), st.integers(0, 1), st.integers(0, 12)),
        st.tuples(st.just("detach"), st.integers(0, 2), st.just(0)),
        st.tuples(st.just("grant"), st.integers(0, 2), st.integers(1, 5)),
        st.tuples(st.just("time"), st.integers(1, 20), st.just(0)),
        st.tuples(st.just("snapshot"), st.integers(0, 2), st.just(0)),
        st.tuples(st.just("restart"), st.integers(0, 2), st.just(0)),
        st.tuples(st.just("seek"), st.integers(0, 1), st.integers(0, 12)),
    ),
    min_size=5,  # hypothesis favours short lists: most bugs need several steps in a row
    max_size=40,
)


class Scenario:
    """A driver plus what the test saw sent and acknowledged, stepped by random ops;
    it checks every redelivery count."""

    NAMES = ("a", "b", "c")

    def __init__(self, policy: DispatchPolicy, max_batches: int = 1_000) -> None:
        self.d = Driver(policy, partitions=2, max_batches=max_batches)
        self.exclusive = policy.type is EXCLUSIVE
        self.live: set[str] = set()
        self.sent: dict[tuple[int, int], int] = {}
        self.acked: set[tuple[int, int]] = set()
        self.restarted = False
        self.unsure: set[tuple[int, int]] = set()  # see seek_mid_pass
        self.seen = 0
        self.join(0)

    def join(self, i: int) -> None:
        name = self.NAMES[i]
        if name in self.live or (self.exclusive and self.live):
            return
        self.d.do(Attach(name, name, 3))
        self.live.add(name)

    def step(self, op: str, x: int, y: int) -> None:
        d = self.d
        if op == "publish":  # one batch of y records, or y - 4 batches of one
            for size in [y] if y <= 4 else [1] * (y - 4):
                head = d.logs[x].head
                d.logs[x].append(size, keys=[b"k%d" % ((head + i) % 5) for i in range(size)])
        elif op in ("ack", "nack"):
            pending = [s for s in d.sends if s.delivery.partition == x]
            if pending:
                s = pending[y % len(pending)]
                lo, hi = s.delivery.from_offset, s.delivery.to_offset
                if op == "ack":
                    self.ack(x, lo, hi)
                else:
                    d.do(Nack(x, lo, hi, delay_s=0))
        elif op == "detach":
            if self.NAMES[x] in self.live:
                d.do(Detach(self.NAMES[x]))
                self.live.discard(self.NAMES[x])
            else:
                self.join(x)
        elif op == "grant":
            if self.NAMES[x] in self.live:
                d.do(Grant(self.NAMES[x], y))
        elif op == "time":
            d.now += x
        elif op == "snapshot":
            d.state.snapshot(x)
        elif op == "seek":
            self.seek_mid_pass(x, y)
        else:
            self.restart(x)
        # self.d: a restart replaced the driver. As the shell, pass again once dead
        # letters are written: their acks may lift key_shared fences.
        while self.settle(self.d.pump()):
            pass
        self.account()
        self.check_progress()

    def seek_mid_pass(self, partition: int, back: int) -> None:
        """The shell plans its reads, a seek moves ``partition`` back ``back`` records
        meanwhile, then the planned reads arrive (a read made stale by the seek)."""
        d = self.d
        planned = d.state.reads([log.head for log in d.logs], d.now)
        offsets = [d.state.cursor(p) for p in range(2)]
        offsets[partition] = max(0, offsets[partition] - back)
        d.do(Seek(tuple(offsets)))
        for p in range(2):
            # A seek forgets acks and failures: a record sent before comes again with
            # count 1; one never sent may come with 1 too when a later one went out.
            for o in range(offsets[p], d.logs[p].head):
                key = (p, o)
                self.acked.discard(key)
                if self.sent.get(key, 0):
                    self.sent[key] = 1
                else:
                    self.unsure.add(key)
        for p, offset in planned:
            self.settle(d.do(Fetched(p, d.logs[p].read(offset, d.max_batches))))

    def check_progress(self) -> None:
        """Once dispatch settled: where every consumer has credit, there is room under
        max_unacked and the partition is not blocked, everything durable has been read
        (sent, or set aside to wait); nothing is left behind unread."""
        d = self.d
        if not self.live or d.state.held >= d.state.policy.max_unacked:
            return
        if any(d.state.credit(name) <= 0 for name in self.live):
            return
        for p, log in enumerate(d.logs):
            if not d.state.blocked(p):
                assert d.state.read_position(p) == log.head, (p, d.state.read_position(p))

    def restart(self, max_ranges: int) -> None:
        self.account()
        self.d = _restart(self.d, max_ranges=max_ranges)
        self.restarted, self.seen = True, 0
        self.live.clear()
        self.join(0)

    def account(self) -> None:
        """Check the sends since the last call: each record's redelivery count is how
        often it was sent before (after a restart, a record whose ack fell out of the
        snapshot may come back with a lower count, never with none; after a seek, see
        :meth:`seek_mid_pass`)."""
        for s in self.d.sends[self.seen :]:
            for o in offsets_of(s):
                key = (s.delivery.partition, o)
                before = self.sent.get(key, 0)
                got = s.delivery.redeliveries.get(o, 0)
                if key in self.unsure:
                    assert got in (0, 1), (key, got)
                    self.unsure.discard(key)
                    before = got
                elif self.restarted and key in self.acked:
                    assert 1 <= got <= before, (key, got, before)
                else:
                    assert got == before, (key, got, before)
                self.sent[key] = before + 1
        self.seen = len(self.d.sends)

    def ack(self, partition: int, begin: int, end: int) -> None:
        self.d.do(Ack(partition, begin, end))
        self.acked.update((partition, o) for o in range(begin, end))

    def settle(self, actions: Sequence[Action]) -> bool:
        """Write every dead letter asked for at once; return whether there was one."""
        letters = [a for a in actions if isinstance(a, ToDeadLetter)]
        for a in letters:
            self.d.do(DeadLettered(a.partition, a.begin, a.end))
            self.acked.update((a.partition, o) for o in range(a.begin, a.end))
        return bool(letters)

    def drain(self) -> bool:
        """Replace every consumer by one that acks all it gets; whether every cursor
        reached its head."""
        d = self.d
        for name in list(self.live):
            d.do(Detach(name))
        d.do(Attach("z", "z", 1_000_000))
        for _ in range(200):
            self.settle(d.pump(now=d.now + 100))
            fresh = d.sends[self.seen :]
            self.account()
            for s in fresh:
                self.ack(s.delivery.partition, s.delivery.from_offset, s.delivery.to_offset)
            if all(d.state.cursor(p) == log.head for p, log in enumerate(d.logs)):
                return d.state.held == 0
        return False


@settings(deadline=None, max_examples=300)
@given(
    st.sampled_from(list(SubscriptionType)),
    st.sampled_from([0, 3]),
    st.sampled_from([1, 2, 1_000]),
    _STEPS,
)
def test_every_record_is_delivered_and_acked_in_the_end(
    kind: SubscriptionType,
    max_deliveries: int,
    max_batches: int,
    steps: list[tuple[str, int, int]],
) -> None:
    """Scenario: a random mix of publishes (keyed), acks, nacks, consumers leaving and
    coming, grants, time passing, snapshots, restarts and seeks back that land between a
    pass's planned reads and their results, on two partitions, for each type, with and
    without a delivery limit (dead letters are written at once), with reads of 1, 2 or
    many batches.
    Expected: the invariant holds after every command (the driver checks it); every
    redelivery count is exact (except right after a seek, which forgets them); whenever
    dispatch settles with credit and room, everything durable has been read; and in the
    end a consumer that acks everything it gets drains both partitions: every cursor
    reaches its head, nothing is lost or stuck."""
    policy = DispatchPolicy(
        type=kind, max_unacked=8, ack_timeout_s=5, max_deliveries=max_deliveries
    )
    scenario = Scenario(policy, max_batches)
    for op, x, y in steps:
        scenario.step(op, x, y)
    assert scenario.drain()


def test_key_shared_a_consumer_without_credit_does_not_stall_the_others() -> None:
    """Scenario: key_shared; a owns key X and has credit for one record; b owns Y and has
    plenty; records 0, 1 (X) then 2..9 (Y), one per batch; reads take one batch.
    Expected: 1 waits for a's credit while b gets 2..9."""
    x = _keys_owned_by(["a", "b"], "a", 1)[0]
    y = _keys_owned_by(["a", "b"], "b", 1)[0]
    d = Driver(DispatchPolicy(type=KEY_SHARED), max_batches=1)
    d.attach("a", credit=1)
    d.attach("b")
    for key in [x, x] + [y] * 8:
        d.logs[0].append(1, keys=[key])
    d.pump()
    assert d.sent_to("a") == [0]
    assert d.sent_to("b") == list(range(2, 10))


def test_key_shared_records_set_aside_for_a_consumer_go_first_and_in_order() -> None:
    """Scenario: as above, then two more X records arrive while a has no credit, then a is
    granted credit. Expected: nothing is sent to a until the grant; no timer is due and
    nothing counts as ready meanwhile (no busy passes, no false STALLED); after the grant
    a gets 1, 10, 11 in order."""
    x = _keys_owned_by(["a", "b"], "a", 1)[0]
    y = _keys_owned_by(["a", "b"], "b", 1)[0]
    d = Driver(DispatchPolicy(type=KEY_SHARED, ack_timeout_s=None), max_batches=1)
    d.attach("a", credit=1)
    d.attach("b")
    for key in [x, x] + [y] * 8:
        d.logs[0].append(1, keys=[key])
    d.pump()
    d.logs[0].append(1, keys=[x])
    d.logs[0].append(1, keys=[x])
    d.pump(now=1.0)
    assert d.sent_to("a") == [0]
    assert d.state.next_deadline() is None
    assert d.state.ready([12], d.now) == 0
    d.do(Grant("a", 10))
    d.pump()
    assert d.sent_to("a") == [0, 1, 10, 11]
    assert d.sent_to("b") == list(range(2, 10))
