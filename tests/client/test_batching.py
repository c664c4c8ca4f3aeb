"""The per-record send paths: the blocking Producer's thread-side accumulator and the
futures both producers hand out (client/_batching.py).

The futures' protocols (asyncio's future-like objects, ``concurrent.futures``) are
checked on batches settled by hand; everything else runs against a real broker over
gRPC on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import grpc
import pytest

from broker.app import Broker
from client import (
    AdminClient,
    AsyncAdminClient,
    AsyncProducer,
    ClientClosed,
    ClientError,
    Producer,
    PublishOutcome,
    RecordFuture,
    RecordMetadata,
    ResourceExhausted,
    partition_for,
)
from client._batching import PendingBatch, ThreadRecordFuture
from proto import broker_pb2 as pb
from proto.batch import decode_batch
from tests.client.conftest import address, read_batches, read_partition
from tests.client.test_producer_faults import CuttingProxy, FaultyFront, slow_broker
from tests.client.test_sync import broker_address, fetch_values

__all__ = ["broker_address"]  # the blocking tests' broker fixture, used here too


def _answer(partition: int, base_offset: int, duplicate: bool = False) -> pb.PublishResponse:
    """The broker's answer to a batch, for settling one by hand."""
    return pb.PublishResponse(partition=partition, base_offset=base_offset, duplicate=duplicate)


# -- the futures, on batches settled by hand ------------------------------------------------


@pytest.mark.asyncio
async def test_record_futures_are_asyncio_futures_to_asyncio() -> None:
    """Scenario: three records' RecordFutures, awaited, gathered, waited for with
    wait_for and asyncio.wait, with a done callback (added and one removed) and one
    cancelled, then the batch is acknowledged at offset 40. Expected: asyncio.isfuture is
    true; each resolves to its own metadata; the callback gets the handle itself; the
    removed one never runs; the cancelled one reports cancelled while the others do not."""
    loop = asyncio.get_running_loop()
    batch = PendingBatch("t", loop)
    for i in range(4):
        batch.add(b"v%d" % i, None, None, 0)
    a, b, c, d = (RecordFuture(batch, i) for i in range(4))
    assert asyncio.isfuture(a)
    assert not a.done()
    with pytest.raises(asyncio.InvalidStateError):
        a.result()
    seen: list[object] = []
    removed: list[object] = []
    b.add_done_callback(seen.append)
    b.add_done_callback(removed.append)
    assert b.remove_done_callback(removed.append) == 1
    assert d.cancel()
    gathered = asyncio.gather(a, b)
    waited = asyncio.ensure_future(asyncio.wait_for(c, 5))
    loop.call_later(0.01, batch.resolve, "t", _answer(2, 40))
    assert await gathered == [RecordMetadata("t", 2, 40), RecordMetadata("t", 2, 41)]
    assert await waited == RecordMetadata("t", 2, 42)
    done, _ = await asyncio.wait([a, c])
    assert done == {a, c}
    await asyncio.sleep(0)  # done callbacks run on the loop's next turn
    assert seen == [b]
    assert removed == []
    assert await a == a.result() == RecordMetadata("t", 2, 40)
    assert d.cancelled()
    assert not a.cancelled()
    with pytest.raises(asyncio.CancelledError):
        await d


@pytest.mark.asyncio
async def test_a_task_gathering_record_futures_can_be_cancelled() -> None:
    """Scenario: a task awaits asyncio.gather of three RecordFutures and is cancelled
    before the batch is answered. Expected: the task ends with CancelledError at once,
    and the futures report cancelled. Before, gather's callback asked each future for
    asyncio's private _make_cancelled_error, which RecordFuture lacked: an AttributeError
    per record in the loop's log, and the task never ended."""
    loop = asyncio.get_running_loop()
    batch = PendingBatch("t", loop)
    for i in range(3):
        batch.add(b"v%d" % i, None, None, 0)
    futures = [RecordFuture(batch, i) for i in range(3)]
    errors: list[dict[str, object]] = []
    loop.set_exception_handler(lambda _loop, context: errors.append(context))
    try:
        task = asyncio.ensure_future(asyncio.gather(*futures))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, 2)
    finally:
        loop.set_exception_handler(None)
    assert all(f.cancelled() for f in futures)
    assert errors == []


