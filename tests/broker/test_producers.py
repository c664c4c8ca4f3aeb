"""The idempotent-producer table: pure, no loop, no disk."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from broker.producers import (
    WINDOW,
    Admit,
    AppendedLongAgo,
    Decision,
    Duplicate,
    InFlight,
    OutOfSequence,
    ProducerTable,
)

#: The tests' wall clock, ms since the epoch: when ``appended`` commits by default.
NOW = 1_700_000_000_000


def appended(
    table: ProducerTable, pid: int, seq: int, count: int, first: int, *, at_ms: int = NOW
) -> None:
    assert table.admit(pid, seq, count) == Admit()
    table.commit(pid, seq, first, first + count - 1, at_ms=at_ms)


def test_the_worked_example() -> None:
    """Producer 7 appended 0-9 at 100-109 and 10-19 at 110-119: a retry of 10 is a duplicate
    with its original offsets; 20 is admitted; 30 is a gap (expected 25 after 20-24)."""
    table = ProducerTable()
    appended(table, 7, 0, 10, 100)
    appended(table, 7, 10, 10, 110)
    assert table.admit(7, 10, 10) == Duplicate(110, 119)
    appended(table, 7, 20, 5, 120)
    assert table.admit(7, 30, 5) == OutOfSequence(expected=25, got=30)


def test_batches_without_a_producer_are_always_admitted() -> None:
    """producer_id -1: no state, every batch admitted, commit is a no-op."""
    table = ProducerTable()
    for _ in range(3):
        assert table.admit(-1, -1, 4) == Admit()
        table.commit(-1, -1, 0, 3, at_ms=NOW)
    assert table.snapshot() == {}


def test_a_retry_while_the_first_is_in_flight_waits_for_it() -> None:
    """An admitted batch not yet committed: its twin gets InFlight; after release (the
    append failed) the same batch is admitted again."""
    table = ProducerTable()
    assert table.admit(1, 0, 3) == Admit()
    assert table.admit(1, 0, 3) == InFlight(1, 0)
    table.release(1, 0)
    assert table.admit(1, 0, 3) == Admit()


def test_pipelined_batches_follow_the_in_flight_ones() -> None:
    """Two batches admitted back to back before either commits: the second must continue
    the first's sequence."""
    table = ProducerTable()
    assert table.admit(1, 0, 3) == Admit()
    assert table.admit(1, 3, 2) == Admit()
    assert table.admit(1, 6, 1) == OutOfSequence(expected=5, got=6)
    table.commit(1, 0, 0, 2, at_ms=NOW)
    table.commit(1, 3, 3, 4, at_ms=NOW)
    assert table.admit(1, 0, 3) == Duplicate(0, 2)


def test_only_the_last_window_batches_keep_their_offsets() -> None:
    """After WINDOW + 1 batches the oldest retry has left the window: answered as appended
    long ago (no offsets), never appended a second time; the others keep their offsets."""
    table = ProducerTable()
    for i in range(WINDOW + 1):
        appended(table, 9, i, 1, i)
    assert table.admit(9, 0, 1) == AppendedLongAgo()
    assert table.admit(9, 1, 1) == Duplicate(1, 1)
    assert table.admit(9, WINDOW + 1, 1) == Admit()


def eight_batches(first_sequence: int = 0) -> ProducerTable:
    """Producer 4 appended 8 batches of 10 from ``first_sequence`` at offsets 100-179;
    the window holds the last WINDOW of them."""
    table = ProducerTable()
    for i in range(8):
        appended(table, 4, first_sequence + 10 * i, 10, 100 + 10 * i)
    return table


