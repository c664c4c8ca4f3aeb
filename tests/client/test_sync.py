"""The sync twins (Producer, AdminClient) and their loop-thread bridge.

The bridge tests need no broker. The client tests use a real broker over loopback gRPC.
The broker serves from its own event loop on a background thread, and the tests call the
blocking clients from plain synchronous code, as users do.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import logging
import signal
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any

import grpc
import pytest

from broker.app import Broker
from client import (
    AlreadyExists,
    AsyncAdminClient,
    AsyncConsumer,
    AsyncFetcher,
    AsyncProducer,
    ClientClosed,
    ClientError,
    NotFound,
    RecordMetadata,
    ResourceExhausted,
    Unavailable,
    partition_for,
)
from client._sync._bridge import LoopThread, to_concurrent
from client._sync._generate import END, TWINS, render
from client._sync.admin import AdminClient
from client._sync.consumer import Consumer
from client._sync.fetcher import Fetcher
from client._sync.producer import Producer
from proto import broker_pb2 as pb
from proto import broker_pb2_grpc
from proto.batch import decode_batch
from tests.broker.conftest import broker_config
from tests.broker.test_serve_process import free_port

# -- harness ------------------------------------------------------------------------------


class BrokerThread:
    """A real broker on 127.0.0.1, serving from its own event loop on a background thread."""

    def __init__(self, data_dir: Path) -> None:
        self._config = broker_config(data_dir)
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None
        self._port = 0
        self._thread = threading.Thread(target=self._main, name="test-broker", daemon=True)

    def __enter__(self) -> str:
        self._thread.start()
        assert self._ready.wait(30), "the broker did not start"
        if self._error is not None:
            raise self._error
        return f"127.0.0.1:{self._port}"

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self._loop is not None
        assert self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)
        assert not self._thread.is_alive(), "the broker did not stop"
        if self._error is not None:
            raise self._error

    def _main(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as exc:  # handed to the test thread
            self._error = exc
            self._ready.set()

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        async with Broker(self._config) as broker:
            self._port = broker.port
            self._ready.set()
            await self._stop.wait()


@pytest.fixture
def broker_address(tmp_path: Path) -> Iterator[str]:
    """``host:port`` of a broker running in a background thread."""
    with BrokerThread(tmp_path / "data") as address:
        yield address


def fetch_values(address: str, topic: str, partition: int) -> list[bytes]:
    """Every value stored in a partition, in offset order, read over sync gRPC."""
    out: list[bytes] = []
    with grpc.insecure_channel(address) as channel:
        stub = broker_pb2_grpc.BrokerStub(channel)
        offset = 0
        while True:
            request = pb.FetchRequest(topic=topic, partition=partition, offset=offset)
            got = stub.Fetch(request, timeout=10)
            if not got.batches:
                return out
            for raw in got.batches:
                batch = decode_batch(raw)
                assert batch is not None
                out += batch.values()
                offset = batch.next_offset


def loop_threads() -> set[threading.Thread]:
    """The bridges' loop threads alive now."""
    return {t for t in threading.enumerate() if t.name.startswith("headrace-")}


@contextmanager
def sigint_once(started: threading.Event) -> Iterator[None]:
    """Send SIGINT to the main thread (as Ctrl-C would) shortly after ``started`` is set."""
    # Signals reach the main thread only; pytest runs tests there, so anything else is a
    # broken setup, not a case to skip.
    assert threading.current_thread() is threading.main_thread(), "run from the main thread"
    main = threading.main_thread().ident
    assert main is not None
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)

    def fire() -> None:
        if started.wait(10):
            time.sleep(0.05)  # let the main thread settle into its wait
            signal.pthread_kill(main, signal.SIGINT)

    killer = threading.Thread(target=fire, name="test-sigint")
    killer.start()
    try:
        yield
    finally:
        killer.join()
        signal.signal(signal.SIGINT, previous)


async def wait_forever(started: threading.Event, cancelled: threading.Event) -> None:
    """Signal ``started``, then sleep until cancelled, then signal ``cancelled``."""
    started.set()
    try:
        await asyncio.sleep(3600)
    except asyncio.CancelledError:
        cancelled.set()
        raise


@pytest.fixture
def bridge() -> Iterator[LoopThread]:
    """A bridge for a pretend ``Thing`` / ``AsyncThing`` pair, closed afterwards."""
    made = LoopThread("Thing", "AsyncThing")
    yield made
    made.close()


