"""Tests of :mod:`broker.replica.fetch_rules`: what a follower does with its leader's
answer for one log. Pure: no event loop, no disk."""

from __future__ import annotations

import random

import pytest

from broker.replica.fetch_rules import (
    Append,
    BackOff,
    BatchHeader,
    Commit,
    LogPosition,
    LogReply,
    RestartAt,
    TruncateTo,
    backoff_s,
    batch_headers,
    last_fetched_epoch,
    plan,
    reply_from_pb,
)
from proto import replication_pb2 as pb
from proto.batch import encode_columns, restamp
from wal.leader_epochs import EpochEntry as E


def raw(base: int, counts: list[int]) -> bytes:
    """Batches of ``counts`` records laid end to end from ``base``, as a leader stores
    them (base offsets patched), producer 7 with dense sequences."""
    out, offset, seq = b"", base, 0
    for n in counts:
        data = restamp(encode_columns([b"v%d" % i for i in range(n)]), 7, seq)
        out += offset.to_bytes(8, "little") + data[8:]
        offset, seq = offset + n, seq + n
    return out


def test_the_worked_example_of_the_module_docstring() -> None:
    """Scenario: the module docstring's example. Expected: diverging (3, 150) cuts to 150;
    asked again, the batches from 150 come with the leader's entries and (4, 150) is
    copied before they are appended."""
    here = LogPosition(0, 160, [E(3, 100)])
    assert last_fetched_epoch(here.epochs, here.head) == 3
    cut = plan(here, LogReply("p/0", diverging=(3, 150), log_start=0, log_end=300))
    assert isinstance(cut, TruncateTo)
    assert cut.offset == 150
    data = raw(150, [5, 5])
    again = plan(
        LogPosition(0, 150, [E(3, 100)]),
        LogReply("p/0", batches=data, high_watermark=140, epochs=(E(3, 100), E(4, 150))),
    )
    assert again == Append(
        data,
        (BatchHeader(7, 0, 150, 154), BatchHeader(7, 5, 155, 159)),
        (E(4, 150),),
        None,
        140,
    )


@pytest.mark.parametrize(
    ("epochs", "head", "diverging", "expected"),
    [
        # own end of the epoch later than the leader's: the leader's
        ([E(1, 0), E(3, 100)], 200, (1, 80), TruncateTo(80, "")),
        # the leader's later than own: own (it ends where own epoch 3 began)
        ([E(1, 0), E(3, 100)], 200, (1, 150), TruncateTo(100, "")),
        # the leader has epoch 2, not here: own largest <= 2 is 1, ending at 100
        ([E(1, 0), E(3, 100)], 200, (2, 180), TruncateTo(100, "")),
        # no epoch <= the leader's here: every record an entry dates goes
        ([E(5, 40), E(6, 90)], 120, (2, 60), TruncateTo(40, "")),
        # the leader has none <= ours (-1, its oldest start 0)
        ([E(5, 40)], 120, (-1, 0), TruncateTo(0, "")),
    ],
)
def test_a_divergence_cuts_to_the_smaller_end_never_to_the_watermark(
    epochs: list[E], head: int, diverging: tuple[int, int], expected: TruncateTo
) -> None:
    """Scenario: the leader reports a divergence; the answer's high watermark (190) is
    above every cut. Expected: the cut is min(leader's end, own end of the largest epoch
    here at or below the leader's), as the table says; never the watermark."""
    reply = LogReply("p/0", high_watermark=190, log_end=300, diverging=diverging)
    action = plan(LogPosition(0, head, epochs), reply)
    assert isinstance(action, TruncateTo)
    assert action.offset == expected.offset


def test_a_divergence_below_the_first_offset_empties_the_log() -> None:
    """Scenario: retention here raised the first offset to 500; the leader's epoch 2 ends
    at 300 (its log start 100). Expected: RestartAt(300): the log is emptied there, not
    cut (which would be refused)."""
    reply = LogReply("p/0", log_start=100, log_end=900, diverging=(2, 300))
    action = plan(LogPosition(500, 800, [E(2, 500), E(4, 600)]), reply)
    assert isinstance(action, RestartAt)
    assert action.offset == 300


