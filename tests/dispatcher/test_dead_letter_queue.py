"""The dead-letter queue of one subscription (dispatcher/dead_letter_queue.py), over real
files.

Real logs in ``tmp_path``, a manual wall clock, 512-byte segments where deletion matters,
and :class:`wal.FaultyFs` for failing disks. Claims checked (DESIGN section 3,
"Dead-letter queue"): each overflow policy does what it says and counts it; removals
persist before segments go, so a reopen neither resurrects nor loses entries.
"""

from __future__ import annotations

import asyncio
import errno
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
import pytest_asyncio

from dispatcher.dead_letter_config import DlqConfig, OverflowPolicy, PutOutcome
from dispatcher.dead_letter_queue import DeadLetterQueue
from dispatcher.dead_letter_records import HEADER_REPLAY_COUNT
from dispatcher.errors import DispatchError, DlqFullError
from tests._helpers import ManualClock
from tests.dispatcher.test_dead_letter_records import letter
from tests.dispatcher.test_subscription import _SlowWrites
from wal import Fault, FaultyFs, FileSystem, LogConfig, WalClosedError, WalError, WalIOError

T0 = 1_700_000_000.0  # the manual clock's start, seconds since the epoch
SMALL_LOG = LogConfig(segment_bytes=512, index_interval_bytes=100)


# -- the queue over real files ----------------------------------------------------------

asyncio_test = pytest.mark.asyncio(loop_scope="function")


@pytest.fixture
def dlq_dir(tmp_path: Path) -> str:
    """The directory of one subscription's dead-letter queue."""
    return str(tmp_path / "dlq" / "orders" / "billing")


@pytest.fixture
def clock() -> ManualClock:
    """A manual wall clock at T0."""
    return ManualClock(T0)


@pytest_asyncio.fixture
async def dlq(dlq_dir: str, clock: ManualClock) -> AsyncIterator[DeadLetterQueue]:
    """A queue with default settings, small segments and the manual clock."""
    queue = await DeadLetterQueue.open(dlq_dir, DlqConfig(), clock=clock, log_config=SMALL_LOG)
    yield queue
    await queue.aclose()


async def put_each(queue: DeadLetterQueue, ids: range) -> None:
    """Store one letter per id, one put each (so sequence == position in ``ids``)."""
    for i in ids:
        assert await queue.put([letter(i)]) is PutOutcome.STORED


def segment_bases(dlq_dir: str) -> list[int]:
    """Base offsets of the queue log's segments on disk."""
    names = os.listdir(os.path.join(dlq_dir, "log"))
    return sorted(int(n[:-4]) for n in names if n.endswith(".log"))


@asyncio_test
async def test_put_is_peeked_in_order(dlq: DeadLetterQueue, clock: ManualClock) -> None:
    """Scenario: three puts, the clock moving 1 s between them. Expected: count 3,
    sequences 0..2, each entry's original offset and dead-letter time (ms), events_total 3."""
    for i in range(3):
        assert await dlq.put([letter(i)]) is PutOutcome.STORED
        clock.advance(1)
    entries = await dlq.peek()
    assert dlq.count() == dlq.entries == 3
    assert (dlq.first_sequence, dlq.next_sequence) == (0, 3)
    assert [e.sequence for e in entries] == [0, 1, 2]
    assert [e.offset for e in entries] == [1000, 1001, 1002]
    assert [e.dead_lettered_ms for e in entries] == [int(T0 * 1000) + 1000 * i for i in range(3)]
    assert dlq.events_total == 3
    assert await dlq.put([]) is PutOutcome.STORED
    assert dlq.count() == 3


