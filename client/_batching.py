"""Per-record batches and their futures: what ``send`` queues and what it hands back.

Role: the part of record batching that :class:`~client.AsyncProducer` (on its loop) and
:class:`~client.Producer` (on the callers' threads) share.

- :class:`PendingBatch` collects records for one partition column by column, encodes them
  as one batch, and holds the batch's outcome: the broker's answer or the error.
- ``send`` returns one handle per record, :class:`RecordFuture` (asyncio) or
  :class:`ThreadRecordFuture` (a ``concurrent.futures.Future``). A handle is two fields,
  the batch and the record's index. Its :class:`RecordMetadata` is made when someone asks
  for it, and a real future (one per record, with its own callbacks) only when someone
  awaits it, adds a callback or waits on it. Settling a batch is one step, not one per
  record: a producer that sends thousands of records a batch and checks them at the end
  pays no per-record future.
- :class:`BufferBudget`: the bytes of records queued and not yet acknowledged, shared by
  the loop thread and the callers' threads, so one ``buffer_max_bytes`` bounds both.

Thread safety: a batch is filled by one owner at a time (the loop, or a caller thread
under the sync producer's lock) and settled on the loop thread; its lock orders settling
against a caller thread making a handle's real future.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable, Generator
from contextvars import Context
from typing import Any

from client._types import RecordMetadata
from client.errors import ClientError
from proto import broker_pb2 as _pb
from proto.batch import Headers, encode_columns

RECORD_OVERHEAD = 16  # bytes a record counts for beyond its key and value


class BufferBudget:
    """Bytes queued and not yet acknowledged, against ``limit``.

    Two counters, so the loop's own per-record count takes no lock: :attr:`loop_used` is
    written only on the loop thread, :attr:`thread_used` only under :attr:`lock` (the
    blocking producer holds it while it queues a record, so a record and its bytes are
    counted in one step). Either is read without a lock: an ``int`` is read whole.
    :attr:`cond` is a condition on :attr:`lock`, for threads waiting for room.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.loop_used = 0
        self.thread_used = 0
        self.lock = threading.Lock()
        self.cond = threading.Condition(self.lock)
        self._waiting = 0  # threads in wait_for_room, guarded by cond

    @property
    def used(self) -> int:
        return self.loop_used + self.thread_used

    def full(self) -> bool:
        """True while no record may be added."""
        return self.loop_used + self.thread_used >= self.limit

    def wait_for_room(self, give_up: Callable[[], bool]) -> None:
        """Block until there is room or ``give_up()``. Hold :attr:`lock`."""
        while self.loop_used + self.thread_used >= self.limit and not give_up():
            self._waiting += 1
            try:
                self.cond.wait()
            finally:
                self._waiting -= 1

    def release(self, size: int, *, by_thread: bool) -> None:
        """``size`` bytes were acknowledged or failed; wake threads waiting for room. On
        the loop thread. ``by_thread``: a caller thread counted them (:attr:`thread_used`)."""
        # Under the lock either way: a thread that found the buffer full holds it until
        # its wait begins, so a release cannot slip between its check and its wait
        # unseen. One lock per batch, not per record.
        with self.lock:
            if by_thread:
                self.thread_used -= size
            else:
                self.loop_used -= size
            if self._waiting:
                self.cond.notify_all()

    def wake_all(self) -> None:
        """Wake every thread waiting for room, to look at ``give_up()`` again."""
        with self.lock:
            self.cond.notify_all()


