"""The processes of the ``dispatch`` scenario's broker phases, driven over their stdio.

Owns :class:`Broker` (``headrace serve`` with fsync ``always``), :class:`Child` (one
consumer process, as the driver sees it) and what that process runs
(:func:`consumer_main`): it prints ``ready`` once every consumer is subscribed (or one JSON
line ``{"error": ..., "code": ...}`` when the broker refuses), then one JSON summary line
when every subscription received the records it expects or when its stdin closes; e2e
latencies go to a file as float64 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import sys
import time
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bench._fanout_child import READY_TIMEOUT_S, LineProcess
from bench._headrace_pubsub import MAX_UNACKED, probe_admin, serve_process
from bench._measure import new_runner
from bench._pubsub_system import read_stamp
from bench._server_process import stdin_closed, wait_until_serving
from client import AsyncAdminClient, AsyncConsumer, ClientError, Message

GRACE_S = 10.0  # after the last e2e send, for every sample to arrive
CHILD = "from bench._dispatch_procs import consumer_main; consumer_main()"


class Broker:
    """``headrace serve`` (fsync ``always``) on a free loopback port, data in ``directory``.

    Not task-safe: owned by the phase that runs it.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        config = f'[broker]\nmax_unacked = {MAX_UNACKED}\n\n[wal]\nfsync = "always"\n'
        self.process, self.address = serve_process(directory, config)

    async def start(self) -> None:
        self.process.start()
        await wait_until_serving(
            lambda: probe_admin(self.address), timeout_s=60, process=self.process
        )

    async def create_topic(self, name: str, partitions: int) -> None:
        async with AsyncAdminClient(self.address) as admin:
            await admin.create_topic(name, partitions)

    def stop(self) -> None:
        self.process.stop()


class Child:
    """One consumer process running :func:`consumer_main`, talked to over its stdio
    (a :class:`~bench._fanout_child.LineProcess`)."""

    def __init__(self, process: LineProcess) -> None:
        self._process = process

    @classmethod
    async def spawn(
        cls,
        broker: Broker,
        topic: str,
        *,
        type_: str,
        names: Sequence[str],
        expected: int,
        start: str,
        per_name: int = 1,
        receive_queue: int = 1_000,
        per_record_acks: bool = False,
        ack_interval_ms: float = 20.0,
        out: Path | None = None,
    ) -> Child:
        argv = [
            *(sys.executable, "-c", CHILD, "--broker", broker.address, "--topic", topic),
            *("--type", type_, "--names", ",".join(names), "--per-name", str(per_name)),
            *("--expected", str(expected), "--from", start),
            *("--receive-queue", str(receive_queue), "--ack-interval-ms", str(ack_interval_ms)),
            *(["--per-record-acks"] if per_record_acks else []),
            *(["--out", str(out)] if out else []),
        ]
        log = broker.directory / f"consumer-{names[0]}.log"
        return cls(await LineProcess.spawn(argv, log=log, who="a consumer process"))

    async def ready(self) -> tuple[str, str] | None:
        """Wait until every consumer subscribed; the (code, message) of a refusal, if any.

        Raises:
            ServerFailedError: the process failed or did not get ready in time.
        """
        line = await self._process.line(READY_TIMEOUT_S)
        if line == "ready":
            return None
        refusal = json.loads(line)
        return str(refusal["code"]), str(refusal["error"])

    async def summary(self, timeout_s: float) -> dict[str, int]:
        """The process's summary: at once if it received everything within ``timeout_s``,
        else after closing its stdin (which tells it to stop)."""
        try:
            line = await self._process.line(timeout_s)
        except TimeoutError:
            self._process.close_stdin()
            line = await self._process.line(GRACE_S)
        summary: dict[str, int] = json.loads(line)
        await asyncio.to_thread(self._process.process.wait)
        return summary

    async def kill(self) -> None:
        """Kill the process if it still runs, reap it, close its pipes."""
        await self._process.reap()


# ---------------------------------------------------------------------------------------
# The consumer process