@asyncio_test
@pytest.mark.parametrize(
    ("max_entries", "before", "incoming", "evicted"),
    [
        pytest.param(5, 3, 2, 0, id="fills-exactly"),
        pytest.param(5, 5, 1, 1, id="full-plus-one"),
        pytest.param(5, 4, 3, 2, id="batch-overflows"),
        pytest.param(3, 2, 5, 4, id="batch-larger-than-queue"),
    ],
)
async def test_drop_oldest_evicts_exactly_the_oldest(
    dlq_dir: str, max_entries: int, before: int, incoming: int, evicted: int
) -> None:
    """Scenario: ``before`` entries, then one put of ``incoming`` letters, max_entries as
    given, overflow drop_oldest. Expected: STORED; the queue holds the newest max_entries
    (or fewer) entries in order; evicted_total counts exactly what went."""
    config = DlqConfig(max_entries=max_entries)
    async with await DeadLetterQueue.open(dlq_dir, config, log_config=SMALL_LOG) as dlq:
        await put_each(dlq, range(before))
        outcome = await dlq.put([letter(before + i) for i in range(incoming)])
        assert outcome is PutOutcome.STORED
        total = before + incoming
        assert dlq.evicted_total == evicted
        assert dlq.count() == total - evicted
        assert [e.sequence for e in await dlq.peek()] == list(range(evicted, total))
        assert [e.offset for e in await dlq.peek()] == [1000 + i for i in range(evicted, total)]
        assert dlq.events_total == total


@asyncio_test
@pytest.mark.parametrize(
    ("before", "incoming", "stored"),
    [
        pytest.param(3, 2, True, id="fills-exactly"),
        pytest.param(5, 1, False, id="full"),
        pytest.param(4, 2, False, id="batch-does-not-fit"),
    ],
)
async def test_reject_stores_nothing_and_counts(
    dlq_dir: str, before: int, incoming: int, stored: bool
) -> None:
    """Scenario: max_entries 5, overflow reject, ``before`` entries, then a put of
    ``incoming``. Expected: if it fits, STORED; otherwise REJECTED, none of the letters
    stored, rejected_total += incoming, the queue untouched."""
    config = DlqConfig(max_entries=5, overflow=OverflowPolicy.REJECT)
    async with await DeadLetterQueue.open(dlq_dir, config, log_config=SMALL_LOG) as dlq:
        await put_each(dlq, range(before))
        outcome = await dlq.put([letter(100 + i) for i in range(incoming)])
        assert outcome.is_stored() is stored
        assert dlq.count() == before + (incoming if stored else 0)
        assert dlq.rejected_total == (0 if stored else incoming)
        assert dlq.evicted_total == 0
        assert dlq.events_total == before + (incoming if stored else 0)


@asyncio_test
async def test_block_raises_and_stores_nothing(dlq_dir: str) -> None:
    """Scenario: max_entries 2, overflow block, two entries, then a third put.
    Expected: DlqFullError (a DispatchError) naming topic/subscription, the size, and to
    ack, purge or replay; nothing stored; after an ack the same put is stored."""
    config = DlqConfig(max_entries=2, overflow=OverflowPolicy.BLOCK)
    async with await DeadLetterQueue.open(dlq_dir, config, log_config=SMALL_LOG) as dlq:
        await put_each(dlq, range(2))
        with pytest.raises(DlqFullError) as info:
            await dlq.put([letter(2)])
        message = str(info.value)
        assert "orders/billing is full at 2 entries" in message
        assert "ack, purge or replay" in message
        assert isinstance(info.value, DispatchError)
        assert (dlq.count(), dlq.next_sequence, dlq.events_total) == (2, 2, 2)
        assert (dlq.rejected_total, dlq.evicted_total) == (0, 0)
        assert await dlq.ack_up_to(0) == 1
        assert await dlq.put([letter(2)]) is PutOutcome.STORED
        assert [e.offset for e in await dlq.peek()] == [1001, 1002]


@asyncio_test
async def test_concurrent_puts_never_overfill_a_rejecting_queue(dlq_dir: str) -> None:
    """Scenario: max_entries 3, overflow reject, 2 entries; two tasks put one letter each
    at the same time. Expected: exactly one is stored and one rejected (the overflow check
    and the append are one step)."""
    config = DlqConfig(max_entries=3, overflow=OverflowPolicy.REJECT)
    async with await DeadLetterQueue.open(dlq_dir, config, log_config=SMALL_LOG) as dlq:
        await put_each(dlq, range(2))
        outcomes = await asyncio.gather(dlq.put([letter(8)]), dlq.put([letter(9)]))
        assert sorted(o.value for o in outcomes) == ["rejected", "stored"]
        assert (dlq.count(), dlq.rejected_total) == (3, 1)