# -- the bridge ---------------------------------------------------------------------------


def test_bridge_starts_lazily_runs_on_its_thread_and_joins_it_on_close() -> None:
    """Scenario: create a bridge, run one coroutine, close. Expected: no thread until the
    first call; the coroutine runs on a thread named for the client; close joins it."""
    before = loop_threads()
    bridge = LoopThread("Thing", "AsyncThing")
    assert loop_threads() == before

    async def where() -> str:
        return threading.current_thread().name

    assert bridge.run(where()) == "headrace-Thing-loop"
    (thread,) = loop_threads() - before
    bridge.close()
    assert not thread.is_alive()
    assert bridge.closed


@pytest.mark.parametrize(
    "error",
    [
        NotFound("topic 'x' does not exist", grpc.StatusCode.NOT_FOUND),
        ClientClosed("the producer is closed"),
        ValueError("linger_ms >= 0"),
        TimeoutError("raised by the work itself"),
    ],
)
def test_errors_cross_the_thread_as_the_same_object(bridge: LoopThread, error: Exception) -> None:
    """An exception raised on the loop reaches the caller unchanged: the same object,
    with its fields (e.g. the status code) intact, not wrapped or re-typed."""

    async def fail() -> None:
        raise error

    with pytest.raises(type(error)) as caught:
        bridge.run(fail())
    assert caught.value is error
    assert bridge.run(asyncio.sleep(0, "still usable")) == "still usable"


def test_timeout_cancels_the_work_and_keeps_the_bridge(bridge: LoopThread) -> None:
    """Scenario: run a coroutine that never finishes with timeout 0.1 s. Expected:
    TimeoutError after ~0.1 s, the coroutine is cancelled on the loop, the bridge works."""
    started, cancelled = threading.Event(), threading.Event()
    began = time.monotonic()
    with pytest.raises(TimeoutError):
        bridge.run(wait_forever(started, cancelled), timeout=0.1)
    assert time.monotonic() - began < 5
    assert cancelled.wait(5)
    assert bridge.run(asyncio.sleep(0, 7)) == 7


def test_keyboard_interrupt_cancels_the_work(bridge: LoopThread) -> None:
    """Scenario: Ctrl-C (SIGINT) while the main thread waits in run(). Expected:
    KeyboardInterrupt in the caller, and the coroutine on the loop is cancelled rather than
    left running."""
    started, cancelled = threading.Event(), threading.Event()
    with sigint_once(started), pytest.raises(KeyboardInterrupt):
        bridge.run(wait_forever(started, cancelled), timeout=30)
    assert cancelled.wait(5)
    assert bridge.run(asyncio.sleep(0, "ok")) == "ok"


def test_closed_bridge_refuses_work_and_closes_the_coroutine() -> None:
    """Scenario: close a bridge twice, then submit work and a closing coroutine. Expected:
    ClientClosed, and the refused coroutines are closed unrun (no 'never awaited'
    warning, which filterwarnings=error would turn into a failure)."""
    bridge = LoopThread("Thing", "AsyncThing")
    assert bridge.run(asyncio.sleep(0, 1)) == 1
    bridge.close()
    bridge.close()
    refused = asyncio.sleep(0)
    with pytest.raises(ClientClosed, match="the Thing is closed"):
        bridge.run(refused)
    assert inspect.getcoroutinestate(refused) == inspect.CORO_CLOSED
    last = asyncio.sleep(0)
    bridge.close(last)
    assert inspect.getcoroutinestate(last) == inspect.CORO_CLOSED


def test_close_cancels_a_waiting_call_with_client_closed() -> None:
    """Scenario: one thread waits in run() on work that never ends; another closes the
    bridge. Expected: the waiter gets ClientClosed (not a bare CancelledError), the work
    saw CancelledError, and close returns after joining the loop thread."""
    before = loop_threads()
    bridge = LoopThread("Thing", "AsyncThing")
    started, cancelled = threading.Event(), threading.Event()
    outcome: list[BaseException] = []

    def waiter() -> None:
        try:
            bridge.run(wait_forever(started, cancelled))
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=waiter)
    thread.start()
    assert started.wait(5)
    (loop_thread,) = loop_threads() - before
    bridge.close()
    assert not loop_thread.is_alive()
    thread.join(5)
    assert [type(e) for e in outcome] == [ClientClosed]
    assert cancelled.is_set()


