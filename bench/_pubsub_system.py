"""What a system measured by the ``pubsub`` scenario implements, and the helpers they share.

Owns the :class:`PubSubSystem` protocol (Headrace and every peer implement it), and the
machinery every implementation needs so that all of them are measured the same way:

- server processes, from :mod:`bench._server_process` (:class:`ServerProcess`,
  :func:`wait_until_serving`, :func:`restart_to_serving`, :func:`rss_mib`, ...);
- end-to-end latency without coordinated omission: :func:`paced_send_times` (the
  schedule), :func:`pace` (an open-loop publisher), :func:`stamp_payload` /
  :func:`read_stamp` (the scheduled send time carried in the payload),
  :class:`LatencyRecorder` and :func:`measure_e2e`, which runs a paced publisher and a
  concurrent consumer and returns one latency per message received;
- :class:`PerRecordSystem`, the optional per-record client paths (Headrace only: the
  peers' clients have no comparable one-record-at-a-time producer to set beside it);
- :class:`FakeSystem` and :class:`FakePerRecordSystem`, in-memory stand-ins for tests of
  the scenario's driver.

Invariants:
    - Latency is measured from the *scheduled* send time, never the actual one: a publisher
      that falls behind (a slow ack, a busy loop) shows up as latency instead of silently
      sending less (no coordinated omission). Example: at 2,000 msg/s message 10 is due
      5 ms after the start; if it leaves at 7 ms and arrives at 7.4 ms, it counts 2.4 ms.
    - Publisher and consumer share one process and ``time.perf_counter_ns``.

Depends on nothing of Headrace's and on no client library: each system brings its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import os
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Sequence
from typing import Protocol, runtime_checkable

from bench._server_process import ServerFailedError

#: Size of an e2e message (the protocol's ``e2e`` takes none: every system sends these).
E2E_PAYLOAD_BYTES = 100
#: Bytes of the stamp at the start of an e2e payload: the scheduled send time in ns.
STAMP_BYTES = 8
_FILLER = os.urandom(1 << 12)  # incompressible padding after the stamp


class PubSubSystem(Protocol):
    """A message broker under test, with its server process and its Python clients.

    Implementations take ``(data_dir: Path)`` (a fresh directory they own) and start their
    server on a free 127.0.0.1 port. They are driven by one task; they are not task-safe.
    """

    system: str  # "headrace" | "nats-jetstream" | "redis-streams"
    fsync: str  # "always" | "everysec" | "default"

    async def start(self) -> None:
        """Start the server in the data dir on a free 127.0.0.1 port; return when serving."""
        ...

    async def publish(self, count: int, payload: bytes) -> float:
        """Seconds to publish ``count`` messages, all acknowledged by the server."""
        ...

    async def consume(self, count: int) -> float:
        """Seconds to consume and ack ``count`` previously published messages."""
        ...

    async def e2e(self, rate: float, seconds: float) -> list[float]:
        """Latencies in ms: open-loop paced publisher plus a concurrent consumer."""
        ...

    async def kill_and_restart(self) -> float:
        """SIGKILL the server, restart it; seconds until a client operation succeeds."""
        ...

    def rss_mib(self) -> float:
        """The server process's resident set size, MiB."""
        ...

    async def stop(self) -> None:
        """Stop the server and the clients; always safe to call, also twice."""
        ...


@runtime_checkable
class PerRecordSystem(PubSubSystem, Protocol):
    """A system whose client is also measured one record at a time, as users call it.

    Each method returns the seconds its ``count`` records took; every record is
    acknowledged by the server (sends) or acked (consume) within that time.
    """

    async def send_per_record(self, count: int, payload: bytes) -> float:
        """Seconds to send ``count`` records with one async ``send`` call each."""
        ...

    async def sync_send_per_record(self, count: int, payload: bytes) -> float:
        """Seconds to send ``count`` records with one blocking ``send`` each, then flush."""
        ...

    async def consume_per_record(self, count: int) -> float:
        """Seconds to receive ``count`` records one at a time, acking each."""
        ...

    async def sync_consume_per_record(self, count: int) -> float:
        """Seconds to receive ``count`` records one blocking call at a time, acking each."""
        ...


# ---------------------------------------------------------------------------------------
# Open-loop pacing and end-to-end latency


