"""Rejects in the dispatch state machine (dispatcher.state): a nack with ``dead_letter``.

A consumer that knows a record will never succeed rejects it (AMQP's reject with
requeue=false): the record is not sent again, and the subscription's poison policy
applies to it at once, whatever its delivery count and whatever ``max_deliveries`` is
(0, unlimited, included). The reject is saved with the failure entry, so a restart
before the dead-letter write still sends it to the policy, not to a consumer. The
:class:`Driver` of ``test_state`` plays the shell and checks the one-place invariant
after every command.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import pytest

from dispatcher.protocol import (
    Ack,
    Action,
    DeadLettered,
    Detach,
    DispatchPolicy,
    Failure,
    FailureRun,
    Nack,
    Note,
    PartitionSnapshot,
    PoisonPolicy,
    SubscriptionType,
    ToDeadLetter,
)
from dispatcher.state_file import StateDoc, decode, encode, partition_doc, restore
from tests.dispatcher.test_state import Driver, _restart


def _letters(actions: Sequence[Action]) -> list[ToDeadLetter]:
    return [a for a in actions if isinstance(a, ToDeadLetter)]


def _sent(records: int, policy: DispatchPolicy | None = None) -> Driver:
    """Consumer ``c`` holds records 0..records-1 of partition 0, sent at t=0."""
    d = Driver(policy or DispatchPolicy())
    d.attach("c")
    d.logs[0].append_batches(records)
    d.pump()
    return d


@pytest.mark.parametrize("max_deliveries", [0, 1, 10])
def test_a_reject_dead_letters_the_record_on_the_next_pass(max_deliveries: int) -> None:
    """Scenario: three records sent once; the consumer rejects record 1 with a reason,
    under max_deliveries 0 (unlimited), 1 and 10.
    Expected: the next pass writes record 1 to the dead-letter queue with 1 attempt and
    the reason, and sends it to nobody; it is parked until DeadLettered acknowledges it."""
    d = _sent(3, DispatchPolicy(max_deliveries=max_deliveries))
    d.take()
    d.do(Nack(0, 1, 2, reason="bad price", dead_letter=True))
    letters = _letters(d.pump())
    assert [(a.begin, a.end) for a in letters] == [(1, 2)]
    assert letters[0].failures == (Failure(1, 1, "bad price", (0,)),)
    assert d.sends == []
    assert d.state.held == 3  # 0 and 2 leased, 1 parked
    d.do(Ack(0, 0, 1))
    d.do(Ack(0, 2, 3))
    d.do(DeadLettered(0, 1, 2))
    assert d.state.cursor(0) == 3
    assert d.state.held == 0
    assert d.state.dead_lettered_total == 1


def test_a_reject_ignores_the_delay_and_the_backoff() -> None:
    """Scenario: backoff 60 s; the consumer rejects record 0 with a delay of an hour.
    Expected: it is dead-lettered at the same instant, not after the delay or backoff."""
    d = _sent(1, DispatchPolicy(backoff_initial_s=60, backoff_max_s=60))
    d.do(Nack(0, 0, 1, delay_s=3600, dead_letter=True))
    assert [(a.begin, a.end) for a in _letters(d.pump())] == [(0, 1)]


def test_a_reject_with_no_consumer_left_still_dead_letters() -> None:
    """Scenario: the consumer rejects record 0 and leaves before the next pass.
    Expected: with nobody attached, the pass still hands the record to the dead-letter
    queue (as for a record past max_deliveries), with the reject's reason, not the
    consumer's leaving."""
    d = _sent(2)
    d.do(Nack(0, 0, 1, reason="unparseable", dead_letter=True))
    d.do(Detach("c"))
    letters = _letters(d.pump())
    assert [(a.begin, a.end) for a in letters] == [(0, 1)]
    assert letters[0].failures[0].reason == "unparseable"


def test_a_reject_without_a_reason_says_it_was_rejected() -> None:
    """Scenario: a reject with an empty reason.
    Expected: the dead letter's reason is "rejected by the consumer" (a nack's default is
    "nacked by the consumer")."""
    d = _sent(1)
    d.do(Nack(0, 0, 1, dead_letter=True))
    (letter,) = _letters(d.pump())
    assert letter.failures[0].reason == "rejected by the consumer"