def test_blocking_from_a_thread_running_a_loop_raises(bridge: LoopThread) -> None:
    """Scenario: run() from inside asyncio.run(), run() and close() from the bridge's own
    loop. Expected: RuntimeError naming the async twin each time, instead of a deadlock;
    the bridge still works afterwards."""

    async def from_async_code() -> None:
        with pytest.raises(RuntimeError, match="use AsyncThing instead"):
            bridge.run(asyncio.sleep(0))

    asyncio.run(from_async_code())

    async def reenter() -> None:
        bridge.run(asyncio.sleep(0))

    async def close_itself() -> None:
        bridge.close()

    with pytest.raises(RuntimeError, match="headrace-Thing-loop"):
        bridge.run(reenter())
    with pytest.raises(RuntimeError, match="AsyncThing"):
        bridge.run(close_itself())
    assert not bridge.closed
    assert bridge.run(asyncio.sleep(0, "alive")) == "alive"


def test_call_runs_a_plain_function_on_the_loop_thread(bridge: LoopThread) -> None:
    """call() runs a sync function (like AsyncConsumer.ack, which touches loop state) on
    the loop thread, with its arguments; its error comes back unchanged and leaves the
    bridge open."""

    def where(prefix: str, *, suffix: str) -> str:
        asyncio.get_running_loop()  # raises RuntimeError off the loop
        return prefix + threading.current_thread().name + suffix

    assert bridge.call(where, "<", suffix=">") == "<headrace-Thing-loop>"
    error = ClientClosed("the consumer is closed")

    def fail() -> None:
        raise error

    with pytest.raises(ClientClosed) as caught:
        bridge.call(fail)
    assert caught.value is error
    assert not bridge.closed


def test_create_failure_closes_the_bridge() -> None:
    """A factory that raises (a constructor rejecting its arguments) re-raises the error
    and leaves the bridge closed with its thread joined."""
    before = loop_threads()
    bridge = LoopThread("Thing", "AsyncThing")

    def factory(size: int) -> int:
        raise ValueError(f"size {size} < 1")

    with pytest.raises(ValueError, match="size 0 < 1"):
        bridge.create(factory, 0)
    assert bridge.closed
    assert loop_threads() == before


class LoopBoundCounter:
    """An async iterable that, like a gRPC stream, only works on a running loop."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __aiter__(self) -> AsyncIterator[tuple[int, str]]:
        asyncio.get_running_loop()  # raises RuntimeError off the loop
        return self._items()

    async def _items(self) -> AsyncIterator[tuple[int, str]]:
        for i in range(self.n):
            await asyncio.sleep(0)
            yield i, threading.current_thread().name


def test_iterate_yields_every_item_from_the_loop_in_order(bridge: LoopThread) -> None:
    """Iterating a loop-bound async iterable from sync code yields 0..4 in order, each
    produced on the bridge's loop thread, then stops."""
    got = list(bridge.iterate(LoopBoundCounter(5)))
    assert [i for i, _ in got] == [0, 1, 2, 3, 4]
    assert {name for _, name in got} == {"headrace-Thing-loop"}


def test_closing_the_iterator_early_closes_the_async_generator(bridge: LoopThread) -> None:
    """Scenario: take one item of an endless async generator, then close the sync iterator.
    Expected: the async generator's finally runs, on the loop thread, and no more items
    are pulled than were asked for."""
    pulled: list[int] = []
    finalized: list[str] = []

    async def endless() -> AsyncIterator[int]:
        try:
            i = 0
            while True:
                pulled.append(i)
                yield i
                i += 1
        finally:
            finalized.append(threading.current_thread().name)

    with closing(bridge.iterate(endless())) as items:
        assert next(items) == 0
    assert finalized == ["headrace-Thing-loop"]
    assert pulled == [0]


class SelfIterating:
    """Like AsyncConsumer: its own async iterator, with an aclose() that ends it for good."""

    def __init__(self) -> None:
        self.closed = False
        self.n = 0

    def __aiter__(self) -> SelfIterating:
        return self

    async def __anext__(self) -> int:
        if self.closed:
            raise StopAsyncIteration
        self.n += 1
        return self.n

    async def aclose(self) -> None:
        self.closed = True