@pytest.mark.parametrize(
    ("case", "producer", "seq", "count", "decision"),
    [
        ("exact window hit", 4, 70, 10, Duplicate(170, 179)),
        ("oldest in the window", 4, 30, 10, Duplicate(130, 139)),
        ("old retry: the first batch", 4, 0, 10, AppendedLongAgo()),
        ("old retry: just before the window", 4, 20, 10, AppendedLongAgo()),
        ("old retry, other boundaries", 4, 5, 20, AppendedLongAgo()),
        ("ends exactly at the next sequence", 4, 75, 5, AppendedLongAgo()),
        ("straddles the next sequence", 4, 75, 10, OutOfSequence(expected=80, got=75)),
        ("the next batch", 4, 80, 3, Admit()),
        ("a gap after the next sequence", 4, 81, 1, OutOfSequence(expected=80, got=81)),
        ("unknown producer", 5, 0, 10, Admit()),
        ("unknown producer, any sequence", 5, 1234, 1, Admit()),
    ],
)
def test_admit_boundaries(
    case: str, producer: int, seq: int, count: int, decision: Decision
) -> None:
    """Producer 4 appended sequences 0-79 in batches of 10 (window: 30-79). A batch inside
    [0, 80) is a duplicate: with offsets in the window, without them before it; a batch
    running past 80 or after it is out of sequence; another producer starts anywhere."""
    assert eight_batches().admit(producer, seq, count) == decision, case


@pytest.mark.parametrize(
    ("seq", "count", "decision"),
    [
        (40, 10, AppendedLongAgo()),  # first_sequence itself
        (39, 1, OutOfSequence(expected=120, got=39)),  # just below first_sequence
        (35, 10, OutOfSequence(expected=120, got=35)),  # starts below, ends inside
        (0, 10, OutOfSequence(expected=120, got=0)),  # far below
    ],
)
def test_a_retry_below_the_first_sequence_is_out_of_sequence(
    seq: int, count: int, decision: Decision
) -> None:
    """Producer 4 started at sequence 40 (40-119 appended): a batch starting below 40 was
    never appended by it, so it is OutOfSequence, not a duplicate; 40 itself is one."""
    assert eight_batches(first_sequence=40).admit(4, seq, count) == decision


def test_a_replay_from_zero_is_answered_without_moving_anything() -> None:
    """Scenario: a producer re-sends all 8 of its batches from sequence 0 (a replayed Spark
    task). Expected: every one is a duplicate (the oldest without offsets), and the next
    new batch is still admitted at sequence 80."""
    table = eight_batches()
    answers = [table.admit(4, 10 * i, 10) for i in range(8)]
    assert answers[:3] == [AppendedLongAgo()] * 3
    assert answers[3:] == [Duplicate(100 + 10 * i, 109 + 10 * i) for i in range(3, 8)]
    assert table.admit(4, 80, 10) == Admit()


def test_an_old_retry_is_not_answered_from_in_flight_sequences() -> None:
    """Sequences 0-79 appended, 80-89 admitted but not appended: a retry covering 80-89 is
    its in-flight twin, one running into it is out of sequence, and after the append fails
    (release) nothing at or past 80 is taken for a duplicate."""
    table = eight_batches()
    assert table.admit(4, 80, 10) == Admit()
    assert table.admit(4, 80, 10) == InFlight(4, 80)
    assert table.admit(4, 75, 10) == OutOfSequence(expected=90, got=75)
    table.release(4, 80)
    assert table.admit(4, 80, 5) == Admit()


def broken_run() -> ProducerTable:
    """Producer 2: batches 0-9 and 10-19 appended at offsets 0-19; 20-29 and 30-39
    admitted back to back; the first append fails and the second lands at 20-29."""
    table = ProducerTable()
    appended(table, 2, 0, 10, 0)
    appended(table, 2, 10, 10, 10)
    assert table.admit(2, 20, 10) == Admit()
    assert table.admit(2, 30, 10) == Admit()
    table.release(2, 20)
    table.commit(2, 30, 20, 29, at_ms=NOW)
    return table


def test_a_broken_run_moves_the_first_sequence_up() -> None:
    """Batches 0-9 and 10-19 appended; 20-29 and 30-39 admitted back to back; the first
    append fails (release) and the second succeeds. Sequences 20-29 are a hole, so a retry
    of anything before 30 that is not in the window is out of sequence, never a duplicate;
    the window still answers its own batches."""
    table = broken_run()
    assert table.admit(2, 20, 10) == OutOfSequence(expected=40, got=20)
    assert table.admit(2, 0, 5) == OutOfSequence(expected=40, got=0)
    assert table.admit(2, 10, 10) == Duplicate(10, 19)
    assert table.admit(2, 30, 10) == Duplicate(20, 29)


def test_a_new_producer_may_start_at_any_sequence() -> None:
    """Unknown producer (e.g. its state expired with retention): any first sequence."""
    assert ProducerTable().admit(5, 1234, 2) == Admit()


