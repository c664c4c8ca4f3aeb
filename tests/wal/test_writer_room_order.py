"""The log writer's room is first come, first queued (:meth:`wal.LogWriter.append` under
backpressure): appends that wait for room in a full queue are queued, and so written, in
the order they called; one arriving while they wait goes behind them, even in the loop
turn when a place frees; a waiter cancelled after it was handed a place passes it on.

The writer thread is held deterministically: :class:`GatedFs` stops every ``fdatasync``
of a ``.log`` at a gate until the test lets it through, and tells the test each time one
reaches the gate, so the test knows when the thread has answered the group before it.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

import pytest

from tests.wal.test_writer import batch_bytes, stored_values, value_for
from wal import AppendResult, FaultyFs, LogConfig, LogWriter, WalClosedError

pytestmark = pytest.mark.asyncio(loop_scope="function")


class GatedFs(FaultyFs):
    """While ``gated``, each ``fdatasync`` of a ``.log`` file releases ``entered`` and
    waits for one permit (see :meth:`let_through`)."""

    def __init__(self) -> None:
        super().__init__()
        self.gated = False
        self.entered = threading.Semaphore(0)
        self._permits = threading.Semaphore(0)

    def fdatasync(self, fd: int) -> None:
        if self.gated and self.path_of(fd).endswith(".log"):
            self.entered.release()
            self._permits.acquire(timeout=10)
        super().fdatasync(fd)

    def let_through(self, syncs: int = 1) -> None:
        """Let ``syncs`` held (or future) syncs run."""
        for _ in range(syncs):
            self._permits.release()

    def open_gate(self) -> None:
        """Stop holding syncs, and let through any that waits."""
        self.gated = False
        self.let_through(100)

    def wait_entered(self) -> None:
        """Block (the loop too) until one more sync reached the gate."""
        assert self.entered.acquire(timeout=10), "no fdatasync reached the gate"


async def gated_writer(wal_dir: str, queue_size: int) -> tuple[LogWriter, GatedFs]:
    fs = GatedFs()
    writer = await LogWriter.open(wal_dir, LogConfig(), fs=fs, queue_size=queue_size)
    fs.gated = True
    return writer, fs


def start(
    writer: LogWriter,
    i: int,
    queued: list[int],
    on_done: Callable[[AppendResult | BaseException], None] | None = None,
) -> asyncio.Task[AppendResult]:
    """Append the one-record batch ``i`` as its own task; note ``i`` in ``queued`` when
    the batch gets its place in the writer's queue."""
    append = writer.append(batch_bytes([i]), on_done=on_done, on_queued=lambda: queued.append(i))
    return asyncio.create_task(append, name=f"append {i}")


async def test_waiters_are_queued_in_call_order_and_a_newcomer_waits_behind_them(
    wal_dir: str,
) -> None:
    """Scenario: queue size 2; append 0 is held in its fdatasync, append 1 fills the queue,
    appends 2-9 wait for room. The sync is let through; the loop is held until the thread
    has posted that group's completion, then append 10 starts: it runs in the same loop
    turn as the completion that frees a place, before the waiter handed that place wakes.
    Expected: appends are queued 0, 1, 2, ..., 9, then 10; the log holds them in that
    order, each once; every caller gets its own offsets."""
    writer, fs = await gated_writer(wal_dir, queue_size=2)
    queued: list[int] = []
    first = start(writer, 0, queued)
    await asyncio.to_thread(fs.wait_entered)  # append 0 alone in its group, held
    tasks = [first, *(start(writer, i, queued) for i in range(1, 10))]
    await asyncio.sleep(0)  # every task ran to its place or to the room
    assert queued == [0, 1]
    await asyncio.sleep(0)  # the turn's commands (append 1) reached the thread's queue
    fs.let_through()  # group [0] completes; the thread takes [1] and holds its sync
    fs.wait_entered()  # loop held: group [0]'s completion is posted, not yet run
    tasks.append(start(writer, 10, queued))  # runs before the woken waiter
    fs.open_gate()
    results = await asyncio.wait_for(asyncio.gather(*tasks), 10)
    assert queued == list(range(11))
    assert [r.first_offset for r in results] == list(range(11))
    await writer.aclose()
    assert stored_values(wal_dir) == [value_for(i) for i in range(11)]


