"""``client._signal.Signal`` behaves as ``asyncio.Event`` does, on a real event loop."""

from __future__ import annotations

import asyncio

import pytest

from client._signal import Signal

pytestmark = pytest.mark.asyncio(loop_scope="function")


async def test_set_wakes_every_waiter_and_later_waits_pass_until_cleared() -> None:
    """Scenario: three tasks wait, then the signal is set. Expected: all three wake; a
    wait while set returns at once; after ``clear`` a wait blocks again."""
    signal = Signal()
    waiters = [asyncio.create_task(signal.wait()) for _ in range(3)]
    await asyncio.sleep(0)
    assert not any(w.done() for w in waiters)
    signal.set()
    assert await asyncio.gather(*waiters) == [True, True, True]
    assert signal.is_set()
    assert await signal.wait()
    signal.clear()
    blocked = asyncio.create_task(signal.wait())
    await asyncio.sleep(0)
    assert not blocked.done()
    signal.set()
    assert await blocked


async def test_a_cancelled_waiter_leaves_the_others_waiting() -> None:
    """Scenario: two tasks wait; one is cancelled, then the signal is set. Expected: the
    cancellation touches only that task; the other wakes; nothing is left registered."""
    signal = Signal()
    gone = asyncio.create_task(signal.wait())
    stays = asyncio.create_task(signal.wait())
    await asyncio.sleep(0)
    gone.cancel()
    with pytest.raises(asyncio.CancelledError):
        await gone
    assert not stays.done()
    signal.set()
    assert await stays
    assert signal._waiters == []
