"""One client process of the ``cluster`` scenario: a producer or a consumer of one topic.

Run as ``python -m bench._cluster_client SPEC`` where SPEC is a JSON object (see
:class:`Spec`). The process connects through the seed list (the client library routes each
topic to its owner by itself), warms up, prints ``ready`` on stdout and waits for one line
on stdin (the parent's ``go``, sent to every client at once); then it does its work and
prints one JSON object: ``start`` and ``end`` (``time.perf_counter()``, which is
CLOCK_MONOTONIC on Linux, so the parent can compare them across processes), ``records``
and ``cpu_s`` (this process's CPU seconds over the measured window, all threads).

- ``produce``: the shape of ``bench pubsub``'s headline publish figure: one idempotent
  ``AsyncProducer`` (default settings), every record handed over in ``send_many`` calls
  (batches of up to 1 MiB, the partitions in turn, one batch in flight per partition);
  every record is acknowledged after fsync, and each call's result is checked to hold all
  of them. The warm-up publishes one record (so the route is learned before the clock
  runs); consumers expect it.
- ``consume``: the shape of ``bench pubsub``'s consume figure: one exclusive subscription
  from ``earliest`` with a receive queue of 20,000, every value read, each
  ``receive_batch`` acked with one ``ack_many``; the time includes closing the consumer
  (the last acks applied).

Depends on the client library only; it never imports the broker.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from dataclasses import dataclass

from client import AsyncConsumer, AsyncProducer

#: Records handed to one ``send_many`` call (a few 1 MiB batches of 100 B records).
CHUNK = 50_000
#: The consumer's receive queue, as ``bench pubsub``'s consume phase.
CONSUME_QUEUE = 20_000


@dataclass(frozen=True, slots=True)
class Spec:
    """What one client process does.

    Attributes:
        role: ``produce`` or ``consume``.
        seeds: The seed list, ``h1:p1,h2:p2``.
        topic: The one topic it produces to or consumes from.
        records: How many records it sends (after the warm-up one) or takes (all of them).
        payload_bytes: Each record's size (``produce``).
        subscription: The subscription's name (``consume``).
    """

    role: str
    seeds: str
    topic: str
    records: int
    payload_bytes: int = 100
    subscription: str = "bench-cluster"

    def to_json(self) -> str:
        """The spec as the child's command-line argument."""
        return json.dumps(
            {
                "role": self.role,
                "seeds": self.seeds,
                "topic": self.topic,
                "records": self.records,
                "payload_bytes": self.payload_bytes,
                "subscription": self.subscription,
            }
        )


def _wait_for_go() -> None:
    print("ready", flush=True)
    if not sys.stdin.readline():
        raise SystemExit("the parent closed stdin before go")


async def _produce(spec: Spec) -> dict[str, float]:
    payload = b"x" * spec.payload_bytes
    async with AsyncProducer(spec.seeds) as producer:
        await (await producer.send_many(spec.topic, [payload]))  # warm-up: the route
        await asyncio.to_thread(_wait_for_go)
        cpu0, start = time.process_time(), time.perf_counter()
        left = spec.records
        while left > 0:
            count = min(CHUNK, left)
            sent = await (await producer.send_many(spec.topic, [payload] * count))
            if len(sent) != count:
                raise RuntimeError(f"{len(sent)} of {count} records were acknowledged")
            left -= count
        end, cpu1 = time.perf_counter(), time.process_time()
    return {"start": start, "end": end, "records": spec.records, "cpu_s": cpu1 - cpu0}


async def _consume(spec: Spec) -> dict[str, float]:
    await asyncio.to_thread(_wait_for_go)
    cpu0, start = time.process_time(), time.perf_counter()
    taken = 0
    async with AsyncConsumer(
        spec.topic, spec.subscription, broker=spec.seeds, receive_queue=CONSUME_QUEUE
    ) as consumer:
        while taken < spec.records:
            batch = await consumer.receive_batch(10_000, timeout=30)
            for message in batch:
                message.value  # noqa: B018 - the application gets every value in hand
            consumer.ack_many(batch)
            taken += len(batch)
    end, cpu1 = time.perf_counter(), time.process_time()
    return {"start": start, "end": end, "records": taken, "cpu_s": cpu1 - cpu0}


def main(argv: list[str]) -> int:
    """Run the client the spec in ``argv[0]`` describes; print its result; exit code 0."""
    spec = Spec(**json.loads(argv[0]))
    work = _produce if spec.role == "produce" else _consume
    try:
        import uvloop
    except ImportError:
        result = asyncio.run(work(spec))
    else:
        result = uvloop.run(work(spec))
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
