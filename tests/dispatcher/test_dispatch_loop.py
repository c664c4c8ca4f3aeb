"""The dispatch task vouches for its own synchronous calls (``owner_lends``) instead of
the state asking ``asyncio.current_task()`` at every command: the lend must never outlive
the call, or a task running after it could change the state unchecked. Real logs on real
files; another task watches the flag and tries a direct change while records, acks and
credit flow."""

from __future__ import annotations

import asyncio
import time

import pytest

from dispatcher import PartitionSnapshot, Subscription
from dispatcher.errors import StateOwnerError
from dispatcher.protocol import Grant
from tests.dispatcher._deliveries import singles, take
from wal import LogWriter


@pytest.mark.asyncio(loop_scope="function")
async def test_the_owner_lends_the_state_only_for_the_length_of_a_call(
    writers: list[LogWriter],
) -> None:
    """Scenario: a running subscription with one consumer; 200 records are appended one
    at a time, each delivery acked on its own and credit granted back every five records
    through the queue (drains with and without a pass after them in the task, passes in
    place from the notifier), while a second task looks
    at ``state.owner_lends`` at every turn of the loop and, every third turn, calls
    ``state.handle`` directly. Expected: the flag is never set when another task runs,
    every direct call is refused with StateOwnerError, and all 200 records arrive."""
    sub = Subscription("t", "s", writers, [PartitionSnapshot(0)] * 2)
    sub.start()
    try:
        session = sub.attach("c", 10)
        await sub.applied()
        seen_lent = refused = turns = 0
        done = asyncio.Event()

        async def watch() -> None:
            nonlocal seen_lent, refused, turns
            while not done.is_set():
                turns += 1
                seen_lent += sub.state.owner_lends
                if turns % 3 == 0:
                    with pytest.raises(StateOwnerError):
                        sub.state.handle(Grant(session.consumer_id, 1), time.monotonic())
                    refused += 1
                await asyncio.sleep(0)

        watcher = asyncio.create_task(watch())

        async def consume() -> int:
            got = 0
            while got < 200:
                for d in await take(session, 1):
                    await sub.ack(d.partition, d.from_offset, d.to_offset)
                    got += d.record_count
                    await asyncio.sleep(0)  # the ack alone is drained: no pass follows
                    if got % 5 == 0:
                        await sub.grant(session, 5)
            return got

        consumer = asyncio.create_task(consume())
        await singles(writers[0], 200)
        assert await consumer == 200
        done.set()
        await watcher
        assert turns > 100
        assert seen_lent == 0
        assert refused == turns // 3
    finally:
        await sub.aclose()


#: CPython 3.11 keeps an instance's attributes inline (shared keys: the fast attribute
#: reads and method calls the specializing interpreter uses) only below 30 of them; at 30
#: or more its ``__dict__`` becomes an ordinary dict and every attribute read and method
#: call on it costs about 1.5x (measured: 29 attributes 29 ns, 30 attributes 44 ns per
#: call and read). Commit 3c3fe05 took SubscriptionState from 27 to 30 attributes, and
#: the fan-out's main thread paid about 5 % more per delivery for it.
INLINE_ATTRIBUTES_BELOW = 30


@pytest.mark.asyncio(loop_scope="function")
async def test_the_objects_on_the_delivery_path_keep_their_attributes_inline(
    writers: list[LogWriter],
) -> None:
    """Scenario: a running subscription with a consumer, after records flowed and were
    acked. Expected: its state, its dispatch loop, the subscription, the consumer's
    session and the log writer each hold fewer than 30 instance attributes, so CPython
    keeps their attribute reads and method calls on the fast path (a class that needs
    more should use ``__slots__`` or move a part into an object of its own)."""
    sub = Subscription("t", "s", writers, [PartitionSnapshot(0)] * 2)
    sub.start()
    try:
        session = sub.attach("c", 10)
        await singles(writers[0], 3)
        for d in await take(session, 3):
            await sub.ack(d.partition, d.from_offset, d.to_offset)
        await sub.applied()
        hot = {
            "SubscriptionState": sub.state,
            "DispatchLoop": sub._loop,
            "Subscription": sub,
            "ConsumerSession": session,
            "LogWriter": writers[0],
        }
        counts = {name: len(vars(obj)) for name, obj in hot.items() if hasattr(obj, "__dict__")}
        assert {n: c for n, c in counts.items() if c >= INLINE_ATTRIBUTES_BELOW} == {}
        assert "SubscriptionState" in counts  # the guard checks what it means to
    finally:
        await sub.aclose()
