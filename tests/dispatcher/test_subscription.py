"""Subscription dispatch over real logs: credit, the unacked cap, acks, redelivery, seek,
and cursors that survive a reopen of the registry (real files)."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest
import pytest_asyncio

from dispatcher import (
    ConsumerSession,
    Delivery,
    InitialPosition,
    InvalidAckError,
    InvalidSubscriptionError,
    PartitionSnapshot,
    Subscription,
    SubscriptionBusyError,
    SubscriptionNotFoundError,
    SubscriptionRegistry,
    cursor_journal,
)
from dispatcher.cursor_recovery import read_states
from dispatcher.dispatch_loop import MAX_BATCHES_PER_READ
from tests.dispatcher._deliveries import singles, take
from wal import Fault, FaultyFs, FileSystem, LogWriter, decode_batch, encode_columns

pytestmark = pytest.mark.asyncio(loop_scope="function")


async def _append(writer: LogWriter, *values: bytes) -> None:
    await writer.append(encode_columns(list(values)))


def _values(deliveries: list[Delivery]) -> list[tuple[int, int, bytes]]:
    """(partition, offset, value) of every delivered record."""
    out = []
    for d in deliveries:
        batch = decode_batch(d.batch)
        assert batch is not None
        assert not isinstance(batch, Exception)
        values = batch.values()
        for offset in range(d.from_offset, d.to_offset):
            out.append((d.partition, offset, values[offset - batch.base_offset]))
    return out


async def _nothing_more(session: ConsumerSession) -> None:
    await asyncio.sleep(0.05)
    assert session.outbox.empty()


@pytest_asyncio.fixture
async def registry(tmp_path: Path) -> AsyncIterator[SubscriptionRegistry]:
    reg = SubscriptionRegistry(str(tmp_path / "data"), flush_interval_s=0.01)
    await reg.open({})
    yield reg
    await reg.aclose()


async def test_delivers_records_appended_before_and_after_attach(
    writers: list[LogWriter], registry: SubscriptionRegistry
) -> None:
    await _append(writers[0], b"a", b"b")
    sub = await registry.subscribe("t", "s", writers)
    session = sub.attach("c", 100)
    await _append(writers[1], b"c")
    await _append(writers[0], b"d")
    got = _values(await take(session, 4))
    assert sorted(got) == [(0, 0, b"a"), (0, 1, b"b"), (0, 2, b"d"), (1, 0, b"c")]
    assert [o for p, o, _ in got if p == 0] == [0, 1, 2]  # per-partition order


async def test_credit_bounds_what_is_sent(
    writers: list[LogWriter], registry: SubscriptionRegistry
) -> None:
    await singles(writers[0], 10)
    sub = await registry.subscribe("t", "s", writers)
    session = sub.attach("c", 3)
    first = await take(session, 3)
    assert [(d.from_offset, d.to_offset) for d in first] == [(0, 1), (1, 2), (2, 3)]
    await _nothing_more(session)
    sub.grant(session, 4)
    second = await take(session, 4)
    assert [d.from_offset for d in second] == [3, 4, 5, 6]
    assert sub.state.credit(session.consumer_id) == 0
    await _nothing_more(session)


async def test_a_backlog_of_small_batches_is_sent_in_slices_with_the_loop_free_between(
    writers: list[LogWriter], registry: SubscriptionRegistry
) -> None:
    """Scenario: 300 one-record batches wait when a consumer with ample credit attaches.
    Expected: another task runs while they are being sent (it sees some delivered and
    not all), the first slice is at most ``MAX_BATCHES_PER_READ`` batches, and every
    record arrives once, in order."""
    await singles(writers[0], 300)
    sub = await registry.subscribe("t", "s", writers)
    session = sub.attach("c", 1_000)
    seen: list[int] = []
    async with asyncio.timeout(5):
        while session.outbox.qsize() < 300:
            await asyncio.sleep(0)
            seen.append(session.outbox.qsize())
    partial = [n for n in seen if 0 < n < 300]
    assert partial, "the whole backlog was sent without yielding to the loop"
    assert partial[0] <= MAX_BATCHES_PER_READ
    got = await take(session, 300)
    assert [d.from_offset for d in got] == list(range(300))


async def test_one_pass_per_commit_and_acks_below_the_cap_wake_nothing(
    writers: list[LogWriter], registry: SubscriptionRegistry
) -> None:
    """Scenario: a consumer receives and acks 10 records appended one at a time, each
    delivered before the next is appended. Expected: one dispatch pass per record (the
    one its commit triggers): a pass that reached the head does not run again at once, and
    an ack, far below the unacked cap, does not wake the task."""
    sub = await registry.subscribe("t", "s", writers)
    session = sub.attach("c", 100)
    await asyncio.sleep(0.05)  # the attach pass
    before = sub.notifier_polls
    for i in range(10):
        await _append(writers[0], b"%d" % i)
        (delivery,) = await take(session, 1)
        sub.ack(0, delivery.from_offset, delivery.to_offset)
    await asyncio.sleep(0.05)
    assert sub.notifier_polls - before == 10
    assert sub.state.cursor(0) == 10


async def test_an_ack_at_the_unacked_cap_wakes_the_task(
    tmp_path: Path, writers: list[LogWriter]
) -> None:
    """Scenario: ``max_unacked`` 2 and 4 records. Expected: 2 are sent; acking one of
    them wakes the task, which sends the third at once (no heartbeat needed)."""
    reg = SubscriptionRegistry(str(tmp_path / "data"), max_unacked=2, flush_interval_s=3600)
    await reg.open({})
    try:
        await singles(writers[0], 4)
        sub = await reg.subscribe("t", "s", writers)
        session = sub.attach("c", 100)
        first = await take(session, 2)
        await _nothing_more(session)
        sub.ack(0, first[0].from_offset, first[0].to_offset)
        assert [d.from_offset for d in await take(session, 1)] == [2]
        assert sub.heartbeat_polls == 0
    finally:
        await reg.aclose()


async def test_a_batch_is_never_split_to_fit_the_credit(
    writers: list[LogWriter], registry: SubscriptionRegistry
) -> None:
    await _append(writers[0], *[bytes([i]) for i in range(10)])
    await _append(writers[0], b"next")
    sub = await registry.subscribe("t", "s", writers)
    session = sub.attach("c", 3)
    got = await take(session, 10)
    assert [(d.from_offset, d.to_offset) for d in got] == [(0, 10)]  # whole, once
    assert sub.state.credit(session.consumer_id) == -7
    await _nothing_more(session)  # no more until the credit is back above zero
    sub.grant(session, 8)
    assert [(d.from_offset, d.to_offset) for d in await take(session, 1)] == [(10, 11)]


async def test_unacked_cap_holds_until_acks_free_room(
    tmp_path: Path, writers: list[LogWriter]
) -> None:
    reg = SubscriptionRegistry(str(tmp_path / "d"), max_unacked=4)
    await reg.open({})
    try:
        await singles(writers[0], 10)
        sub = await reg.subscribe("t", "s", writers)
        session = sub.attach("c", 1000)
        assert [d.from_offset for d in await take(session, 4)] == [0, 1, 2, 3]
        await _nothing_more(session)
        assert (await sub.status()).partitions[0].in_flight == 4
        sub.ack(0, 0, 2)
        assert [d.from_offset for d in await take(session, 2)] == [4, 5]
        await _nothing_more(session)
    finally:
        await reg.aclose()


async def test_out_of_order_acks_and_redelivery_to_the_next_consumer(
    writers: list[LogWriter], registry: SubscriptionRegistry
) -> None:
    await _append(writers[0], *[bytes([i]) for i in range(6)])
    sub = await registry.subscribe("t", "s", writers)
    first = sub.attach("one", 100)
    await take(first, 6)
    sub.ack(0, 1, 2)
    await sub.ack(0, 3, 5)
    await sub.applied()  # the dispatch task applied both acks
    status = (await sub.status()).partitions[0]
    assert (status.cursor, status.lag, status.in_flight) == (0, 3, 3)
    sub.detach(first)
    second = sub.attach("two", 100)
    again = await take(second, 3)
    assert [(d.from_offset, d.to_offset) for d in again] == [(0, 1), (2, 3), (5, 6)]
    assert [d.redeliveries for d in again] == [{0: 1}, {2: 1}, {5: 1}]
    sub.ack_up_to(0, 6)
    await sub.applied()
    assert (await sub.status()).partitions[0].cursor == 6
    assert (await sub.status()).lag == 0


async def test_exclusive_refuses_a_second_consumer(
    writers: list[LogWriter], registry: SubscriptionRegistry
) -> None:
    sub = await registry.subscribe("t", "s", writers)
    sub.attach("one", 1)
    with pytest.raises(SubscriptionBusyError, match="'one' holds it"):
        sub.attach("two", 1)


async def test_acks_of_undelivered_offsets_are_refused(
    writers: list[LogWriter], registry: SubscriptionRegistry
) -> None:
    await _append(writers[0], b"a", b"b")
    await _append(writers[0], b"c")
    sub = await registry.subscribe("t", "s", writers)
    session = sub.attach("c", 2)
    await take(session, 2)
    with pytest.raises(InvalidAckError, match="only offsets below 2 were delivered"):
        sub.ack(0, 0, 3)
    with pytest.raises(InvalidAckError):
        sub.ack_up_to(0, 3)
    with pytest.raises(InvalidSubscriptionError, match="partition: 7 does not exist"):
        sub.ack(7, 0, 1)
    with pytest.raises(InvalidSubscriptionError, match="not an offset range"):
        sub.ack(0, 2, 1)
    assert (await sub.status()).partitions[0].cursor == 0  # nothing was acknowledged


async def test_latest_starts_at_the_head(
    writers: list[LogWriter], registry: SubscriptionRegistry
) -> None:
    await _append(writers[0], b"old")
    sub = await registry.subscribe("t", "s", writers, initial=InitialPosition.LATEST)
    session = sub.attach("c", 10)
    await _append(writers[0], b"new")
    assert _values(await take(session, 1)) == [(0, 1, b"new")]


async def test_commit_moves_the_cursor_without_delivery(
    writers: list[LogWriter], registry: SubscriptionRegistry
) -> None:
    await _append(writers[0], b"a", b"b", b"c")
    sub = await registry.subscribe("t", "s", writers)
    assert await sub.commit(0, 2) == 2
    assert await sub.commit(0, 1) == 2  # never backwards
    with pytest.raises(InvalidSubscriptionError, match=r"outside \[0, 3\]"):
        sub.commit(0, 4)
    session = sub.attach("c", 10)
    assert _values(await take(session, 1)) == [(0, 2, b"c")]


async def test_seek_resends_from_the_new_position(
    writers: list[LogWriter], registry: SubscriptionRegistry
) -> None:
    await _append(writers[0], b"a", b"b", b"c")
    sub = await registry.subscribe("t", "s", writers)
    session = sub.attach("c", 100)
    await take(session, 3)
    sub.ack_up_to(0, 3)
    sub.seek([1, 0])
    assert _values(await take(session, 2)) == [(0, 1, b"b"), (0, 2, b"c")]
    await sub.seek([99, 99])  # clamped to the head
    assert [p.cursor for p in (await sub.status()).partitions] == [3, 0]


async def test_a_seek_during_a_save_mid_pass_skips_nothing(
    writers: list[LogWriter],
) -> None:
    """Scenario: two partitions of 8 one-record batches; a consumer took 0..4 of each and
    nacked 4 of each; 5..7 wait for credit. The save that a redelivery awaits seeks both
    partitions back to 2 (the race: a seek lands while a pass is between its reads).
    Then credit comes.
    Expected: after the seek each partition delivers 2..7, in order: the read planned
    before the seek, from 4, sends nothing at all."""
    for writer in writers:
        await singles(writer, 5)
    seeks: list[list[int]] = []

    async def save_and_seek(sub: Subscription) -> None:
        if not seeks:
            seeks.append([2, 2])
            sub.seek([2, 2])

    sub = Subscription("t", "s", writers, [PartitionSnapshot(0)] * 2, persist=save_and_seek)
    sub.start()
    try:
        session = sub.attach("c", 10)
        await take(session, 10)
        for writer in writers:
            await singles(writer, 3)
        for p in (0, 1):
            sub.nack(p, 4, 5, delay_s=0, reason="again")
        await _nothing_more(session)
        sub.grant(session, 100)
        got: list[tuple[int, int]] = []
        async with asyncio.timeout(5):
            while not all([o for q, o in got if q == p][-6:] == list(range(2, 8)) for p in (0, 1)):
                delivery = await session.next()
                assert delivery is not None
                got += [(p, o) for p, o, _ in _values([delivery])]
        assert seeks == [[2, 2]]
        # The partition read first sent 4..7 before the seek landed (its save was what
        # the seek interrupted), then 2..7 again; the one read second, stale, sent
        # nothing until the next pass sent it 2..7.
        per_partition = sorted([o for q, o in got if q == p] for p in (0, 1))
        assert per_partition == [[2, 3, 4, 5, 6, 7], [4, 5, 6, 7, 2, 3, 4, 5, 6, 7]]
    finally:
        await sub.aclose()


async def test_cursor_and_ack_holes_survive_a_reopen(
    tmp_path: Path, writers: list[LogWriter]
) -> None:
    data = str(tmp_path / "data")
    await _append(writers[0], *[bytes([i]) for i in range(8)])
    reg = SubscriptionRegistry(data)
    await reg.open({})
    sub = await reg.subscribe("t", "s", writers)
    session = sub.attach("c", 100)
    await take(session, 8)
    sub.ack_up_to(0, 2)
    sub.ack(0, 4, 6)
    await reg.aclose()

    again = SubscriptionRegistry(data)
    await again.open({"t": writers})
    try:
        sub = again.get("t", "s")
        assert (await sub.status()).partitions[0].cursor == 2
        assert (sub.snapshot()[0].cursor, sub.snapshot()[0].acked) == (2, ((4, 6),))
        session = sub.attach("c", 100)
        got = await take(session, 4)
        assert [(d.from_offset, d.to_offset) for d in got] == [(2, 4), (6, 8)]
    finally:
        await again.aclose()


async def test_background_flush_saves_acks(tmp_path: Path, writers: list[LogWriter]) -> None:
    data = str(tmp_path / "data")
    await _append(writers[0], b"a", b"b")
    reg = SubscriptionRegistry(data, flush_interval_s=0.01)
    await reg.open({})
    try:
        sub = await reg.subscribe("t", "s", writers)
        await take(sub.attach("c", 10), 2)
        sub.ack_up_to(0, 2)
        root = os.path.join(data, "subscriptions")
        async with asyncio.timeout(5):
            while read_states(root, "t")["s"].partitions[0].cursor != 2:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
    finally:
        await reg.aclose()


class _JournalLog(FaultyFs):
    """Records the subscriptions of every batch written to a cursor journal."""

    def __init__(self, faults: Sequence[Fault] = ()) -> None:
        super().__init__(faults=faults)
        self.batches: list[list[str]] = []

    def write_all(
        self, fd: int, buffers: Sequence[bytes | bytearray | memoryview], offset: int
    ) -> int:
        if self.path_of(fd).endswith(cursor_journal.NAME):
            parsed = cursor_journal.parse(b"".join(bytes(b) for b in buffers))
            self.batches.append([entry.subscription for entry in parsed.entries])
        return super().write_all(fd, buffers, offset)


async def test_one_flush_saves_every_dirty_subscription_with_one_journal_sync(
    tmp_path: Path, writers: list[LogWriter]
) -> None:
    """Scenario: 12 subscriptions of one topic ack between two flushes, and the fdatasync
    of the topic's cursor journal fails until the test lifts the fault. Expected: each
    flush is one write of all 12 states to the journal; while the sync fails nothing counts
    as saved (the retention floor holds); once it works, the retry saves all 12, and they
    are what a reopen would load."""
    data = str(tmp_path / "data")
    await _append(writers[0], b"a", b"b")
    journal = os.path.join(data, "subscriptions", "t", cursor_journal.NAME)
    fs = _JournalLog([Fault("fdatasync", path_contains=journal, after=12, times=None)])
    reg = SubscriptionRegistry(data, fs=fs, flush_interval_s=0.02)
    await reg.open({})
    try:
        subs = [await reg.subscribe("t", f"s{i:02}", writers) for i in range(12)]
        assert fs.faults[0].seen == 12  # each creation was saved on its own
        fs.batches.clear()
        for sub in subs:
            await take(sub.attach("c", 10), 2)
        for sub in subs:  # all in one step of the loop: the flusher sees them together
            sub.ack_up_to(0, 2)
        async with asyncio.timeout(5):
            while len(fs.batches) < 3:  # noqa: ASYNC110 - three failed flushes
                await asyncio.sleep(0.01)
        assert reg.saved_floor("t") == [0, 0]
        fs.faults.clear()
        async with asyncio.timeout(5):
            while reg.saved_floor("t") != [2, 0]:  # noqa: ASYNC110 - the retry
                await asyncio.sleep(0.01)
        names = [f"s{i:02}" for i in range(12)]
        assert len(fs.batches) >= 4
        assert all(sorted(batch) == names for batch in fs.batches)
        saved = read_states(os.path.join(data, "subscriptions"), "t")
        assert {name: doc.partitions[0].cursor for name, doc in saved.items()} == dict.fromkeys(
            names, 2
        )
    finally:
        await reg.aclose()


async def test_a_redelivery_pass_does_not_ask_for_a_second_save(
    writers: list[LogWriter],
) -> None:
    """Scenario: a record is nacked, then sent again; the pass awaits a save first
    (Persist).
    Expected: the nack reports its change once (on_change, which marks the subscription
    for the flusher), the pass saves once, and nothing more is reported after the save:
    it covered the pass's changes, so the flusher has nothing left to write."""
    await _append(writers[0], b"a")
    changes: list[int] = []
    saves: list[int] = []

    async def save(sub: Subscription) -> None:
        saves.append(sub.state.changes)

    sub = Subscription(
        "t",
        "s",
        writers,
        [PartitionSnapshot(0)] * 2,
        on_change=lambda s: changes.append(s.state.changes),
        persist=save,
    )
    sub.start()
    try:
        session = sub.attach("c", 10)
        await take(session, 1)
        changes.clear()
        sub.nack(0, 0, 1, delay_s=0, reason="again")
        again = await take(session, 1)
        assert again[0].redeliveries == {0: 1}
        await _nothing_more(session)
        assert len(changes) == 1  # the nack
        assert saves == [sub.state.changes]  # the pass's save held everything
    finally:
        await sub.aclose()


