"""The notifier's pass in place: a subscription whose dispatch task sleeps passes in the
log's notification itself (a plain function call), and hands a pass that has to await (a
save before a redelivery) over to the task, which does the awaiting. Real logs on real
files; a fake monotonic clock."""

from __future__ import annotations

import asyncio

import pytest

from dispatcher import PartitionSnapshot, Subscription
from tests.dispatcher._deliveries import singles, take
from wal import LogWriter

pytestmark = pytest.mark.asyncio(loop_scope="function")


async def _settled(sub: Subscription) -> None:
    """Let the task apply what was queued and go back to sleep."""
    for _ in range(5):
        await asyncio.sleep(0)
    await sub.applied()


async def test_the_notification_itself_puts_the_new_record_in_the_outbox(
    writers: list[LogWriter],
) -> None:
    """Scenario: a consumer with credit waits; a record is appended. A listener added
    after the subscription's looks at the consumer's outbox when the log notifies.
    Expected: the delivery is there already (no loop turn for the dispatch task between
    the commit and the consumer's stream), counted as one notifier pass."""
    sub = Subscription("t", "s", writers, [PartitionSnapshot(0)] * 2)
    sub.start()
    try:
        session = sub.attach("c", 10)
        await _settled(sub)
        before = sub.notifier_polls
        seen: list[int] = []
        writers[0].add_listener(lambda _hwm: seen.append(session.outbox.qsize()))
        await singles(writers[0], 1)
        assert seen == [1]
        assert sub.notifier_polls == before + 1
        (delivery,) = await take(session, 1)
        assert (delivery.partition, delivery.from_offset, delivery.to_offset) == (0, 0, 1)
    finally:
        await sub.aclose()


async def _nacked_and_due(writers: list[LogWriter], sub: Subscription, now: list[float]) -> None:
    """Deliver record 0, nack it for 10 s (the task's timer then waits 10 real seconds),
    and move the fake clock past the delay, so only a notification finds it due."""
    session = sub.attach("c", 10)
    await singles(writers[0], 1)
    await take(session, 1)
    await sub.nack(0, 0, 1, delay_s=10.0, reason="later")
    await _settled(sub)
    now[0] += 11.0


async def test_a_notifier_pass_that_must_save_first_is_finished_by_the_task(
    writers: list[LogWriter],
) -> None:
    """Scenario: a nacked record is due when a new record's notification passes; the
    redelivery needs its delivery count saved, and the save waits on a gate.
    Expected: the pass ran in the notification (counted as a notifier pass) and stopped
    at the save without sending; the dispatch task, not the notification, starts the
    save (no coroutine runs outside a task), and nothing is sent while it waits; once the
    save ends, the task sends the redelivery (count 1) and the new record, in order, and
    no second save is asked for."""
    now = [100.0]
    gate = asyncio.Event()
    saves: list[int] = []

    async def save(sub: Subscription) -> None:
        saves.append(sub.state.changes)
        await gate.wait()

    sub = Subscription(
        "t", "s", writers, [PartitionSnapshot(0)] * 2, persist=save, clock=lambda: now[0]
    )
    sub.start()
    try:
        await _nacked_and_due(writers, sub, now)
        session = next(iter(sub._sessions.values()))
        polls = sub.notifier_polls
        seen: list[tuple[int, int, int]] = []
        writers[0].add_listener(
            lambda _hwm: seen.append((session.outbox.qsize(), len(saves), sub.notifier_polls))
        )
        await singles(writers[0], 1)
        # The pass ran in the notification and stopped at the save, sending nothing; the
        # save is the task's to await.
        assert seen == [(0, 0, polls + 1)]
        await asyncio.sleep(0.02)
        assert len(saves) == 1
        assert session.outbox.empty()
        gate.set()
        got = await take(session, 2)
        assert [(d.from_offset, d.to_offset, d.redeliveries) for d in got] == [
            (0, 1, {0: 1}),
            (1, 2, {}),
        ]
        await asyncio.sleep(0.02)
        assert len(saves) == 1
    finally:
        await sub.aclose()


async def test_closing_while_a_notifier_pass_awaits_its_save_lets_the_consumer_go(
    writers: list[LogWriter],
) -> None:
    """Scenario: as above, but the subscription closes while the save still waits.
    Expected: the close ends (the suspended pass is dropped, nothing half-sent), the
    consumer gets its end (None), and the redelivery never went out."""
    now = [100.0]
    gate = asyncio.Event()

    async def save(_sub: Subscription) -> None:
        await gate.wait()

    sub = Subscription(
        "t", "s", writers, [PartitionSnapshot(0)] * 2, persist=save, clock=lambda: now[0]
    )
    sub.start()
    await _nacked_and_due(writers, sub, now)
    session = next(iter(sub._sessions.values()))
    await singles(writers[0], 1)
    async with asyncio.timeout(5):
        await sub.aclose()
    assert await session.next() is None


async def test_a_notification_while_the_task_works_wakes_it_instead(
    writers: list[LogWriter],
) -> None:
    """Scenario: records are appended while the dispatch task is between a pass and its
    sleep (a backlog pass that passes again at once). Expected: every record arrives
    once, in order (notifications the task could not take in place are not lost)."""
    sub = Subscription("t", "s", writers, [PartitionSnapshot(0)] * 2)
    sub.start()
    try:
        await singles(writers[0], 200)  # a backlog: the attach's passes run in slices
        session = sub.attach("c", 1_000)
        await singles(writers[0], 50)
        got = await take(session, 250)
        assert [d.from_offset for d in got] == list(range(250))
    finally:
        await sub.aclose()
