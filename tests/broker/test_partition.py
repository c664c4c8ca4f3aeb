"""Partition's append path without gRPC: twins, cancelled callers, the dedup commit."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from broker.partition import Partition
from tests.wal.test_writer import HeldFs
from wal import AppendResult, LogConfig, encode_columns


@pytest_asyncio.fixture
async def held(tmp_path: Path) -> AsyncIterator[tuple[Partition, HeldFs]]:
    """Partition 0 of a topic directory, on a :class:`HeldFs`."""
    fs = HeldFs()
    partition = await Partition.open(0, str(tmp_path), LogConfig(), fs)
    try:
        yield partition, fs
    finally:
        fs.released.set()
        await partition.aclose()


def batch(pid: int, seq: int, *values: bytes) -> bytes:
    return encode_columns(list(values), producer_id=pid, base_sequence=seq)


@pytest.mark.asyncio
async def test_a_twin_admitted_before_the_append_task_starts_waits_for_it(
    held: tuple[Partition, HeldFs],
) -> None:
    """Scenario: two appends of the same batch started together, so the second is decided
    (InFlight) before the first one's append task has run a step. Expected: both answer
    offset 0, exactly one as a duplicate; the head is 1."""
    partition, _ = held
    data = batch(3, 0, b"x")
    answers = await asyncio.gather(partition.append(data), partition.append(data))
    assert sorted(answers, key=lambda a: a[1]) == [
        (AppendResult(0, 0), False),
        (AppendResult(0, 0), True),
    ]
    assert partition.writer.head == 1


@pytest.mark.asyncio
async def test_a_cancelled_caller_waits_for_its_append_which_is_committed(
    held: tuple[Partition, HeldFs],
) -> None:
    """Scenario: an append held in the writer's fdatasync; its caller is cancelled; a twin
    arrives; the writer is released; then the batch is appended again. Expected: the
    cancelled caller waits for the append (not done while it is held), then raises
    CancelledError; the twin and the later retry answer offsets 0-1 as duplicates; the
    head is 2: the dedup entry was committed although the caller was gone."""
    partition, fs = held
    data = batch(4, 0, b"a", b"b")
    fs.hold = True
    caller = asyncio.create_task(partition.append(data))
    assert await asyncio.to_thread(fs.entered.wait, 5)
    caller.cancel()
    twin = asyncio.create_task(partition.append(data))
    await asyncio.sleep(0.05)
    assert not caller.done()
    assert not twin.done()
    fs.released.set()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert await twin == (AppendResult(0, 1), True)
    assert await partition.append(data) == (AppendResult(0, 1), True)
    assert partition.writer.head == 2
