"""Deleting a subscription in :class:`dispatcher.SubscriptionRegistry`: crash-atomic, run to
its end, and never half-undone.

Each delete is stopped at every named crash point of :mod:`dispatcher.removal` (the hook
raises :class:`wal.SimulatedCrash` there, the registry is dropped and a new one opens the same
directory), its caller is cancelled at those points, and its commit is made to fail. After
each: the subscription is whole (saved state, dead letters, registered, acking) or absent
(nothing of it on disk or in memory, and the name subscribes anew at its initial position).
Real logs and files; no gRPC (``tests/broker/test_subscription_delete.py`` has that).
"""

from __future__ import annotations

import asyncio
import errno
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
import pytest_asyncio

from dispatcher import (
    InitialPosition,
    SubscriptionDeletedError,
    SubscriptionInUseError,
    SubscriptionNotFoundError,
    SubscriptionRegistry,
    SubscriptionType,
    cursor_journal,
)
from dispatcher.cursor_recovery import read_states
from dispatcher.dead_letter_records import DeadLetter
from dispatcher.removal import CRASH_POINTS
from dispatcher.state_file import StateDoc
from wal import Fault, FaultyFs, FileSystem, LogWriter, SimulatedCrash, encode_columns

pytestmark = pytest.mark.asyncio(loop_scope="function")

TOPIC, SUB = "orders", "billing"
JOURNAL = cursor_journal.NAME


@pytest_asyncio.fixture
async def writer(tmp_path: Path) -> AsyncIterator[LogWriter]:
    """One partition holding records 0-4."""
    opened = await LogWriter.open(str(tmp_path / "logs" / "0"))
    await opened.append(encode_columns([b"r%d" % i for i in range(5)]))
    yield opened
    await opened.aclose()


def registry(
    tmp_path: Path, hook: Callable[[str], None] = lambda _p: None, fs: FileSystem | None = None
) -> SubscriptionRegistry:
    return SubscriptionRegistry(str(tmp_path / "data"), fs=fs, crash_point=hook)


def crash_at(point: str) -> Callable[[str], None]:
    def hook(name: str) -> None:
        if name == point:
            raise SimulatedCrash(name)

    return hook


def letter(offset: int) -> DeadLetter:
    return DeadLetter(TOPIC, 0, offset, SUB, None, b"v", (), 1, 3, "poison", (1, 2, 3))


async def populated(
    reg: SubscriptionRegistry,
    writer: LogWriter,
    type_: SubscriptionType = SubscriptionType.EXCLUSIVE,
) -> None:
    """Open ``reg``; give it ``SUB`` with offsets 0-1 acked (saved) and two dead letters."""
    await reg.open({TOPIC: [writer]})
    sub = await reg.subscribe(TOPIC, SUB, [writer], type_=type_)
    sub.commit(0, 2)
    await reg.save(sub)
    dlq = await reg.dead_letter_queue(TOPIC, SUB)
    assert dlq is not None
    await dlq.put([letter(2), letter(3)])


def files(tmp_path: Path) -> list[str]:
    """Every file and directory under the subscription and dead-letter roots."""
    data = tmp_path / "data"
    return sorted(
        str(p.relative_to(data))
        for root in ("subscriptions", "dlq")
        for p in data.glob(f"{root}/**/*")
    )


async def assert_whole(reg: SubscriptionRegistry, tmp_path: Path) -> None:
    """``SUB`` is registered at cursor 2 with its two dead letters, and on disk."""
    sub = reg.get(TOPIC, SUB)
    assert sub.state.cursor(0) == 2
    dlq = await reg.dead_letter_queue(TOPIC, SUB, create=False)
    assert dlq is not None
    assert dlq.count() == 2
    assert saved(tmp_path)[SUB].partitions[0].cursor == 2


def saved(tmp_path: Path) -> dict[str, StateDoc]:
    """The saved state of every subscription of ``TOPIC``, as a reopen would load it."""
    return read_states(str(tmp_path / "data" / "subscriptions"), TOPIC)


async def assert_absent(reg: SubscriptionRegistry, tmp_path: Path, writer: LogWriter) -> None:
    """``SUB`` is gone from memory and disk, and subscribes anew at the earliest offset
    with an empty queue; only its new state is saved then."""
    with pytest.raises(SubscriptionNotFoundError):
        reg.get(TOPIC, SUB)
    assert [f for f in files(tmp_path) if SUB in f] == []
    assert SUB not in saved(tmp_path)
    assert reg.saved_floor(TOPIC) is None
    fresh = await reg.subscribe(TOPIC, SUB, [writer], initial=InitialPosition.EARLIEST)
    assert fresh.state.cursor(0) == 0
    assert await reg.dead_letter_queue(TOPIC, SUB, create=False) is None
    assert [f for f in files(tmp_path) if SUB in f] == []
    assert saved(tmp_path)[SUB].partitions[0].cursor == 0


