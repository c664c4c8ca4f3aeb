"""Dead-letter replay: the pure planning steps (pacing, the replayable prefix, batching),
and the one-replay-per-queue rule under cancellation, with a real queue on disk and an
append the test holds open."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from broker.errors import DeadLetterReplayError
from broker.replay import (
    DeadLetterReplayer,
    ReplayOrder,
    batch_size_for,
    encode_chunks,
    replayable_prefix,
)
from dispatcher.dead_letter_config import DlqConfig
from dispatcher.dead_letter_queue import DeadLetterQueue
from dispatcher.dead_letter_records import HEADER_REPLAY_COUNT, DlqEntry
from tests.dispatcher.test_dead_letter_records import letter
from wal import decode_batch


def entry(sequence: int, *, replays: int = 0, truncated: bool = False, size: int = 4) -> DlqEntry:
    """An entry of ``size`` value bytes, replayed ``replays`` times."""
    headers = ((HEADER_REPLAY_COUNT, str(replays).encode()),) if replays else ()
    return DlqEntry(
        sequence=sequence,
        topic="t",
        partition=0,
        offset=sequence,
        subscription="s",
        key=None,
        value=b"v" * size,
        headers=headers,
        timestamp_ms=0,
        attempts=1,
        reason="r",
        attempt_times_ms=(0,),
        dead_lettered_ms=0,
        truncated=truncated,
        original_size=size + (1 if truncated else 0),
        replay_count=replays,
    )


@pytest.mark.parametrize(
    ("rate", "size"),
    [(1, 1), (10, 1), (11, 2), (100, 10), (1_000, 100), (10_000, 1_000), (100_000, 1_000)],
)
def test_batch_size_is_a_tenth_of_a_second_capped(rate: int, size: int) -> None:
    """Scenario: rates from 1 to 100 000 per second. Expected: a tenth of a second's worth
    of records per batch, rounded up, at least 1 and at most 1000."""
    assert batch_size_for(rate) == size


def test_prefix_stops_at_the_first_entry_to_skip() -> None:
    """Scenario: entries 0, 1 fine, 2 at max_replays, 3 fine. Expected: take 0 and 1; 2 is
    the skip with the loop-guard reason; done."""
    take, skipped, done = replayable_prefix(
        [entry(0), entry(1, replays=2), entry(2, replays=3), entry(3)], 3, None
    )
    assert [e.sequence for e in take] == [0, 1]
    assert skipped is not None
    assert skipped.sequence == 2
    assert "max_replays=3" in skipped.reason
    assert done


def test_prefix_refuses_a_truncated_entry_first() -> None:
    """Scenario: the first entry is truncated. Expected: nothing taken; it is the skip."""
    take, skipped, done = replayable_prefix([entry(5, truncated=True), entry(6)], 3, None)
    assert take == []
    assert skipped is not None
    assert (skipped.sequence, "truncated" in skipped.reason, done) == (5, True, True)


@pytest.mark.parametrize(
    ("up_to", "taken", "done"),
    [(None, [0, 1, 2], False), (2, [0, 1, 2], False), (1, [0, 1], True), (-1, [], True)],
)
def test_prefix_honours_up_to_sequence(up_to: int | None, taken: list[int], done: bool) -> None:
    """Scenario: three fine entries and an inclusive bound. Expected: entries at or below
    the bound; done once an entry lies past it; no skip either way."""
    take, skipped, finished = replayable_prefix([entry(i) for i in range(3)], 3, up_to)
    assert ([e.sequence for e in take], skipped, finished) == (taken, None, done)


def test_chunks_respect_the_batch_byte_limit_and_keep_order() -> None:
    """Scenario: five 3000-byte values under an 8 KiB batch limit. Expected: several
    batches, each within the limit, holding the values in order with x-replay-count
    incremented and the given timestamp."""
    entries = [entry(i, size=3000, replays=i % 2) for i in range(5)]
    chunks = encode_chunks(entries, 8192 + 4096, now_ms=42)
    assert len(chunks) > 1
    assert all(len(c) <= 8192 + 4096 for c in chunks)
    batches = [decode_batch(c) for c in chunks]
    records = [r for b in batches if b is not None for r in b.records()]
    assert [r.value for r in records] == [e.value for e in entries]
    assert [r.headers[HEADER_REPLAY_COUNT] for r in records] == [b"1", b"2", b"1", b"2", b"1"]
    assert {r.timestamp_ms for r in records} == {42}


class _Partitions:
    """The topics the replayer sees: ``orders`` with three partitions."""

    def get(self, _topic: str) -> Any:
        part = SimpleNamespace(log=SimpleNamespace(config=SimpleNamespace(max_batch_bytes=1 << 20)))
        return SimpleNamespace(partitions=[part] * 3, partition=lambda _i: part)


@pytest.mark.asyncio(loop_scope="function")
async def test_a_cancelled_replay_holds_the_queue_until_its_batch_is_acked(
    tmp_path: Path,
) -> None:
    """Scenario: a replay of three entries is cancelled while its batch is being
    published (the append waits for the test); a second replay is asked for at once.
    Expected: the second is refused (the first batch still runs); once the publish ends,
    the first call ends cancelled with its batch acked, each entry was published once,
    and a replay after it finds nothing left."""
    published: list[bytes] = []
    entered, release = asyncio.Event(), asyncio.Event()

    async def append(_topic: str, _partition: object, data: bytes) -> None:
        published.append(data)
        entered.set()
        await release.wait()

    replayer = DeadLetterReplayer(_Partitions(), append)  # type: ignore[arg-type]
    async with await DeadLetterQueue.open(str(tmp_path / "dlq"), DlqConfig()) as dlq:
        await dlq.put([letter(i) for i in range(3)])
        first = asyncio.create_task(replayer.replay(dlq, "orders", "billing", ReplayOrder()))
        await entered.wait()
        first.cancel()
        await asyncio.sleep(0)
        with pytest.raises(DeadLetterReplayError, match="another replay"):
            async with asyncio.timeout(5):  # a replay let in would wait on the append
                await replayer.replay(dlq, "orders", "billing", ReplayOrder())
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await first
        assert dlq.count() == 0
        assert _records(published) == 3
        again = await replayer.replay(dlq, "orders", "billing", ReplayOrder())
        assert (again.replayed, _records(published)) == (0, 3)


def _records(batches: list[bytes]) -> int:
    total = 0
    for data in batches:
        batch = decode_batch(data)
        assert batch is not None
        assert not isinstance(batch, Exception)
        total += len(batch.offsets())
    return total