def test_leaving_a_loop_over_a_self_iterating_client_keeps_it_open(bridge: LoopThread) -> None:
    """Scenario: break out of ``for x in iterate(client)`` where the client is its own
    async iterator with an aclose(). Expected: the client is not closed (as after an
    ``async for``), and a second loop continues where the first stopped."""
    client = SelfIterating()
    with closing(bridge.iterate(client)) as items:
        assert next(items) == 1
    assert not client.closed
    with closing(bridge.iterate(client)) as items:
        assert next(items) == 2


def test_iterate_raises_the_iterators_error_unchanged(bridge: LoopThread) -> None:
    """An async iterator that fails after one item: the item arrives, then the same
    exception object is raised from next()."""
    error = NotFound("subscription 's' does not exist", grpc.StatusCode.NOT_FOUND)

    async def one_then_fail() -> AsyncIterator[int]:
        yield 1
        raise error

    items = bridge.iterate(one_then_fail())
    assert next(items) == 1
    with pytest.raises(NotFound) as caught:
        next(items)
    assert caught.value is error


def test_interrupting_iterate_cancels_then_closes_the_generator(
    bridge: LoopThread, caplog: pytest.LogCaptureFixture
) -> None:
    """Scenario: Ctrl-C while next() waits on an async generator whose cleanup itself
    awaits. Expected: KeyboardInterrupt; the generator is cancelled and its cleanup runs
    once, to the end; closing it does not collide with that cleanup (no warning)."""
    caplog.set_level(logging.WARNING, logger="client._sync._bridge")
    started = threading.Event()
    finalized: list[str] = []

    async def slow() -> AsyncIterator[int]:
        try:
            yield 1
            started.set()
            await asyncio.sleep(3600)
            yield 2
        finally:
            await asyncio.sleep(0.05)  # still unwinding when the caller is interrupted
            finalized.append("done")

    items = bridge.iterate(slow())
    assert next(items) == 1
    with sigint_once(started), pytest.raises(KeyboardInterrupt):
        next(items)
    assert finalized == ["done"]
    assert caplog.records == []
    with pytest.raises(StopIteration):
        next(items)


def test_to_concurrent_settles_like_its_source(bridge: LoopThread) -> None:
    """A concurrent future made from an asyncio future gets its result or its very
    exception; cancelling the asyncio future shows as CancelledError; cancel() on the
    concurrent one is refused (the work has started)."""
    error = ResourceExhausted("record over max_record_bytes")

    async def settle_later(
        outcome: int | BaseException | None,
    ) -> concurrent.futures.Future[int]:
        source: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        loop = asyncio.get_running_loop()
        if outcome is None:
            loop.call_later(0.02, source.cancel)
        elif isinstance(outcome, BaseException):
            loop.call_later(0.02, source.set_exception, outcome)
        else:
            loop.call_later(0.02, source.set_result, outcome)
        return to_concurrent(source)

    ok = bridge.run(settle_later(42))
    assert not ok.cancel()
    assert ok.result(5) == 42
    assert bridge.run(settle_later(error)).exception(5) is error
    with pytest.raises(concurrent.futures.CancelledError):
        bridge.run(settle_later(None)).result(5)


# -- parity with the async classes -----------------------------------------------------


def _public_methods(cls: type) -> set[str]:
    return {n for n in dir(cls) if not n.startswith("_") and inspect.isfunction(getattr(cls, n))}


@pytest.mark.parametrize(
    ("async_cls", "sync_cls", "own"),
    [
        (AsyncProducer, Producer, set()),
        (AsyncAdminClient, AdminClient, set()),
        (AsyncConsumer, Consumer, set()),
        (AsyncFetcher, Fetcher, {"fetch_ahead"}),
    ],
    ids=["Producer", "AdminClient", "Consumer", "Fetcher"],
)
def test_every_async_method_has_a_twin_with_the_same_parameters(
    async_cls: type, sync_cls: type, own: set[str]
) -> None:
    """Scenario: the public methods and constructor parameters of each async class and its
    blocking twin, the hand-written parts of a twin included (the generator checks only
    its generated block). Expected: the same public methods (close for aclose; the
    Fetcher also has fetch_ahead), each with identical parameters, and the same
    constructor apart from ``channel``. Adding a method to the async class fails this
    until the twin has it."""
    plumbing = next((t.plumbing for t in TWINS if t.async_cls is async_cls), frozenset())
    methods = _public_methods(async_cls) - plumbing - {"aclose"}
    assert _public_methods(sync_cls) == methods | {"close"} | own
    for name in methods:
        async_params = inspect.signature(getattr(async_cls, name)).parameters
        sync_params = inspect.signature(getattr(sync_cls, name)).parameters
        assert list(sync_params.values()) == list(async_params.values()), name
    async_init = dict(inspect.signature(async_cls).parameters)
    del async_init["channel"]
    assert dict(inspect.signature(sync_cls).parameters) == async_init


