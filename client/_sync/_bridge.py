"""LoopThread: blocking calls into a private event loop that runs on a daemon thread.

Role: let a sync client drive its async twin (and :class:`Blocking`, what every blocking
client is: a context manager that closes it). Each sync object owns one :class:`LoopThread`.
It builds the async object on the loop (``grpc.aio`` channels bind to the loop they are
created on) and runs every call there. The calling thread blocks on a
``concurrent.futures.Future``.

Invariants:

* Work for one object runs on one loop, in the order it was submitted.
* The bridge re-raises the coroutine's exception object as-is. A ``NotFound`` raised on
  the loop is the same ``NotFound`` the caller catches. The bridge raises only three errors
  of its own: ``ClientClosed`` (closed before or during the call), ``TimeoutError`` (the
  caller's ``timeout`` ran out) and ``RuntimeError`` (a blocking call from a thread that is
  running an event loop, which would deadlock or stall that loop).
* If the caller stops waiting (timeout, ``KeyboardInterrupt``), the work is cancelled on the
  loop and not left running. Example: ``run(coro, timeout=1)`` raises ``TimeoutError``
  after 1 s, and ``coro`` gets ``CancelledError`` at its current ``await``.
* A coroutine that the bridge refuses to run is closed, so it never warns "never awaited".

One loop per object, not a shared refcounted one, for three reasons. ``close()`` then stops
exactly this client's work and joins its thread, and its timing does not depend on other
clients. A slow done-callback or a large batch encode in one client cannot stall another.
And no module-level loop state is inherited across ``fork()`` (Spark forks Python workers):
a client made in the child gets a fresh thread. The cost is one mostly idle thread per live
client, and clients are long-lived.

Must not depend on ``grpc`` or ``proto``: it only knows coroutines and async iterators.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import enum
import functools
import inspect
import logging
import threading
from collections.abc import AsyncIterable, AsyncIterator, Callable, Coroutine, Generator
from types import TracebackType
from typing import Any, Generic, Literal, ParamSpec, Self, TypeVar

from client.errors import ClientClosed

logger = logging.getLogger(__name__)

T = TypeVar("T")
P = ParamSpec("P")


class _End(enum.Enum):
    """The marker :class:`_Pump` returns for an exhausted iterator."""

    END = enum.auto()


class Blocking:
    """What every blocking client is: a context manager whose exit calls its ``close``."""

    def close(self) -> None:
        """Release what the client holds; each client says what (idempotent)."""
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class LoopThread:
    """A private event loop on a daemon thread, started lazily by the first call.

    Thread-safe: any number of threads may call at once. A lock guards starting and
    closing, and the loop runs the submitted work one step at a time.

    Args:
        name: The sync class it serves, for the thread name and errors ("Producer").
        async_name: The async twin that errors point to ("AsyncProducer").
    """

    def __init__(self, name: str, async_name: str) -> None:
        self.name = name
        self.async_name = async_name
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._closed = False

    @property
    def closed(self) -> bool:
        """True once :meth:`close` has begun; nothing more is accepted."""
        return self._closed

    def create(self, factory: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Build a loop-bound object (the async twin) on the loop thread.

        Raises:
            Whatever ``factory`` raised. The bridge is then closed and its thread joined, so
            a failed constructor leaves no thread behind.
        """
        try:
            return self.call(factory, *args, **kwargs)
        except BaseException:
            self._stop()
            raise

    def call(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run a plain function on the loop thread and block until it returns.

        This is for methods of the async twin that are not coroutines but touch
        loop-owned state, e.g. ``AsyncConsumer.ack``. Errors are as for :meth:`run`.
        """
        return self.run(_invoke(functools.partial(fn, *args, **kwargs)))

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the loop and block until it finishes.

        Args:
            coro: The work, e.g. ``async_producer.publish(...)``.
            timeout: Seconds to wait, or None to wait as long as it takes.

        Returns:
            What ``coro`` returned.

        Raises:
            Exception: What ``coro`` raised, the same object. One exception to this: if
                ``coro`` is cancelled on the loop, the caller gets
                ``concurrent.futures.CancelledError``, or ``ClientClosed`` if :meth:`close`
                cancelled it.
            TimeoutError: ``timeout`` passed. ``coro`` was cancelled.
            KeyboardInterrupt: The waiting thread was interrupted. ``coro`` was cancelled.
            ClientClosed: The bridge was closed before or while ``coro`` ran.
            RuntimeError: This thread is running an event loop.
        """
        try:
            self.check_caller()
        except RuntimeError:
            coro.close()
            raise
        return self._wait(self._submit(coro), timeout)

    def iterate(self, iterable: AsyncIterable[T]) -> Generator[T, None, None]:
        """Iterate an async iterable from blocking code.

        Each ``next()`` asks the loop for one item and blocks until it arrives. ``aiter()``
        and every ``anext()`` run on the loop, so the iterator may use loop-bound objects.
        Nothing is read ahead: the loop takes no item the caller has not asked for.
        Closing the returned generator finalizes an async generator on the loop (its
        ``aclose()``). That happens on ``close()``, at the end of ``contextlib.closing``,
        or at garbage collection after a ``break``. Any other async iterator is left open,
        as a ``break`` out of ``async for`` leaves it. This matters when the iterator is the
        client itself: breaking out of ``for message in consumer`` must not close the
        consumer. If the caller is interrupted while it waits, the pending ``anext()`` is
        cancelled first, then an async generator is finalized.

        Raises:
            ClientClosed, RuntimeError: As :meth:`run`, at the call and at each ``next()``.
        """
        pump = self.run(_open(iterable))
        return self._drain(pump)

    def close(self, last: Coroutine[Any, Any, object] | None = None) -> None:
        """Run ``last`` (the twin's ``aclose()``), then stop the loop and join the thread.

        Idempotent: a closed bridge closes ``last`` unrun. Work still pending on the loop is
        cancelled, and any thread waiting for it gets ``ClientClosed``. If ``last`` fails,
        the bridge still stops, then the error is re-raised.

        Raises:
            RuntimeError: This thread is running an event loop. Nothing is closed.
        """
        try:
            self.check_caller()
        except RuntimeError:
            if last is not None:
                last.close()
            raise
        try:
            if last is not None:
                self._run_last(last)
        finally:
            self._stop()

    def check_caller(self) -> None:
        """Refuse to block a thread that runs an event loop, this bridge's own included.

        A per-record caller checks ``sys.get_asyncgen_hooks().firstiter is not None``
        first and calls this only then: every running event loop (asyncio's and uvloop's)
        installs async-generator hooks (PEP 525), so a thread with none runs no loop. That
        costs about 45 ns where ``asyncio.get_running_loop()`` raising costs about 180, and
        both are public API (``asyncio._get_running_loop`` is not).

        Raises:
            RuntimeError: This thread is running an event loop.
        """
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return
        raise RuntimeError(
            f"{self.name} is a blocking client and cannot be called from a thread that is "
            f"running an event loop (here: {threading.current_thread().name}); in async "
            f"code use {self.async_name} instead"
        )

    # -- internals ------------------------------------------------------------------

    def _submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Schedule ``coro`` on the loop and return at once, starting the loop if needed.

        Raises:
            ClientClosed: The bridge is closed (``coro`` is closed unrun).
        """
        try:
            with self._lock:
                if self._closed:
                    raise ClientClosed(f"the {self.name} is closed")
                return asyncio.run_coroutine_threadsafe(_carry(coro), self._start())
        except BaseException:
            coro.close()
            raise

    def _start(self) -> asyncio.AbstractEventLoop:
        """The loop, started on its thread on first use. Call with the lock held."""
        if self._loop is None:
            loop = asyncio.new_event_loop()
            thread = threading.Thread(
                target=self._serve, args=(loop,), name=f"headrace-{self.name}-loop", daemon=True
            )
            thread.start()
            self._loop, self._thread = loop, thread
        return self._loop

    def _serve(self, loop: asyncio.AbstractEventLoop) -> None:
        """The thread's body: run until stopped, then cancel leftovers and close the loop."""
        asyncio.set_event_loop(loop)
        try:
            loop.run_forever()
        finally:
            try:
                _cancel_all(loop, self.name)
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.run_until_complete(loop.shutdown_default_executor())
            finally:
                asyncio.set_event_loop(None)
                loop.close()

    def _wait(self, future: concurrent.futures.Future[T], timeout: float | None) -> T:
        try:
            return future.result(timeout)
        except _CarriedError as carrier:
            error = carrier.error
        except BaseException:
            if not future.done():
                future.cancel()  # timed out or interrupted: stop the work on the loop too
            elif future.cancelled() and self._closed:
                raise ClientClosed(f"the {self.name} was closed during the call") from None
            raise
        raise error  # outside the except block, so its __context__ stays as it was

    def _run_last(self, last: Coroutine[Any, Any, object]) -> None:
        if self._closed:
            last.close()
            return
        with contextlib.suppress(ClientClosed):  # closed by another thread meanwhile
            self.run(last)

    def _stop(self) -> None:
        with self._lock:
            loop, thread = self._loop, self._thread
            first = not self._closed
            self._closed = True
        if loop is None or thread is None:
            return
        if first:
            loop.call_soon_threadsafe(loop.stop)
        thread.join()

    def _drain(self, pump: _Pump[T]) -> Generator[T, None, None]:
        try:
            while True:
                item = self.run(pump.next())
                if item is _End.END:
                    return
                yield item
        finally:
            self._finish(pump)

    def _finish(self, pump: _Pump[Any]) -> None:
        """Close the async iterator. Never raises: it runs in ``finally`` blocks."""
        try:
            self.check_caller()
        except RuntimeError:
            # Collected on an event loop thread (e.g. this one): cannot block, so let it go.
            if not self._closed:
                self._submit(pump.aclose())
            return
        try:
            self.run(pump.aclose())
        except ClientClosed:
            pass  # the loop's shutdown already finalized the iterator
        except Exception:
            logger.warning("%s: closing an iterator failed", self.name, exc_info=True)


class _Pump(Generic[T]):
    """One async iterator driven from blocking code; used only on the loop thread."""

    def __init__(self, iterator: AsyncIterator[T]) -> None:
        self._iterator = iterator
        self._pending: asyncio.Task[Any] | None = None

    async def next(self) -> T | Literal[_End.END]:
        self._pending = asyncio.current_task()
        try:
            return await anext(self._iterator)
        except StopAsyncIteration:
            return _End.END

    async def aclose(self) -> None:
        # An interrupted next() may still be unwinding its cancellation; closing an async
        # generator while it runs raises RuntimeError, so let it finish first.
        pending = self._pending
        if pending is not None and not pending.done():
            await asyncio.wait([pending])
        # Only an async generator is finalized here, as the loop would at collection. An
        # iterator that is also the resource (AsyncConsumer.__aiter__ returns self) stays
        # open, as after leaving an ``async for``: its own close() owns its aclose().
        if inspect.isasyncgen(self._iterator):
            await self._iterator.aclose()


def to_concurrent(source: asyncio.Future[T]) -> concurrent.futures.Future[T]:
    """A ``concurrent.futures.Future`` that settles like ``source``. Call on the loop.

    The result is already RUNNING, so ``cancel()`` on it returns False. The work behind
    it (a queued record) has started, and a waiter giving up must not withdraw it. If
    ``source`` is cancelled, the result raises ``concurrent.futures.CancelledError``.
    Done callbacks added to the result run on the loop thread.
    """
    target: concurrent.futures.Future[T] = concurrent.futures.Future()
    target.set_running_or_notify_cancel()
    source.add_done_callback(functools.partial(_settle, target))
    return target


def _settle(target: concurrent.futures.Future[T], source: asyncio.Future[T]) -> None:
    if source.cancelled():
        target.set_exception(concurrent.futures.CancelledError())
    elif (exc := source.exception()) is not None:
        target.set_exception(exc)
    else:
        target.set_result(source.result())


class _CarriedError(Exception):
    """Carries an exception that ``run_coroutine_threadsafe`` would replace by a copy."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(error)
        self.error = error


async def _carry(coro: Coroutine[Any, Any, T]) -> T:
    # Crossing to a concurrent future, asyncio re-creates TimeoutError, InvalidStateError
    # and CancelledError as new objects (asyncio.futures._convert_future_exc), losing the
    # originals' tracebacks and causes. Send the first two across in a carrier instead.
    # Cancellation keeps the standard path: it is how closing and timeouts are reported.
    try:
        return await coro
    except (TimeoutError, asyncio.InvalidStateError) as exc:
        raise _CarriedError(exc) from None


async def _invoke(factory: Callable[[], T]) -> T:
    return factory()


async def _open(iterable: AsyncIterable[T]) -> _Pump[T]:
    return _Pump(aiter(iterable))


def _cancel_all(loop: asyncio.AbstractEventLoop, name: str) -> None:
    """Cancel every task left on ``loop`` and wait for them (as ``asyncio.run`` does)."""
    tasks = asyncio.all_tasks(loop)
    for task in tasks:
        task.cancel()
    outcomes = loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
    for outcome in outcomes:
        if isinstance(outcome, Exception):
            logger.warning("%s: a task failed while the loop shut down", name, exc_info=outcome)