class PendingBatch:
    """Records for one partition, added one by one, published as one batch.

    Args:
        topic: The topic, for the records' :class:`RecordMetadata`.
        loop: The loop whose futures :class:`RecordFuture` hands out (None: no asyncio
            handles, the blocking producer's batches).
    """

    __slots__ = (
        "_lock",
        "_watchers",
        "base_offset",
        "done",
        "duplicate",
        "error",
        "has_headers",
        "headers",
        "keys",
        "loop",
        "opened",
        "partition",
        "size",
        "timestamps",
        "topic",
        "values",
    )

    def __init__(self, topic: str, loop: asyncio.AbstractEventLoop | None) -> None:
        self.topic = topic
        self.loop = loop
        self.values: list[bytes] = []
        self.keys: list[bytes | None] = []
        self.headers: list[Headers] = []
        self.timestamps: list[int] = []
        self.size = 0
        self.has_headers = False
        self.opened = 0.0  # when the first record came (monotonic), for linger
        self.done = False
        self.partition = -1
        self.base_offset = -1
        self.duplicate = False
        self.error: ClientError | None = None
        self._lock = threading.Lock()
        self._watchers: list[RecordFuture | ThreadRecordFuture] = []

    @property
    def count(self) -> int:
        return len(self.values)

    def add(self, value: bytes, key: bytes | None, headers: Headers | None, ts: int) -> int:
        """Append one record; returns its size in bytes as the buffers count it.

        The key and header columns start with the first record that has one (the ones
        before get ``None`` and no headers), so a batch without keys encodes as one.
        """
        values = self.values
        if key is not None:
            if len(self.keys) < len(values):
                self.keys += [None] * (len(values) - len(self.keys))
            self.keys.append(key)
        elif self.keys:
            self.keys.append(None)
        if headers:
            if not self.has_headers:
                self.has_headers = True
                self.headers = [{} for _ in values]
            self.headers.append(headers)
        elif self.has_headers:
            self.headers.append({})
        values.append(value)
        self.timestamps.append(ts)
        size = len(value) + (len(key) if key is not None else 0) + RECORD_OVERHEAD
        self.size += size
        return size

    def encode(self, producer_id: int, base_sequence: int) -> bytes:
        """The records as one wire batch. Once only: the columns are let go (so a future
        kept for a record keeps no batch of values alive), and :attr:`count` is then 0."""
        try:
            return encode_columns(
                self.values,
                keys=self.keys or None,  # once a key came, one entry per record
                timestamps_ms=self.timestamps,
                headers=self.headers if self.has_headers else None,
                producer_id=producer_id,
                base_sequence=base_sequence,
            )
        finally:
            self.values, self.keys, self.headers, self.timestamps = [], [], [], []

    def resolve(self, topic: str, response: _pb.PublishResponse) -> None:
        """The broker acknowledged the batch (``topic`` is this batch's own)."""
        self._settle(response.partition, response.base_offset, response.duplicate, None)

    def fail(self, exc: ClientError) -> None:
        """The batch failed: every record's future fails with ``exc``."""
        self._settle(-1, -1, False, exc)

    def metadata(self, index: int) -> RecordMetadata:
        """The acknowledged record's metadata (-1: a duplicate whose offsets are forgotten)."""
        base = self.base_offset
        offset = base + index if base >= 0 else -1
        return RecordMetadata(self.topic, self.partition, offset, self.duplicate)

    def outcome(self, index: int) -> RecordMetadata:
        """The record's metadata, or raise its error. Call once :attr:`done`."""
        if self.error is not None:
            raise self.error
        return self.metadata(index)

    def watch(self, handle: RecordFuture | ThreadRecordFuture) -> bool:
        """Settle ``handle``'s real future with the batch: False if the batch is done
        already (the caller settles it now)."""
        with self._lock:
            if self.done:
                return False
            self._watchers.append(handle)
            return True

    def _settle(
        self, partition: int, base: int, duplicate: bool, error: ClientError | None
    ) -> None:
        with self._lock:
            if self.done:
                return
            self.partition, self.base_offset, self.duplicate = partition, base, duplicate
            self.error = error
            self.done = True
            watchers, self._watchers = self._watchers, []
        for handle in watchers:
            handle.settle()


class _Relay:
    """A done callback of a :class:`RecordFuture`, registered on its real future: it
    calls ``fn`` with the handle, and equals any relay of the same ``fn`` (so
    ``remove_done_callback`` finds it)."""

    __slots__ = ("fn", "handle")

    def __init__(self, fn: Callable[[Any], object], handle: RecordFuture) -> None:
        self.fn = fn
        self.handle = handle

    def __call__(self, _: object) -> None:
        self.fn(self.handle)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Relay) and other.fn == self.fn

    def __hash__(self) -> int:
        return hash(self.fn)