def paced_send_times(rate: float, seconds: float) -> list[float]:
    """When an open-loop publisher at ``rate`` msg/s for ``seconds`` sends: offsets in
    seconds from its start, ``i / rate`` for each of ``round(rate * seconds)`` messages."""
    if rate <= 0 or seconds < 0:
        raise ValueError(f"bad pace: {rate} msg/s for {seconds} s")
    return [i / rate for i in range(round(rate * seconds))]


def stamp_payload(sent_ns: int, size: int) -> bytes:
    """A ``size``-byte payload that starts with ``sent_ns`` (big-endian, 8 bytes)."""
    if not STAMP_BYTES <= size <= STAMP_BYTES + len(_FILLER):
        raise ValueError(f"payload of {size} B cannot carry a stamp")
    return sent_ns.to_bytes(STAMP_BYTES, "big") + _FILLER[: size - STAMP_BYTES]


def read_stamp(payload: bytes) -> int:
    """The send time (ns) :func:`stamp_payload` put in ``payload``."""
    return int.from_bytes(payload[:STAMP_BYTES], "big")


async def pace(
    rate: float,
    seconds: float,
    send: Callable[[int], Awaitable[object]],
    *,
    clock_ns: Callable[[], int] = time.perf_counter_ns,
) -> int:
    """Call ``send(scheduled_ns)`` at ``rate`` msg/s for ``seconds``, open loop.

    A thread keeps the schedule and hands each due message to the event loop, where the
    send runs as its own task, so a slow acknowledgement never delays the next send. The
    loop's own timers cannot keep it: uvloop's have 1 ms granularity and fire up to 1 ms
    early or late, which at 2,000 msg/s (one send every 0.5 ms) would either shift every
    latency by up to 1 ms or need a busy loop that takes a whole core from the servers.
    The thread sleeps with a timer slack of :data:`PACER_TIMER_SLACK_NS` (Linux).

    Before the clock runs, garbage is collected and what survives is frozen (``gc.freeze``)
    until the last send ends: a full collection walks every object the process holds, and
    after an earlier phase's million latency samples that paused this loop for 20-60 ms
    mid-run, which the sends then carried as latency (whichever system was measured).

    Returns:
        The number of messages sent, once every send has finished.

    Raises:
        Exception: The first exception a send raised (after all of them finished).
    """
    gc.collect()
    gc.freeze()
    try:
        return await _pace(rate, seconds, send, clock_ns)
    finally:
        gc.unfreeze()


async def _pace(
    rate: float,
    seconds: float,
    send: Callable[[int], Awaitable[object]],
    clock_ns: Callable[[], int],
) -> int:
    loop = asyncio.get_running_loop()
    tasks: list[asyncio.Future[object]] = []

    def start_send(due_ns: int) -> None:  # on the loop
        tasks.append(asyncio.ensure_future(send(due_ns)))

    stop = threading.Event()
    try:
        await asyncio.to_thread(
            _tick, paced_send_times(rate, seconds), clock_ns, stop, loop, start_send
        )
    finally:
        stop.set()  # when cancelled: the thread stops at its next message
    outcomes = await asyncio.gather(*tasks, return_exceptions=True)
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            raise outcome
    return len(tasks)


def _tick(
    offsets: Sequence[float],
    clock_ns: Callable[[], int],
    stop: threading.Event,
    loop: asyncio.AbstractEventLoop,
    start_send: Callable[[int], None],
) -> None:
    """The pacer thread: at each scheduled time, have the loop call ``start_send(due)``."""
    with timer_slack(PACER_TIMER_SLACK_NS):
        start = clock_ns()
        for offset in offsets:
            if stop.is_set():
                return
            due = start + round(offset * 1e9)
            left = due - clock_ns()
            if left > 0:
                time.sleep(left / 1e9)
            loop.call_soon_threadsafe(start_send, due)


#: The pacer thread's timer slack, ns. Linux lets a sleep end up to the thread's slack
#: late, 50 us by default: a tenth of the gap between two sends at 2,000 msg/s, added to
#: every system's latencies. Measured on the e2e phase (Headrace, 2,000 msg/s): the p50
#: from the scheduled time to the send starting went from 0.32-0.33 ms to 0.27-0.28 ms.
PACER_TIMER_SLACK_NS = 1_000
_PR_SET_TIMERSLACK = 29  # <linux/prctl.h>
_PR_GET_TIMERSLACK = 30