def test_a_stale_divergence_at_the_head_backs_off_instead_of_looping() -> None:
    """Scenario: the leader says 'diverging (3, 200)' and the head is 200 with epoch 3
    ending there. Expected: BackOff (no cut that changes nothing, then the same ask)."""
    action = plan(LogPosition(0, 200, [E(3, 0)]), LogReply("p/0", diverging=(3, 200)))
    assert isinstance(action, BackOff)


@pytest.mark.parametrize(
    ("first", "head", "start", "end", "expected"),
    [
        (0, 0, 1000, 1500, RestartAt(1000, "")),  # a wiped disk, retention on the leader
        (0, 700, 1000, 1500, RestartAt(1000, "")),  # fell behind retention
        (0, 1700, 1000, 1500, TruncateTo(1500, "")),  # past the leader's end
        (0, 1200, 1000, 1500, BackOff(pb.OFFSET_OUT_OF_RANGE, "")),  # in range: odd
    ],
)
def test_out_of_range(first: int, head: int, start: int, end: int, expected: object) -> None:
    """Scenario: OFFSET_OUT_OF_RANGE with the head below the leader's log start, past its
    end, or (oddly) inside. Expected: restart at the log start, cut to the end, back
    off."""
    reply = LogReply("p/0", error=pb.OFFSET_OUT_OF_RANGE, log_start=start, log_end=end)
    action = plan(LogPosition(first, head, []), reply)
    assert type(action) is type(expected)
    assert getattr(action, "offset", None) == getattr(expected, "offset", None)


@pytest.mark.parametrize(
    "error",
    [pb.NOT_LEADER, pb.FENCED_LEADER_EPOCH, pb.UNKNOWN_LEADER_EPOCH, pb.UNKNOWN_LOG],
)
def test_an_error_backs_off(error: int) -> None:
    """Scenario: a log's answer carries an error. Expected: BackOff naming it."""
    action = plan(LogPosition(0, 10, [E(1, 0)]), LogReply("p/3", error=error))
    assert isinstance(action, BackOff)
    assert pb.ReplicaError.Name(error) in action.why


@pytest.mark.parametrize(
    ("head", "leader_epochs", "expected"),
    [
        (300, (E(6, 500),), None),  # pre-epoch records below the leader's first epoch
        (500, (E(6, 500),), None),  # exactly up to it
        (700, (E(6, 500),), 500),  # records past it have no epoch here: cut there
        (700, (), None),  # the leader has no epochs at all: all pre-epoch
    ],
)
def test_records_no_entry_dates_are_kept_only_below_the_leaders_first_epoch(
    head: int, leader_epochs: tuple[E, ...], expected: int | None
) -> None:
    """Scenario: a follower with records and no epoch entry below its head (copied
    before the topic had epochs, or from before it was replicated). Expected: it is cut
    to the start of the leader's oldest entry when its head is past it; else it commits
    or appends as usual."""
    reply = LogReply("p/0", high_watermark=head, log_end=900, epochs=leader_epochs)
    action = plan(LogPosition(0, head, []), reply)
    if expected is None:
        assert isinstance(action, Commit)
    else:
        assert isinstance(action, TruncateTo)
        assert action.offset == expected


def test_an_entry_dating_nothing_here_is_dropped_before_an_append() -> None:
    """Scenario: the follower copied (4, 200) then crashed before the batches; the leader
    that won kept epoch 3 to 250, then epoch 5. Its batches from 200 come with (3, 100)
    and (5, 250). Expected: drop entries from 200 (the stale 4), then copy (5, 250) only
    (its start is inside what is appended)."""
    data = raw(200, [30, 30])
    action = plan(
        LogPosition(0, 200, [E(3, 100), E(4, 200)]),
        LogReply("p/0", batches=data, epochs=(E(3, 100), E(5, 250))),
    )
    assert isinstance(action, Append)
    assert action.drop_epochs_from == 200
    assert action.assign == (E(5, 250),)


