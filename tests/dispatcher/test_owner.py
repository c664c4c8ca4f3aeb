"""One owner per subscription (dispatcher.subscription): every command goes through the
subscription's bounded queue and only its dispatch task applies it; deadlines run on the
monotonic clock.

Races are made deterministic with a log reader and a dead-letter sink that block on an
event the test controls, never with sleeps; and every change of the state is checked to
happen on the dispatch task (:func:`_guard`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from dispatcher import (
    ConsumerSession,
    Delivery,
    InvalidAckError,
    InvalidSubscriptionError,
    PartitionSnapshot,
    PoisonPolicy,
    Subscription,
)
from dispatcher import subscription as subscription_module
from dispatcher.protocol import Action, Command, Commit, DispatchPolicy, ToDeadLetter
from tests._helpers import ManualClock
from tests.dispatcher._deliveries import singles, take
from wal import LogWriter, RecordBatch

pytestmark = pytest.mark.asyncio(loop_scope="function")


async def _settle(turns: int = 20) -> None:
    for _ in range(turns):
        await asyncio.sleep(0)


def _offsets(deliveries: list[Delivery]) -> list[int]:
    return [o for d in deliveries for o in range(d.from_offset, d.to_offset)]


def _guard(sub: Subscription) -> list[str]:
    """Make every change of ``sub``'s state assert that it runs on the dispatch task (or
    with no task at all: before the start, after the close). Returns the commands
    applied, by type name."""
    applied: list[str] = []
    handle = sub.state.handle

    def guarded(cmd: Command, now: float, *, wall: float | None = None) -> list[Action]:
        task = sub._task
        assert task is None or asyncio.current_task() is task, f"{cmd} applied off the owner"
        applied.append(type(cmd).__name__)
        return handle(cmd, now, wall=wall)

    sub.state.handle = guarded  # type: ignore[method-assign]
    return applied


class BlockingReader:
    """Reads the real log, but the first read waits until :attr:`go` is set."""

    def __init__(self, writers: list[LogWriter]) -> None:
        self.writers = writers
        self.started = asyncio.Event()
        self.go = asyncio.Event()
        self.reads: list[tuple[int, int]] = []

    async def __call__(self, p: int, offset: int, max_bytes: int) -> list[RecordBatch]:
        self.reads.append((p, offset))
        if len(self.reads) == 1:
            self.started.set()
            await self.go.wait()
        return self.writers[p].read(offset, max_bytes)


async def test_a_seek_while_a_read_is_in_flight_drops_the_stale_read(
    writers: list[LogWriter],
) -> None:
    """Scenario: 10 one-record batches; the first read (from 0) is in flight when an
    admin seeks to 6, then the read returns.
    Expected: the seek is not applied while the read is out (its future is not done,
    the cursor is unmoved); it is applied before the read's result, so none of the read's
    records below 6 is ever delivered: the consumer gets exactly 6..9, and only the
    dispatch task changed the state."""
    await singles(writers[0], 10)
    reader = BlockingReader(writers)
    sub = Subscription("t", "s", writers, [PartitionSnapshot(0)] * 2, reader=reader)
    applied = _guard(sub)
    sub.start()
    try:
        session = sub.attach("c", 100)
        async with asyncio.timeout(5):
            await reader.started.wait()
        seek = sub.seek([6, 0])
        await _settle()
        assert not seek.done()
        assert sub.state.cursor(0) == 0
        reader.go.set()
        async with asyncio.timeout(5):
            await seek
        assert sub.state.cursor(0) == 6
        assert _offsets(await take(session, 4)) == [6, 7, 8, 9]
        await _settle()
        assert session.outbox.empty()
        assert reader.reads[0] == (0, 0)
        assert applied.index("Seek") < applied.index("Fetched")
    finally:
        await sub.aclose()


async def test_acks_during_a_read_in_flight_wait_for_the_owner(writers: list[LogWriter]) -> None:
    """Scenario: records 0..3 delivered; new records 4..5 are appended and their read is
    held; meanwhile the consumer acks 0..3 and gets more credit.
    Expected: nothing is applied while the read is out (cursor 0); once it returns, the
    acks and the grant are applied in order, then the read's records go out: 4..5."""
    await singles(writers[0], 4)
    reads = 0
    held = asyncio.Event()
    go = asyncio.Event()

    async def reader(p: int, offset: int, max_bytes: int) -> list[RecordBatch]:
        nonlocal reads
        reads += 1
        if offset >= 4:
            held.set()
            await go.wait()
        return writers[p].read(offset, max_bytes)

    sub = Subscription("t", "s", writers, [PartitionSnapshot(0)] * 2, reader=reader)
    _guard(sub)
    sub.start()
    try:
        session = sub.attach("c", 4)
        assert _offsets(await take(session, 4)) == [0, 1, 2, 3]
        await singles(writers[0], 2)
        sub.grant(session, 2)  # the read of 4..5 starts
        async with asyncio.timeout(5):
            await held.wait()
        for offset in range(4):
            sub.ack(0, offset, offset + 1)
        await _settle()
        assert sub.state.cursor(0) == 0  # queued, not applied by this task
        go.set()
        assert _offsets(await take(session, 2)) == [4, 5]
        await sub.applied()
        assert sub.state.cursor(0) == 4
    finally:
        await sub.aclose()