@asyncio_test
async def test_peek_filters_by_reason_and_start(dlq: DeadLetterQueue) -> None:
    """Scenario: 10 entries, even ones with reason "timeout after 30 s", odd ones "nack:
    bad schema"; entries 0..1 acked. Expected: reason filters by substring; from_sequence
    starts there (never below the first sequence); limit caps; past the end is empty."""
    for i in range(10):
        reason = "timeout after 30 s" if i % 2 == 0 else "nack: bad schema"
        await dlq.put([letter(i, reason=reason)])
    await dlq.ack_up_to(1)
    assert [e.sequence for e in await dlq.peek(reason="timeout")] == [2, 4, 6, 8]
    assert [e.sequence for e in await dlq.peek(reason="schema", from_sequence=4)] == [5, 7, 9]
    assert [e.sequence for e in await dlq.peek(from_sequence=0, limit=3)] == [2, 3, 4]
    assert [e.sequence for e in await dlq.peek(from_sequence=7, limit=100)] == [7, 8, 9]
    assert (await dlq.peek(reason="timeout", limit=2))[-1].sequence == 4
    assert await dlq.peek(reason="no such reason") == []
    assert await dlq.peek(from_sequence=10) == []
    assert await dlq.peek(limit=0) == []


@asyncio_test
@pytest.mark.parametrize(
    ("sequence", "removed", "first"),
    [
        pytest.param(-1, 0, 0, id="below-everything"),
        pytest.param(0, 1, 1, id="first-only"),
        pytest.param(4, 5, 5, id="inclusive"),
        pytest.param(9, 10, 10, id="last"),
        pytest.param(100, 10, 10, id="past-the-head"),
    ],
)
async def test_ack_up_to_is_inclusive(
    dlq: DeadLetterQueue, sequence: int, removed: int, first: int
) -> None:
    """Scenario: 10 entries (0..9), then ack_up_to(sequence). Expected: every entry at
    or below it is gone, the count of removed ones is returned, and acking the same again
    removes nothing."""
    await put_each(dlq, range(10))
    assert await dlq.ack_up_to(sequence) == removed
    assert dlq.first_sequence == first
    assert dlq.count() == 10 - removed
    assert [e.sequence for e in await dlq.peek()] == list(range(first, 10))
    assert await dlq.ack_up_to(sequence) == 0


@asyncio_test
async def test_a_cancelled_removal_holds_the_lock_until_its_state_write_ends(
    dlq_dir: str,
) -> None:
    """Scenario: an ack_up_to whose state write (in a thread) is slow is cancelled, and
    another ack_up_to follows at once.
    Expected: the second state write starts only after the first one ended (they share a
    temp file), and the reopened queue starts after both acks."""
    fs = _SlowWrites()
    fs.go.set()
    queue = await DeadLetterQueue.open(dlq_dir, DlqConfig(), fs=fs, log_config=SMALL_LOG)
    await put_each(queue, range(5))
    fs.go.clear()
    fs.started.clear()
    fs.events.clear()
    first = asyncio.create_task(queue.ack_up_to(1))
    await asyncio.to_thread(fs.started.wait, 5)
    first.cancel()
    second = asyncio.create_task(queue.ack_up_to(3))
    await asyncio.sleep(0.05)
    assert fs.events == ["start"]  # the second write waits
    fs.go.set()
    assert await second == 2
    with pytest.raises(asyncio.CancelledError):
        await first
    assert fs.events == ["start", "end", "start", "end"]
    await queue.aclose()
    async with await DeadLetterQueue.open(dlq_dir, DlqConfig(), log_config=SMALL_LOG) as again:
        assert again.first_sequence == 4


