"""Honest delivery counts, end to end: a clean close gives back what the application never
received, a crash does not (real broker, real gRPC on loopback, real client; the crash is
a SIGKILLed child process; the CLI runs through its click entry point).

The defect these guard against: ten runs of ``headrace consume --count 1`` dead-lettered
995 records nobody had seen, because each departure counted the whole prefetch buffer as
a failed delivery attempt.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from broker.app import Broker
from broker.cli import cli
from broker.config import BrokerConfig
from client import AsyncAdminClient, AsyncConsumer, AsyncProducer, Consumer, Message
from dispatcher import DispatchConfig, DispatchPolicy, Subscription
from tests._helpers import eventually
from tests.broker.conftest import broker_config
from tests.client.conftest import address

pytestmark = pytest.mark.asyncio(loop_scope="function")

ROOT = Path(__file__).resolve().parents[2]


def _config(tmp_path: Path, **policy: object) -> BrokerConfig:
    defaults = DispatchPolicy(**policy)  # type: ignore[arg-type]
    return broker_config(tmp_path / "data", dispatch=DispatchConfig(defaults=defaults))


async def _setup(broker: Broker, count: int, *, batch: int = 10, poison: int = -1) -> None:
    """Topic ``t`` of one partition holding records ``b"0"`` .. ``count - 1`` in
    batches of ``batch`` (the record at ``poison`` has the value ``b"poison"``)."""
    async with AsyncAdminClient(address(broker)) as admin:
        await admin.create_topic("t", 1)
    async with AsyncProducer(address(broker), linger_ms=0) as producer:
        for base in range(0, count, batch):
            futures = [
                await producer.send("t", b"poison" if i == poison else b"%d" % i)
                for i in range(base, min(base + batch, count))
            ]
            await asyncio.gather(*futures)


def _sub(broker: Broker) -> Subscription:
    return broker.subscriptions.get("t", "s")


async def _take(consumer: AsyncConsumer, n: int) -> list[Message]:
    out: list[Message] = []
    async with asyncio.timeout(10):
        while len(out) < n:
            out += await consumer.receive_batch(n - len(out))
    return out


async def _dead_letters(broker: Broker) -> int:
    async with AsyncAdminClient(address(broker)) as admin:
        return await admin.count_dead_letters("t", "s")


@pytest.mark.parametrize("kind", ["exclusive", "failover", "shared", "key_shared"])
async def test_a_clean_close_releases_the_prefetch_uncounted(tmp_path: Path, kind: str) -> None:
    """Scenario: 200 records; a consumer with a prefetch of 1,000 receives all of them,
    takes one, acks it and closes (``async with``). A second consumer follows.
    Expected: the second gets the other 199 in order, every one with redelivery_count 0;
    the broker counted no redelivery and released 199 records."""
    async with Broker(_config(tmp_path, max_deliveries=3)) as broker:
        await _setup(broker, 200)
        kw = {"broker": address(broker), "type": kind, "receive_queue": 1_000}
        async with AsyncConsumer("t", "s", consumer_name="a", **kw) as a:  # type: ignore[arg-type]
            (first,) = await _take(a, 1)
            await eventually(lambda: _sub(broker).state.in_flight(0) == 200)
            a.ack(first)
        assert first.value == b"0"
        async with AsyncConsumer("t", "s", consumer_name="b", **kw) as b:  # type: ignore[arg-type]
            rest = await _take(b, 199)
            b.ack_many(rest)
        assert [m.value for m in rest] == [b"%d" % i for i in range(1, 200)]
        assert {m.redelivery_count for m in rest} == {0}
        state = _sub(broker).state
        assert (state.redelivered_total, state.released_total) == (0, 199)


async def test_a_sync_consumer_releases_its_prefetch_on_close(tmp_path: Path) -> None:
    """Scenario: the blocking ``Consumer`` (in a thread) takes 5 of 50 prefetched records,
    acks them and leaves its ``with`` block.
    Expected: 45 records released; the next consumer gets them as first deliveries."""
    async with Broker(_config(tmp_path)) as broker:
        await _setup(broker, 50)

        def take_five() -> list[bytes]:
            with Consumer("t", "s", broker=address(broker)) as consumer:
                got = [consumer.receive(timeout=10) for _ in range(5)]
                consumer.ack_many(got)
                return [m.value for m in got]

        assert await asyncio.to_thread(take_five) == [b"%d" % i for i in range(5)]
        async with AsyncConsumer("t", "s", broker=address(broker)) as b:
            rest = await _take(b, 45)
        assert [m.redelivery_count for m in rest] == [0] * 45
        assert _sub(broker).state.released_total == 45


def _consume(*args: str) -> Result:
    return CliRunner().invoke(cli, ["consume", *args], catch_exceptions=False)


async def test_ten_cli_runs_of_count_one_dead_letter_nothing(tmp_path: Path) -> None:
    """Scenario: the user's report: 1,000 records, max_deliveries 3, and ``headrace
    consume t -s s --count 1`` run ten times (through the click entry point).
    Expected: the runs print 0 .. 9, each exits 0; the DLQ is empty, the broker counted
    no redelivery, and the cursor is at 10: the 990 records nobody saw were never counted
    (the CLI asked for one record ahead, not the client's 1,000)."""
    async with Broker(_config(tmp_path, max_deliveries=3)) as broker:
        await _setup(broker, 1_000, batch=1)
        printed = []
        for _ in range(10):
            result = await asyncio.to_thread(
                _consume, "t", "-s", "s", "--count", "1", "--broker", address(broker)
            )
            assert result.exit_code == 0, result.output
            printed.append(result.stdout)
        assert printed == [f"{i}\n" for i in range(10)]
        assert await _dead_letters(broker) == 0
        state = _sub(broker).state
        assert state.redelivered_total == 0
        assert state.cursor(0) == 10


async def test_consume_timeout_stops_with_fewer_records_than_count(tmp_path: Path) -> None:
    """Scenario: 3 records; ``consume --count 5 --timeout 0.5``.
    Expected: it prints and acks the 3, waits 0.5 s for a fourth, exits 0 with the note
    ``stopped after 0.5s without a record; got 3 of 5`` on stderr."""
    async with Broker(_config(tmp_path)) as broker:
        await _setup(broker, 3)
        args = ("t", "-s", "s", "--count", "5", "--timeout", "0.5", "--broker", address(broker))
        result = await asyncio.to_thread(_consume, *args)
        assert result.exit_code == 0, result.output
        assert result.stdout == "0\n1\n2\n"
        assert "stopped after 0.5s without a record; got 3 of 5" in result.stderr
        assert "consumed 3 records from t" in result.stderr
        await eventually(lambda: _sub(broker).state.cursor(0) == 3)


@pytest.mark.parametrize("value", ["0", "-1", "abc", "nan", "inf", ""])
async def test_a_bad_consume_timeout_is_a_usage_error(value: str) -> None:
    """Scenario: ``consume --timeout`` with zero, a negative, a word, NaN, infinity, nothing.
    Expected: exit 2 with a message naming --timeout; no broker is contacted."""
    result = _consume("t", "-s", "s", "--timeout", value, "--broker", "127.0.0.1:1")
    assert result.exit_code == 2
    assert "--timeout" in result.stderr


CHILD = """
import asyncio, sys
from client import AsyncConsumer

async def main():
    consumer = AsyncConsumer("t", "s", broker=sys.argv[1], receive_queue=1000)
    message = await consumer.receive(timeout=20)
    print(message.offset, flush=True)
    await asyncio.sleep(3600)

asyncio.run(main())
"""


async def test_a_sigkilled_consumer_counts_what_it_held(tmp_path: Path) -> None:
    """Scenario: a consumer in a child process prefetches 100 records, takes one, and is
    SIGKILLed holding them all.
    Expected: a broken stream is a failed attempt: the next consumer gets all 100 again,
    each with redelivery_count 1."""
    async with Broker(_config(tmp_path, max_deliveries=3)) as broker:
        await _setup(broker, 100)
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        child = await asyncio.create_subprocess_exec(
            sys.executable, "-c", CHILD, address(broker), stdout=asyncio.subprocess.PIPE, env=env
        )
        try:
            assert child.stdout is not None
            line = await asyncio.wait_for(child.stdout.readline(), 20)
            assert line == b"0\n"
            await eventually(lambda: _sub(broker).state.in_flight(0) == 100)
        finally:
            child.send_signal(signal.SIGKILL)
            await child.wait()
        async with AsyncConsumer("t", "s", broker=address(broker)) as b:
            again = await _take(b, 100)
        assert [m.offset for m in again] == list(range(100))
        assert {m.redelivery_count for m in again} == {1}
        assert _sub(broker).state.released_total == 0


class PoisonedError(Exception):
    """The application's failure on the poison record."""


async def test_a_poison_record_that_kills_its_consumer_reaches_the_dlq(tmp_path: Path) -> None:
    """Scenario: 20 records, record 5 is poison; max_deliveries 3. A consumer with a
    prefetch of 1,000 acks each record until the poison one, on which it raises inside
    ``async with`` (a clean close at the gRPC level); it is restarted in a loop.
    Expected: the poison record reaches the DLQ after 3 attempts (its redelivery counts
    were 0, 1, 2); nothing else is dead-lettered; records after it were released, never
    counted: each arrives with redelivery_count 0, and every record is finally acked."""
    async with Broker(_config(tmp_path, max_deliveries=3, backoff_initial_s=0)) as broker:
        await _setup(broker, 20, poison=5)
        poison_counts: list[int] = []
        counts: dict[bytes, set[int]] = {}
        acked: set[bytes] = set()
        for _ in range(6):
            if len(acked) == 19:
                break
            with contextlib.suppress(PoisonedError):
                async with AsyncConsumer("t", "s", broker=address(broker)) as consumer:
                    while len(acked) < 19:
                        message = await consumer.receive(timeout=10)
                        counts.setdefault(message.value, set()).add(message.redelivery_count)
                        if message.value == b"poison":
                            poison_counts.append(message.redelivery_count)
                            raise PoisonedError
                        consumer.ack(message)
                        acked.add(message.value)
        assert poison_counts == [0, 1, 2]
        await eventually(lambda: _sub(broker).state.cursor(0) == 20)
        assert await _dead_letters(broker) == 1
        assert _sub(broker).state.dead_lettered_total == 1
        assert {v: c for v, c in counts.items() if v != b"poison"} == {
            b"%d" % i: {0} for i in range(20) if i != 5
        }
