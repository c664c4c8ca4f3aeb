"""The dead-letter writer a dispatch loop hands its ``ToDeadLetter`` actions to: writes in
order on a task of its own, and every outcome goes back as a command, never into the state."""

from __future__ import annotations

import asyncio

import pytest

from dispatcher.dead_letter_writer import DeadLetterWriter
from dispatcher.protocol import Command, DeadLettered, DeadLetterFailed, ToDeadLetter
from wal import decode_batch, encode_columns


def _dead_letter(begin: int) -> ToDeadLetter:
    """A dead letter of offset ``begin`` of partition 0, one record of a real batch."""
    batch = decode_batch(encode_columns([b"poison"]))
    assert batch is not None
    return ToDeadLetter(0, batch, begin, begin + 1, ())


class _Outcomes:
    """The commands the writer sends back; ``wait(n)`` returns once ``n`` arrived."""

    def __init__(self) -> None:
        self.commands: list[Command] = []
        self._news = asyncio.Event()

    def submit(self, command: Command) -> None:
        self.commands.append(command)
        self._news.set()

    async def wait(self, count: int) -> list[Command]:
        async with asyncio.timeout(5):
            while len(self.commands) < count:
                self._news.clear()
                await self._news.wait()
        return self.commands


@pytest.mark.asyncio(loop_scope="function")
async def test_writes_in_order_and_sends_each_outcome_back_as_a_command() -> None:
    """Scenario: three dead letters added at once; the second write fails. Expected: the
    writes happen in the order added, the outcomes come back as DeadLettered,
    DeadLetterFailed (with the error's text), DeadLettered, in that order, and the
    writer's error is the failure until the next write works (then None)."""
    letters = [_dead_letter(p) for p in (0, 1, 2)]
    written: list[int] = []
    errors_seen: list[Exception | None] = []
    sink = _Outcomes()

    async def write(_sub: str, action: ToDeadLetter) -> None:
        errors_seen.append(writer.error)
        written.append(action.begin)
        if action.begin == 1:
            raise OSError("disk gone")

    writer = DeadLetterWriter("sub", write, sink.submit, "dead letters t/s")
    for letter in letters:
        writer.add(letter)
    outcomes = await sink.wait(3)
    assert written == [0, 1, 2]
    assert [type(o) for o in outcomes] == [DeadLettered, DeadLetterFailed, DeadLettered]
    failed = outcomes[1]
    assert isinstance(failed, DeadLetterFailed)
    assert "disk gone" in failed.error
    assert errors_seen[2] is not None  # the failure stood until the next write
    assert writer.error is None
    await writer.stop()


@pytest.mark.asyncio(loop_scope="function")
async def test_without_a_queue_every_write_fails_and_stop_ends_the_task() -> None:
    """Scenario: a subscription with no dead-letter queue (``write`` is None) gets a dead
    letter; then the writer is stopped. Expected: one DeadLetterFailed saying there is
    no queue, the error kept, and ``stop`` returns."""
    sink = _Outcomes()
    writer: DeadLetterWriter[str] = DeadLetterWriter("sub", None, sink.submit, "dl t/s")
    writer.add(_dead_letter(5))
    outcomes = await sink.wait(1)
    assert isinstance(outcomes[0], DeadLetterFailed)
    assert "no dead-letter queue" in outcomes[0].error
    assert writer.error is not None
    await writer.stop()