@pytest.mark.asyncio
async def test_a_failed_batch_fails_each_record_future_with_its_error() -> None:
    """Scenario: a batch fails with a ClientError; one record was awaited before, one is
    looked at only after. Expected: both raise the same error object, and exception()
    returns it without making a future."""
    batch = PendingBatch("t", asyncio.get_running_loop())
    batch.add(b"x", None, None, 0)
    batch.add(b"y", None, None, 0)
    early, late = RecordFuture(batch, 0), RecordFuture(batch, 1)
    waiting = asyncio.ensure_future(asyncio.gather(early))
    await asyncio.sleep(0)
    error = ResourceExhausted("too big", outcome=PublishOutcome.REFUSED)
    batch.fail(error)
    with pytest.raises(ResourceExhausted) as caught:
        await waiting
    assert caught.value is error
    assert late.exception() is error
    assert late.done()
    with pytest.raises(ResourceExhausted):
        late.result()


def test_thread_record_futures_are_concurrent_futures_made_on_demand() -> None:
    """Scenario: ThreadRecordFutures of one batch: one waited on with result(timeout) from
    another thread, one passed to concurrent.futures.wait and as_completed, one given a
    done callback, one never touched; the batch is acknowledged at offset 7 (a duplicate)
    from a third thread. Expected: each is a concurrent.futures.Future that is running and
    refuses cancel(); a result(timeout) before the answer raises TimeoutError; after it,
    every future holds its own metadata and the callback got its future."""
    batch = PendingBatch("t", None)
    for _i in range(4):
        batch.add(b"v", None, None, 0)
    futures = [ThreadRecordFuture(batch, i) for i in range(4)]
    assert all(isinstance(f, concurrent.futures.Future) for f in futures)
    assert futures[0].running()
    assert not futures[0].cancelled()
    assert not futures[0].cancel()
    with pytest.raises(concurrent.futures.TimeoutError):
        futures[0].result(timeout=0.01)
    called: list[concurrent.futures.Future[RecordMetadata]] = []
    futures[2].add_done_callback(called.append)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        waiter = pool.submit(futures[0].result, 10)
        threading.Timer(0.02, batch.resolve, ("t", _answer(1, 7, True))).start()
        done, not_done = concurrent.futures.wait(futures[:2], timeout=10)
        assert done == set(futures[:2])
        assert not not_done
        assert waiter.result(10) == RecordMetadata("t", 1, 7, True)
    assert list(concurrent.futures.as_completed(futures[1:3], timeout=1)) != []
    assert [f.result(0) for f in futures] == [RecordMetadata("t", 1, 7 + i, True) for i in range(4)]
    assert called == [futures[2]]
    assert not futures[3]._made  # never asked for anything a batch cannot answer


def test_a_batch_starts_its_key_and_header_columns_with_the_first_record_that_has_one() -> None:
    """Scenario: records without a key or headers, then one with both, then one without.
    Expected: the encoded batch gives every record its own key (None before and after)
    and headers (empty for the others); a batch without any key encodes no keys; encoding
    lets the columns go."""
    batch = PendingBatch("t", None)
    batch.add(b"a", None, None, 1)
    batch.add(b"b", None, None, 2)
    batch.add(b"c", b"k", {"h": b"1"}, 3)
    batch.add(b"d", None, None, 4)
    decoded = decode_batch(batch.encode(5, 0))
    assert decoded is not None
    assert decoded.values() == [b"a", b"b", b"c", b"d"]
    assert decoded.keys() == [None, None, b"k", None]
    assert [dict(m) for m in decoded.headers()] == [{}, {}, {"h": b"1"}, {}]
    assert batch.count == 0
    assert batch.size == 4 * 17 + 1
    plain = PendingBatch("t", None)
    plain.add(b"a", None, None, 1)
    decoded = decode_batch(plain.encode(-1, -1))
    assert decoded is not None
    assert decoded.keys() == [None]


# -- the blocking producer against a broker -------------------------------------------------