async def test_an_ack_racing_a_dead_letter_write_is_applied_once_in_order(
    writers: list[LogWriter],
) -> None:
    """Scenario: max_deliveries 1, poison policy dead_letter. Record 0 is nacked; its
    dead-letter write blocks; meanwhile the consumer acks 0 and 1. Then the write ends.
    Expected: the write's result comes back as a command and is applied after the acks,
    by the dispatch task: record 0 counts acknowledged once (not also dead-lettered),
    the cursor is 2, every state change ran on the owner, and the persisted-state hook
    (on_change) was only called from it too. The write's result is not consumer activity
    (inactivity expiry)."""
    await singles(writers[0], 2)
    writing = asyncio.Event()
    go = asyncio.Event()
    written: list[ToDeadLetter] = []
    changes_by: list[bool] = []

    async def sink(_sub: Subscription, action: ToDeadLetter) -> None:
        written.append(action)
        writing.set()
        await go.wait()

    def on_change(s: Subscription) -> None:
        task = s._task
        changes_by.append(task is None or asyncio.current_task() is task)

    policy = DispatchPolicy(max_deliveries=1, poison=PoisonPolicy.DEAD_LETTER, ack_timeout_s=None)
    sub = Subscription(
        "t",
        "s",
        writers,
        [PartitionSnapshot(0)] * 2,
        policy=policy,
        dead_letters=sink,
        on_change=on_change,
    )
    applied = _guard(sub)
    sub.start()
    try:
        session = sub.attach("c", 10)
        await take(session, 2)
        sub.nack(0, 0, 1, delay_s=0, reason="poison")
        async with asyncio.timeout(5):
            await writing.wait()
        await sub.ack(0, 0, 1)
        await sub.ack(0, 1, 2)
        await sub.applied()
        assert sub.state.cursor(0) == 2
        activity = sub.activity
        go.set()
        await _settle()  # the writer hands its result to the queue; the task applies it
        assert "DeadLettered" in applied
        await sub.applied()
        assert sub.activity == activity  # its own results and barriers are not activity
        assert [(w.begin, w.end) for w in written] == [(0, 1)]
        assert applied.index("Ack") < applied.index("DeadLettered")
        assert sub.state.acked_total == 2
        assert sub.state.dead_lettered_total == 0  # acknowledged before it was written
        assert sub.state.cursor(0) == 2
        assert changes_by
        assert all(changes_by)
    finally:
        await sub.aclose()


async def test_bad_commands_are_refused_at_once_and_never_queued(
    writers: list[LogWriter],
) -> None:
    """Scenario: acks of undelivered offsets, a bad range, a commit past the head and a
    seek with the wrong number of offsets. Expected: each raises in the caller, before
    anything is queued; the state is unchanged."""
    await singles(writers[0], 2)
    sub = Subscription("t", "s", writers, [PartitionSnapshot(0)] * 2)
    sub.start()
    try:
        session = sub.attach("c", 2)
        await take(session, 2)
        await sub.applied()
        before = sub.state.changes
        with pytest.raises(InvalidAckError):
            sub.ack(0, 0, 3)
        with pytest.raises(InvalidSubscriptionError):
            sub.ack(0, 2, 1)
        with pytest.raises(InvalidSubscriptionError):
            sub.nack(0, 0, 1, delay_s=-1, reason="")
        with pytest.raises(InvalidSubscriptionError):
            sub.commit(0, 99)
        with pytest.raises(InvalidSubscriptionError):
            sub.seek([0])
        assert not sub._commands
        assert sub.state.changes == before
        assert sub.state.cursor(0) == 0
    finally:
        await sub.aclose()


