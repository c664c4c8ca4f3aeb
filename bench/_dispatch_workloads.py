"""The two workloads the ``dispatch`` scenario runs through a real broker.

Owns :func:`e2e` (an open-loop publisher's paced, stamped records fanned out to many
``exclusive`` subscriptions, the consumers in their own processes; every (record,
subscription) pair's latency) and :func:`shared` (a preloaded topic taken through one
``shared`` subscription by several consumers that ack every record on its own;
messages per second), with the topics and subscription they use. What each measures and
why is in :mod:`bench.dispatch`'s docstring, which turns their figures into results and
goals; the processes they drive are :mod:`bench._dispatch_procs`. Imports neither
:mod:`bench.dispatch` nor :mod:`bench._runner`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from array import array
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

from bench._dispatch_procs import GRACE_S, Broker, Child
from bench._headrace_pubsub import MAX_UNACKED
from bench._measure import per_second
from bench._pubsub_system import E2E_PAYLOAD_BYTES, pace, paced_send_times, stamp_payload
from bench._server_process import ServerFailedError
from client import AsyncAdminClient, AsyncConsumer, AsyncProducer, ClientError

E2E_TOPIC = "dispatch-e2e"
SHARED_TOPIC = "dispatch-shared"
SHARED_SUBSCRIPTION = "dispatch-shared"
SHARED_PARTITIONS = 4
#: How long an e2e consumer's acks wait to be sent: 100 ms is 200 records at 2,000 msg/s,
#: far below the unacked cap, and 5x fewer ack messages than the 20 ms default.
E2E_ACK_INTERVAL_MS = 100.0


async def e2e(
    broker: Broker, *, subscriptions: int, processes: int, rate: float, seconds: float
) -> tuple[list[float], int]:
    """Publish paced records at ``rate`` for ``seconds`` to ``subscriptions`` exclusive
    subscriptions, their consumers dealt out over ``processes`` processes; return the
    latencies (ms, ascending) of every (record, subscription) pair that arrived, and the
    number of records sent."""
    await broker.create_topic(E2E_TOPIC, 1)
    outs = [broker.directory / f"e2e-{i}.f64" for i in range(processes)]
    async with AsyncProducer(broker.address, linger_ms=0) as producer:
        # Connect and look the topic up before the clock runs; the consumers subscribe at
        # ``latest`` after it, so they never see this record.
        await producer.publish(E2E_TOPIC, b"warm-up")
        children = await _e2e_consumers(broker, subscriptions, rate, seconds, outs)
        try:
            for refusal in await asyncio.gather(*(child.ready() for child in children)):
                if refusal is not None:
                    raise ServerFailedError(f"the broker refused a subscription: {refusal}")

            def send(due_ns: int) -> Awaitable[object]:
                return producer.publish(E2E_TOPIC, stamp_payload(due_ns, E2E_PAYLOAD_BYTES))

            sent = await pace(rate, seconds, send, clock_ns=time.monotonic_ns)
            await asyncio.gather(*(child.summary(GRACE_S) for child in children))
        finally:
            await asyncio.gather(*(child.kill() for child in children))
    samples = array("d")
    for out in outs:
        samples.frombytes(out.read_bytes())
    with contextlib.suppress(ClientError):  # its subscriptions would idle beside the next phase
        async with AsyncAdminClient(broker.address) as admin:
            await admin.delete_topic(E2E_TOPIC)
    return sorted(samples), sent


async def _e2e_consumers(
    broker: Broker, subscriptions: int, rate: float, seconds: float, outs: Sequence[Path]
) -> list[Child]:
    """The e2e consumer processes, one per file in ``outs``, the subscriptions dealt out
    among them; each expects every record the publisher will send."""
    names = [f"e2e-{i}" for i in range(subscriptions)]
    expected = len(paced_send_times(rate, seconds))
    return [
        await Child.spawn(
            broker,
            E2E_TOPIC,
            type_="exclusive",
            names=names[i :: len(outs)],
            expected=expected,
            start="latest",
            ack_interval_ms=E2E_ACK_INTERVAL_MS,
            out=out,
        )
        for i, out in enumerate(outs)
    ]


async def shared(
    broker: Broker, *, records: int, consumers: int, warn: Callable[[str], None]
) -> float | None:
    """Preload ``records`` records, then take them through one ``shared`` subscription
    with ``consumers`` consumers, each acking every record on its own; return messages
    per second. None when the broker refuses the ``shared`` type (said through ``warn``)."""
    await broker.create_topic(SHARED_TOPIC, SHARED_PARTITIONS)
    count = records
    if not await _shared_offered(broker.address, warn):
        return None
    async with AsyncProducer(broker.address) as producer:
        sent = await (await producer.send_many(SHARED_TOPIC, [b"s" * E2E_PAYLOAD_BYTES] * count))
    if len(sent) != count:
        raise ServerFailedError(f"{len(sent)} of {count} records were acknowledged")
    child = await Child.spawn(
        broker,
        SHARED_TOPIC,
        type_="shared",
        names=[SHARED_SUBSCRIPTION],
        expected=count,
        start="earliest",
        per_name=consumers,
        receive_queue=MAX_UNACKED // consumers,
        per_record_acks=True,
    )
    try:
        refusal = await child.ready()
        if refusal is not None:
            _refused(warn, *refusal)
            return None
        summary = await child.summary(max(60.0, count / 10_000))
    finally:
        await child.kill()
    if summary["received"] < count:
        raise ServerFailedError(f"{summary['received']} of {count} shared records arrived")
    await _wait_acked(broker.address, warn)
    return per_second(count, (summary["end_ns"] - summary["first_ns"]) / 1e9)


async def _shared_offered(address: str, warn: Callable[[str], None]) -> bool:
    """Whether the broker accepts the shared subscription; says why not (``warn``).

    Asked on the empty topic, before the preload: this creates the subscription at offset
    0 of every partition, exactly as the consumers would.
    """
    probe = AsyncConsumer(SHARED_TOPIC, SHARED_SUBSCRIPTION, broker=address, type="shared")
    try:
        await probe.start()
    except ClientError as exc:
        _refused(warn, exc.code.name if exc.code else type(exc).__name__, str(exc))
        return False
    finally:
        await probe.aclose()
    return True


def _refused(warn: Callable[[str], None], code: str, message: str) -> None:
    warn(f"skipping shared_msgs_s: the broker refused a shared subscription ({code}: {message})")


async def _wait_acked(address: str, warn: Callable[[str], None], timeout_s: float = 10.0) -> None:
    """Return once the shared subscription has no lag left; say so (``warn``) if it
    keeps some (records received twice hid records never acked)."""
    async with AsyncAdminClient(address) as admin:
        deadline = time.monotonic() + timeout_s
        while (info := await admin.describe_subscription(SHARED_TOPIC, SHARED_SUBSCRIPTION)).lag:
            if time.monotonic() > deadline:
                warn(f"shared subscription still has {info.lag} records unacked at the end")
                return
            await asyncio.sleep(0.05)
