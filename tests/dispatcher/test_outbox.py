"""``dispatcher.session.Outbox``: the one-reader queue between a dispatch task and a
consumer's stream, on a real event loop."""

from __future__ import annotations

import asyncio

import pytest

from dispatcher.session import Outbox

pytestmark = pytest.mark.asyncio(loop_scope="function")


async def test_items_come_out_in_order_and_a_waiting_reader_wakes() -> None:
    """Scenario: two items put, then taken; then a reader waits on the empty outbox and
    an item is put. Expected: first in, first out; the waiting reader gets the item."""
    box: Outbox[int] = Outbox()
    box.put_nowait(1)
    box.put_nowait(2)
    assert (box.qsize(), box.empty()) == (2, False)
    assert [await box.get(), box.get_nowait()] == [1, 2]
    assert box.empty()
    reader = asyncio.create_task(box.get())
    await asyncio.sleep(0)
    assert not reader.done()
    box.put_nowait(3)
    assert await reader == 3
    with pytest.raises(asyncio.QueueEmpty):
        box.get_nowait()


async def test_a_cancelled_reader_leaves_the_items_to_the_next() -> None:
    """Scenario: a reader waits and is cancelled; then items are put and a new reader
    takes them. Expected: the cancel loses nothing and leaves no stale waiter."""
    box: Outbox[str] = Outbox()
    reader = asyncio.create_task(box.get())
    await asyncio.sleep(0)
    reader.cancel()
    with pytest.raises(asyncio.CancelledError):
        await reader
    box.put_nowait("a")
    box.put_nowait("b")
    assert [await box.get(), await box.get()] == ["a", "b"]


async def test_a_second_reader_is_refused_while_one_waits() -> None:
    """An outbox has one reader: a second ``get`` while the first waits raises at once,
    and the first still gets the next item."""
    box: Outbox[int] = Outbox()
    first = asyncio.create_task(box.get())
    await asyncio.sleep(0)
    with pytest.raises(RuntimeError, match="one reader"):
        await box.get()
    box.put_nowait(7)
    assert await first == 7


async def test_a_reader_woken_then_cancelled_leaves_the_item() -> None:
    """Scenario: an item is put for a waiting reader, which is cancelled before it runs.
    Expected: the item stays for the next ``get``."""
    box: Outbox[int] = Outbox()
    reader = asyncio.create_task(box.get())
    await asyncio.sleep(0)
    box.put_nowait(5)
    reader.cancel()
    with pytest.raises(asyncio.CancelledError):
        await reader
    assert await box.get() == 5