def test_threads_sending_at_once_keep_their_order_and_get_their_offsets(
    broker_address: str,
) -> None:
    """Scenario: 4 threads each send 1,500 keyed records (5 keys per thread) through one
    Producer to a 3-partition topic, without waiting, then flush. Expected: every future
    holds the offset where its record is in the log, on the key's partition; each thread's
    records keep their send order within each partition; no record is missing or twice."""
    with AdminClient(broker_address) as admin:
        admin.create_topic("many", 3)
    per_thread: dict[int, list[tuple[bytes, bytes, concurrent.futures.Future[Any]]]] = {}
    with Producer(broker_address, linger_ms=1, batch_max_bytes=8_000) as producer:
        start = threading.Barrier(4)

        def sender(worker: int) -> None:
            start.wait()
            sent = per_thread[worker] = []
            for i in range(1_500):
                key, value = b"w%d-k%d" % (worker, i % 5), b"w%d-%d" % (worker, i)
                sent.append((key, value, producer.send("many", value, key=key)))

        threads = [threading.Thread(target=sender, args=(w,)) for w in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        producer.flush()
        assert all(f.done() for sent in per_thread.values() for _, _, f in sent)
    logs = [fetch_values(broker_address, "many", p) for p in range(3)]
    assert sum(map(len, logs)) == 6_000
    for sent in per_thread.values():
        last: dict[int, int] = {}
        for key, value, future in sent:
            meta = future.result(0)
            assert meta.partition == partition_for(key, 3)
            assert logs[meta.partition][meta.offset] == value
            assert meta.offset > last.get(meta.partition, -1)
            last[meta.partition] = meta.offset


def test_flush_waits_for_every_record_sent_before_it_not_for_the_linger(
    broker_address: str,
) -> None:
    """Scenario: with linger_ms 60,000, two threads send 200 unkeyed records, then the main
    thread flushes. Expected: flush returns within seconds, not after the linger, with
    every future done and the 200 records in the log."""
    with AdminClient(broker_address) as admin:
        admin.create_topic("linger", 2)
    with Producer(broker_address, linger_ms=60_000) as producer:
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            batches = list(
                pool.map(lambda w: [producer.send("linger", b"%d" % w) for _ in range(100)], (0, 1))
            )
        assert not any(f.done() for sent in batches for f in sent)
        started = time.monotonic()
        producer.flush()
        assert time.monotonic() - started < 10
        assert all(f.done() and f.exception() is None for sent in batches for f in sent)
    assert sum(len(fetch_values(broker_address, "linger", p)) for p in (0, 1)) == 200


def test_linger_alone_sends_a_batch(broker_address: str) -> None:
    """Scenario: one record sent with linger_ms 50 and nothing else: no flush, no full
    batch. Expected: it is acknowledged on its own within seconds (the linger timer)."""
    with AdminClient(broker_address) as admin:
        admin.create_topic("alone", 1)
    with Producer(broker_address, linger_ms=50) as producer:
        assert producer.send("alone", b"x").result(10) == RecordMetadata("alone", 0, 0)
        assert producer.send("alone", b"y").result(10) == RecordMetadata("alone", 0, 1)


@pytest.mark.asyncio
async def test_a_full_buffer_blocks_send_until_acks_free_room(tmp_path: Path) -> None:
    """Scenario: each fdatasync takes 400 ms more; buffer_max_bytes and batch_max_bytes
    are 1,160 B (ten 100 B records). A thread sends ten records (the buffer is then full,
    and the batch is in the writer), then an eleventh. Expected: the eleventh send is
    still blocked 150 ms later; it returns once the first ten are acknowledged, and all
    eleven are in the log in order."""
    async with slow_broker(tmp_path, 0.4) as broker:
        async with AsyncAdminClient(address(broker)) as admin:
            await admin.create_topic("room", 1)

        def run() -> None:
            with Producer(
                address(broker), batch_max_bytes=1_160, buffer_max_bytes=1_160
            ) as producer:
                first = [producer.send("room", b"%0100d" % i) for i in range(10)]
                assert producer._producer.budget.full()
                returned = threading.Event()
                results: list[concurrent.futures.Future[RecordMetadata]] = []

                def eleventh() -> None:
                    results.append(producer.send("room", b"%0100d" % 10))
                    returned.set()

                blocked = threading.Thread(target=eleventh)
                blocked.start()
                assert not returned.wait(0.15)
                assert returned.wait(10)
                blocked.join()
                assert all(f.done() for f in first)
                assert results[0].result(10).offset == 10

        await asyncio.to_thread(run)
        stored = [v for _, v, _ in await read_partition(broker, "room", 0)]
    assert stored == [b"%0100d" % i for i in range(11)]


@pytest.mark.asyncio
async def test_close_wakes_a_send_blocked_on_a_full_buffer(tmp_path: Path) -> None:
    """Scenario: fdatasync takes 400 ms more, the buffer holds one batch, and a second
    thread's send is blocked for room when the producer is closed. Expected: the blocked
    send raises ClientClosed; close still flushes, so the records queued before are
    acknowledged; a send after close raises ClientClosed."""
    async with slow_broker(tmp_path, 0.4) as broker:
        async with AsyncAdminClient(address(broker)) as admin:
            await admin.create_topic("shut", 1)

        def run() -> None:
            producer = Producer(address(broker), batch_max_bytes=1_160, buffer_max_bytes=1_160)
            first = [producer.send("shut", b"%0100d" % i) for i in range(10)]
            outcome: list[BaseException] = []

            def blocked_send() -> None:
                try:
                    producer.send("shut", b"late")
                except BaseException as exc:
                    outcome.append(exc)

            sender = threading.Thread(target=blocked_send)
            sender.start()
            time.sleep(0.1)
            producer.close()
            sender.join(10)
            assert len(outcome) == 1, outcome
            assert isinstance(outcome[0], ClientClosed), outcome
            assert [f.result(0).offset for f in first] == list(range(10))
            with pytest.raises(ClientClosed, match="is closed"):
                producer.send("shut", b"after")

        await asyncio.to_thread(run)


@pytest.mark.asyncio
async def test_aclose_fails_an_async_send_waiting_for_room(tmp_path: Path) -> None:
    """Scenario: fdatasync takes 400 ms more, the buffer holds one batch of ten records,
    and an eleventh ``AsyncProducer.send`` waits for room when ``aclose`` starts.
    Expected: that send raises ClientClosed (it must not add a record to a sender that
    close stops, whose future would never settle); the ten are acknowledged, and the log
    holds exactly them."""
    async with slow_broker(tmp_path, 0.4) as broker:
        async with AsyncAdminClient(address(broker)) as admin:
            await admin.create_topic("closing", 1)
        producer = AsyncProducer(address(broker), batch_max_bytes=1_160, buffer_max_bytes=1_160)
        first = [await producer.send("closing", b"%0100d" % i) for i in range(10)]
        assert producer.budget.full()
        late = asyncio.create_task(producer.send("closing", b"late"))
        await asyncio.sleep(0.05)
        assert not late.done()  # waiting for room
        await asyncio.wait_for(producer.aclose(), 10)
        with pytest.raises(ClientClosed, match="is closed"):
            await asyncio.wait_for(late, 1)
        assert [(await f).offset for f in first] == list(range(10))
        stored = [v for _, v, _ in await read_partition(broker, "closing", 0)]
    assert stored == [b"%0100d" % i for i in range(10)]


@pytest.mark.asyncio
@pytest.mark.parametrize("blocking", [True, False], ids=["Producer", "AsyncProducer"])
async def test_an_error_fails_exactly_the_records_of_its_batch(
    broker: Broker, blocking: bool
) -> None:
    """Scenario: 30 records to one partition in batches of exactly ten (batch_max_bytes
    1,160 B); the broker's answer to the 2nd Publish is replaced by INTERNAL after the
    append. Expected: records 10-19 fail with outcome UNKNOWN (they were written, the
    client cannot know), the others are acknowledged at offsets 0-9 and 20-29, under a
    new producer id after the failure, and the log holds each of the 30 records once."""
    async with AsyncAdminClient(address(broker)) as admin:
        await admin.create_topic("fail", 1)
    values = [b"%0100d" % i for i in range(30)]
    async with FaultyFront(address(broker), {2: grpc.StatusCode.INTERNAL}) as front:
        outcomes: list[RecordMetadata | BaseException]
        if blocking:

            def run() -> list[RecordMetadata | BaseException]:
                with Producer(front.address, batch_max_bytes=1_160) as producer:
                    futures = [producer.send("fail", v) for v in values]
                    producer.flush()
                return [f.exception(0) or f.result(0) for f in futures]

            outcomes = await asyncio.to_thread(run)
        else:
            async with AsyncProducer(front.address, batch_max_bytes=1_160) as producer:
                sent = [await producer.send("fail", v) for v in values]
                outcomes = list(await asyncio.gather(*sent, return_exceptions=True))
    failed = [i for i, o in enumerate(outcomes) if isinstance(o, BaseException)]
    assert failed == list(range(10, 20))
    assert all(
        isinstance(o, ClientError) and o.outcome is PublishOutcome.UNKNOWN for o in outcomes[10:20]
    )
    offsets = [o.offset for o in outcomes if isinstance(o, RecordMetadata)]
    assert offsets == [*range(10), *range(20, 30)]
    batches = await read_batches(broker, "fail", 0)
    assert [b.values() for b in batches] == [values[0:10], values[10:20], values[20:30]]
    # One batch in flight (the default window): the 3rd is sent after the failure, under a
    # new id. (Pipelined, it may be in flight behind the 2nd and written under the 1st id:
    # tests/client/test_pipeline.py.)
    assert batches[0].producer_id == batches[1].producer_id != batches[2].producer_id


@pytest.mark.asyncio
async def test_blocking_sends_through_cut_connections_are_never_duplicated(
    tmp_path: Path,
) -> None:
    """Scenario: a thread sends distinct keyed records through the blocking Producer, one
    a millisecond, to a 2-partition topic, through a proxy that cuts every connection
    5 ms after every 3rd chunk, until 15 cuts (at most 2,000 records); each fdatasync
    takes 20 ms more, so cuts land while batches wait in the writer. Expected: 15 cuts;
    every future acknowledged; the log holds each key exactly once."""
    async with slow_broker(tmp_path, 0.02) as broker:
        async with AsyncAdminClient(address(broker)) as admin:
            await admin.create_topic("cut", 2)
        proxy = CuttingProxy(broker.port, every=3, delay_s=0.005, max_cuts=15)
        target = await proxy.start()

        def run() -> tuple[list[bytes], list[bool]]:
            keys: list[bytes] = []
            futures = []
            with Producer(
                target, linger_ms=2, batch_max_bytes=2_000, delivery_timeout_s=60
            ) as producer:
                while proxy.cuts < proxy.max_cuts and len(keys) < 2_000:
                    keys.append(b"k%04d" % len(keys))
                    futures.append(producer.send("cut", b"v", key=keys[-1]))
                    time.sleep(0.001)
            return keys, [f.exception(0) is None for f in futures]

        try:
            keys, acked = await asyncio.to_thread(run)
        finally:
            await proxy.aclose()
        stored = [k for p in (0, 1) for _, _, k in await read_partition(broker, "cut", p)]
    assert proxy.cuts == 15
    assert all(acked)
    counts = Counter(stored)
    assert [k for k, n in counts.items() if n > 1] == []
    assert set(counts) == set(keys)


def test_send_and_send_many_keep_one_threads_order(broker_address: str) -> None:
    """Scenario: one thread sends records with send (queued on the thread side), then
    send_many (which goes through the loop), then send again, all to one partition with
    linger_ms 60,000, then flushes. Expected: the log holds them in call order (send_many
    hands over what send queued first), and the futures say so."""
    with AdminClient(broker_address) as admin:
        admin.create_topic("mixed", 1)
    with Producer(broker_address, linger_ms=60_000) as producer:
        first = [producer.send("mixed", b"1"), producer.send("mixed", b"2")]
        bulk = producer.send_many("mixed", [b"3", b"4"])
        last = producer.send("mixed", b"5")
        producer.flush()
        assert [f.result(0).offset for f in first] == [0, 1]
        assert [m.offset for m in bulk.result(0)] == [2, 3]
        assert last.result(0).offset == 4
    assert fetch_values(broker_address, "mixed", 0) == [b"%d" % i for i in range(1, 6)]