@contextlib.contextmanager
def timer_slack(ns: int) -> Iterator[None]:
    """Run the block with the calling thread's timer slack at ``ns`` (> 0), then put the
    old one back. On systems without ``prctl`` (not Linux) the block runs as it is."""
    if ns <= 0:
        raise ValueError(f"timer slack must be > 0 ns (0 means the default), got {ns}")
    prctl = _prctl()
    if prctl is None:
        yield
        return
    before = prctl(_PR_GET_TIMERSLACK, 0, 0, 0, 0)
    if before < 0 or prctl(_PR_SET_TIMERSLACK, ns, 0, 0, 0) != 0:
        yield  # refused (a seccomp filter, say): sleeps stay as precise as they were
        return
    try:
        yield
    finally:
        prctl(_PR_SET_TIMERSLACK, before, 0, 0, 0)


def _prctl() -> Callable[..., int] | None:
    """libc's ``prctl`` (arguments as C longs), or ``None`` where there is none."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl: Callable[..., int] = fn
    return prctl


class LatencyRecorder:
    """Collects one latency per received e2e message; owned by the consumer's task.

    The consumer calls :meth:`set_ready` once it is subscribed, then :meth:`record` with
    each payload it receives (and acks it), for as long as :attr:`running` is true.
    """

    def __init__(self, expected: int, clock_ns: Callable[[], int] = time.perf_counter_ns):
        self.expected = expected
        self.latencies_ms: list[float] = []
        self._clock_ns = clock_ns
        self._ready = asyncio.Event()
        self._complete = asyncio.Event()
        self._finished = asyncio.Event()  # complete, or told to stop

    @property
    def running(self) -> bool:
        """Whether the consumer should go on: messages are missing and no stop was asked."""
        return not self._finished.is_set()

    def set_ready(self) -> None:
        """Tell the publisher it may start: the consumer is subscribed."""
        self._ready.set()

    def record(self, payload: bytes) -> None:
        """Record a received payload's latency: now minus its scheduled send time."""
        self.latencies_ms.append((self._clock_ns() - read_stamp(payload)) / 1e6)
        if len(self.latencies_ms) >= self.expected:
            self._complete.set()
            self._finished.set()

    def stop(self) -> None:
        """Ask the consumer to return (it sees :attr:`running` turn false)."""
        self._finished.set()

    async def wait_ready(self) -> None:
        """Return once the consumer called :meth:`set_ready`."""
        await self._ready.wait()

    async def wait_complete(self) -> None:
        """Return once ``expected`` messages were recorded."""
        await self._complete.wait()

    async def wait_finished(self) -> None:
        """Return once :attr:`running` is false: for consumers that receive by callback."""
        await self._finished.wait()


#: How long an e2e consumer gets to return once told to stop, before it is cancelled.
CONSUMER_STOP_S = 5.0


async def measure_e2e(
    rate: float,
    seconds: float,
    send: Callable[[bytes], Awaitable[object]],
    consume: Callable[[LatencyRecorder], Coroutine[object, object, None]],
    *,
    payload_bytes: int = E2E_PAYLOAD_BYTES,
    grace_s: float = 10.0,
) -> list[float]:
    """Run ``consume`` as a task and a paced publisher beside it; return latencies in ms.

    The consumer is stopped by asking, not by cancelling: some clients (redis-py) can lose
    a cancellation that lands mid-command and then never return.

    Args:
        rate: Messages per second the publisher sends.
        seconds: How long it sends.
        send: Publishes one payload and returns once the server acknowledged it.
        consume: Loops while ``recorder.running``: calls ``recorder.set_ready()`` once
            subscribed, then ``recorder.record(payload)`` for each message it receives,
            and acks it. Each wait for messages must be short (about 0.1 s) so that it
            returns soon after being told to stop; it is cancelled after
            :data:`CONSUMER_STOP_S`.
        payload_bytes: Size of each payload, stamp included.
        grace_s: How long to wait, after the last send, and for the consumer to be ready.

    Returns:
        One latency per message received, in ms, in arrival order; fewer than sent if some
        did not arrive within ``grace_s`` (the caller decides what that means).

    Raises:
        ServerFailedError: The consumer did not return even when cancelled.
    """
    recorder = LatencyRecorder(len(paced_send_times(rate, seconds)))
    consumer = asyncio.create_task(consume(recorder))
    try:
        await _until(recorder.wait_ready(), consumer, grace_s, "the e2e consumer is not ready")
        await pace(rate, seconds, lambda due: send(stamp_payload(due, payload_bytes)))
        with contextlib.suppress(TimeoutError):
            await _until(recorder.wait_complete(), consumer, grace_s, "")
    finally:
        recorder.stop()
        await _stop_consumer(consumer)
    return recorder.latencies_ms