async def test_delete_removes_state_and_queue_and_frees_the_floor(
    tmp_path: Path, writer: LogWriter
) -> None:
    """Scenario: a subscription with a saved cursor and dead letters is deleted, then the
    registry reopens. Expected: it pinned the retention floor at 2 before; after the delete
    nothing of it is left (floor None, no files), and the same after a reopen."""
    reg = registry(tmp_path)
    await populated(reg, writer)
    assert reg.saved_floor(TOPIC) == [2]
    assert await reg.delete(TOPIC, SUB) == ()
    await assert_absent(reg, tmp_path, writer)
    await reg.delete(TOPIC, SUB)
    await reg.aclose()
    reg = registry(tmp_path)
    await reg.open({TOPIC: [writer]})
    await assert_absent(reg, tmp_path, writer)
    await reg.aclose()


async def test_attached_consumers_refuse_the_delete_unless_forced(
    tmp_path: Path, writer: LogWriter
) -> None:
    """Scenario: consumers 'a' and 'b' are attached (shared); a delete, then a forced one.
    Expected: the first raises SubscriptionInUseError naming both and changes nothing; the
    forced one returns both names and ends their sessions with SubscriptionDeletedError."""
    reg = registry(tmp_path)
    await populated(reg, writer, SubscriptionType.SHARED)
    sub = reg.get(TOPIC, SUB)
    sessions = [sub.attach(name, 10) for name in ("a", "b")]
    with pytest.raises(SubscriptionInUseError, match=r"'a', 'b'.*use --force to detach them"):
        await reg.delete(TOPIC, SUB)
    await assert_whole(reg, tmp_path)
    assert await reg.delete(TOPIC, SUB, force=True) == ("a", "b")
    for session in sessions:
        while (await session.next()) is not None:
            pass
        assert isinstance(session.ended_by, SubscriptionDeletedError)
        assert "subscription deleted" in str(session.ended_by)
    await assert_absent(reg, tmp_path, writer)
    await reg.aclose()


@pytest.mark.parametrize("point", CRASH_POINTS)
async def test_a_delete_crashing_at_a_point_leaves_nothing_after_a_restart(
    tmp_path: Path, writer: LogWriter, point: str
) -> None:
    """Scenario: the delete crashes at ``point`` (each is past the commit point); the
    registry closes and a new one opens. Expected: the subscription and every file of it
    are gone (the queue left behind is pruned at open), and the name starts afresh."""
    reg = registry(tmp_path, crash_at(point))
    await populated(reg, writer)
    with pytest.raises(SimulatedCrash):
        await reg.delete(TOPIC, SUB)
    await reg.aclose()
    assert any(SUB in f for f in files(tmp_path))  # the crash left the queue behind
    reg = registry(tmp_path)
    await reg.open({TOPIC: [writer]})
    await assert_absent(reg, tmp_path, writer)
    await reg.aclose()


def cancel_at(point: str, victim: list[asyncio.Task[object]]) -> Callable[[str], None]:
    """A hook that cancels the caller when the delete reaches ``point`` (on a worker
    thread, so the cancel goes through the loop)."""
    loop = asyncio.get_running_loop()

    def hook(name: str) -> None:
        if name == point:
            loop.call_soon_threadsafe(victim[0].cancel)

    return hook


@pytest.mark.parametrize("point", CRASH_POINTS)
async def test_a_delete_whose_caller_is_cancelled_runs_to_its_end(
    tmp_path: Path, writer: LogWriter, point: str
) -> None:
    """Scenario: the caller of a delete is cancelled while the delete is at ``point`` (a
    DeleteSubscription past its deadline). Expected: the caller sees CancelledError; the
    subscription is nonetheless gone from memory and disk, and after a reopen too."""
    victim: list[asyncio.Task[object]] = []
    reg = registry(tmp_path, cancel_at(point, victim))
    await populated(reg, writer)
    victim.append(asyncio.create_task(reg.delete(TOPIC, SUB)))
    with pytest.raises(asyncio.CancelledError):
        await victim[0]
    with pytest.raises(SubscriptionNotFoundError):
        reg.get(TOPIC, SUB)
    assert [f for f in files(tmp_path) if SUB in f] == []
    await reg.aclose()
    reg = registry(tmp_path)
    await reg.open({TOPIC: [writer]})
    await assert_absent(reg, tmp_path, writer)
    await reg.aclose()


