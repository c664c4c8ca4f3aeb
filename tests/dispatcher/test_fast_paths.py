"""The dispatcher's fast paths pinned to the general code they stand for.

The delivery path under fan-out runs once per subscription per group commit, so its
common case (one consumer with credit, nothing waiting, nothing acked out of order) takes
shortcuts: :meth:`RangeMap.add` appends past the last range, :meth:`RangeMap.cut` without
``only`` replaces one slice, a batch with no ack holes skips :meth:`AckRanges.unacked`,
and the state's ``held``, ``has_room``, ``next_deadline`` and ``reads`` use loops that
skip partitions with nothing waiting; the shell skips a ``Tick`` that ``tick_due`` says
can change nothing. Each claim here: the shortcut gives exactly what the
general code (copied below as the reference) gives, structure included, over random
command sequences. Pure: no event loop, no disk.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, bisect_right
from typing import TypeVar

from hypothesis import given, settings
from hypothesis import strategies as st

from dispatcher.acks import AckRanges
from dispatcher.protocol import (
    TICK,
    Ack,
    AckUpTo,
    Attach,
    Command,
    DeadLetterFailed,
    Detach,
    DispatchPolicy,
    Drain,
    Grant,
    Nack,
    PoisonPolicy,
    Release,
    SubscriptionType,
)
from dispatcher.ranges import RangeMap
from dispatcher.state import SubscriptionState
from tests.dispatcher.test_state import Driver

T = TypeVar("T")


# -- RangeMap: the general insert and per-range cut, as they were -----------------------


def _reference_add(m: RangeMap[T], begin: int, end: int, value: T) -> None:
    if begin >= end:
        return
    i = bisect_left(m._begins, begin)
    m._begins.insert(i, begin)
    m._ends.insert(i, end)
    m._values.insert(i, value)
    m.total += end - begin


def _reference_cut(m: RangeMap[T], begin: int, end: int) -> list[tuple[int, int, T]]:
    removed: list[tuple[int, int, T]] = []
    begins, ends, values = m._begins, m._ends, m._values
    i = bisect_right(ends, begin)
    while i < len(begins) and begins[i] < end:
        rb, re, value = begins[i], ends[i], values[i]
        cb, ce = max(rb, begin), min(re, end)
        removed.append((cb, ce, value))
        m.total -= ce - cb
        keep_b = [b for b in ((rb, cb), (ce, re)) if b[0] < b[1]]
        begins[i : i + 1] = [b for b, _ in keep_b]
        ends[i : i + 1] = [e for _, e in keep_b]
        values[i : i + 1] = [value] * len(keep_b)
        i += len(keep_b)
    return removed


def _shape(m: RangeMap[T]) -> tuple[list[int], list[int], list[T], int]:
    return list(m._begins), list(m._ends), list(m._values), m.total


_RANGE_OPS = st.lists(
    st.tuples(st.sampled_from(["add", "cut"]), st.integers(0, 60), st.integers(0, 12)),
    max_size=60,
)


@given(_RANGE_OPS)
def test_range_map_add_and_cut_match_the_general_code(ops: list[tuple[str, int, int]]) -> None:
    """Scenario: random adds (mostly past the end, as sends are) and cuts without ``only``
    on a RangeMap and on a copy driven by the general insert and per-range cut.
    Expected: the same ranges, values, total and removed pieces after every step."""
    fast: RangeMap[int] = RangeMap()
    ref: RangeMap[int] = RangeMap()
    top = 0
    for step, (op, at, length) in enumerate(ops):
        if op == "add":
            begin = top + at % 3  # past the end, touching or with a gap
            end = begin + length
            fast.add(begin, end, step)
            _reference_add(ref, begin, end, step)
            top = max(top, end)
        else:
            assert fast.cut(at, at + length) == _reference_cut(ref, at, at + length)
        assert _shape(fast) == _shape(ref)


def test_range_map_add_below_the_end_still_refuses_an_overlap() -> None:
    """Scenario: an add that overlaps the last range, and one that fits in a gap.
    Expected: the overlap is refused (the append shortcut is only for ranges past the
    end); the gap is filled in order."""
    m: RangeMap[str] = RangeMap()
    m.add(0, 5, "a")
    m.add(10, 15, "b")
    try:
        m.add(14, 20, "c")
    except ValueError:
        pass
    else:
        raise AssertionError("an overlap was accepted")
    m.add(5, 10, "d")
    assert list(m) == [(0, 5, "a"), (5, 10, "d"), (10, 15, "b")]


# -- AckRanges: no holes means unacked() is one span --------------------------------------


@given(
    st.lists(st.tuples(st.integers(0, 50), st.integers(0, 8)), max_size=20),
    st.integers(0, 70),
    st.integers(0, 20),
)
def test_without_ranges_unacked_is_one_span(
    acks: list[tuple[int, int]], begin: int, length: int
) -> None:
    """Scenario: random acks, then the unacked part of ``[begin, begin + length)``.
    Expected: ``has_ranges`` says whether any range lies above the cursor; without one,
    ``unacked`` gives exactly ``[max(begin, cursor), end)`` (or nothing), which is what
    the state's batch shortcut uses."""
    a = AckRanges()
    for b, n in acks:
        a.ack(b, b + n)
    assert a.has_ranges() == bool(a.ranges())
    if not a.has_ranges():
        lo, end = max(begin, a.cursor), begin + length
        assert list(a.unacked(begin, end)) == ([(lo, end)] if lo < end else [])


