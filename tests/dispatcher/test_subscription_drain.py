"""Drain and release in the subscription shell (dispatcher.subscription), over real logs.

A draining consumer's outbox ends with ``DRAINED``, and nothing ever follows it: a send
the state machine decided before the drain but the shell carries out after it (a pass
awaiting the save that precedes a redelivery) is released instead, uncounted.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from dispatcher import DispatchPolicy, PartitionSnapshot, Subscription, SubscriptionType
from dispatcher.session import DRAINED
from tests._helpers import eventually
from wal import LogWriter, encode_columns

pytestmark = pytest.mark.asyncio(loop_scope="function")


@pytest_asyncio.fixture
async def writer(tmp_path: Path) -> AsyncIterator[LogWriter]:
    opened = await LogWriter.open(str(tmp_path / "log"))
    yield opened
    await opened.aclose()


async def test_a_send_decided_before_a_drain_is_released_not_sent(writer: LogWriter) -> None:
    """Scenario: record 0 is sent, nacked with no delay; the pass that redelivers it
    awaits its save (held), and meanwhile the consumer drains. Then the save finishes.
    Expected: the outbox holds DRAINED and nothing after it; the redelivery was released:
    record 0 waits with its count from the nack (1), and a later consumer gets it with
    redelivery count 1, not 2."""
    await writer.append(encode_columns([b"a"]))
    hold = asyncio.Event()
    saving = asyncio.Event()

    async def save(_sub: Subscription) -> None:
        saving.set()
        await hold.wait()

    sub = Subscription("t", "s", [writer], [PartitionSnapshot(0)], persist=save)
    sub.start()
    try:
        session = sub.attach("a", 10)
        first = await asyncio.wait_for(session.next(), 5)
        assert first is not None
        assert first.from_offset == 0
        sub.nack(0, 0, 1, delay_s=0, reason="again")
        await asyncio.wait_for(saving.wait(), 5)  # the redelivery's pass awaits its save
        sub.drain(session)
        hold.set()
        await eventually(lambda: sub.state.released_total == 1)
        assert await asyncio.wait_for(session.next(), 5) is DRAINED
        assert session.outbox.empty()
        sub.detach(session)
        other = sub.attach("b", 10)
        again = await asyncio.wait_for(other.next(), 5)
        assert again is not None
        assert again.redeliveries == {0: 1}
    finally:
        await sub.aclose()


async def test_drain_of_a_detached_or_drained_session_does_nothing(writer: LogWriter) -> None:
    """Scenario: a session drains twice, and a session that left drains.
    Expected: one DRAINED marker for the first; nothing for the others."""
    policy = DispatchPolicy(type=SubscriptionType.SHARED)
    sub = Subscription("t", "s", [writer], [PartitionSnapshot(0)], policy=policy)
    sub.start()
    try:
        session = sub.attach("a", 10)
        sub.drain(session)
        sub.drain(session)
        assert session.outbox.qsize() == 1
        gone = sub.attach("b", 10)
        sub.detach(gone)
        sub.drain(gone)
        assert gone.outbox.empty()
    finally:
        await sub.aclose()