async def test_damaged_file_restarts_at_earliest_and_is_kept(
    tmp_path: Path, writers: list[LogWriter]
) -> None:
    data = str(tmp_path / "data")
    await _append(writers[0], b"a", b"b")
    reg = SubscriptionRegistry(data)
    await reg.open({})
    sub = await reg.subscribe("t", "s", writers)
    sub.commit(0, 2)
    await reg.save(sub)
    await reg.aclose()
    path = Path(data, "subscriptions", "t", "s.json")
    path.write_bytes(b'{"version": 1, "topic": "t", "subscr')  # torn

    again = SubscriptionRegistry(data)
    await again.open({"t": writers})
    try:
        assert (await again.get("t", "s").status()).partitions[0].cursor == 0
        assert Path(str(path) + ".corrupt").exists()
    finally:
        await again.aclose()


async def test_subscriptions_of_deleted_topics_are_dropped(
    tmp_path: Path, writers: list[LogWriter]
) -> None:
    """Scenario: subscriptions of topics "gone" and "kept", each with a dead-letter queue;
    "kept" is dropped; the registry reopens knowing only topic "kept" (so "gone" was
    deleted while the broker was down).
    Expected: the drop removes kept's subscription and queue directories; the reopen
    prunes gone's subscriptions and queues, and knows no subscription."""
    data = str(tmp_path / "data")
    reg = SubscriptionRegistry(data)
    await reg.open({})
    for topic in ("gone", "kept"):
        await reg.subscribe(topic, "s", writers)
        assert await reg.dead_letter_queue(topic, "s") is not None
    assert Path(data, "dlq", "kept", "s").is_dir()
    await reg.drop_topic("kept")
    with pytest.raises(SubscriptionNotFoundError, match="consume kept --subscription s"):
        reg.get("kept", "s")
    assert not Path(data, "dlq", "kept").exists()
    assert not Path(data, "subscriptions", "kept").exists()
    await reg.aclose()
    assert Path(data, "dlq", "gone", "s").is_dir()
    again = SubscriptionRegistry(data)
    await again.open({"kept": writers})
    try:
        assert again.subscriptions() == []
        assert not Path(data, "subscriptions", "gone").exists()
        assert not Path(data, "dlq", "gone").exists()
    finally:
        await again.aclose()