# -- SubscriptionState: queries against their general form --------------------------------


def _reference_held(s: SubscriptionState) -> int:
    return sum(p.held() for p in s._parts)


def _reference_has_room(s: SubscriptionState) -> bool:
    return _reference_held(s) < s.policy.max_unacked and any(c.credit > 0 for c in s._eligible())


def _reference_next_deadline(s: SubscriptionState) -> float | None:
    times = []
    heap = list(s._deadlines)  # pruning a copy: the real call prunes the same leases
    heapq.heapify(heap)
    while heap and not s._live(heap[0][1]):
        heapq.heappop(heap)
    if heap:
        times.append(heap[0][0])
    credit = any(c.credit > 0 for c in s._eligible())
    for part in s._parts:
        if part.waiting and not part.blocked and credit:
            times.extend(at for _, _, at in part.sendable_waiting())
        elif s._exhausted[part.index] and not part.blocked:
            for offset in s._exhausted[part.index]:
                times.extend(at for _, _, at in part.waiting.overlapping(offset, offset + 1))
        if part.retry_dead_letters:
            times.extend(at for _, _, at in part.parked if at is not None)
    return min(times) if times else None


def _reference_reads(s: SubscriptionState, heads: list[int], now: float) -> list[tuple[int, int]]:
    if not s._consumers and not any(s._exhausted):
        return []
    count = len(s._parts)
    start = s._next_partition
    credit = any(c.credit > 0 for c in s._eligible())
    room = credit and _reference_held(s) < s.policy.max_unacked
    out = []
    for i in range(count):
        p = (start + i) % count
        part = s._parts[p]
        offset = None
        if part.blocked:
            if part.retry_dead_letters:
                offset = next((b for b, _, at in part.parked if at is not None and at <= now), None)
        else:
            if credit:
                offset = next((b for b, _, at in part.sendable_waiting() if at <= now), None)
            elif s._exhausted[p]:
                offset = s._first_exhausted(part, now)
            if room and offset is None and part.read_pos < heads[p]:
                offset = part.read_pos
        if offset is not None:
            out.append((p, offset))
    return out


def _fingerprint(s: SubscriptionState) -> object:
    """Everything a Tick may change, as plain values."""
    parts = [
        (
            p.acks.cursor,
            p.acks.ranges(),
            p.read_pos,
            p.sent_mark,
            [(lo, hi, id(lease), lease.remaining) for lo, hi, lease in p.leases],
            list(p.waiting),
            list(p.parked),
            list(p.stuck),
            {o: (t.deliveries, t.reason, list(t.times)) for o, t in p.tries.items()},
            p.blocked,
        )
        for p in s._parts
    ]
    consumers = [
        (c.id, c.credit, c.in_flight, dict(c.fences), sorted(id(x) for x in c.leases))
        for c in s._consumers.values()
    ]
    counters = (s.changes, s.ack_timeouts_total, s.redelivered_total, len(s._deadlines))
    return parts, consumers, counters, [sorted(e) for e in s._exhausted]


def _check_queries(d: Driver) -> None:
    s = d.state
    if not s.tick_due(d.now):  # the shell skips the Tick then: it must change nothing
        before = _fingerprint(s)
        assert s.handle(TICK, d.now) == []
        assert _fingerprint(s) == before
    assert s.held == _reference_held(s)
    assert s.has_room() == _reference_has_room(s)
    assert s.next_deadline() == _reference_next_deadline(s)
    heads = [log.head for log in d.logs]
    expected = _reference_reads(s, heads, d.now)  # first: it may forget exhausted offsets
    assert s.reads(heads, d.now) == expected


_KINDS = [
    *("append", "ack", "ack_up_to", "nack", "nack", "release", "grant"),
    *("attach", "detach", "drain", "time", "dl_fail"),
]
_STEPS = st.lists(
    st.tuples(
        st.sampled_from(_KINDS),
        st.integers(0, 1),
        st.integers(0, 30),
        st.integers(1, 6),
        st.booleans(),
    ),
    min_size=5,
    max_size=60,
)