@pytest.mark.parametrize(
    ("policy", "level", "words"),
    [
        (PoisonPolicy.DROP, logging.WARNING, "dropped rejected by its consumer"),
        (PoisonPolicy.BLOCK, logging.ERROR, "was rejected by its consumer (poison policy block)"),
    ],
)
def test_a_reject_follows_the_poison_policy(policy: PoisonPolicy, level: int, words: str) -> None:
    """Scenario: record 0 of two is rejected under poison policy drop, then block.
    Expected: drop acknowledges it with a warning naming the reject; block stops the
    partition with an error saying so; neither writes a dead letter or resends it."""
    d = _sent(2, DispatchPolicy(poison=policy))
    d.take()
    d.do(Nack(0, 0, 1, dead_letter=True))
    actions = d.pump()
    notes = [a for a in actions if isinstance(a, Note)]
    assert [n.level for n in notes] == [level]
    assert words in notes[0].message
    assert _letters(actions) == []
    assert d.sends == []
    if policy is PoisonPolicy.DROP:
        assert d.state.dropped_total == 1
        d.do(Ack(0, 1, 2))
        assert d.state.cursor(0) == 2
    else:
        assert "rejected" in d.state.blocked(0)


def test_a_reject_survives_a_restart_before_the_dead_letter_write() -> None:
    """Scenario: record 0 is rejected; the broker saves the state (its snapshot, whose
    state file names the rejected run) and restarts before the dead-letter write; a
    consumer attaches.
    Expected: after the restart the record goes to the dead-letter queue, not to the
    consumer, with its reason."""
    d = _sent(2, DispatchPolicy(max_deliveries=0))
    d.do(Ack(0, 1, 2))
    d.do(Nack(0, 0, 1, reason="poison", dead_letter=True))
    (run,) = d.state.snapshot(10)[0].failures
    assert run.rejected
    assert partition_doc(d.state.snapshot(10)[0]).rejected == [(0, 1)]
    fresh = _restart(d)
    fresh.attach("c2")
    letters = _letters(fresh.pump())
    assert [(a.begin, a.end) for a in letters] == [(0, 1)]
    assert letters[0].failures[0].reason == "poison"
    assert fresh.sent_to("c2") == []


def test_the_state_file_names_rejected_runs_only_when_there_are_some() -> None:
    """Scenario: a partition with one plain failure run and one rejected run, saved
    through the state file, then one with no rejected run.
    Expected: the first has ``"rejected": [[1, 2]]`` and reads back with only that run
    rejected; the second has no ``rejected`` key and no ``committer``, as an older broker
    wrote and reads them."""
    runs = (FailureRun(0, 1, 1, "x", (0,)), FailureRun(1, 2, 1, "y", (0,), True))
    snap = PartitionSnapshot(0, (), 2, runs)
    data = encode(StateDoc(3, "t", "s", "exclusive", [partition_doc(snap)]))
    assert b'"rejected":[[1,2]]' in data
    back = restore(decode(data), [_Writer(0, 2)], "t", "s")  # type: ignore[list-item]
    assert back[0].failures == runs
    plain = PartitionSnapshot(0, (), 1, runs[:1])
    data = encode(StateDoc(3, "t", "s", "exclusive", [partition_doc(plain)]))
    assert b"rejected" not in data
    assert b"committer" not in data


class _Writer:
    """What ``state_file.restore`` reads of a partition's log."""

    def __init__(self, first_offset: int, high_water_mark: int) -> None:
        self.first_offset = first_offset
        self.high_water_mark = high_water_mark


def test_a_shared_reject_is_not_sent_to_the_other_consumer() -> None:
    """Scenario: shared subscription, consumers a and b both with credit; a rejects the
    record it got.
    Expected: the record is dead-lettered; b does not get it."""
    d = Driver(DispatchPolicy(type=SubscriptionType.SHARED))
    d.attach("a")
    d.attach("b")
    d.logs[0].append(1)
    d.pump()
    holder = "a" if d.sent_to("a") else "b"
    other = "b" if holder == "a" else "a"
    d.do(Nack(0, 0, 1, dead_letter=True))
    assert [(a.begin, a.end) for a in _letters(d.pump())] == [(0, 1)]
    assert d.sent_to(other) == []
