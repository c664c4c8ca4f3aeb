"""The poison policy applied to one record, and dead-letter outcomes. Pure."""

from __future__ import annotations

from dispatcher.partition_book import BatchContext, PartitionBook, Tries
from dispatcher.poison import DEAD_LETTER_RETRY_S, PoisonRules
from dispatcher.protocol import Action, Note, PartitionSnapshot, PoisonPolicy, ToDeadLetter
from wal import RecordBatch, decode_batch, encode_columns


def _batch(base: int, count: int) -> RecordBatch:
    first = decode_batch(encode_columns([b"v"] * count, timestamps_ms=0))
    assert first is not None
    placed = decode_batch(first.with_base_offset(base))
    assert placed is not None
    return placed


def _setup(policy: PoisonPolicy) -> tuple[PoisonRules, PartitionBook, list[tuple[int, int]]]:
    acked: list[tuple[int, int]] = []
    rules = PoisonRules(policy, 1, lambda part, lo, hi: acked.append((lo, hi)))
    part = PartitionBook(0, PartitionSnapshot(0, delivered=10))
    part.tries[3] = Tries(5, "boom", [1, 2, 3, 4, 5])
    rules.exhausted[0].add(3)
    return rules, part, acked


def test_each_policy_meets_a_poison_record_its_own_way() -> None:
    """Scenario: record 3 failed 5 times; the policy is applied under each setting.
    Expected: dead_letter parks it with a ToDeadLetter carrying its history; drop
    acknowledges it with a warning; block parks it and blocks the partition naming it.
    Each forgets 3 as exhausted."""
    outcomes: dict[PoisonPolicy, list[Action]] = {}
    for policy in PoisonPolicy:
        rules, part, acked = _setup(policy)
        out: list[Action] = []
        rules.apply(part, BatchContext(_batch(0, 10), 7.0, out), 3)
        outcomes[policy] = out
        assert rules.exhausted[0] == set()
        if policy is PoisonPolicy.DROP:
            assert acked == [(3, 4)]
            assert rules.dropped_total == 1
        else:
            assert list(part.parked) == [(3, 4, None)]
            assert acked == []
    (letter,) = outcomes[PoisonPolicy.DEAD_LETTER]
    assert isinstance(letter, ToDeadLetter)
    assert (letter.begin, letter.end) == (3, 4)
    assert letter.failures[0].deliveries == 5
    assert letter.failures[0].reason == "boom"
    (note,) = outcomes[PoisonPolicy.DROP]
    assert isinstance(note, Note)
    assert "after 5 deliveries" in note.message
    (note,) = outcomes[PoisonPolicy.BLOCK]
    assert isinstance(note, Note)
    assert "offset 3 failed 5 deliveries" in note.message


def test_a_failed_dead_letter_write_blocks_and_is_retried_later() -> None:
    """Scenario: record 3 is handed to the dead-letter queue; the write fails at t=7;
    the batch comes back at t=7.5 and again after DEAD_LETTER_RETRY_S; then it is
    written.
    Expected: the partition is blocked with a reason; no retry before the delay, one
    ToDeadLetter after; the written record is acknowledged and counted."""
    rules, part, acked = _setup(PoisonPolicy.DEAD_LETTER)
    rules.apply(part, BatchContext(_batch(0, 10), 7.0, []), 3)
    (note,) = rules.dead_letter_failed(part, 3, 4, "disk full", 7.0)
    assert isinstance(note, Note)
    assert part.retry_dead_letters
    assert "disk full" in part.blocked
    early: list[Action] = []
    rules.retry_dead_letters(part, BatchContext(_batch(0, 10), 7.5, early))
    assert early == []
    late: list[Action] = []
    rules.retry_dead_letters(part, BatchContext(_batch(0, 10), 7.0 + DEAD_LETTER_RETRY_S, late))
    assert [type(a) for a in late] == [ToDeadLetter]
    rules.dead_lettered(part, 3, 4)
    assert acked == [(3, 4)]
    assert rules.dead_lettered_total == 1