def _command(  # noqa: PLR0917 - one private caller
    d: Driver, kind: str, p: int, a: int, n: int, names: list[str]
) -> Command | None:
    sent = d.state._parts[p].sent_mark
    begin = a % (sent + 1)
    end = min(begin + n, sent)
    who = names[a % len(names)] if names else None
    if kind == "ack" and begin < end:
        return Ack(p, begin, end)
    if kind == "ack_up_to":
        return AckUpTo(p, begin)
    if kind == "nack" and begin < end:
        return Nack(p, begin, end, 0.0 if n < 4 else 2.0, "no")
    if kind == "release" and begin < end and who is not None:
        return Release(who, p, begin, end)
    if kind == "grant" and who is not None:
        return Grant(who, 4 * n)
    if kind == "detach" and who is not None:
        return Detach(who)
    if kind == "drain" and who is not None:
        return Drain(who)
    if kind == "dl_fail":
        parked = list(d.state._parts[p].parked)
        if parked:
            lo, hi, _ = parked[a % len(parked)]
            return DeadLetterFailed(p, lo, hi, "disk full")
    return None


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(list(SubscriptionType)),
    st.sampled_from([4, 1_000]),
    st.sampled_from([1, 3]),
    st.sampled_from(list(PoisonPolicy)),
    _STEPS,
)
def test_state_queries_match_their_general_form(
    kind: SubscriptionType,
    max_unacked: int,
    max_deliveries: int,
    poison: PoisonPolicy,
    steps: list[tuple[str, int, int, int, bool]],
) -> None:
    """Scenario: a consumer attached with credit, then random appends, acks, nacks,
    releases, grants, attaches, detaches, drains, failed dead-letter writes and clock
    steps on two partitions, most followed by a pass, for every type, a tight and a
    loose unacked cap, poison after one or three deliveries, under each poison policy.
    Expected: after every step (before and after its pass) ``held``, ``has_room``,
    ``next_deadline`` and ``reads`` answer what their general form answers, and a Tick
    that ``tick_due`` says is not due changes nothing."""
    policy = DispatchPolicy(
        type=kind,
        max_unacked=max_unacked,
        max_deliveries=max_deliveries,
        poison=poison,
        ack_timeout_s=5.0,
    )
    d = Driver(policy, partitions=2)
    names = ["c0"]
    d.do(Attach("c0", "c0", 20))
    serial = 0
    for step, p, a, n, then_pass in steps:
        if step == "append":
            d.logs[p].append_batches(1 + a % 3, n)
        elif step == "time":
            d.now += n
        elif step == "attach":
            if kind is SubscriptionType.EXCLUSIVE and names:
                continue
            serial += 1
            names.append(f"c{serial}")
            d.do(Attach(names[-1], names[-1], a % 4))
        else:
            cmd = _command(d, step, p, a, n, names)
            if cmd is not None:
                try:
                    d.state.check(cmd)
                except Exception:  # a range the state refuses: not what is tested here
                    cmd = None
            if cmd is not None:
                d.do(cmd)
                if isinstance(cmd, Detach):
                    names.remove(cmd.consumer)
        _check_queries(d)
        if then_pass:
            d.pump()
            _check_queries(d)


# -- tick_due by example -------------------------------------------------------------------


def test_tick_is_due_at_a_lease_deadline_exactly() -> None:
    """Scenario: one record sent at t=0 with a 5 s ack timeout; nothing else happens.
    Expected: no Tick is due before t=5; at t=5 one is, and it takes the lease back."""
    d = Driver(DispatchPolicy(ack_timeout_s=5.0))
    d.attach("a")
    d.logs[0].append(1)
    d.pump(0.0)
    assert not d.state.tick_due(4.999)
    assert d.state.tick_due(5.0)
    d.do(TICK, 5.0)
    assert d.state.in_flight(0) == 0
    assert d.state.ack_timeouts_total == 1


def test_tick_is_due_while_a_key_shared_fence_is_held() -> None:
    """Scenario: key_shared; consumer a holds records 0..3 when b attaches (b is fenced
    at offset 4); a acks them all.
    Expected: a Tick is due while b's fence is held, with no lease near its deadline;
    that Tick lifts the fence, and then none is due."""
    d = Driver(DispatchPolicy(type=SubscriptionType.KEY_SHARED, ack_timeout_s=None))
    d.attach("a")
    d.logs[0].append(4)
    d.pump(0.0)
    d.attach("b")
    assert d.state._consumers["b"].fences == {0: 4}
    d.do(Ack(0, 0, 4))
    assert d.state.tick_due(0.0)
    d.do(TICK)
    assert d.state._consumers["b"].fences == {}
    assert not d.state.tick_due(0.0)


def test_tick_is_due_while_failure_entries_are_kept() -> None:
    """Scenario: a record is nacked (it gets a failure entry), sent again and acked.
    Expected: a Tick is due while the entry is kept (a Tick prunes entries of acked
    offsets once there are many), whatever the leases' deadlines."""
    d = Driver(DispatchPolicy(ack_timeout_s=None))
    d.attach("a")
    d.logs[0].append(1)
    d.pump(0.0)
    assert not d.state.tick_due(0.0)
    d.do(Nack(0, 0, 1, 0.0, "no"))
    assert d.state.tick_due(0.0)