@pytest.mark.parametrize("partial", [0, 7], ids=["nothing-written", "part-written"])
async def test_a_commit_that_fails_leaves_the_subscription_working(
    tmp_path: Path, writer: LogWriter, partial: int
) -> None:
    """Scenario: writing the tombstone to the cursor journal fails (EIO), with nothing
    or a part of it written, and a consumer attached and force on. Expected: the delete
    raises OSError; the subscription is whole and still serves its consumer (an ack is
    taken and saved, after the part is cut); it is whole after a reopen; then the delete
    succeeds."""
    fs = FaultyFs()
    reg = registry(tmp_path, fs=fs)
    await populated(reg, writer)
    session = reg.get(TOPIC, SUB).attach("a", 10)
    fs.faults.append(Fault("pwritev", path_contains=JOURNAL, partial=partial))
    with pytest.raises(OSError, match="Input/output error"):
        await reg.delete(TOPIC, SUB, force=True)
    await assert_whole(reg, tmp_path)
    delivery = await asyncio.wait_for(session.next(), 5)
    assert delivery is not None
    assert session.ended_by is None
    reg.get(TOPIC, SUB).ack(0, 2, 3)
    await reg.save(reg.get(TOPIC, SUB))
    await reg.aclose()
    reg = registry(tmp_path, fs=fs)
    await reg.open({TOPIC: [writer]})
    assert reg.get(TOPIC, SUB).state.cursor(0) == 3
    await reg.delete(TOPIC, SUB)
    await assert_absent(reg, tmp_path, writer)
    await reg.aclose()


async def test_a_subscribe_during_a_delete_waits_and_gets_a_new_subscription(
    tmp_path: Path, writer: LogWriter
) -> None:
    """Scenario: a subscribe of the same name arrives while the delete is at its commit
    point. Expected: it waits for the delete, then gets a new subscription at the earliest
    offset whose saved state survives (the delete's tombstone is older than it)."""
    gate = asyncio.Event()
    loop = asyncio.get_running_loop()
    started = asyncio.Event()

    def hook(name: str) -> None:
        if name == "delete.after_commit":
            loop.call_soon_threadsafe(started.set)
            asyncio.run_coroutine_threadsafe(gate.wait(), loop).result(5)

    reg = registry(tmp_path, hook)
    await populated(reg, writer)
    deleting = asyncio.create_task(reg.delete(TOPIC, SUB))
    await started.wait()
    subscribing = asyncio.create_task(reg.subscribe(TOPIC, SUB, [writer]))
    await asyncio.sleep(0.05)
    assert not subscribing.done()
    gate.set()
    await deleting
    fresh = await subscribing
    assert fresh.state.cursor(0) == 0
    assert saved(tmp_path)[SUB].partitions[0].cursor == 0
    assert await reg.dead_letter_queue(TOPIC, SUB, create=False) is None
    await reg.aclose()
    assert (tmp_path / "data" / "subscriptions" / TOPIC / f"{SUB}.json").exists()


async def test_a_commit_whose_sync_fails_counts_as_done_and_leaves_no_queue_to_inherit(
    tmp_path: Path, writer: LogWriter
) -> None:
    """Scenario: the tombstone is written whole to the cursor journal but its fdatasync
    fails (EIO). Expected: the delete raises OSError; the subscription is gone (the
    tombstone stays in the journal, and the next sync makes it durable, so it cannot carry
    on); a new subscription of the name starts at the earliest offset with an empty
    queue, never the old one's dead letters, and so it does after a reopen."""
    fs = FaultyFs()
    reg = registry(tmp_path, fs=fs)
    await populated(reg, writer)
    fs.faults.append(Fault("fdatasync", path_contains=JOURNAL))
    with pytest.raises(OSError, match="Input/output error") as caught:
        await reg.delete(TOPIC, SUB)
    assert caught.value.errno == errno.EIO
    fs.faults.clear()
    with pytest.raises(SubscriptionNotFoundError):
        reg.get(TOPIC, SUB)
    fresh = await reg.subscribe(TOPIC, SUB, [writer])
    assert fresh.state.cursor(0) == 0
    assert await reg.dead_letter_queue(TOPIC, SUB, create=False) is None
    assert [f for f in files(tmp_path) if SUB in f] == []
    assert saved(tmp_path)[SUB].partitions[0].cursor == 0
    await reg.aclose()
    reg = registry(tmp_path)
    await reg.open({TOPIC: [writer]})
    assert reg.get(TOPIC, SUB).state.cursor(0) == 0
    assert await reg.dead_letter_queue(TOPIC, SUB, create=False) is None
    await reg.aclose()
