"""Client channels: the reconnect backoff options, and that clients honour their cap
after a real broker process was away for seconds."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from client import AsyncAdminClient, AsyncConsumer, AsyncProducer
from client._channel import MAX_MESSAGE_BYTES, channel_options
from tests.broker.test_kill import BrokerProcess
from tests.broker.test_serve_process import free_port


@pytest.mark.parametrize(
    ("cap_s", "initial_ms", "cap_ms"),
    [(1.0, 100, 1000), (0.5, 100, 500), (0.05, 50, 50), (30.0, 100, 30_000)],
)
def test_options_cap_the_reconnect_backoff(cap_s: float, initial_ms: int, cap_ms: int) -> None:
    """The cap sets the max backoff and the least connect time; the first pause is 100 ms,
    or the cap if lower; message limits are 64 MiB both ways."""
    options = dict(channel_options(cap_s))
    assert options["grpc.initial_reconnect_backoff_ms"] == initial_ms
    assert options["grpc.max_reconnect_backoff_ms"] == cap_ms
    assert options["grpc.min_reconnect_backoff_ms"] == cap_ms
    assert options["grpc.max_send_message_length"] == MAX_MESSAGE_BYTES
    assert options["grpc.max_receive_message_length"] == MAX_MESSAGE_BYTES
    assert options["grpc.use_local_subchannel_pool"] == 1  # no backoff inherited


def test_the_default_cap_is_one_second() -> None:
    """Without a setting every client channel reconnects at least once a second."""
    assert dict(channel_options())["grpc.max_reconnect_backoff_ms"] == 1000


@pytest.mark.parametrize("cap_s", [0.0, -1.0, 3601.0])
def test_a_bad_cap_is_refused_with_its_range(cap_s: float) -> None:
    """Out of range: one ValueError naming the setting and the range."""
    with pytest.raises(ValueError, match=r"reconnect_backoff_max_s must be from 0.001 to 3600"):
        channel_options(cap_s)


CONFIG = """\
[broker]
grace_seconds = 0.5
"""
#: Long enough for gRPC's default backoff (1 s growing 1.6x, +-20 %: attempts near 1,
#: 2.6, 5.2, 9.3, 15.8, 26 s) to be between far-apart attempts when the broker returns:
#: measured here, a default channel came back 0.9 s after an 8 s outage (too short to
#: tell), 6.4 s after a 20 s one, 22.3 s after a 45 s one; capped at 0.5 s: 0.3-0.6 s.
OUTAGE_S = 20.0
#: How soon after the broker serves again the clients must be back: the 0.5 s cap, plus
#: the consumer's own reopen pause (at most 2 s) and a margin for a loaded machine.
BACK_WITHIN_S = 3.5


@pytest.mark.asyncio
@pytest.mark.slow
@pytest.mark.timeout(90)
async def test_clients_are_back_soon_after_an_outage_longer_than_the_cap(
    tmp_path: Path,
) -> None:
    """Scenario: a consumer (``reconnect_backoff_max_s`` 0.5) receives from a real
    ``headrace serve``; the broker is SIGKILLed, stays down 20 s, and starts again on the
    same port; meanwhile a producer (also capped at 0.5 s) keeps publishing. Expected: within
    3.5 s of the broker serving again, a record published after the restart is
    acknowledged and the consumer receives it (both channels reconnected at the capped
    backoff; with gRPC's default backoff this fails)."""
    broker = BrokerProcess(tmp_path, free_port(), CONFIG)
    await broker.start()
    try:
        async with AsyncAdminClient(broker.address) as admin:
            await admin.create_topic("t", 1)
        async with (
            AsyncProducer(
                broker.address, linger_ms=0, delivery_timeout_s=60, reconnect_backoff_max_s=0.5
            ) as producer,
            AsyncConsumer("t", "s", broker=broker.address, reconnect_backoff_max_s=0.5) as consumer,
        ):
            await producer.publish("t", b"before")
            assert (await consumer.receive(timeout=10)).value == b"before"
            broker.kill()
            await asyncio.sleep(OUTAGE_S)
            await broker.start()
            serving = time.monotonic()
            await asyncio.wait_for(producer.publish("t", b"after"), BACK_WITHIN_S)
            while (await consumer.receive(timeout=BACK_WITHIN_S)).value != b"after":
                pass  # "before" again: its ack may not have been saved before the kill
            assert time.monotonic() - serving < BACK_WITHIN_S
    finally:
        broker.kill()
