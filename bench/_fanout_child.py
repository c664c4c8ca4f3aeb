"""The consumer process of a bare fan-out peer (the gRPC floor, Redis Streams), both sides.

Owns how a driver runs one fan-out with that process (:func:`drive`: spawn it, wait for it,
publish at a pace, collect its latencies; built from :func:`spawn`, :func:`expect_line`
and :func:`collect`), :class:`LineProcess` (a child read line by line on the loop, also
used by :mod:`bench._dispatch_procs`), and what the process runs (:func:`main`, around a
peer's receive loop, and :func:`consume`).

The protocol: the child runs with ``--server`` (where to connect), ``--subscribers``,
``--expected`` (records per subscriber) and ``--out``. It prints ``ready`` once every
subscriber is subscribed, then one JSON summary line once each subscriber got
``expected`` records or its stdin closed; the latencies (ms, float64, in arrival order)
go to ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import subprocess
import sys
import time
from array import array
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from pathlib import Path
from subprocess import PIPE
from typing import Any

from bench._measure import new_runner
from bench._pubsub_system import E2E_PAYLOAD_BYTES, pace, stamp_payload
from bench._server_process import ServerFailedError, stdin_closed

#: How long a driver waits for ``ready``: 100 subscribers connect and subscribe first.
READY_TIMEOUT_S = 60.0

# ---------------------------------------------------------------------------------------
# The driver's side


async def drive(
    code: str,
    *,
    server: str,
    subscribers: int,
    rate: float,
    seconds: float,
    grace_s: float,
    publish: Callable[[bytes], Awaitable[object]],
    directory: Path,
    name: str,
) -> tuple[list[float], int]:
    """Spawn the consumer process (``python -c code``; its files are named after
    ``name``), wait until it is ready, ``publish`` stamped records at ``rate`` for
    ``seconds``, collect its summary. Return the latencies (ms, ascending) of every
    (record, subscriber) pair that arrived within ``grace_s`` of the last send, and the
    number of records sent.

    Raises:
        ServerFailedError: the consumer process failed or never got ready.
    """
    who = f"the {name} consumer"
    out = directory / f"{name}-latencies.f64"
    consumer = await spawn(
        code,
        server=server,
        subscribers=subscribers,
        expected=round(rate * seconds),
        out=out,
        log=directory / f"{name}-consumer.log",
        who=who,
    )
    try:
        await expect_line(consumer, "ready", READY_TIMEOUT_S)

        def send(due_ns: int) -> Awaitable[object]:
            return publish(stamp_payload(due_ns, E2E_PAYLOAD_BYTES))

        sent = await pace(rate, seconds, send, clock_ns=time.monotonic_ns)
        await collect(consumer, grace_s)
    finally:
        await consumer.reap()
    samples = array("d")
    samples.frombytes(out.read_bytes())
    return sorted(samples), sent


class LineProcess:
    """A child process whose stdout is read line by line on the event loop.

    Spawned with ``subprocess.Popen`` (vfork and exec), not the event loop's subprocess
    support: uvloop forks, and gRPC's fork handlers then complain on stderr. Its stdout is
    read through an ``asyncio.StreamReader``, so a wait for a line that times out loses
    nothing: the line is still there for the next wait (a ``readline`` in a thread would
    go on and swallow it).
    """

    def __init__(
        self,
        process: subprocess.Popen[bytes],
        stdout: asyncio.StreamReader,
        transport: asyncio.ReadTransport,
        log: Path,
        who: str,
    ) -> None:
        self.process = process
        self._stdout = stdout
        self._transport = transport
        self._log = log
        self.who = who

    @classmethod
    async def spawn(cls, argv: Sequence[str], *, log: Path, who: str) -> LineProcess:
        """Run ``argv`` with its stderr appended to ``log``; ``who`` names it in errors."""
        with log.open("ab") as stderr:
            # vfork and exec: returns at once (see the class docstring)
            process = subprocess.Popen(argv, stdin=PIPE, stdout=PIPE, stderr=stderr)  # noqa: ASYNC220
        reader = asyncio.StreamReader()
        transport, _ = await asyncio.get_running_loop().connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), process.stdout
        )
        return cls(process, reader, transport, log, who)

    async def line(self, timeout_s: float) -> str:
        """The next stdout line, stripped.

        Raises:
            TimeoutError: none within ``timeout_s`` (it stays readable).
            ServerFailedError: the process closed its stdout (exited); the message holds
                its exit status and the end of its log.
        """
        line = await asyncio.wait_for(self._stdout.readline(), timeout_s)
        if not line:
            code = await asyncio.to_thread(self.process.wait)
            tail = "\n".join(self._log.read_text(errors="replace").splitlines()[-10:])
            raise ServerFailedError(f"{self.who} exited with status {code}:\n{tail}")
        return line.decode().strip()

    def close_stdin(self) -> None:
        """Tell the process to stop (the protocol's signal)."""
        if self.process.stdin is not None and not self.process.stdin.closed:
            self.process.stdin.close()

    async def reap(self) -> None:
        """Kill the process if it still runs, wait for it, close its pipes."""
        self.close_stdin()
        if self.process.poll() is None:
            self.process.kill()
        await asyncio.to_thread(self.process.wait)
        self._transport.close()


def spawn(
    code: str, *, server: str, subscribers: int, expected: int, out: Path, log: Path, who: str
) -> Awaitable[LineProcess]:
    """Run ``python -c code`` with the protocol's arguments, its stderr appended to ``log``."""
    argv = [sys.executable, "-c", code, "--server", server, "--subscribers", str(subscribers)]
    argv += ["--expected", str(expected), "--out", str(out)]
    return LineProcess.spawn(argv, log=log, who=who)


async def expect_line(process: LineProcess, start: str, timeout_s: float) -> str:
    """The process's next stdout line, which must start with ``start``.

    Raises:
        ServerFailedError: it said something else (or exited).
        TimeoutError: no line within ``timeout_s``.
    """
    text = await process.line(timeout_s)
    if not text.startswith(start):
        raise ServerFailedError(
            f"{process.who} said {text!r} (exit status {process.process.poll()})"
        )
    return text


async def collect(process: LineProcess, grace_s: float) -> None:
    """Wait up to ``grace_s`` for the summary; if it does not come, close the child's stdin
    (it stops and writes what came) and wait up to ``grace_s`` again."""
    try:
        await expect_line(process, "{", grace_s)
    except TimeoutError:
        process.close_stdin()
        await expect_line(process, "{", grace_s)


# ---------------------------------------------------------------------------------------
# The child's side

#: Receives until every subscriber has ``expected`` records (or stdin closes): (server,
#: subscribers, expected) -> the latencies, ms.
Consume = Callable[[str, int, int], Coroutine[Any, Any, "array[float]"]]


def main(prog: str, consume_: Consume, argv: Sequence[str] | None = None) -> None:
    """Entry point of a consumer process: parse the protocol's arguments, run
    ``consume_`` on a fresh loop, write the latencies and the summary."""
    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("--server", required=True)
    parser.add_argument("--subscribers", type=int, required=True)
    parser.add_argument("--expected", type=int, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    _, runner = new_runner()
    with runner:
        latencies = runner.run(consume_(args.server, args.subscribers, args.expected))
    args.out.write_bytes(latencies.tobytes())
    print(json.dumps({"received": len(latencies)}), flush=True)


async def consume(
    takers: Sequence[Coroutine[Any, Any, None]],
    subscribed: Awaitable[object],
    done: asyncio.Event,
    close: Callable[[], Awaitable[object]],
) -> None:
    """Run the subscribers' ``takers``; say ``ready`` once ``subscribed`` completes; return
    once ``done`` is set or stdin closes (a taker's failure ends it too), then ``close``."""
    tasks = [asyncio.create_task(taker) for taker in takers]
    stdin_gone = asyncio.create_task(stdin_closed())
    try:
        if not await _until(asyncio.ensure_future(subscribed), tasks, stdin_gone):
            raise ServerFailedError("stdin closed before every subscriber was subscribed")
        gc.freeze()  # as the Headrace consumers do: no full GC over the setup
        print("ready", flush=True)
        await _until(asyncio.create_task(done.wait()), tasks, stdin_gone)
    finally:
        for task in (*tasks, stdin_gone):
            task.cancel()
        await asyncio.gather(*tasks, stdin_gone, return_exceptions=True)
        await close()


async def _until(
    wanted: asyncio.Future[Any], tasks: Sequence[asyncio.Task[None]], stop: asyncio.Task[None]
) -> bool:
    """Wait until ``wanted`` completes (True) or ``stop`` does (False, ``wanted`` is
    cancelled); re-raise the failure of any of ``tasks`` (tasks that end well are let be)."""
    pending: set[asyncio.Future[Any]] = {wanted, stop, *tasks}
    while True:
        finished, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        for task in finished:
            if task is not wanted and not task.cancelled() and task.exception() is not None:
                wanted.cancel()
                task.result()
        if wanted in finished:
            return True
        if stop in finished:
            wanted.cancel()
            return False