@pytest.mark.parametrize("observed", [False, True])
def test_snapshot_restore_and_observe_rebuild_the_same_answers(observed: bool) -> None:
    """State rebuilt from a snapshot, or by observing the batches in the log, answers
    retries exactly like the original table."""
    table = ProducerTable()
    appended(table, 3, 0, 2, 10)
    appended(table, 3, 2, 4, 12)
    if observed:
        rebuilt = ProducerTable()
        rebuilt.observe(3, 0, 10, 11, at_ms=NOW)
        rebuilt.observe(3, 2, 12, 15, at_ms=NOW)
        rebuilt.observe(-1, -1, 16, 20, at_ms=NOW)  # a batch without a producer is ignored
    else:
        rebuilt = ProducerTable.restore(table.snapshot(), now_ms=NOW)
    assert rebuilt.admit(3, 2, 4) == Duplicate(12, 15)
    assert rebuilt.admit(3, 7, 1) == OutOfSequence(expected=6, got=7)


@pytest.mark.parametrize("how", ["snapshot", "observed"])
def test_the_first_sequence_survives_a_restart(how: str) -> None:
    """Eight batches from sequence 40, rebuilt from a JSON round trip of the snapshot or by
    observing the whole log: a retry of the first batch (out of the window) is still a
    duplicate, one below 40 still out of sequence, and the next batch admitted."""
    table = eight_batches(first_sequence=40)
    if how == "snapshot":
        doc = json.loads(json.dumps(table.snapshot()))
        assert doc["4"]["first_sequence"] == 40
        rebuilt = ProducerTable.restore(doc, now_ms=NOW)
    else:
        rebuilt = ProducerTable()
        for i in range(8):
            rebuilt.observe(4, 40 + 10 * i, 100 + 10 * i, 109 + 10 * i, at_ms=NOW)
    assert rebuilt.snapshot() == table.snapshot()
    assert rebuilt.admit(4, 40, 10) == AppendedLongAgo()
    assert rebuilt.admit(4, 30, 10) == OutOfSequence(expected=120, got=30)
    assert rebuilt.admit(4, 110, 10) == Duplicate(170, 179)
    assert rebuilt.admit(4, 120, 1) == Admit()


def test_a_snapshot_continued_by_observe_keeps_the_first_sequence() -> None:
    """A snapshot after 8 batches, then 3 more batches found in the log after it: the run
    still starts at 0, so the very first batch is a duplicate."""
    table = eight_batches()
    rebuilt = ProducerTable.restore(table.snapshot(), now_ms=NOW)
    for i in range(8, 11):
        rebuilt.observe(4, 10 * i, 100 + 10 * i, 109 + 10 * i, at_ms=NOW)
    assert rebuilt.admit(4, 0, 10) == AppendedLongAgo()
    assert rebuilt.admit(4, 110, 10) == Admit()


def test_a_snapshot_below_an_offset_plus_the_log_after_it_is_the_whole_table() -> None:
    """Eight batches of 10 at offsets 100-179; a snapshot below offset 150 (batches 150+
    were committed while it was taken), restored, then the log from 150 observed.
    Expected: the snapshot holds the window's batches ending below 150 only; the rebuilt table
    equals the original, so it answers every retry the same way."""
    table = eight_batches()
    doc = json.loads(json.dumps(table.snapshot(below=150)))
    assert [row[3] for row in doc["4"]["appended"]] == [139, 149]  # the window, below 150
    rebuilt = ProducerTable.restore(doc, now_ms=NOW)
    for i in range(5, 8):
        rebuilt.observe(4, 10 * i, 100 + 10 * i, 109 + 10 * i, at_ms=NOW)
    assert rebuilt.snapshot() == table.snapshot()
    assert rebuilt.admit(4, 0, 10) == AppendedLongAgo()
    assert rebuilt.admit(4, 70, 10) == Duplicate(170, 179)