async def test_a_full_command_queue_makes_the_caller_wait_and_drops_nothing(
    writers: list[LogWriter], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Scenario: a queue of 4 commands; 10 acks are queued without yielding.
    Expected: the first 3 report room at once; from the 4th on the caller must wait
    (their futures are not done); once the task runs, every ack is applied (cursor 10)
    and every wait ends."""
    monkeypatch.setattr(subscription_module, "MAX_QUEUED_COMMANDS", 4)
    await singles(writers[0], 10)
    sub = Subscription("t", "s", writers, [PartitionSnapshot(0)] * 2)
    sub.start()
    try:
        session = sub.attach("c", 10)
        await take(session, 10)
        await sub.applied()
        waits = [sub.ack(0, o, o + 1) for o in range(10)]
        assert [w.done() for w in waits] == [True] * 3 + [False] * 7
        async with asyncio.timeout(5):
            await asyncio.gather(*waits)
        await sub.applied()
        assert sub.state.cursor(0) == 10
        assert sub.state.acked_total == 10
    finally:
        await sub.aclose()


async def test_commit_and_seek_answer_through_their_future(writers: list[LogWriter]) -> None:
    """Scenario: a commit to 3, a seek to 1, a commit to 2 in a row, without awaiting.
    Expected: each future holds its own result, applied in order: 3, then the seek,
    then 2 (the seek forgot the first commit's acks)."""
    await singles(writers[0], 5)
    sub = Subscription("t", "s", writers, [PartitionSnapshot(0)] * 2)
    sub.start()
    try:
        first = sub.commit(0, 3)
        seek = sub.seek([1, 0])
        second = sub.commit(0, 2)
        async with asyncio.timeout(5):
            assert await first == 3
            await seek
            assert await second == 2
    finally:
        await sub.aclose()


async def test_a_command_that_fails_with_a_bug_fails_its_caller_and_the_owner_goes_on(
    writers: list[LogWriter],
) -> None:
    """Scenario: applying the first commit raises KeyError (a bug in the state machine,
    not a refusal); a second commit is queued behind it.
    Expected: the first caller gets the KeyError (its future does not hang), the dispatch
    task stays alive, and the second commit is applied and answered."""
    await singles(writers[0], 5)
    sub = Subscription("t", "s", writers, [PartitionSnapshot(0)] * 2)
    handle = sub.state.handle
    failed: list[Command] = []

    def buggy(cmd: Command, now: float, *, wall: float | None = None) -> list[Action]:
        if isinstance(cmd, Commit) and not failed:
            failed.append(cmd)
            raise KeyError("planted")
        return handle(cmd, now, wall=wall)

    sub.state.handle = buggy  # type: ignore[method-assign]
    sub.start()
    try:
        first = sub.commit(0, 3)
        second = sub.commit(0, 2)
        async with asyncio.timeout(5):
            with pytest.raises(KeyError, match="planted"):
                await first
            assert await second == 2
        assert sub._task is not None
        assert not sub._task.done()
    finally:
        await sub.aclose()


async def test_queued_acks_are_applied_when_the_subscription_closes(
    writers: list[LogWriter],
) -> None:
    """Scenario: acks are queued and the subscription is closed before its task ran.
    Expected: the closer applies them (the snapshot saved after a close holds them)."""
    await singles(writers[0], 3)
    sub = Subscription("t", "s", writers, [PartitionSnapshot(0)] * 2)
    sub.start()
    session = sub.attach("c", 3)
    await take(session, 3)
    await sub.applied()
    sub.ack(0, 0, 3)
    await sub.aclose()
    assert sub.snapshot()[0].cursor == 3


async def _redelivered_after(
    writers: list[LogWriter], *, nack_delay_s: float | None, ack_timeout_s: float | None
) -> tuple[ManualClock, ManualClock, Subscription, ConsumerSession, Callable[[], Awaitable[bool]]]:
    mono, wall = ManualClock(100.0), ManualClock(1_700_000_000.0)
    policy = DispatchPolicy(ack_timeout_s=ack_timeout_s, backoff_jitter=0.0)
    sub = Subscription(
        "t", "s", writers, [PartitionSnapshot(0)] * 2, policy=policy, clock=mono, wall_clock=wall
    )
    sub.start()
    session = sub.attach("c", 100)
    await take(session, 1)
    if nack_delay_s is not None:
        sub.nack(0, 0, 1, delay_s=nack_delay_s, reason="later")

    async def poke() -> bool:
        """Wake the task for a pass (a grant), let it settle: whether 0 went out again."""
        sub.grant(session, 1)
        await _settle()
        return not session.outbox.empty()

    return mono, wall, sub, session, poke


@pytest.mark.parametrize(
    ("nack_delay_s", "ack_timeout_s", "due_s"),
    [(30.0, None, 30.0), (None, 30.0, 31.0)],  # a nack delay; an ack timeout + 1 s backoff
    ids=["nack delay", "ack timeout"],
)
async def test_stepping_the_wall_clock_does_not_move_a_redelivery(
    writers: list[LogWriter], nack_delay_s: float | None, ack_timeout_s: float | None, due_s: float
) -> None:
    """Scenario: record 0 is sent at monotonic 100 (wall 1.7e9) and will be sent again
    after a 30 s nack delay, or a 30 s ack timeout plus 1 s backoff. The wall clock then
    steps +1 h and -1 h (NTP), with a dispatch pass after each step.
    Expected: no step sends it again; it goes out when the monotonic clock reaches the
    deadline, not before; its failure is recorded at the wall time of the first send."""
    await singles(writers[0], 1)
    mono, wall, sub, session, poke = await _redelivered_after(
        writers, nack_delay_s=nack_delay_s, ack_timeout_s=ack_timeout_s
    )
    try:
        wall.advance(3600)
        assert not await poke()
        wall.advance(-7200)
        assert not await poke()
        if ack_timeout_s is not None:
            mono.advance(ack_timeout_s)  # the lease expires; the backoff starts now
            assert not await poke()
        mono.now = 100.0 + due_s - 0.01
        assert not await poke()
        mono.now = 100.0 + due_s
        assert await poke()
        (again,) = await take(session, 1)
        assert again.redeliveries == {0: 1}
        (failure,) = sub.snapshot()[0].failures
        assert failure.times_ms == (1_700_000_000_000,)
    finally:
        await sub.aclose()