async def test_bad_names_are_refused(
    writers: list[LogWriter], registry: SubscriptionRegistry
) -> None:
    with pytest.raises(InvalidSubscriptionError, match="not a valid subscription name"):
        await registry.subscribe("t", "../etc", writers)
    with pytest.raises(InvalidSubscriptionError):
        await registry.subscribe("t", "", writers)


async def test_a_subscription_closes_its_consumer(writers: list[LogWriter]) -> None:
    sub = Subscription("t", "s", writers, [PartitionSnapshot(0), PartitionSnapshot(0)])
    sub.start()
    session = sub.attach("c", 1)
    await sub.aclose()
    assert await session.next() is None


async def test_saved_floor_follows_cursors_on_disk_only(
    tmp_path: Path, writers: list[LogWriter]
) -> None:
    """Scenario: two subscriptions of one topic; one acks records that are not saved yet,
    then is saved. Expected: the floor is the lowest *saved* cursor per partition (an ack
    only in memory does not raise it), None for a topic without subscriptions, and it
    survives a reopen."""
    data = str(tmp_path / "data")
    await _append(writers[0], *[bytes([i]) for i in range(6)])
    await _append(writers[1], b"x", b"y")
    reg = SubscriptionRegistry(data, flush_interval_s=3600)
    await reg.open({})
    try:
        assert reg.saved_floor("t") is None
        fast = await reg.subscribe("t", "fast", writers)
        await reg.subscribe("t", "slow", writers)
        assert reg.saved_floor("t") == [0, 0]
        session = fast.attach("c", 100)
        await take(session, 8)
        fast.ack_up_to(0, 6)
        fast.ack_up_to(1, 2)
        assert reg.saved_floor("t") == [0, 0]  # not on disk yet
        slow = reg.get("t", "slow")
        slow.commit(0, 4)
        await reg.save(slow)
        await reg.save(fast)
        assert reg.saved_floor("t") == [4, 0]
        assert reg.saved_floor("other") is None
    finally:
        await reg.aclose()
    again = SubscriptionRegistry(data)
    await again.open({"t": writers})
    try:
        assert again.saved_floor("t") == [4, 0]
    finally:
        await again.aclose()


