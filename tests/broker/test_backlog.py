"""Pure tests of the backlog quota's rules (:mod:`broker.backlog`): no event loop, no disk."""

from __future__ import annotations

import pytest

from broker.backlog import (
    NO_LIMIT,
    BacklogConfig,
    BacklogGate,
    BacklogPolicy,
    QuotaCrossed,
    QuotaState,
    admission_limit,
    backlog,
    eviction_offset,
)
from wal.policy import SegmentInfo


def segments(*bases: int, head: int) -> list[SegmentInfo]:
    """Segments starting at ``bases`` (the last is the active one, ending at ``head``)."""
    ends = [*bases[1:], head]
    return [SegmentInfo(b, e, 100, None) for b, e in zip(bases, ends, strict=True)]


def gate(quota: int, floor: int | None, first: int = 0, now: float = 0.0) -> BacklogGate:
    """A gate with ``quota`` refreshed at ``now`` with ``floor`` and ``first``."""
    g = BacklogGate(BacklogConfig(quota_messages=quota), refresh_s=0.1)
    g.refresh(floor, first, now)
    return g


@pytest.mark.parametrize(
    ("head", "floor", "first", "expected"),
    [
        (500, None, 0, 0),  # no subscription: nobody is behind
        (500, 200, 0, 300),  # records from the floor to the head
        (500, 200, 300, 200),  # evicted past the floor: only what remains counts
        (500, 500, 0, 0),  # caught up
        (500, 600, 0, 0),  # a floor past the head never goes negative
    ],
    ids=["no-subscription", "floor", "first-above-floor", "caught-up", "floor-past-head"],
)
def test_backlog_is_head_minus_the_higher_of_floor_and_first_offset(
    head: int, floor: int | None, first: int, expected: int
) -> None:
    """Scenario: each shape of floor and first offset. Expected: head - max(floor, first),
    never negative, and 0 without a subscription."""
    assert backlog(head, floor, first) == expected


@pytest.mark.parametrize(
    ("head", "admitted"),
    [
        (109, True),  # one under the quota
        (110, True),  # exactly at the quota
        (111, False),  # one over
    ],
    ids=["under", "at-quota", "one-over"],
)
def test_admission_boundary(head: int, admitted: bool) -> None:
    """Scenario: quota 10, saved floor 100, the head just around 110. Expected: a publish is
    admitted up to a backlog of exactly the quota and refused one record past it."""
    g = gate(10, floor=100)
    assert g.limit == 110
    assert g.admits(head) is admitted
    assert (g.observe(head) is not None) is (not admitted)


@pytest.mark.parametrize(
    ("quota", "floor"),
    [(0, 100), (10, None)],
    ids=["no-quota", "no-subscription"],
)
def test_no_quota_or_no_subscription_admits_everything(quota: int, floor: int | None) -> None:
    """Scenario: quota 0 (disabled), or no subscription (floor None). Expected: the limit is
    never reached, whatever the head."""
    assert admission_limit(floor, 0, quota) == NO_LIMIT
    assert gate(quota, floor).admits(NO_LIMIT)


def test_eviction_moves_the_limit_with_the_first_offset() -> None:
    """Scenario: quota 10, floor 100, then the log's first offset moves to 150 (eviction
    past the floor). Expected: the limit counts from the first offset: 160."""
    g = gate(10, floor=100)
    g.refresh(100, 150, 1.0)
    assert g.limit == 160
    assert g.backlog(160) == 10


def test_quota_crossing_is_reported_once_per_change_of_state() -> None:
    """Scenario: a partition goes over its quota, stays over for several publishes, then
    acks raise the floor. Expected: one OVER event, none while it stays over, one UNDER
    event after the refresh; each event carries the backlog and the quota."""
    g = gate(10, floor=0)
    assert g.observe(5) is None  # starts under
    assert g.observe(12) == QuotaCrossed(QuotaState.OVER, 12, 10)
    assert g.state.is_over()
    assert g.observe(13) is None
    assert g.observe(20) is None
    g.refresh(15, 0, 1.0)
    assert g.observe(20) == QuotaCrossed(QuotaState.UNDER, 5, 10)
    assert not g.state.is_over()