def test_a_snapshot_below_a_later_broken_run_starts_the_run_at_its_rows() -> None:
    """Batches 0-9, 10-19 at offsets 0-19; then 20-29 fails and 30-39 lands at 20-29 (the
    run breaks: it starts at 30 now). A snapshot below offset 20 cannot say the run
    started at 30. Expected: it says the run of its own rows (from 0), which restores
    cleanly; observing the batch at 20 then breaks the run at 30 again, as in the log."""
    table = broken_run()
    doc = table.snapshot(below=20)
    assert doc["2"]["first_sequence"] == 0
    rebuilt = ProducerTable.restore(doc, now_ms=NOW)
    assert rebuilt.admit(2, 0, 10) == Duplicate(0, 9)
    rebuilt.observe(2, 30, 20, 29, at_ms=NOW)
    assert rebuilt.snapshot() == table.snapshot()
    assert rebuilt.admit(2, 20, 10) == OutOfSequence(expected=40, got=20)


def test_a_snapshot_below_a_producers_first_batch_leaves_it_out() -> None:
    """A producer whose only batch ends at or past the offset is not in the snapshot."""
    table = ProducerTable()
    appended(table, 1, 0, 5, 0)
    appended(table, 9, 0, 5, 5)
    assert set(table.snapshot(below=5)) == {"1"}


def test_restore_reads_the_old_format() -> None:
    """A snapshot from before first_sequence (a bare list of rows per producer) opens; the
    run starts at its oldest row: retries of the rows are duplicates with offsets, older
    ones stay out of sequence as they were, and the next batch is admitted."""
    old = {"4": [[30 + 10 * i, 10, 130 + 10 * i, 139 + 10 * i] for i in range(5)]}
    rebuilt = ProducerTable.restore(old, now_ms=NOW)
    assert rebuilt.admit(4, 30, 10) == Duplicate(130, 139)
    assert rebuilt.admit(4, 20, 10) == OutOfSequence(expected=80, got=20)
    assert rebuilt.admit(4, 80, 10) == Admit()
    assert rebuilt.snapshot()["4"]["first_sequence"] == 30


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"1": [[0, 5, 10, 11]]}, "damaged"),  # old format: offsets disagree with count
        ({"1": {"first_sequence": 0, "appended": [[0, 5, 10, 11]]}}, "damaged"),
        ({"1": 7}, "damaged"),  # neither rows nor an object
        (  # the run cannot start after its oldest row
            {"1": {"first_sequence": 5, "appended": [[0, 5, 10, 14]]}},
            "contradicts",
        ),
        (  # a hole inside the rows: the run cannot reach back past it
            {"1": {"first_sequence": 0, "appended": [[0, 5, 10, 14], [9, 1, 15, 15]]}},
            "contradicts",
        ),
        (  # a time that is not an integer
            {"1": {"first_sequence": 0, "last_append_ms": "1h", "appended": [[0, 5, 10, 14]]}},
            "last_append_ms",
        ),
    ],
)
def test_restore_rejects_a_damaged_snapshot(doc: dict[str, Any], message: str) -> None:
    """A row whose offsets disagree with its count, an entry of the wrong shape, a
    first_sequence the rows contradict, or a last_append_ms that is not an integer:
    ValueError (the partition then rescans the log)."""
    with pytest.raises(ValueError, match=message):
        ProducerTable.restore(doc, now_ms=NOW)


# -- expiry -------------------------------------------------------------------------------

MINUTE = 60_000


def test_the_expiry_worked_example() -> None:
    """Scenario: the module docstring's example. Producer 7 appended at 1,000, producer 8
    at 50,000, producer 9's first batch is in flight; max_idle 60,000. Expected: at 61,000
    nothing goes (7 is idle exactly 60,000); at 61,001 only 7 goes (count 1); then 7's
    old batch is admitted again, 8's is still a duplicate, and 9 can still commit."""
    table = ProducerTable()
    appended(table, 7, 0, 10, 100, at_ms=1_000)
    appended(table, 8, 0, 5, 110, at_ms=50_000)
    assert table.admit(9, 0, 2) == Admit()
    assert table.expire(61_000, MINUTE) == 0
    assert table.expire(61_001, MINUTE) == 1
    assert len(table) == 2
    assert table.admit(7, 0, 10) == Admit()
    assert table.admit(8, 0, 5) == Duplicate(110, 114)
    table.commit(9, 0, 115, 116, at_ms=61_001)
    assert table.admit(9, 0, 2) == Duplicate(115, 116)


