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