class RecordFuture:
    """The asyncio future of one record sent with :meth:`AsyncProducer.send
    <client.AsyncProducer.send>`: it resolves to the record's :class:`RecordMetadata`
    once the broker acknowledged its batch, or fails with the batch's ``ClientError``.

    It is awaitable and has the methods of an ``asyncio.Future`` (``done``, ``result``,
    ``exception``, ``cancelled``, ``cancel``, ``add_done_callback``,
    ``remove_done_callback``, ``get_loop``), and asyncio treats it as a future
    (``asyncio.isfuture`` is true), so ``asyncio.gather``, ``wait`` and ``wait_for`` take
    it as it is. Cancelling it stops nobody waiting for it from getting
    ``CancelledError``, but does not withdraw the record.
    """

    __slots__ = ("_batch", "_future", "_index")
    _asyncio_future_blocking = False  # asyncio's mark of a future-like object

    def __init__(self, batch: PendingBatch, index: int) -> None:
        self._batch = batch
        self._index = index
        self._future: asyncio.Future[RecordMetadata] | None = None

    def _real(self) -> asyncio.Future[RecordMetadata]:
        future = self._future
        if future is None:
            loop = self._batch.loop
            assert loop is not None, "a RecordFuture needs a batch made on a loop"
            future = self._future = loop.create_future()
            if not self._batch.watch(self):
                self.settle()
        return future

    def settle(self) -> None:
        """Copy the batch's outcome to the real future (the batch calls it)."""
        future = self._future
        if future is None or future.done():
            return
        batch = self._batch
        if batch.error is not None:
            future.set_exception(batch.error)
        else:
            future.set_result(batch.metadata(self._index))

    def __await__(self) -> Generator[Any, None, RecordMetadata]:
        future = self._future
        if future is None and self._batch.done:
            return self._batch.outcome(self._index)
        return (yield from self._real().__await__())

    __iter__ = __await__

    def done(self) -> bool:
        future = self._future
        return future.done() if future is not None else self._batch.done

    def result(self) -> RecordMetadata:
        future = self._future
        if future is not None:
            return future.result()
        if not self._batch.done:
            raise asyncio.InvalidStateError("Result is not set.")
        return self._batch.outcome(self._index)

    def exception(self) -> BaseException | None:
        future = self._future
        if future is not None:
            return future.exception()
        if not self._batch.done:
            raise asyncio.InvalidStateError("Exception is not set.")
        return self._batch.error

    def cancelled(self) -> bool:
        future = self._future
        return future is not None and future.cancelled()

    def cancel(self, msg: Any | None = None) -> bool:
        return self._real().cancel(msg)

    def _make_cancelled_error(self) -> asyncio.CancelledError:
        """The error a cancelled future raises: asyncio's private method, which
        ``asyncio.gather`` calls on each child it holds once one is cancelled."""
        return self._real()._make_cancelled_error()  # type: ignore[attr-defined,no-any-return]

    def add_done_callback(
        self, fn: Callable[[RecordFuture], object], *, context: Context | None = None
    ) -> None:
        self._real().add_done_callback(_Relay(fn, self), context=context)

    def remove_done_callback(self, fn: Callable[[RecordFuture], object]) -> int:
        return self._real().remove_done_callback(_Relay(fn, self))

    def get_loop(self) -> asyncio.AbstractEventLoop:
        loop = self._batch.loop
        assert loop is not None
        return loop

    def __repr__(self) -> str:
        state = "pending" if not self.done() else "cancelled" if self.cancelled() else "done"
        return f"<RecordFuture {state} {self._batch.topic} record {self._index}>"


#: The attributes of ``concurrent.futures.Future.__init__``: reading one makes the real
#: future of a :class:`ThreadRecordFuture`.
_FUTURE_STATE = frozenset(
    {"_condition", "_state", "_result", "_exception", "_waiters", "_done_callbacks"}
)


class ThreadRecordFuture(concurrent.futures.Future[RecordMetadata]):
    """The ``concurrent.futures.Future`` of one record sent with :meth:`Producer.send
    <client.Producer.send>`: it holds the record's :class:`RecordMetadata` once the broker
    acknowledged its batch, or the batch's ``ClientError``.

    It is a ``concurrent.futures.Future`` in every respect (``result(timeout)``,
    callbacks, ``concurrent.futures.wait``), already running, so ``cancel()`` returns False.
    Its condition and state are made on first use; until then ``done()`` and, once done,
    ``result()`` and ``exception()`` read the batch.
    """

    __slots__ = ("_batch", "_index", "_made")  # the base's attributes go in __dict__

    def __init__(self, batch: PendingBatch, index: int) -> None:  # no super(): made lazily
        self._batch = batch
        self._index = index
        self._made = False

    def __getattr__(self, name: str) -> Any:
        if name not in _FUTURE_STATE:
            raise AttributeError(name)
        self._materialize()
        return object.__getattribute__(self, name)

    def _materialize(self) -> None:
        batch = self._batch
        with batch._lock:  # two threads may ask at once
            if self._made:
                return
            concurrent.futures.Future.__init__(self)
            self.set_running_or_notify_cancel()
            self._made = True
        if not batch.watch(self):
            self.settle()

    def settle(self) -> None:
        """Copy the batch's outcome to the real future (the batch calls it)."""
        batch = self._batch
        if super().done():
            return
        if batch.error is not None:
            self.set_exception(batch.error)
        else:
            self.set_result(batch.metadata(self._index))

    def done(self) -> bool:
        if not self._made:
            return self._batch.done
        return super().done()

    def running(self) -> bool:
        if not self._made:
            return not self._batch.done
        return super().running()

    def cancelled(self) -> bool:
        if not self._made:
            return False  # running from the start, so it cannot be cancelled
        return super().cancelled()

    def result(self, timeout: float | None = None) -> RecordMetadata:
        if not self._made and self._batch.done:
            return self._batch.outcome(self._index)
        return super().result(timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        if not self._made and self._batch.done:
            return self._batch.error
        return super().exception(timeout)