@pytest.mark.parametrize(
    ("idle_ms", "forgotten"),
    [(0, 0), (MINUTE - 1, 0), (MINUTE, 0), (MINUTE + 1, 1), (100 * MINUTE, 1)],
)
def test_expire_forgets_only_producers_idle_longer_than_max_idle(
    idle_ms: int, forgotten: int
) -> None:
    """Scenario: one producer appended at NOW; expire runs ``idle_ms`` later with max_idle
    one minute. Expected: forgotten (count 1, out of the snapshot) only when idle for
    strictly longer than a minute."""
    table = ProducerTable()
    appended(table, 1, 0, 3, 0)
    assert table.expire(NOW + idle_ms, MINUTE) == forgotten
    assert ("1" in table.snapshot()) is (forgotten == 0)


def test_a_forgotten_producer_starts_over_at_any_sequence() -> None:
    """Scenario: producer 4 appended sequences 0-79 and was forgotten. Expected: its retry
    of the last batch is admitted (it would be appended twice: the trade-off), as is a
    batch at any other sequence; the table then tracks it from that batch only."""
    table = eight_batches()
    assert table.expire(NOW + 2 * MINUTE, MINUTE) == 1
    assert table.snapshot() == {}
    assert table.admit(4, 70, 10) == Admit()
    table.release(4, 70)
    appended(table, 4, 500, 2, 180, at_ms=NOW + 2 * MINUTE)
    assert table.admit(4, 0, 10) == OutOfSequence(expected=502, got=0)
    assert table.snapshot()["4"]["first_sequence"] == 500


def test_a_producer_with_a_batch_in_flight_is_kept() -> None:
    """Scenario: producer 2 appended long ago and has a new batch in flight; producer 3's
    very first batch is in flight (it never appended). Expected: expire keeps both (count
    0); once 2's batch commits its idle time restarts, and after it is released producer 3
    (nothing appended, nothing in flight) is forgotten."""
    table = ProducerTable()
    appended(table, 2, 0, 1, 0, at_ms=0)
    assert table.admit(2, 1, 1) == Admit()
    assert table.admit(3, 0, 1) == Admit()
    assert table.expire(NOW, MINUTE) == 0
    table.commit(2, 1, 1, 1, at_ms=NOW)
    table.release(3, 0)
    assert table.expire(NOW + MINUTE, MINUTE) == 1
    assert table.admit(2, 1, 1) == Duplicate(1, 1)
    assert len(table) == 1


def test_last_append_ms_never_moves_back() -> None:
    """Scenario: a commit stamped earlier than the previous one (the wall clock stepped
    back). Expected: the producer keeps the later time, so it is not expired early."""
    table = ProducerTable()
    appended(table, 5, 0, 1, 0, at_ms=NOW)
    appended(table, 5, 1, 1, 1, at_ms=NOW - 10 * MINUTE)
    assert table.snapshot()["5"]["last_append_ms"] == NOW
    assert table.expire(NOW + MINUTE, MINUTE) == 0


def test_snapshot_restore_keeps_last_append_ms() -> None:
    """Scenario: producers that appended at NOW and NOW + 30 s, snapshot through JSON,
    restored a minute later. Expected: each keeps its last_append_ms (not the restore
    time), so the restored table expires the first one at the same moment as the
    original."""
    table = ProducerTable()
    appended(table, 1, 0, 2, 0, at_ms=NOW)
    appended(table, 2, 0, 2, 2, at_ms=NOW + 30_000)
    doc = json.loads(json.dumps(table.snapshot()))
    assert [doc[p]["last_append_ms"] for p in ("1", "2")] == [NOW, NOW + 30_000]
    rebuilt = ProducerTable.restore(doc, now_ms=NOW + MINUTE)
    assert rebuilt.snapshot() == table.snapshot()
    assert rebuilt.expire(NOW + MINUTE + 1, MINUTE) == 1
    assert rebuilt.admit(1, 0, 2) == Admit()
    assert rebuilt.admit(2, 0, 2) == Duplicate(2, 3)