async def _until(
    event: Awaitable[None], consumer: asyncio.Task[None], timeout_s: float, what: str
) -> None:
    """Wait for ``event``, or for the consumer to end (re-raising its error).

    Raises:
        TimeoutError: ``timeout_s`` passed first (with ``what`` as the message).
    """
    waiter = asyncio.ensure_future(event)
    try:
        done, _ = await asyncio.wait(
            {waiter, consumer}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED
        )
    finally:
        waiter.cancel()
    if consumer in done:
        consumer.result()  # raises the consumer's error, if it had one
    elif waiter not in done:
        raise TimeoutError(what)


async def _stop_consumer(consumer: asyncio.Task[None]) -> None:
    """Give a consumer told to stop :data:`CONSUMER_STOP_S` to return, then cancel it."""
    done, _ = await asyncio.wait({consumer}, timeout=CONSUMER_STOP_S)
    if not done:
        consumer.cancel()
        done, _ = await asyncio.wait({consumer}, timeout=CONSUMER_STOP_S)
    if not done:
        raise ServerFailedError("the e2e consumer does not stop, not even when cancelled")
    if not consumer.cancelled():
        consumer.result()  # raises the consumer's error, if it had one


# ---------------------------------------------------------------------------------------
# A fake for tests


class FakeSystem:
    """A :class:`PubSubSystem` without a server: fixed rates and latencies, optional failure.

    Args:
        system: The name it reports.
        fsync: The fsync policy it reports.
        msgs_s: The publish and consume rate it pretends to reach.
        fail_in: The name of a method that raises ``RuntimeError`` (e.g. ``"consume"``).
    """

    def __init__(
        self, system: str, fsync: str, *, msgs_s: float = 1e6, fail_in: str | None = None
    ) -> None:
        self.system = system
        self.fsync = fsync
        self.msgs_s = msgs_s
        self.fail_in = fail_in
        self.calls: list[str] = []

    def _call(self, name: str) -> None:
        self.calls.append(name)
        if name == self.fail_in:
            raise RuntimeError(f"{self.system} failed in {name}")

    async def start(self) -> None:
        self._call("start")

    async def publish(self, count: int, payload: bytes) -> float:
        self._call("publish")
        return count / self.msgs_s

    async def consume(self, count: int) -> float:
        self._call("consume")
        return count / self.msgs_s

    async def e2e(self, rate: float, seconds: float) -> list[float]:
        self._call("e2e")
        count = round(rate * seconds)
        return [0.1 + 4.0 * i / max(count - 1, 1) for i in range(count)]

    async def kill_and_restart(self) -> float:
        self._call("kill_and_restart")
        return 0.25

    def rss_mib(self) -> float:
        self._call("rss_mib")
        return 42.0

    async def stop(self) -> None:
        self.calls.append("stop")


class FakePerRecordSystem(FakeSystem):
    """A :class:`FakeSystem` that also has the per-record paths, at a tenth of its rate."""

    async def send_per_record(self, count: int, payload: bytes) -> float:
        self._call("send_per_record")
        return 10 * count / self.msgs_s

    async def sync_send_per_record(self, count: int, payload: bytes) -> float:
        self._call("sync_send_per_record")
        return 10 * count / self.msgs_s

    async def consume_per_record(self, count: int) -> float:
        self._call("consume_per_record")
        return 10 * count / self.msgs_s

    async def sync_consume_per_record(self, count: int) -> float:
        self._call("sync_consume_per_record")
        return 10 * count / self.msgs_s