def test_an_entry_past_the_batches_is_not_copied_yet() -> None:
    """Scenario: the batches end at 210; the leader's epoch 5 starts at 210. Expected:
    not copied now (it dates nothing appended); the next append copies it."""
    data = raw(200, [10])
    action = plan(
        LogPosition(0, 200, [E(3, 100)]),
        LogReply("p/0", batches=data, epochs=(E(3, 100), E(5, 210))),
    )
    assert isinstance(action, Append)
    assert (action.assign, action.drop_epochs_from) == ((), None)


def test_nothing_new_only_commits() -> None:
    """Scenario: the long poll ended with no batches. Expected: Commit(leader's mark)."""
    assert plan(LogPosition(0, 50, [E(1, 0)]), LogReply("p/0", high_watermark=42)) == Commit(42)


def test_last_fetched_epoch_is_the_newest_entry_below_the_head() -> None:
    """Scenario: entries (1, 0), (3, 100), (4, 200). Expected: head 200 -> 3 (epoch 4
    dates no record yet); 201 -> 4; 100 -> 1; 0 -> -1; no entries -> -1."""
    entries = [E(1, 0), E(3, 100), E(4, 200)]
    assert [last_fetched_epoch(entries, h) for h in (200, 201, 100, 0)] == [3, 4, 1, -1]
    assert last_fetched_epoch([], 50) == -1


def test_batch_headers_reads_each_batch_in_place_and_stops_at_a_short_tail() -> None:
    """Scenario: three batches (2, 1, 3 records) from 40, then 20 stray bytes. Expected:
    three headers with their offsets and sequences; the tail ignored."""
    data = raw(40, [2, 1, 3])
    assert batch_headers(data + b"\0" * 20) == [
        BatchHeader(7, 0, 40, 41),
        BatchHeader(7, 2, 42, 42),
        BatchHeader(7, 3, 43, 45),
    ]
    assert batch_headers(b"") == []


def test_reply_from_pb() -> None:
    """Scenario: a LogData with every field. Expected: the same values in domain terms;
    an unset divergence is None."""
    data = pb.LogData(
        log="p/1",
        error=pb.OFFSET_OUT_OF_RANGE,
        high_watermark=5,
        log_start=2,
        log_end=9,
        batches=b"xy",
        diverging=pb.Divergence(epoch=3, end_offset=7),
        epochs=[pb.EpochStart(epoch=3, start_offset=2)],
    )
    assert reply_from_pb(data) == LogReply(
        "p/1", pb.OFFSET_OUT_OF_RANGE, 5, 2, 9, b"xy", (3, 7), (E(3, 2),)
    )
    assert reply_from_pb(pb.LogData(log="p/0")).diverging is None


@pytest.mark.parametrize(
    ("failures", "low", "high"),
    [(1, 0.025, 0.05), (2, 0.05, 0.1), (3, 0.1, 0.2), (7, 1.0, 2.0), (50, 1.0, 2.0)],
)
def test_backoff_doubles_to_its_ceiling_with_jitter(failures: int, low: float, high: float) -> None:
    """Scenario: 200 draws after ``failures`` failures in a row (base 0.05 s, max 2 s).
    Expected: each in [half the ceiling, the ceiling]; the draws differ (jitter)."""
    rng = random.Random(failures)
    draws = [backoff_s(failures, rng) for _ in range(200)]
    assert all(low <= d <= high for d in draws)
    assert len(set(draws)) > 150


def test_a_leader_batch_spanning_the_head_cuts_to_its_start() -> None:
    """Scenario: the head is 105 but the leader's first batch covers 100-109 (the two
    logs batched records differently: they are not the same records). Expected: cut to
    100; batches starting past the head (110) back off instead of appending a gap."""
    spanning = plan(LogPosition(0, 105, []), LogReply("p/0", batches=raw(100, [10]), epochs=()))
    assert isinstance(spanning, TruncateTo)
    assert spanning.offset == 100
    gap = plan(LogPosition(0, 105, []), LogReply("p/0", batches=raw(110, [10])))
    assert isinstance(gap, BackOff)