@pytest.mark.parametrize(
    "entry",
    [
        [[0, 2, 10, 11]],  # before first_sequence: bare rows
        {"first_sequence": 0, "appended": [[0, 2, 10, 11]]},  # before last_append_ms
    ],
    ids=["rows-only", "no-last-append"],
)
def test_an_old_snapshot_counts_as_appended_at_the_restore(entry: object) -> None:
    """Scenario: a snapshot in either older format (no last_append_ms) restored at NOW.
    Expected: the producer counts as having appended at NOW: kept for a full max_idle
    after the restore (its retry stays a duplicate), forgotten only after that."""
    rebuilt = ProducerTable.restore({"6": entry}, now_ms=NOW)
    assert rebuilt.snapshot()["6"]["last_append_ms"] == NOW
    assert rebuilt.expire(NOW + MINUTE, MINUTE) == 0
    assert rebuilt.admit(6, 0, 2) == Duplicate(10, 11)
    assert rebuilt.expire(NOW + MINUTE + 1, MINUTE) == 1


def test_observe_stamps_the_given_time() -> None:
    """Scenario: batches of one producer observed with times 5,000 then 9,000. Expected:
    its last_append_ms is 9,000, so it expires after 9,000 + max_idle, not before."""
    table = ProducerTable()
    table.observe(3, 0, 0, 0, at_ms=5_000)
    table.observe(3, 1, 1, 1, at_ms=9_000)
    assert table.expire(9_000 + MINUTE, MINUTE) == 0
    assert table.expire(9_001 + MINUTE, MINUTE) == 1


def test_the_cap_forgets_the_least_recently_active_producer() -> None:
    """The module docstring's example: cap 2; producers 7 and 8 commit, then 7 again; a
    new producer 9 forgets 8 (7 was active since), and 8's retry is admitted as new."""
    table = ProducerTable(max_producers=2)
    for pid, seq, offset in ((7, 0, 0), (8, 0, 1), (7, 1, 2)):
        assert table.admit(pid, seq, 1) == Admit()
        table.commit(pid, seq, offset, offset, at_ms=0)
    assert table.admit(9, 0, 1) == Admit()
    assert (len(table), table.take_evicted(), table.take_evicted()) == (2, 1, 0)
    assert table.admit(7, 1, 1) == Duplicate(2, 2)
    assert table.admit(8, 0, 1) == Admit()  # forgotten: its retry would be appended again


def test_the_cap_never_forgets_a_producer_with_a_batch_in_flight() -> None:
    """Cap 2, both producers with a batch in flight: a third is admitted over the cap
    rather than forgetting state an append still needs; once one commits, the next new
    producer brings the table back within the cap."""
    table = ProducerTable(max_producers=2)
    assert table.admit(1, 0, 1) == Admit()
    assert table.admit(2, 0, 1) == Admit()
    assert table.admit(3, 0, 1) == Admit()
    assert (len(table), table.take_evicted()) == (3, 0)
    table.commit(1, 0, 0, 0, at_ms=0)
    table.commit(2, 0, 1, 1, at_ms=0)
    table.commit(3, 0, 2, 2, at_ms=0)
    assert table.admit(4, 0, 1) == Admit()
    assert (len(table), table.take_evicted()) == (2, 2)
    assert table.admit(3, 0, 1) == Duplicate(2, 2)


def test_random_producer_ids_stay_within_the_cap() -> None:
    """10,000 batches, each from a new random producer id (what a fuzzer sends), through a
    table capped at 100: it never holds more than 100, and the newest are the ones kept."""
    table = ProducerTable(max_producers=100)
    ids = random.Random(7).sample(range(1 << 62), 10_000)
    for offset, pid in enumerate(ids):
        assert table.admit(pid, 0, 1) == Admit()
        table.commit(pid, 0, offset, offset, at_ms=0)
        assert len(table) <= 100
    assert table.take_evicted() == 9_900
    assert table.admit(ids[-1], 0, 1) == Duplicate(9_999, 9_999)


def test_a_restore_keeps_producers_up_to_its_own_cap_not_the_default() -> None:
    """A snapshot of 12,000 producers (more than the default cap of 10,000) restored under
    a cap of 20,000 keeps all of them: the rebuild runs under the configured cap."""
    table = ProducerTable(max_producers=20_000)
    for pid in range(12_000):
        assert table.admit(pid, 0, 1) == Admit()
        table.commit(pid, 0, pid, pid, at_ms=0)
    restored = ProducerTable.restore(table.snapshot(), now_ms=0, max_producers=20_000)
    assert (len(restored), restored.take_evicted()) == (12_000, 0)
    assert restored.admit(0, 0, 1) == Duplicate(0, 0)