@pytest.mark.parametrize(
    ("now", "stale"),
    [(0.0, False), (0.099, False), (0.1, True), (5.0, True)],
    ids=["just-refreshed", "just-before", "exactly-refresh_s", "long-after"],
)
def test_floor_goes_stale_after_refresh_s(now: float, stale: bool) -> None:
    """Scenario: a gate refreshed at 0 with refresh_s 0.1. Expected: stale from 0.1 s on."""
    assert gate(10, 0).is_stale(now) is stale


def test_a_new_gate_is_stale() -> None:
    """Scenario: a gate never refreshed. Expected: stale, and it admits everything."""
    g = BacklogGate(BacklogConfig(quota_messages=10))
    assert g.is_stale(0.0)
    assert g.admits(10**12)


@pytest.mark.parametrize(
    ("last", "now", "due"),
    [(None, 0.0, True), (1.0, 1.05, False), (1.0, 1.1, True)],
    ids=["never", "too-soon", "after-refresh_s"],
)
def test_eviction_attempts_are_spaced(last: float | None, now: float, due: bool) -> None:
    """Scenario: an eviction began at ``last``. Expected: another may begin only refresh_s
    (0.1 s) later, so publishes to a partition that cannot shrink do not each start one."""
    g = gate(10, 0)
    if last is not None:
        g.evicting(last)
    assert g.eviction_due(now) is due


@pytest.mark.parametrize(
    ("bases", "head", "quota", "expected"),
    [
        # The module's worked example: keep from 5100 - 1000 = 4100; first base >= it: 4500.
        ((3000, 4000, 4500, 5050), 5100, 1000, 4500),
        # keep_from 30 is a base exactly: everything before it goes, nothing more.
        ((0, 10, 20, 30, 40), 50, 20, 30),
        # keep_from 29 (quota 21): the segment at 20 holds it, so it goes as well.
        ((0, 10, 20, 30, 40), 50, 21, 30),
        # keep_from 31 (quota 19): the segment at 30 holds it, so it goes too.
        ((0, 10, 20, 30, 40), 50, 19, 40),
        # The active segment alone is over quota: every sealed segment goes, no more.
        ((0, 10, 20), 100, 5, 20),
        # Already within the quota from the first segment on: nothing to delete.
        ((0, 10, 20), 25, 25, None),
        # Only the active segment: it always stays.
        ((0,), 100, 5, None),
    ],
    ids=[
        "worked-example",
        "at-a-base",
        "inside-a-segment",
        "one-past-a-base",
        "active-alone-over",
        "within-quota",
        "active-only",
    ],
)
def test_eviction_offset(
    bases: tuple[int, ...], head: int, quota: int, expected: int | None
) -> None:
    """Scenario: segments at ``bases``, the head, and a quota. Expected: the offset for
    delete_before that leaves a backlog within the quota while deleting the fewest oldest
    segments, never the active one; None when nothing would go."""
    assert eviction_offset(segments(*bases, head=head), head, quota) == expected


def test_eviction_offset_of_no_segments_is_none() -> None:
    """Scenario: an empty list of segments. Expected: None (nothing to delete)."""
    assert eviction_offset([], 10, 5) is None


@pytest.mark.parametrize(
    ("policy", "reject", "block", "evict"),
    [
        (BacklogPolicy.REJECT_PRODUCER, True, False, False),
        (BacklogPolicy.BLOCK_PRODUCER, False, True, False),
        (BacklogPolicy.EVICT_OLDEST_BACKLOG, False, False, True),
    ],
)
def test_policy_predicates(policy: BacklogPolicy, reject: bool, block: bool, evict: bool) -> None:
    """Scenario: each policy. Expected: exactly its own predicate is true."""
    assert (policy.is_reject(), policy.is_block(), policy.is_evict()) == (reject, block, evict)


def test_config_defaults() -> None:
    """Scenario: a default BacklogConfig. Expected: no quota, reject_producer, 30 s timeout."""
    config = BacklogConfig()
    assert not config.has_quota()
    assert config.policy is BacklogPolicy.REJECT_PRODUCER
    assert config.block_timeout_ms == 30_000