@asyncio_test
async def test_purge_removes_everything_and_frees_the_disk(
    dlq: DeadLetterQueue, dlq_dir: str
) -> None:
    """Scenario: 12 entries over several 512-byte segments, then purge. Expected: returns
    12, count 0, no segment holding entries is left (the active one is sealed and deleted
    too); later puts continue at sequence 12; a second purge returns 0."""
    await put_each(dlq, range(12))
    assert len(segment_bases(dlq_dir)) > 1
    assert await dlq.purge() == 12
    assert dlq.count() == 0
    assert await dlq.peek() == []
    assert segment_bases(dlq_dir) == [12]
    assert await dlq.purge() == 0
    await dlq.put([letter(99)])
    assert [(e.sequence, e.offset) for e in await dlq.peek()] == [(12, 1099)]


@asyncio_test
@pytest.mark.parametrize(
    ("elapsed_s", "expired"),
    [
        pytest.param(100.0, 0, id="oldest-exactly-max-age"),
        pytest.param(100.001, 1, id="oldest-1ms-over"),
        pytest.param(110.001, 2, id="two-over"),
        pytest.param(120.001, 3, id="all-over"),
    ],
)
async def test_expire_removes_entries_older_than_max_age(
    dlq_dir: str, clock: ManualClock, elapsed_s: float, expired: int
) -> None:
    """Scenario: max_age 100 s; entries dead-lettered at T0, T0+10 s and T0+20 s; the
    clock set to T0 + elapsed. Expected: entries more than 100 s old are removed, one
    exactly 100 s old stays; the count is returned and added to expired_total and
    evicted_total."""
    config = DlqConfig(max_age_s=100.0)
    async with await DeadLetterQueue.open(dlq_dir, config, clock=clock) as dlq:
        for i in range(3):
            clock.now = T0 + 10 * i
            await dlq.put([letter(i)])
        clock.now = T0 + elapsed_s
        assert await dlq.expire() == expired
        assert (dlq.expired_total, dlq.evicted_total) == (expired, expired)
        assert [e.offset for e in await dlq.peek()] == [1000 + i for i in range(expired, 3)]


@asyncio_test
async def test_expire_keeps_everything_without_max_age(dlq_dir: str, clock: ManualClock) -> None:
    """Scenario: max_age None, an entry ten years old. Expected: expire removes nothing."""
    config = DlqConfig(max_age_s=None)
    async with await DeadLetterQueue.open(dlq_dir, config, clock=clock) as dlq:
        await dlq.put([letter(0)])
        clock.advance(10 * 365 * 86_400)
        assert await dlq.expire() == 0
        assert dlq.count() == 1


@asyncio_test
async def test_full_queue_expires_before_it_rejects(dlq_dir: str, clock: ManualClock) -> None:
    """Scenario: max_entries 2, reject, max_age 60 s; two entries, then 61 s later a put.
    Expected: the expired entries make room, so the letter is STORED, not rejected."""
    config = DlqConfig(max_entries=2, overflow=OverflowPolicy.REJECT, max_age_s=60.0)
    async with await DeadLetterQueue.open(dlq_dir, config, clock=clock) as dlq:
        await put_each(dlq, range(2))
        clock.advance(61)
        assert await dlq.put([letter(2)]) is PutOutcome.STORED
        assert (dlq.rejected_total, dlq.expired_total) == (0, 2)
        assert [e.offset for e in await dlq.peek()] == [1002]


@asyncio_test
async def test_replayable_applies_the_queues_guard(dlq_dir: str) -> None:
    """Scenario: max_replays 1; one fresh entry, one replayed once, one truncated.
    Expected: only the fresh one is replayable; the others say why not."""
    config = DlqConfig(max_replays=1, max_event_bytes=16)
    async with await DeadLetterQueue.open(dlq_dir, config) as dlq:
        await dlq.put(
            [
                letter(0),
                letter(1, headers=((HEADER_REPLAY_COUNT, b"1"),)),
                letter(2, value=b"x" * 17),
            ]
        )
        fresh, replayed, cut = await dlq.peek()
        assert dlq.replayable(fresh) is None
        assert "max_replays=1" in (dlq.replayable(replayed) or "")
        assert "truncated" in (dlq.replayable(cut) or "")


# -- durability across reopen -----------------------------------------------------------