class _SlowWrites(FileSystem):
    """Writes that wait for a go-ahead, and a log of when each starts and ends."""

    def __init__(self) -> None:
        super().__init__()
        self.started = threading.Event()
        self.go = threading.Event()
        self.events: list[str] = []

    def write_all(
        self, fd: int, buffers: Sequence[bytes | bytearray | memoryview], offset: int
    ) -> int:
        self.events.append("start")
        self.started.set()
        self.go.wait(5)
        written = super().write_all(fd, buffers, offset)
        self.events.append("end")
        return written


async def test_a_cancelled_save_holds_the_lock_until_its_write_ends(
    tmp_path: Path, writers: list[LogWriter]
) -> None:
    """Scenario: a save whose write (in a thread) is slow is cancelled, and another save
    of the same subscription follows at once. Expected: the second write starts only after
    the first one ended (it goes where the first one ends in the journal), and both saves
    leave a readable state."""
    fs = _SlowWrites()
    reg = SubscriptionRegistry(str(tmp_path / "data"), fs=fs, flush_interval_s=3600)
    await reg.open({})
    fs.go.set()
    sub = await reg.subscribe("t", "s", writers)
    fs.go.clear()
    fs.started.clear()
    fs.events.clear()
    first = asyncio.create_task(reg.save(sub))
    await asyncio.to_thread(fs.started.wait, 5)
    first.cancel()
    second = asyncio.create_task(reg.save(sub))
    await asyncio.sleep(0.05)
    assert fs.events == ["start"]  # the second write waits
    fs.go.set()
    await second
    with pytest.raises(asyncio.CancelledError):
        await first
    assert fs.events == ["start", "end", "start", "end"]
    await reg.aclose()
    again = SubscriptionRegistry(str(tmp_path / "data"))
    await again.open({"t": writers})
    assert again.get("t", "s").snapshot()[0].cursor == 0
    await again.aclose()
