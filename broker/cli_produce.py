"""``headrace produce``: each line of stdin (or ``--count`` generated records) as a record.

Role: read the input, pick each record's partition, hand the records to the client's
:class:`~client.AsyncProducer`, count what was acknowledged in input order, and stop
cleanly on a signal.

Input: a thread reads stdin with ``os.read`` and hands the event loop whole lines, a
chunk at a time (:class:`StdinLines`), so the loop never blocks on input: the lines of a
slow pipe (``tail -f log | headrace produce``) are published as they come, after the
producer's linger, and a signal is handled at once rather than after the next line.

Partitions: ``--partition N`` sends every record to partition N. Otherwise a record with
``--key`` goes to the partition of its key's hash; records without a key are spread as
``--spread`` says: ``round-robin`` (the default) puts each record on the next partition,
starting at a random one, so ``seq 6`` on three partitions puts two records on each;
``sticky`` is the client library's own way: every record goes to one partition until its
batch is sent (full, or ``linger_ms`` passed), then the next batch goes to the next
partition. Sticky makes fewer, larger batches. The CLI's default is round-robin: a person
trying partitions expects ``seq 5`` to reach more than one, a run of one record each
(a loop of ``echo x | headrace produce``) spreads too, and the cost is small (1,000,000
lines to 3 partitions on loopback: 1.94 s round-robin, 1.84 s sticky).

Signals (SIGINT, Ctrl-C; SIGTERM): the first stops reading input, waits until every
record already handed to the producer is acknowledged or failed, and says on stderr how
many lines were acknowledged: lines 1 to N of the input, all of them, so the input can be
resumed at line N+1 (``tail -n +N+1 FILE``). A second signal stops waiting: lines 1 to N
are acknowledged, and whether each line sent after them was written is unknown. Either
way the exit code is 128 plus the first signal's number (130 for SIGINT, 143 for SIGTERM).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import io
import os
import random
import signal
import sys
import threading
from collections.abc import Callable, Coroutine, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

import click

from broker.cli_client import (
    Target,
    broker_option,
    connect_timeout_option,
    explain,
    reachable_channel,
)
from broker.cli_output import plural
from broker.cli_params import TOPIC_NAME
from client import AsyncProducer, ClientError, RecordFuture

#: How records without a key are spread over the partitions (``--spread``).
SPREADS = ("round-robin", "sticky")
#: The most bytes one read of stdin takes.
READ_BYTES = 1 << 16
#: Chunks of lines read ahead of the producer, at most.
READ_AHEAD = 8
#: ``--count`` records made at a time.
GENERATED_CHUNK = 4096
#: How long the wait after a stop signal lasts before ``produce`` says what it waits for.
SAY_WAITING_AFTER_S = 0.5
#: The signals that stop ``produce``.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StdinLines:
    """Whole lines of a binary stream (stdin), read by a daemon thread and handed to the
    event loop a chunk (a list of lines) at a time; ``None`` after the last.

    A line is the bytes before a newline, without the newline and any carriage returns
    before it; a last line without a newline counts. A stream with a file descriptor is
    read with ``os.read``, which holds no lock of Python's buffered stdin, so a thread
    still blocked in it when the command exits stops nobody (a thread blocked in the
    buffered ``read`` would hold its lock at interpreter shutdown, a fatal error); one
    without (click's test runner) through its ``read1``. Use from the loop that made it.
    """

    def __init__(self, source: BinaryIO) -> None:
        self._read_some = _reader_of(source)
        self._loop = asyncio.get_running_loop()
        self._chunks: asyncio.Queue[list[bytes] | OSError | None] = asyncio.Queue()
        self._room = threading.Semaphore(READ_AHEAD)
        self._thread = threading.Thread(target=self._read, name="produce-stdin", daemon=True)
        self._thread.start()

    async def next_chunk(self) -> list[bytes] | None:
        """The next lines, or None at the end of the input (or after :meth:`wake`).

        Raises:
            click.ClickException: stdin could not be read.
        """
        chunk = await self._chunks.get()
        if isinstance(chunk, OSError):
            raise click.ClickException(f"cannot read stdin: {chunk.strerror or chunk}")
        if chunk is not None:
            self._room.release()
        return chunk

    def wake(self) -> None:
        """Make a waiting :meth:`next_chunk` return None now."""
        self._chunks.put_nowait(None)

    def _read(self) -> None:
        tail = b""
        try:
            while data := self._read_some(READ_BYTES):
                *lines, tail = (tail + data).split(b"\n")
                if lines:
                    self._room.acquire()
                    self._hand([line.rstrip(b"\r") for line in lines])
            self._hand([tail.rstrip(b"\r")] if tail else [])
            self._hand(None)
        except OSError as exc:
            self._hand(exc)
        except RuntimeError:
            return  # the loop is closed: the command is over

    def _hand(self, item: list[bytes] | OSError | None) -> None:
        self._loop.call_soon_threadsafe(self._chunks.put_nowait, item)


def _reader_of(source: BinaryIO) -> Callable[[int], bytes]:
    """How to read up to N bytes of ``source`` as they come: ``os.read`` of its file
    descriptor when it has one, else its ``read1`` (or ``read``)."""
    try:
        fd = source.fileno()
    except (OSError, ValueError, io.UnsupportedOperation):
        read: Callable[[int], bytes] = getattr(source, "read1", source.read)
        return read
    return functools.partial(os.read, fd)


@dataclass(slots=True)
class Stop:
    """What the signals asked for: the first stops the input, the second the wait."""

    signum: int | None = None
    abandoned: bool = False

    @property
    def exit_code(self) -> int:
        """128 plus the first signal's number, the shell's code for a signal's end."""
        assert self.signum is not None
        return 128 + self.signum


class Acked:
    """Records handed to the producer, in input order, and how many of the first were
    acknowledged: ``count`` is N when records 1 to N were and record N+1 was not (yet).

    Only records not yet counted are held, so memory follows what is in flight.
    """

    __slots__ = ("count", "error", "futures", "sent")

    def __init__(self) -> None:
        self.futures: collections.deque[RecordFuture] = collections.deque()
        self.count = 0
        self.sent = 0
        #: The first failure met in input order, once one is.
        self.error: ClientError | None = None

    def add(self, future: RecordFuture) -> None:
        """Record ``future``, the next record's."""
        self.futures.append(future)
        self.sent += 1

    def advance(self) -> None:
        """Count the leading records that are acknowledged; stop at a failed one."""
        futures = self.futures
        while futures and self.error is None and futures[0].done():
            error = futures[0].exception()
            if error is not None:
                self.error = error if isinstance(error, ClientError) else ClientError(str(error))
                return
            futures.popleft()
            self.count += 1

    @property
    def in_flight(self) -> int:
        """Records sent past the acknowledged ones."""
        return self.sent - self.count


class Producing:
    """One ``produce`` run: input → producer, the count, and the signals' effect.

    Not task-safe beyond its own tasks; lives on one loop.
    """

    def __init__(self, topic: str, noun: str, key: bytes | None) -> None:
        self.topic = topic
        self.noun = noun  # "line" or "record"
        self.key = key
        self.acked = Acked()
        self.stop = Stop()
        self.sending = False  # past the connection check: records may be out
        self._work: asyncio.Task[None] | None = None
        self._input: StdinLines | None = None

    def on_signal(self, signum: int) -> None:
        """The first signal stops the input (or, before anything was sent, everything);
        the second stops the wait for acknowledgements."""
        if self.stop.signum is None:
            self.stop.signum = signum
            if self._input is not None:
                self._input.wake()
            if not self.sending and self._work is not None:
                self._work.cancel()
            else:
                asyncio.get_running_loop().call_later(SAY_WAITING_AFTER_S, self._say_waiting)
            return
        self.stop.abandoned = True
        if self._work is not None:
            self._work.cancel()

    def _say_waiting(self) -> None:
        """Say what the wait after a stop signal is for, once it lasts."""
        if self.stop.abandoned or self._work is None or self._work.done():
            return
        self.acked.advance()
        click.echo(
            f"{signal.Signals(self.stop.signum or 0).name}: stopped reading input; waiting "
            f"for {plural(self.acked.in_flight, self.noun)} to be acknowledged (a second "
            "Ctrl-C or SIGTERM stops waiting)",
            err=True,
        )

    async def run(self, body: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Run ``body`` (connect, send, wait) with the stop signals handled; returns
        when it is done or abandoned (:attr:`stop`)."""
        loop = asyncio.get_running_loop()
        before = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
        for signum in STOP_SIGNALS:
            with contextlib.suppress(ValueError, RuntimeError):  # not the main thread
                loop.add_signal_handler(signum, self.on_signal, signum)
        try:
            self._work = asyncio.ensure_future(body())
            try:
                await self._work
            except asyncio.CancelledError:
                if self.stop.signum is None:
                    raise
        finally:
            for signum, handler in before.items():
                if loop.remove_signal_handler(signum) and handler is not None:
                    signal.signal(signum, handler)

    def read_stdin(self) -> StdinLines:
        """Start reading stdin (:class:`StdinLines`), woken by a stop signal."""
        stdin = sys.stdin.buffer if sys.stdin is not None else io.BytesIO()
        self._input = StdinLines(stdin)
        return self._input

    async def send_lines(
        self, producer: AsyncProducer, lines: StdinLines, pick: Callable[[], int | None]
    ) -> None:
        """Send every line of ``lines`` until the input ends, a stop signal, or a failure."""
        while (chunk := await lines.next_chunk()) is not None:
            if not await self.send(producer, chunk, pick):
                return

    async def send(
        self, producer: AsyncProducer, values: Iterable[bytes], pick: Callable[[], int | None]
    ) -> bool:
        """Send ``values``; False when a stop signal or a failure ended it early."""
        acked, topic, key = self.acked, self.topic, self.key
        for value in values:
            if self.stop.signum is not None:
                return False
            acked.add(await producer.send(topic, value, key=key, partition=pick()))
        acked.advance()
        return acked.error is None and self.stop.signum is None

    async def finish(self, producer: AsyncProducer) -> None:
        """Wait for every record sent, then close the producer."""
        await producer.aclose()
        self.acked.advance()

    def report(self) -> str:
        """The stderr line after a stop signal."""
        stop, acked = self.stop, self.acked
        assert stop.signum is not None
        name = signal.Signals(stop.signum).name
        if not self.sending:
            return f"interrupted by {name} before anything was sent; nothing was produced"
        done = _acknowledged(acked.count, self.noun)
        if stop.abandoned:
            return (
                f"interrupted by {name}, then stopped waiting at a second signal; {done}; "
                f"whether the {plural(acked.in_flight, self.noun)} sent after "
                f"{'them' if acked.count else 'that'} were written is unknown"
                + (", so resuming there may repeat some" if self.noun == "line" else "")
            )
        return f"interrupted by {name}: stopped reading input and waited for what was sent; {done}"


def _acknowledged(count: int, noun: str) -> str:
    """Which records were acknowledged (1 to ``count`` in input order), and for lines of
    stdin where to resume."""
    if noun == "record":  # --count
        if not count:
            return "no record was acknowledged"
        return f"{plural(count, 'record')} (record-0 to record-{count - 1}) acknowledged"
    resume = f"resume at line {count + 1} (tail -n +{count + 1} FILE)"
    if not count:
        return f"no line was acknowledged: {resume}"
    lines = "line 1 of the input was" if count == 1 else f"lines 1 to {count} of the input were"
    return f"{lines} acknowledged: {resume}"


def _generated(count: int) -> Iterator[list[bytes]]:
    """``--count``'s records, ``record-0`` to ``record-{count - 1}``, a chunk at a time."""
    for start in range(0, count, GENERATED_CHUNK):
        yield [b"record-%d" % i for i in range(start, min(start + GENERATED_CHUNK, count))]


def spread_picker(spread: str, partitions: int, rng: random.Random) -> Callable[[], int | None]:
    """The partition of each next record without a key (None: the producer's sticky
    choice); round-robin starts at a random partition, so many one-record runs do not
    all land on partition 0."""
    if spread == "sticky":
        return lambda: None
    following = _cycle(rng.randrange(partitions), partitions)
    return following.__next__


def _cycle(start: int, partitions: int) -> Iterator[int]:
    while True:
        yield from range(start, partitions)
        start = 0


def _spread_of(key: str | None, partition: int | None, spread: str | None) -> str:
    """The ``--spread`` to use; a usage error when it was given where no record is spread."""
    if spread is not None and (key is not None or partition is not None):
        given = "--key" if key is not None else "--partition"
        raise click.UsageError(
            f"--spread applies to records without a key spread over the partitions; "
            f"with {given} it has nothing to spread"
        )
    return spread or "round-robin"


@click.command()
@click.argument("topic", type=TOPIC_NAME)
@click.option("--key", help="Key of every record (picks the partition).")
@click.option(
    "--partition",
    type=click.IntRange(0, 2**31 - 1),
    help="Send every record to this partition (0 to the topic's count - 1).",
)
@click.option(
    "--spread",
    type=click.Choice(SPREADS),
    help="How records without --key are spread over the partitions: round-robin, each "
    "to the next partition (the default); sticky, the client library's way, each batch "
    "to one partition and the next batch to the next.",
)
@click.option("--count", type=click.IntRange(1), help="Send N generated records, not stdin.")
@connect_timeout_option("before anything is sent")
@broker_option
def produce(  # noqa: PLR0917 - click passes every option as an argument
    topic: str,
    key: str | None,
    partition: int | None,
    spread: str | None,
    count: int | None,
    connect_timeout: float,
    target: Target,
) -> None:
    """Publish each line of stdin (or --count generated records) as one record.

    Exits 0 only after every record was acknowledged. A broker that does not answer
    within --connect-timeout is an error (exit 1) before anything is read or sent; once
    sending, the producer retries a lost broker for up to 30 s per record.

    Ctrl-C (SIGINT) or SIGTERM stops reading input, waits for the records sent, and says
    how many lines were acknowledged (lines 1 to N: resume at line N+1); a second one
    stops waiting. Exit codes: 0 done, 1 error, 2 usage, 130 after SIGINT, 143 after
    SIGTERM.
    """
    spread = _spread_of(key, partition, spread)
    run = Producing(topic, "record" if count else "line", None if key is None else key.encode())

    async def body() -> None:
        async with reachable_channel(target, connect_timeout) as (channel, seeds):
            producer = AsyncProducer(channel=channel, **seeds.kwargs())
            partitions = await producer.partition_count(topic)
            if partition is not None and partition >= partitions:
                raise click.BadParameter(
                    f"topic {topic!r} has {plural(partitions, 'partition')}, 0 to "
                    f"{partitions - 1}; there is no partition {partition}",
                    param_hint="--partition",
                )
            fixed = partition
            pick = (
                (lambda: fixed)
                if fixed is not None or key is not None
                else spread_picker(spread, partitions, random.Random())
            )
            run.sending = True
            try:
                if count:
                    for chunk in _generated(count):
                        if not await run.send(producer, chunk, pick):
                            break
                else:
                    await run.send_lines(producer, run.read_stdin(), pick)
                await run.finish(producer)
            except asyncio.CancelledError:
                run.acked.advance()
                raise

    try:
        asyncio.run(run.run(body))
    except ClientError as exc:
        raise click.ClickException(_failed(explain(exc, target), run)) from exc
    except KeyboardInterrupt:  # before the handlers were in place: nothing was sent
        click.echo("interrupted by SIGINT before anything was sent; nothing was produced", err=True)
        raise SystemExit(130) from None
    if run.stop.signum is not None:
        click.echo(run.report(), err=True)
        sys.exit(run.stop.exit_code)
    if run.acked.error is not None:
        raise click.ClickException(_failed(explain(run.acked.error, target), run))
    click.echo(f"produced {plural(run.acked.count, 'record')} to {topic}", err=True)


def _failed(message: str, run: Producing) -> str:
    """``message``, with how much of the input was acknowledged when some was sent."""
    if not run.acked.sent:
        return message
    return f"{message} ({_acknowledged(run.acked.count, run.noun)})"
