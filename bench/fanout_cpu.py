"""Main-thread CPU per delivery of the real dispatcher under fan-out, in one process.

Owns :func:`measure` and its command line (``python -m bench.fanout_cpu``). It drives
what the broker's main thread does for the ``dispatch`` scenario's fan-out, without gRPC:
a real :class:`~wal.LogWriter` on a temporary directory (fsync ``never``, so the disk
does not set the pace), a real :class:`~dispatcher.SubscriptionRegistry` with
``subscriptions`` subscriptions of one topic, one consumer session each. A task per
session takes its deliveries, builds each Subscribe response as the broker does
(:func:`broker.convert.delivery`) and, every ``ack_interval_s`` as the client does, acks
what it got (contiguous runs merged) and grants that much credit back. The publisher
appends ``records`` one-record batches with two appends in flight: about two records per
group commit, as in the fan-out bench (2.3 a commit there, in one batch from a publisher
with one batch in flight; here two batches, so each commit is two deliveries per
subscription, and the figure is for comparing trees, not the bench's absolute cost).

It reports the main thread's CPU time (``time.thread_time``) per delivered record:
much less sensitive to a busy machine than wall time, so two trees can be compared by
running this alternately (``PYTHONPATH`` set to each). Example::

    PYTHONPATH=$PWD python -m bench.fanout_cpu --records 2000
    cpu_us_per_delivery=20.4 deliveries=200000 passes=106000 cpu_s=4.08 wall_s=5.5

``--unpaced`` takes the wall clock out of the work: each delivery is acked and its credit
granted back at once, and the heartbeat and the cursor flusher wait an hour. Under
valgrind (about 50 times slower) the paced acks and timers would otherwise make the work
per delivery follow the machine's load; unpaced, the instructions a delivery costs are the
same from run to run (docs/benchmarks.md, "Counting instructions").
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass

from bench._measure import new_runner
from broker.convert import delivery as to_response
from dispatcher import ConsumerSession, HeartbeatConfig, Subscription, SubscriptionRegistry
from wal import FsyncPolicy, LogConfig, LogWriter, encode_columns

_TOPIC = "fanout-cpu"
_PAYLOAD = b"x" * 100
_HOUR_S = 3_600.0  # --unpaced: the heartbeat's and the flusher's interval (never, in a run)


@dataclass(frozen=True, slots=True)
class Result:
    """One run: main-thread CPU seconds, wall seconds, records delivered, passes."""

    cpu_s: float
    wall_s: float
    deliveries: int
    passes: int

    @property
    def cpu_us_per_delivery(self) -> float:
        return 1e6 * self.cpu_s / max(self.deliveries, 1)

    def line(self) -> str:
        return (
            f"cpu_us_per_delivery={self.cpu_us_per_delivery:.1f} deliveries={self.deliveries} "
            f"passes={self.passes} cpu_s={self.cpu_s:.2f} wall_s={self.wall_s:.2f}"
        )


async def _consume(
    sub: Subscription, session: ConsumerSession, expected: int, ack_interval_s: float
) -> None:
    """Take ``expected`` records off ``session``; ack and re-grant every interval."""
    got = 0
    runs: list[list[int]] = []  # [partition, begin, end], contiguous runs merged
    last = time.monotonic()
    while got < expected:
        d = await session.next()
        if d is None:
            raise RuntimeError(f"{sub.name}: the session ended after {got} records")
        to_response(_TOPIC, d)
        got += d.to_offset - d.from_offset
        if runs and runs[-1][0] == d.partition and runs[-1][2] == d.from_offset:
            runs[-1][2] = d.to_offset
        else:
            runs.append([d.partition, d.from_offset, d.to_offset])
        now = time.monotonic()
        if now - last >= ack_interval_s or got >= expected:
            last = now
            for partition, begin, end in runs:
                await sub.ack(partition, begin, end)
            await sub.grant(session, sum(end - begin for _, begin, end in runs))
            runs.clear()


async def measure(
    *,
    records: int,
    subscriptions: int,
    credit: int = 1_000,
    ack_interval_s: float = 0.1,
    unpaced: bool = False,
) -> Result:
    """Append ``records`` one-record batches and deliver each to every subscription;
    return the main thread's CPU time over it. ``unpaced``: ack at once, and no
    heartbeat or cursor flush during the run (see the module doc)."""
    if unpaced:
        ack_interval_s = 0.0
    with tempfile.TemporaryDirectory(prefix="fanout-cpu-") as tmp:
        writer = await LogWriter.open(os.path.join(tmp, "log"), LogConfig(fsync=FsyncPolicy.NEVER))
        registry = SubscriptionRegistry(
            os.path.join(tmp, "data"),
            max_unacked=20_000,
            flush_interval_s=_HOUR_S if unpaced else 0.1,  # 0.1: the registry's default
            heartbeat=HeartbeatConfig(_HOUR_S) if unpaced else None,
        )
        try:
            await registry.open({})
            pairs = []
            for i in range(subscriptions):
                sub = await registry.subscribe(_TOPIC, f"s{i}", [writer])
                pairs.append((sub, sub.attach(f"c{i}", credit)))
            consumers = [
                asyncio.create_task(_consume(sub, session, records, ack_interval_s))
                for sub, session in pairs
            ]
            await asyncio.sleep(0.1)  # the attaches are applied
            batch = encode_columns([_PAYLOAD])
            in_flight = asyncio.Semaphore(2)

            async def append() -> None:
                try:
                    await writer.append(batch)
                finally:
                    in_flight.release()

            wall, cpu = time.perf_counter(), time.thread_time()
            appends = []
            for _ in range(records):
                await in_flight.acquire()
                appends.append(asyncio.create_task(append()))
            await asyncio.gather(*appends)
            await asyncio.gather(*consumers)
            cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
            return Result(
                cpu,
                wall,
                sum(sub.state.sent_total for sub, _ in pairs),
                sum(sub.notifier_polls for sub, _ in pairs),
            )
        finally:
            await registry.aclose()
            await writer.aclose()


def main(argv: Sequence[str] | None = None) -> None:
    """Command line: print one :meth:`Result.line`."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.fanout_cpu",
        description="Main-thread CPU per delivery of the dispatcher under fan-out.",
    )
    parser.add_argument("--records", type=int, default=2_000, help="appends (default 2000)")
    parser.add_argument(
        "--subscriptions", type=int, default=100, help="subscriptions (default 100)"
    )
    parser.add_argument(
        "--unpaced",
        action="store_true",
        help="ack at once, no heartbeat or cursor flush: the same work at any speed (valgrind)",
    )
    args = parser.parse_args(argv)
    if args.records < 1 or args.subscriptions < 1:
        parser.error("--records and --subscriptions must be at least 1")
    _, runner = new_runner()
    with runner:
        result = runner.run(
            measure(records=args.records, subscriptions=args.subscriptions, unpaced=args.unpaced)
        )
    sys.stdout.write(result.line() + "\n")


if __name__ == "__main__":
    main()