def test_the_generated_twins_are_current() -> None:
    """Scenario: ``python -m client._sync._generate --check`` on the tree (what ``make
    lint`` is to run). Expected: exit 0 and no output: every bridged twin's generated
    block is what the generator writes from its async class today."""
    done = subprocess.run(
        [sys.executable, "-m", "client._sync._generate", "--check"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")


def test_a_stale_twin_fails_the_check_and_names_its_file(tmp_path: Path) -> None:
    """Scenario: the AdminClient module with one forwarded method deleted from its
    generated block, and with a parameter of another renamed, rendered again. Expected:
    the rendering differs from the edited text and equals the committed module (so
    ``--check`` fails on either edit and a plain run repairs it); a module without the
    marker lines is refused by name."""
    twin = next(t for t in TWINS if t.name == "AdminClient")
    text = twin.path.read_text()
    start = text.index("    def list_topics(self)")
    end = text.index("    def describe_topic(")
    dropped = text[:start] + text[end:]
    renamed = text.replace(
        "def describe_topic(self, name: str)", "def describe_topic(self, n: str)"
    )
    for edited in (dropped, renamed):
        assert edited != text
        assert render(twin, edited) == text
    with pytest.raises(SystemExit, match="marker lines are missing"):
        render(twin, text.replace(END, "    # the end"))


# -- Producer and AdminClient against a broker ----------------------------------------


def test_admin_client_round_trip(broker_address: str) -> None:
    """Create, list, describe and delete through the blocking AdminClient; creating twice
    raises AlreadyExists and describing a deleted topic raises NotFound."""
    with AdminClient(broker_address) as admin:
        created = admin.create_topic("events", 3)
        assert (created.name, len(created.partitions)) == ("events", 3)
        with pytest.raises(AlreadyExists, match="already exists"):
            admin.create_topic("events", 1)
        assert [t.name for t in admin.list_topics()] == ["events"]
        assert [p.head for p in admin.describe_topic("events").partitions] == [0, 0, 0]
        admin.delete_topic("events")
        with pytest.raises(NotFound, match="does not exist") as caught:
            admin.describe_topic("events")
        assert caught.value.code == grpc.StatusCode.NOT_FOUND


def test_published_records_are_stored_and_counted(broker_address: str) -> None:
    """Scenario: publish 60 records over 6 keys to a 3-partition topic with the blocking
    Producer. Expected: each ack names partition crc32c(key) % 3; describe_topic's heads
    equal the records per partition; each partition stores its values in publish order."""
    with AdminClient(broker_address) as admin:
        admin.create_topic("orders", 3)
        with Producer(broker_address, linger_ms=1) as producer:
            acks = [
                producer.publish("orders", f"v{i}".encode(), key=f"k{i % 6}".encode())
                for i in range(60)
            ]
        heads = [p.head for p in admin.describe_topic("orders").partitions]
    for i, ack in enumerate(acks):
        assert ack.partition == partition_for(f"k{i % 6}".encode(), 3)
    for p in range(3):
        mine = [f"v{i}".encode() for i, a in enumerate(acks) if a.partition == p]
        assert heads[p] == len(mine)
        assert fetch_values(broker_address, "orders", p) == mine
    assert sum(heads) == 60


def test_send_returns_concurrent_futures_that_resolve_in_order(broker_address: str) -> None:
    """Scenario: send 300 records to one partition without waiting, then flush. Expected:
    send returns running concurrent futures (cancel() refused) that all resolve after the
    flush, with offsets 0..299 in send order."""
    with AdminClient(broker_address) as admin:
        admin.create_topic("fast", 1)
    with Producer(broker_address, linger_ms=20) as producer:
        futures = [producer.send("fast", f"{i}".encode()) for i in range(300)]
        assert all(isinstance(f, concurrent.futures.Future) for f in futures)
        assert not futures[-1].cancel()
        producer.flush()
        assert all(f.done() for f in futures)
        acks = [f.result() for f in futures]
    assert acks == [RecordMetadata("fast", 0, i) for i in range(300)]
    assert fetch_values(broker_address, "fast", 0) == [f"{i}".encode() for i in range(300)]


def test_one_producer_is_shared_by_threads(broker_address: str) -> None:
    """Scenario: 4 threads publish 50 records each through one Producer. Expected: every
    record acknowledged once, offsets exactly 0..199, and each thread's own records in its
    publish order."""
    with AdminClient(broker_address) as admin:
        admin.create_topic("shared", 1)
    with (
        Producer(broker_address, linger_ms=2) as producer,
        concurrent.futures.ThreadPoolExecutor(4) as pool,
    ):

        def publish_many(worker: int) -> list[int]:
            return [producer.publish("shared", b"%d" % worker).offset for _ in range(50)]

        per_thread = list(pool.map(publish_many, range(4)))
    assert sorted(o for offsets in per_thread for o in offsets) == list(range(200))
    assert all(offsets == sorted(offsets) for offsets in per_thread)


def test_errors_are_the_client_error_subclasses(broker_address: str) -> None:
    """Each failure arrives as its ClientError subclass with its status code: a missing
    topic (NotFound, from send, publish, describe and delete), an oversized record
    (ResourceExhausted, in the send future), a bad partition and bad settings
    (ValueError, leaving no loop thread behind)."""
    before = loop_threads()
    with AdminClient(broker_address) as admin, Producer(broker_address) as producer:
        for call in (
            lambda: producer.send("missing", b"x"),
            lambda: producer.publish("missing", b"x"),
            lambda: admin.describe_topic("missing"),
            lambda: admin.delete_topic("missing"),
        ):
            with pytest.raises(NotFound) as caught:
                call()
            assert caught.value.code == grpc.StatusCode.NOT_FOUND
        admin.create_topic("limits", 2)
        failed = producer.send("limits", b"x" * (2 << 20), partition=0).exception(10)
        assert isinstance(failed, ResourceExhausted)
        assert "max_record_bytes" in str(failed)
        with pytest.raises(ValueError, match="partitions 0-1, not 5"):
            producer.send("limits", b"x", partition=5)
        assert producer.publish("limits", b"fine", partition=0).offset == 0
    with pytest.raises(ValueError, match="linger_ms"):
        Producer(broker_address, linger_ms=-1)
    assert loop_threads() == before


def test_close_is_idempotent_and_later_calls_raise_client_closed(broker_address: str) -> None:
    """Scenario: close a Producer and an AdminClient twice, then call every method.
    Expected: the second close is a no-op, each call raises ClientClosed, and both loop
    threads are gone."""
    before = loop_threads()
    admin = AdminClient(broker_address)
    admin.create_topic("t", 1)
    producer = Producer(broker_address)
    producer.publish("t", b"x")
    assert len(loop_threads() - before) == 2
    for client in (producer, admin):
        client.close()
        client.close()
    calls: list[Callable[[], object]] = [
        lambda: producer.send("t", b"x"),
        lambda: producer.publish("t", b"x"),
        producer.flush,
        admin.list_topics,
        lambda: admin.create_topic("u"),
        lambda: admin.describe_topic("t"),
        lambda: admin.delete_topic("t"),
    ]
    for call in calls:
        with pytest.raises(ClientClosed, match="is closed"):
            call()
    assert loop_threads() == before


def test_leaving_the_with_block_flushes_then_closes(broker_address: str) -> None:
    """Records sent but not awaited inside ``with Producer(...)`` are acknowledged by the
    time the block exits (close flushes); afterwards the producer raises ClientClosed."""
    with AdminClient(broker_address) as admin:
        admin.create_topic("late", 1)
    with Producer(broker_address, linger_ms=200) as producer:
        futures = [producer.send("late", b"x") for _ in range(10)]
        assert not any(f.done() for f in futures)
    assert [f.result(0).offset for f in futures] == list(range(10))
    with pytest.raises(ClientClosed):
        producer.publish("late", b"y")


def test_blocking_clients_refuse_a_running_loop(broker_address: str) -> None:
    """Scenario: construct and call the blocking clients inside asyncio.run(). Expected:
    RuntimeError naming the async class each time, nothing is half-closed, and the
    producer made outside still works afterwards."""
    with AdminClient(broker_address) as admin:
        admin.create_topic("t", 1)
    producer = Producer(broker_address)

    async def misuse() -> None:
        with pytest.raises(RuntimeError, match="use AsyncProducer instead"):
            Producer(broker_address)
        with pytest.raises(RuntimeError, match="use AsyncAdminClient instead"):
            AdminClient(broker_address)
        with pytest.raises(RuntimeError, match="use AsyncProducer instead"):
            producer.publish("t", b"x")
        with pytest.raises(RuntimeError, match="use AsyncProducer instead"):
            producer.close()

    asyncio.run(misuse())
    try:
        assert producer.publish("t", b"after").offset == 0
    finally:
        producer.close()


def test_a_blocking_consumer_refuses_a_running_loop_even_with_messages_at_hand(
    broker_address: str,
) -> None:
    """Scenario: a blocking Consumer takes one of 10 records (the rest wait in its
    read-ahead), then receive, receive_batch, ack and close are called inside
    asyncio.run(). Expected: RuntimeError naming AsyncConsumer each time (never a message
    from the read-ahead); outside the loop, receive then gives record 1 and close works."""
    _produce(broker_address, "sync-loop", 10)
    consumer = Consumer("sync-loop", "s", broker=broker_address)
    first = consumer.receive(timeout=10)

    async def misuse() -> None:
        for call in (consumer.receive, consumer.receive_batch, consumer.close):
            with pytest.raises(RuntimeError, match="use AsyncConsumer instead"):
                call()
        with pytest.raises(RuntimeError, match="use AsyncConsumer instead"):
            consumer.ack(first)

    asyncio.run(misuse())
    try:
        assert consumer.receive(timeout=10).value == b"1"
    finally:
        consumer.close()


def test_a_done_callback_cannot_block_on_its_own_producer(broker_address: str) -> None:
    """Scenario: a send future's done callback (run on the producer's loop thread) calls
    publish. Expected: RuntimeError in the callback instead of a deadlock, and the
    original record is still acknowledged."""
    with AdminClient(broker_address) as admin:
        admin.create_topic("cb", 1)
    seen: list[tuple[str, BaseException]] = []
    called = threading.Event()
    with Producer(broker_address, linger_ms=200) as producer:

        def callback(_: concurrent.futures.Future[RecordMetadata]) -> None:
            try:
                producer.publish("cb", b"again")
            except ClientError:
                pass
            except RuntimeError as exc:
                seen.append((threading.current_thread().name, exc))
            called.set()

        future = producer.send("cb", b"first")
        future.add_done_callback(callback)
        assert called.wait(10)
        assert future.result().offset == 0
    assert len(seen) == 1
    assert seen[0][0] == "headrace-Producer-loop"
    assert "use AsyncProducer instead" in str(seen[0][1])


def test_subscription_admin_calls_reach_the_broker(broker_address: str) -> None:
    """The subscription twins call through: a topic with no subscriptions lists none,
    describing an unknown subscription raises NotFound, and seek with two targets raises
    ValueError from the async client before any RPC."""
    with AdminClient(broker_address) as admin:
        admin.create_topic("subs", 2)
        assert admin.list_subscriptions("subs") == []
        with pytest.raises(NotFound):
            admin.describe_subscription("subs", "nobody")
        with pytest.raises(ValueError, match="exactly one"):
            admin.seek("subs", "nobody", earliest=True, offset=3)


def test_consumer_iterates_acks_and_times_out(broker_address: str) -> None:
    """Produce 20 records, read them with the blocking Consumer (a for loop, then
    receive), ack each; the cursor reaches 20; an idle receive times out; leaving the for
    loop keeps the consumer open."""
    with AdminClient(broker_address) as admin:
        admin.create_topic("sync-consume", 1)
    with Producer(broker_address, linger_ms=1) as producer:
        for i in range(20):
            producer.send("sync-consume", b"%d" % i)
    got: list[bytes] = []
    with Consumer("sync-consume", "s", broker=broker_address) as consumer:
        for message in consumer:
            got.append(message.value)
            consumer.ack(message)
            if len(got) == 10:
                break
        while len(got) < 20:
            message = consumer.receive(timeout=5)
            got.append(message.value)
            consumer.ack(message)
        with pytest.raises(TimeoutError):
            consumer.receive(timeout=0.05)
    assert got == [b"%d" % i for i in range(20)]
    with AdminClient(broker_address) as admin:
        info = admin.describe_subscription("sync-consume", "s")
    assert [(p.cursor, p.lag) for p in info.partitions] == [(20, 0)]


def _produce(broker_address: str, topic: str, count: int) -> None:
    with AdminClient(broker_address) as admin:
        admin.create_topic(topic, 1)
    with Producer(broker_address, linger_ms=5) as producer:
        for i in range(count):
            producer.send(topic, b"%d" % i)


def _cursors(broker_address: str, topic: str) -> list[int]:
    with AdminClient(broker_address) as admin:
        return [p.cursor for p in admin.describe_subscription(topic, "s").partitions]


def test_the_sync_consumer_takes_and_acks_without_a_trip_per_message(
    broker_address: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Scenario: 1,000 records, taken with ``for message in consumer`` and acked one by
    one (receive_queue 1,000: up to 250 read ahead a trip). Expected: at most 40 blocking
    trips to the loop thread for all of it (one a message and one an ack would be 2,000);
    every record in order; the cursor at 1,000 after close (every queued ack was sent)."""
    _produce(broker_address, "sync-fast", 1_000)
    trips = 0
    run = LoopThread.run

    def counted(self: LoopThread, coro: Any, timeout: float | None = None) -> Any:
        nonlocal trips
        trips += 1
        return run(self, coro, timeout)

    got: list[int] = []
    with Consumer("sync-fast", "s", broker=broker_address, receive_queue=1_000) as consumer:
        monkeypatch.setattr(LoopThread, "run", counted)
        for message in consumer:
            got.append(message.offset)
            consumer.ack(message)
            if len(got) == 1_000:
                break
        monkeypatch.setattr(LoopThread, "run", run)
    assert got == list(range(1_000))
    assert trips <= 40
    assert _cursors(broker_address, "sync-fast") == [1_000]


def test_threads_sharing_a_sync_consumer_each_get_other_messages(broker_address: str) -> None:
    """Scenario: 2,000 records; four threads take from one blocking Consumer (``receive``
    with a 1 s timeout, until it times out) and ack each message, half of them one by one
    and half with ``ack_many``. Expected: every offset handed out exactly once across the
    threads; the cursor at 2,000 after close."""
    _produce(broker_address, "sync-threads", 2_000)
    taken: list[list[int]] = [[] for _ in range(4)]
    with Consumer("sync-threads", "s", broker=broker_address) as consumer:

        def take(mine: list[int], one_by_one: bool) -> None:
            while True:
                try:
                    message = consumer.receive(timeout=1)
                except TimeoutError:
                    return
                mine.append(message.offset)
                if one_by_one:
                    consumer.ack(message)
                else:
                    consumer.ack_many([message])

        threads = [
            threading.Thread(target=take, args=(mine, i % 2 == 0)) for i, mine in enumerate(taken)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
    assert sorted(o for mine in taken for o in mine) == list(range(2_000))
    assert _cursors(broker_address, "sync-threads") == [2_000]


def test_a_closed_sync_consumer_refuses_acks_and_ends_iteration(broker_address: str) -> None:
    """Scenario: a blocking Consumer takes one of 10 records, then is closed. Expected:
    acking it raises ClientClosed (the broker sends it again); ``receive`` raises
    ClientClosed; a ``for`` loop over it ends at once, with nothing handed out. A new
    consumer's ``receive_batch(0)`` and ``receive(timeout=nan)`` raise ValueError, and
    nothing was acked."""
    _produce(broker_address, "sync-closed", 10)
    consumer = Consumer("sync-closed", "s", broker=broker_address)
    message = consumer.receive(timeout=10)
    consumer.close()
    with pytest.raises(ClientClosed):
        consumer.ack(message)
    with pytest.raises(ClientClosed):
        consumer.receive(timeout=1)
    assert list(consumer) == []
    with Consumer("sync-closed", "s", broker=broker_address) as again:
        with pytest.raises(ValueError, match="max_messages must be at least 1"):
            again.receive_batch(0)
        with pytest.raises(ValueError, match="timeout must be a number of seconds >= 0"):
            again.receive(timeout=float("nan"))
    assert _cursors(broker_address, "sync-closed") == [0]


def test_the_sync_consumer_gives_up_after_connect_timeout() -> None:
    """The blocking twin takes the same setting and raises the same error."""
    consumer = Consumer("t", "s", broker=f"127.0.0.1:{free_port()}", connect_timeout=0.3)
    try:
        with pytest.raises(Unavailable, match=r"could not be reached for 0\.3 s"):
            consumer.start()
    finally:
        consumer.close()