@asyncio_test
async def test_state_survives_reopen(dlq_dir: str) -> None:
    """Scenario: 10 entries over small segments, ack_up_to(3), close, reopen.
    Expected: entries 0..3 stay gone, 4..9 are all there with their fields, the count is
    6, counters start from zero, and new puts continue at sequence 10."""
    config = DlqConfig()
    async with await DeadLetterQueue.open(dlq_dir, config, log_config=SMALL_LOG) as dlq:
        await put_each(dlq, range(10))
        await dlq.ack_up_to(3)
        before = await dlq.peek()
    async with await DeadLetterQueue.open(dlq_dir, config, log_config=SMALL_LOG) as dlq:
        assert (dlq.first_sequence, dlq.next_sequence, dlq.count()) == (4, 10, 6)
        assert await dlq.peek() == before
        assert (dlq.events_total, dlq.evicted_total, dlq.rejected_total) == (0, 0, 0)
        await dlq.put([letter(10)])
        assert (await dlq.peek())[-1].sequence == 10


@asyncio_test
async def test_ack_deletes_whole_segments_below(dlq: DeadLetterQueue, dlq_dir: str) -> None:
    """Scenario: 20 entries over 512-byte segments, then ack_up_to(12). Expected: every
    segment whose entries all lie at or below 12 is gone from disk; the segment holding 13
    stays; the log's first offset is at or below 13."""
    await put_each(dlq, range(20))
    bases = segment_bases(dlq_dir)
    assert len(bases) >= 4
    await dlq.ack_up_to(12)
    kept = [b for i, b in enumerate(bases) if i + 1 == len(bases) or bases[i + 1] > 13]
    assert segment_bases(dlq_dir) == kept
    assert kept[0] <= 13
    assert [e.sequence for e in await dlq.peek()] == list(range(13, 20))


@asyncio_test
async def test_reopen_after_save_but_before_segment_delete(dlq_dir: str) -> None:
    """Scenario: the state file is saved but renaming the doomed segments fails (as if
    the broker died between the two). Expected: ack_up_to still reports the removal; the
    segments stay on disk; after reopening the acked entries stay gone and the rest stay;
    the next removal deletes the leftover segments."""
    fs = FaultyFs()
    config = DlqConfig()
    async with await DeadLetterQueue.open(dlq_dir, config, fs=fs, log_config=SMALL_LOG) as dlq:
        await put_each(dlq, range(12))
        bases = segment_bases(dlq_dir)
        fs.faults.append(Fault("rename", errno.EIO, path_contains=".log"))
        assert await dlq.ack_up_to(7) == 8
        assert segment_bases(dlq_dir) == bases
    async with await DeadLetterQueue.open(dlq_dir, config, log_config=SMALL_LOG) as dlq:
        assert (dlq.first_sequence, dlq.count()) == (8, 4)
        assert [e.offset for e in await dlq.peek()] == [1008, 1009, 1010, 1011]
        await dlq.ack_up_to(8)
        assert segment_bases(dlq_dir)[0] > 0


@asyncio_test
async def test_failed_state_save_removes_nothing(dlq_dir: str) -> None:
    """Scenario: saving the state file fails (EIO on its rename) during ack_up_to.
    Expected: WalIOError naming the state file; nothing removed now or after reopening."""
    fs = FaultyFs()
    config = DlqConfig()
    async with await DeadLetterQueue.open(dlq_dir, config, fs=fs, log_config=SMALL_LOG) as dlq:
        await put_each(dlq, range(5))
        fs.faults.append(Fault("rename", errno.EIO, path_contains="state.json"))
        with pytest.raises(WalIOError, match=r"state\.json"):
            await dlq.ack_up_to(2)
        assert (dlq.first_sequence, dlq.count()) == (0, 5)
    async with await DeadLetterQueue.open(dlq_dir, config, log_config=SMALL_LOG) as dlq:
        assert (dlq.first_sequence, dlq.count()) == (0, 5)


