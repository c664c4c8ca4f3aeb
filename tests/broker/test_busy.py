"""While the broker process is busy, every publish answer's in-flight hint is 1.

- Pure (:mod:`broker.busy`): busy once the averaged CPU reaches ``BUSY_AT`` of a core or
  one period ``PEAK_AT``, calm again only at ``CALM_AT`` (hysteresis); a period of no
  length is ignored; the hint passes the partition's through while calm.
- The monitor (:mod:`broker.load_monitor`) with fake clocks: a reading once a period,
  taken as hints are asked; a pause counts as one low period.
- End to end over real gRPC: a broker whose fdatasync takes 20 ms more answers with hint
  2 after the warm-up; then a thread of this process spins (the process uses a whole
  core) and within a second the answers carry 1; once it stops, 2 again.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import grpc
import pytest

from broker.busy import BUSY_AT, CALM_AT, PEAK_AT, BusyRule
from broker.load_monitor import LoadMonitor
from proto import admin_pb2, admin_pb2_grpc, broker_pb2_grpc
from proto import broker_pb2 as pb
from tests.client.conftest import address
from tests.client.test_producer_faults import slow_broker
from wal import encode_columns
from wal.commit_cost import PIPELINED, WARMUP_COMMITS


def _rule_at(cores: float, periods: int = 20, rule: BusyRule | None = None) -> BusyRule:
    rule = rule or BusyRule()
    for _ in range(periods):
        rule.observe(cores * 0.05, 0.05)
    return rule


def test_busy_from_busy_at_and_calm_again_only_at_calm_at() -> None:
    assert not _rule_at(BUSY_AT - 0.02).busy
    rule = _rule_at(BUSY_AT + 0.01)
    assert rule.busy
    assert rule.in_flight_hint(PIPELINED) == 1
    _rule_at((BUSY_AT + CALM_AT) / 2, rule=rule)  # between the two: it stays busy
    assert rule.busy
    _rule_at(CALM_AT - 0.02, rule=rule)
    assert not rule.busy
    assert rule.in_flight_hint(PIPELINED) == PIPELINED
    assert rule.in_flight_hint(1) == 1
    _rule_at((BUSY_AT + CALM_AT) / 2, rule=rule)  # between the two: it stays calm
    assert not rule.busy


def test_one_period_at_the_peak_makes_a_calm_process_busy() -> None:
    """Scenario: calm at 0.3 of a core, then one 50 ms period at ``PEAK_AT`` (the
    average is still under ``BUSY_AT``). Expected: busy at once; a period just under the
    peak is not enough."""
    rule = _rule_at(0.3)
    rule.observe((PEAK_AT - 0.01) * 0.05, 0.05)
    assert not rule.busy
    rule = _rule_at(0.3)
    rule.observe(PEAK_AT * 0.05, 0.05)
    assert rule.cores < BUSY_AT
    assert rule.busy


def test_a_period_of_no_length_is_ignored() -> None:
    rule = _rule_at(0.3)
    before = rule.cores
    rule.observe(5.0, 0.0)
    assert rule.cores == before


class _Clocks:
    """A fake monotonic clock and CPU clock that tests move by hand."""

    def __init__(self) -> None:
        self.now = 100.0
        self.cpu = 5.0

    def run(self, seconds: float, cores: float) -> None:
        self.now += seconds
        self.cpu += seconds * cores


def test_the_monitor_reads_the_cpu_once_a_period_as_hints_are_asked() -> None:
    """Scenario: fake clocks; hints asked every 10 ms while the process uses 1.5 cores,
    then after a 10 s pause at 0.01, then at 0.3. Expected: a reading only once 25 ms
    passed (asks in between change nothing); busy (hint 1) within three periods at 1.5;
    the pause's single period counts as one low period; calm again at 0.3."""
    clocks = _Clocks()
    monitor = LoadMonitor(period_s=0.025, cpu=lambda: clocks.cpu, clock=lambda: clocks.now)
    assert monitor.hint(PIPELINED) == PIPELINED
    clocks.run(0.01, 1.5)
    assert monitor.hint(PIPELINED) == PIPELINED
    assert monitor.rule.cores == 0.0  # 10 ms: no reading yet
    for _ in range(8):
        clocks.run(0.01, 1.5)
        monitor.hint(PIPELINED)
    # Readings at 30, 60 and 90 ms, each 30 ms at 1.5 cores: 0.75, 1.125, 1.3125.
    assert monitor.rule.cores == pytest.approx(1.3125)
    assert monitor.rule.busy
    assert monitor.hint(PIPELINED) == 1
    clocks.run(10.0, 0.01)
    monitor.hint(PIPELINED)
    assert monitor.rule.cores == pytest.approx(1.3125 + (0.01 - 1.3125) / 2)  # one period
    for _ in range(20):
        clocks.run(0.03, 0.3)
        monitor.hint(PIPELINED)
    assert not monitor.rule.busy
    assert monitor.hint(PIPELINED) == PIPELINED


async def _hint(stream: grpc.aio.StreamStreamCall[pb.PublishRequest, pb.PublishResponse]) -> int:
    await stream.write(pb.PublishRequest(topic="b", batch=encode_columns([b"x"])))
    answer = await stream.read()
    assert isinstance(answer, pb.PublishResponse)
    return answer.in_flight_hint


def _spin(stop: threading.Event) -> None:
    while not stop.is_set():
        sum(range(1000))  # Python work: a core's worth of CPU, as a saturated broker uses


async def _until(
    stream: grpc.aio.StreamStreamCall[pb.PublishRequest, pb.PublishResponse], want: int
) -> int:
    """Publish one batch at a time until an answer's hint is ``want`` or a second passed;
    return the last hint."""
    deadline = time.monotonic() + 1.0
    while (hint := await _hint(stream)) != want and time.monotonic() < deadline:
        pass
    return hint


@pytest.mark.asyncio
async def test_a_busy_process_answers_hint_one(tmp_path: Path) -> None:
    """Scenario: fdatasync 20 ms slower, so each partition's commit is cheap for the loop
    beside its disk; the warm-up gives hint 2. A thread spins (the process at a core or
    more). Expected: hint 1 within a second, the rule busy; 2 again once it stopped."""
    async with (
        slow_broker(tmp_path, 0.02) as broker,
        grpc.aio.insecure_channel(address(broker)) as channel,
    ):
        admin = admin_pb2_grpc.AdminStub(channel)
        await admin.CreateTopic(admin_pb2.CreateTopicRequest(name="b", partitions=1))
        stream = broker_pb2_grpc.BrokerStub(channel).PublishStream()
        hints = [await _hint(stream) for _ in range(WARMUP_COMMITS)]
        assert hints[-1] == PIPELINED
        stop = threading.Event()
        spinner = threading.Thread(target=_spin, args=(stop,))
        spinner.start()
        try:
            assert await _until(stream, 1) == 1
            assert broker.load.rule.busy
        finally:
            stop.set()
            spinner.join()
        assert await _until(stream, PIPELINED) == PIPELINED
        await stream.done_writing()