def consumer_main(argv: Sequence[str] | None = None) -> None:
    """Entry point of a consumer process (see the module docstring for its protocol)."""
    parser = argparse.ArgumentParser(prog="bench.dispatch consumer")
    parser.add_argument("--broker", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--type", required=True)
    parser.add_argument("--names", required=True, help="subscriptions, comma-separated")
    parser.add_argument("--per-name", type=int, default=1, help="consumers per subscription")
    parser.add_argument("--expected", type=int, required=True, help="records per subscription")
    parser.add_argument("--from", dest="start", default="earliest")
    parser.add_argument("--receive-queue", type=int, default=1_000)
    parser.add_argument("--per-record-acks", action="store_true")
    parser.add_argument("--ack-interval-ms", type=float, default=20.0)
    parser.add_argument("--out", type=Path, default=None, help="write latencies (ms) here")
    args = parser.parse_args(argv)
    _, runner = new_runner()
    with runner:
        summary = runner.run(_consume(args))
    print(json.dumps(summary), flush=True)


@dataclass(slots=True)
class _Tally:
    """What a consumer process received; shared by its consumers' tasks (one loop)."""

    counts: dict[str, int]
    expected: int
    latencies: array[float] | None
    per_record_acks: bool
    first_ns: int = 0
    done: asyncio.Event = field(default_factory=asyncio.Event)

    def took(self, consumer: AsyncConsumer, batch: list[Message]) -> None:
        now = time.monotonic_ns()
        self.first_ns = self.first_ns or now
        if self.latencies is not None:
            self.latencies.extend([(now - read_stamp(m.value)) / 1e6 for m in batch])
        if self.per_record_acks:
            for message in batch:
                consumer.ack(message)
        else:
            consumer.ack_many(batch)
        self.counts[consumer.subscription] += len(batch)
        if all(count >= self.expected for count in self.counts.values()):
            self.done.set()


async def _consume(args: argparse.Namespace) -> dict[str, object]:
    names = args.names.split(",")
    consumers = [
        AsyncConsumer(
            args.topic,
            name,
            broker=args.broker,
            type=args.type,
            initial_position=args.start,
            consumer_name=f"{name}-{i}",
            receive_queue=args.receive_queue,
            ack_interval_ms=args.ack_interval_ms,
        )
        for name in names
        for i in range(args.per_name)
    ]
    tally = _Tally(
        dict.fromkeys(names, 0),
        args.expected,
        array("d") if args.out else None,
        args.per_record_acks,
    )
    try:
        try:
            await asyncio.gather(*(consumer.start() for consumer in consumers))
        except ClientError as exc:
            return {"error": str(exc), "code": exc.code.name if exc.code else type(exc).__name__}
        gc.freeze()  # the measuring side pauses for no full GC over its setup
        print("ready", flush=True)
        await _until_done(consumers, tally)
    finally:
        await asyncio.gather(*(consumer.aclose() for consumer in consumers))
    end_ns = time.monotonic_ns()  # every ack sent and applied: the streams ended
    if args.out is not None and tally.latencies is not None:
        args.out.write_bytes(tally.latencies.tobytes())
    received = sum(tally.counts.values())
    return {"received": received, "first_ns": tally.first_ns, "end_ns": end_ns}


async def _until_done(consumers: Sequence[AsyncConsumer], tally: _Tally) -> None:
    """Receive with every consumer until each subscription has the records it expects,
    or stdin closes; re-raise a consumer's error."""
    takers = [asyncio.create_task(_take(c, tally)) for c in consumers]
    ends = [asyncio.create_task(stdin_closed()), asyncio.create_task(tally.done.wait())]
    waiting: set[asyncio.Task[object]] = {*ends, *takers}
    try:
        while not any(end.done() for end in ends):
            done, waiting = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                task.result()  # a consumer's error ends the process
    finally:
        for task in waiting:
            task.cancel()
        if waiting:
            await asyncio.wait(waiting)


async def _take(consumer: AsyncConsumer, tally: _Tally) -> None:
    """Receive until the consumer's subscription has every record it expects."""
    while tally.counts[consumer.subscription] < tally.expected:
        tally.took(consumer, await consumer.receive_batch(10_000))