@asyncio_test
@pytest.mark.parametrize(
    "fault",
    [
        # (not ENOSPC: a write that finds the disk full is cut back and does not latch)
        pytest.param(Fault("pwritev", errno.EIO, path_contains=".log"), id="write-EIO"),
        pytest.param(Fault("fdatasync", errno.EIO, path_contains=".log"), id="fdatasync-EIO"),
    ],
)
async def test_failing_disk_makes_put_raise(dlq_dir: str, fault: Fault) -> None:
    """Scenario: three entries stored, then the disk fails the next put's write or sync.
    Expected: put raises a WalError, count and peek are unchanged, events_total does not
    count it, and later puts keep failing (the log is latched). After reopening on a
    healthy disk every stored entry is intact (the failed one may be there too: it was
    never acknowledged, so showing it twice beats losing it)."""
    fs = FaultyFs()
    config = DlqConfig()
    async with await DeadLetterQueue.open(dlq_dir, config, fs=fs, log_config=SMALL_LOG) as dlq:
        await put_each(dlq, range(3))
        before = await dlq.peek()
        fs.faults.append(fault)
        with pytest.raises(WalError):
            await dlq.put([letter(3)])
        assert (dlq.count(), await dlq.peek(), dlq.events_total) == (3, before, 3)
        with pytest.raises(WalError):
            await dlq.put([letter(4)])
        assert dlq.count() == 3
    async with await DeadLetterQueue.open(dlq_dir, config, log_config=SMALL_LOG) as dlq:
        assert (await dlq.peek())[:3] == before
        assert [e.offset for e in (await dlq.peek())[3:]] in ([], [1003])


@asyncio_test
async def test_damaged_state_file_restarts_at_the_oldest_entry(dlq_dir: str) -> None:
    """Scenario: the state file is overwritten with garbage. Expected: it is kept as
    ``state.json.corrupt`` and the queue restarts at the oldest entry its log holds
    (acked entries may show again; none is lost)."""
    async with await DeadLetterQueue.open(dlq_dir, DlqConfig()) as dlq:
        await put_each(dlq, range(4))
        await dlq.ack_up_to(1)
    Path(dlq_dir, "state.json").write_bytes(b"{not json")
    async with await DeadLetterQueue.open(dlq_dir, DlqConfig()) as dlq:
        assert (dlq.first_sequence, dlq.count()) == (0, 4)
    assert Path(dlq_dir, "state.json.corrupt").read_bytes() == b"{not json"


@asyncio_test
async def test_saved_sequence_past_the_head_is_clamped_and_saved(dlq_dir: str) -> None:
    """Scenario: the state file claims first_sequence 50 but the log ends at 3 (its tail
    was lost). Expected: the queue opens empty at 3, and saves that, so entries put now
    are still there after the next reopen (not hidden below a stale 50)."""
    async with await DeadLetterQueue.open(dlq_dir, DlqConfig()) as dlq:
        await put_each(dlq, range(3))
    Path(dlq_dir, "state.json").write_bytes(b'{"version":1,"first_sequence":50}')
    async with await DeadLetterQueue.open(dlq_dir, DlqConfig()) as dlq:
        assert (dlq.first_sequence, dlq.count()) == (3, 0)
        await dlq.put([letter(3)])
    async with await DeadLetterQueue.open(dlq_dir, DlqConfig()) as dlq:
        assert [(e.sequence, e.offset) for e in await dlq.peek()] == [(3, 1003)]


@asyncio_test
async def test_closed_queue_refuses_changes(dlq_dir: str) -> None:
    """Scenario: a queue is closed twice, then used. Expected: the second close is a
    no-op; put, ack_up_to, purge and expire raise WalClosedError."""
    dlq = await DeadLetterQueue.open(dlq_dir, DlqConfig(), fs=FileSystem())
    await dlq.put([letter(0)])
    await dlq.aclose()
    await dlq.aclose()
    with pytest.raises(WalClosedError):
        await dlq.put([letter(1)])
    ops: list[Callable[[], Awaitable[int]]] = [lambda: dlq.ack_up_to(0), dlq.purge, dlq.expire]
    for op in ops:
        with pytest.raises(WalClosedError):
            await op()