async def test_a_waiter_cancelled_after_it_was_handed_a_place_passes_it_on(
    wal_dir: str,
) -> None:
    """Scenario: queue size 1; append 0 is held in its fdatasync, appends 1 and 2 wait for
    room. Append 0's completion hands its place to 1, and in that same callback (append
    0's ``on_done``) append 1's caller is cancelled, before it woke. Expected: append 1
    ends cancelled and is never written; append 2 gets the place (no stall) and lands
    right after 0; later appends go on."""
    writer, fs = await gated_writer(wal_dir, queue_size=1)
    queued: list[int] = []
    waiters: list[asyncio.Task[AppendResult]] = []

    def cancel_first_waiter(_outcome: AppendResult | BaseException) -> None:
        waiters[0].cancel()

    first = start(writer, 0, queued, on_done=cancel_first_waiter)
    await asyncio.to_thread(fs.wait_entered)
    waiters += [start(writer, 1, queued), start(writer, 2, queued)]
    await asyncio.sleep(0)
    assert queued == [0]
    fs.open_gate()
    assert (await asyncio.wait_for(first, 10)).first_offset == 0
    with pytest.raises(asyncio.CancelledError):
        await waiters[0]
    assert (await asyncio.wait_for(waiters[1], 10)).first_offset == 1
    assert (await asyncio.wait_for(writer.append(batch_bytes([3])), 10)).first_offset == 2
    assert queued == [0, 2]
    await writer.aclose()
    assert stored_values(wal_dir) == [value_for(0), value_for(2), value_for(3)]


async def test_a_waiter_cancelled_while_waiting_leaves_the_line(wal_dir: str) -> None:
    """Scenario: queue size 1; append 0 held in its sync; appends 1, 2, 3 wait; 2 is
    cancelled while it waits. Expected: 2 ends cancelled and is never written; 1 and 3
    are queued in that order after 0; a flush (a command) afterwards is not held up."""
    writer, fs = await gated_writer(wal_dir, queue_size=1)
    queued: list[int] = []
    first = start(writer, 0, queued)
    await asyncio.to_thread(fs.wait_entered)
    waiters = [start(writer, i, queued) for i in (1, 2, 3)]
    await asyncio.sleep(0)
    waiters[1].cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiters[1]
    fs.open_gate()
    results = await asyncio.wait_for(asyncio.gather(first, waiters[0], waiters[2]), 10)
    assert [r.first_offset for r in results] == [0, 1, 2]
    await asyncio.wait_for(writer.flush(), 10)
    assert queued == [0, 1, 3]
    await writer.aclose()
    assert stored_values(wal_dir) == [value_for(0), value_for(1), value_for(3)]


async def test_waiters_are_refused_when_the_writer_closes(wal_dir: str) -> None:
    """Scenario: queue size 1; append 0 held in its sync; appends 1-3 wait for room; the
    writer is closed. Expected: append 0 is acknowledged and stored; each waiter is
    refused with WalClosedError (none hangs), and nothing of theirs is written."""
    writer, fs = await gated_writer(wal_dir, queue_size=1)
    queued: list[int] = []
    first = start(writer, 0, queued)
    await asyncio.to_thread(fs.wait_entered)
    waiters = [start(writer, i, queued) for i in (1, 2, 3)]
    await asyncio.sleep(0)
    closing = asyncio.create_task(writer.aclose())
    await asyncio.sleep(0)
    fs.open_gate()
    assert (await asyncio.wait_for(first, 10)).first_offset == 0
    outcomes = await asyncio.wait_for(asyncio.gather(*waiters, return_exceptions=True), 10)
    assert all(isinstance(o, WalClosedError) for o in outcomes), outcomes
    await asyncio.wait_for(closing, 10)
    assert queued == [0]
    assert stored_values(wal_dir) == [value_for(0)]
