"""The producer load of the replication end-to-end tests and the check of what it got
acknowledged (issue 37): :mod:`tests.cluster.test_replication_failover`,
:mod:`tests.cluster.test_replication_recovery`,
:mod:`tests.cluster.test_replication_single_copy`, and the moves and reshape tests, which
take :class:`Load` and :data:`TOPIC` through the failover module.

Role:

- :class:`Load`: one idempotent :class:`~client.AsyncProducer` (every broker a seed)
  sending unique values ``v<n>`` to :data:`TOPIC` until stopped, noting each ack as
  ``(partition, offset) -> value`` and each failure.
- :func:`check_acked`: after a run, compared with the topic as read back through its
  leader: no record failed, every acknowledged record is at its offset, and no value is
  there twice (an idempotent producer's resend was appended once).

Invariant the check relies on: the values are unique (``v0``, ``v1``, ...), so a value
found twice is a record written twice. Worked example: ``v7`` acked at (0, 3) and read
back at (0, 3) and (0, 9): the acked record is there, but the log holds it twice, so the
check fails.

:mod:`tests.cluster.replica_runs` has the fault tests' load (acks kept with their send
order, for the checker of :mod:`tests.cluster.replica_checker`); this one keeps what the
tests here compare: positions and values.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field

from client import AsyncProducer, RecordFuture

TOPIC = "orders"
IN_FLIGHT = 20
PAUSE_S = 0.005


@dataclass
class Load:
    """One idempotent producer sending unique values until stopped; what it got acked."""

    seeds: str
    #: (partition, offset) -> value acknowledged there.
    acked: dict[tuple[int, int], bytes] = field(default_factory=dict)
    failed: list[str] = field(default_factory=list)

    async def wait_more(self, than: int, within_s: float) -> None:
        deadline = time.monotonic() + within_s
        while len(self.acked) <= than:
            assert time.monotonic() < deadline, f"no ack beyond {than} in {within_s} s"
            await asyncio.sleep(0.02)

    async def _produce(self, producer: AsyncProducer, stop: asyncio.Event) -> None:
        window = asyncio.Semaphore(IN_FLIGHT)
        n = 0
        while not stop.is_set():
            await window.acquire()
            value = f"v{n}".encode()
            n += 1
            future = await producer.send(TOPIC, value)

            def settled(f: RecordFuture, value: bytes = value) -> None:
                window.release()
                if f.cancelled() or f.exception() is not None:
                    self.failed.append(repr(f.exception()))
                    return
                meta = f.result()
                self.acked[(meta.partition, meta.offset)] = value

            future.add_done_callback(settled)
            await asyncio.sleep(PAUSE_S)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Load]:
        stop = asyncio.Event()
        async with AsyncProducer(self.seeds, delivery_timeout_s=60.0) as producer:
            task = asyncio.create_task(self._produce(producer, stop))
            try:
                yield self
            finally:
                stop.set()
                await asyncio.gather(task, return_exceptions=True)
                await producer.flush()


def check_acked(load: Load, held: Mapping[tuple[int, int], bytes]) -> None:
    """No record failed; every record ``load`` got acknowledged is at its offset in
    ``held`` (the topic read through its leader); no value is in ``held`` twice."""
    assert load.failed == [], load.failed[:5]
    values = list(held.values())
    assert len(values) == len(set(values)), "a value is in the leader's log twice"
    for position, value in load.acked.items():
        assert held.get(position) == value, f"{position}: acked {value!r} lost"
