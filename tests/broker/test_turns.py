"""The turnstile of a PublishStream's requests (:class:`broker.turns.Turnstile`): first
come, first served; a turn handed over cannot be taken by a newcomer; requests that end
give up the turn or leave the line, so nobody waits forever. Driven on one event loop
with no disk and no sleeps: each step runs the loop until the tasks settle."""

from __future__ import annotations

import asyncio

import pytest

from broker.turns import Turnstile

pytestmark = pytest.mark.asyncio(loop_scope="function")


async def settle() -> None:
    """Let every ready task run until it waits again."""
    for _ in range(5):
        await asyncio.sleep(0)


def request(turns: Turnstile, name: str, log: list[str]) -> asyncio.Task[None]:
    """A request that takes the turn (waiting if it must), notes ``name`` when it holds
    it, then waits until the test says its batch is queued."""

    async def run() -> None:
        key = asyncio.current_task()
        if not turns.take(key):
            await turns.wait(key)
        try:
            log.append(name)
            await asyncio.Event().wait()  # held until cancelled or passed on below
        finally:
            turns.release(key)

    return asyncio.create_task(run(), name=name)


async def test_the_free_turn_is_taken_at_once_and_a_key_without_it_releases_nothing() -> None:
    """Scenario: an idle turnstile. Expected: take succeeds at once for one key and fails
    for another while held; releasing with a key that does not hold it changes nothing;
    the holder's release frees it."""
    turns, a, b = Turnstile(), object(), object()
    assert turns.take(a)
    assert not turns.take(b)
    turns.release(b)
    assert not turns.take(b)
    turns.release(a)
    assert turns.take(b)


async def test_waiters_hold_the_turn_in_line_order_and_a_newcomer_waits_behind_them() -> None:
    """Scenario: holder h; waiters w1, w2 in line; h is queued (on_queued) and, in the
    same step, newcomer n tries to take the turn. Expected: n cannot (w1 was handed it);
    w1, w2, n then hold it in that order as each is queued."""
    turns, log = Turnstile(), list[str]()
    h = object()
    assert turns.take(h)
    w1, w2 = request(turns, "w1", log), request(turns, "w2", log)
    await settle()
    assert log == []
    turns.on_queued()  # h's batch is queued: w1's turn
    assert not turns.take(object())
    n = request(turns, "n", log)
    await settle()
    assert log == ["w1"]
    turns.on_queued()
    await settle()
    turns.on_queued()
    await settle()
    assert log == ["w1", "w2", "n"]
    for task in (w1, w2, n):
        task.cancel()
    await asyncio.gather(w1, w2, n, return_exceptions=True)


async def test_a_request_ending_before_it_was_queued_hands_the_turn_on() -> None:
    """Scenario: w1 holds the turn (not yet queued), w2 waits; w1 is cancelled (refused,
    failed and cancelled requests end the same way). Expected: w2 holds the turn."""
    turns, log = Turnstile(), list[str]()
    w1, w2 = request(turns, "w1", log), request(turns, "w2", log)
    await settle()
    w1.cancel()
    await settle()
    assert log == ["w1", "w2"]
    w2.cancel()
    await asyncio.gather(w1, w2, return_exceptions=True)
    assert turns.take(object())


async def test_a_waiter_cancelled_in_line_leaves_it_and_the_next_still_waits() -> None:
    """Scenario: h holds the turn; w1, w2 wait; w1 is cancelled. Expected: w2 does not
    jump ahead of h: it gets the turn only when h is queued."""
    turns, log = Turnstile(), list[str]()
    h = object()
    assert turns.take(h)
    w1, w2 = request(turns, "w1", log), request(turns, "w2", log)
    await settle()
    w1.cancel()
    await settle()
    assert log == []
    turns.release(h)
    await settle()
    assert log == ["w2"]
    w2.cancel()
    await asyncio.gather(w1, w2, return_exceptions=True)


async def test_a_waiter_cancelled_after_it_was_handed_the_turn_hands_it_on() -> None:
    """Scenario: h holds the turn; w1, w2 wait; h is queued, handing the turn to w1, and
    w1 is cancelled before it wakes. Expected: w1 never ran in its turn; w2 holds it (no
    stall)."""
    turns, log = Turnstile(), list[str]()
    h = object()
    assert turns.take(h)
    w1, w2 = request(turns, "w1", log), request(turns, "w2", log)
    await settle()
    turns.on_queued()
    w1.cancel()
    await settle()
    assert log == ["w2"]
    w2.cancel()
    await asyncio.gather(w1, w2, return_exceptions=True)
    assert turns.take(object())
