"""The in-flight hint's rule (:mod:`wal.commit_cost`) and the writer's measurements of it.

- Pure: the hint stays 1 through the warm-up; becomes 2 once the loop's work per commit
  falls under half the disk's; falls back to 1 only once it rises over the disk's
  (hysteresis between); averages weight each commit by 1/8.
- The writer, on real files: a listener that costs nothing beside an fdatasync held 20 ms
  longer turns the hint to 2; one that holds the loop 60 ms a commit turns it back to 1;
  under the ``never`` policy nothing is observed.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.client.test_producer_faults import SlowSyncFs
from wal import FsyncPolicy, LogConfig, LogWriter, encode_columns
from wal.commit_cost import OFF_RATIO, ON_RATIO, PIPELINED, WARMUP_COMMITS, CommitCost


def test_the_hint_stays_one_through_the_warm_up() -> None:
    cost = CommitCost()
    for _ in range(WARMUP_COMMITS - 1):
        cost.observe(0.001, 0.0)
        assert cost.in_flight_hint == 1
    cost.observe(0.001, 0.0)
    assert cost.in_flight_hint == PIPELINED


@pytest.mark.parametrize(
    ("ratio", "pipelined"),
    [(0.1, True), (ON_RATIO * 0.99, True), (ON_RATIO, False), (0.8, False), (6.0, False)],
)
def test_a_cold_hint_turns_on_under_the_on_ratio_only(ratio: float, pipelined: bool) -> None:
    cost = CommitCost()
    for _ in range(WARMUP_COMMITS):
        cost.observe(0.0002, 0.0002 * ratio)
    assert cost.pipelined is pipelined


def test_between_the_thresholds_the_hint_keeps_its_value() -> None:
    """Scenario: on at ratio 0.2, then 50 commits at 0.8 (between 0.5 and 1.0): still
    on; then commits at 3.0 turn it off; then 50 at 0.8 again: still off."""
    cost = CommitCost()
    for _ in range(WARMUP_COMMITS):
        cost.observe(0.0002, 0.00004)
    assert cost.pipelined
    for _ in range(50):
        cost.observe(0.0002, 0.00016)
        assert cost.pipelined
    for _ in range(50):
        cost.observe(0.0002, 0.0006)
    assert not cost.pipelined
    assert cost.notify_s > cost.disk_s * OFF_RATIO
    for _ in range(50):
        cost.observe(0.0002, 0.00016)
        assert not cost.pipelined


def test_the_averages_weight_each_commit_by_an_eighth() -> None:
    cost = CommitCost()
    cost.observe(0.008, 0.0)
    cost.observe(0.0, 0.008)
    assert cost.disk_s == pytest.approx(0.007)
    assert cost.notify_s == pytest.approx(0.001)
    assert cost.commits == 2


async def _commits(writer: LogWriter, n: int) -> None:
    for i in range(n):
        await writer.append(encode_columns([b"%d" % i]))


@pytest.mark.asyncio
async def test_the_writer_measures_its_disk_against_its_listeners(tmp_path: Path) -> None:
    """Scenario: every fdatasync takes 20 ms longer; a listener that costs nothing, for
    ``WARMUP_COMMITS`` commits: hint 2 (disk about 20 ms, listeners about 0). Then the
    listener holds the loop 60 ms on each commit: within 8 commits the hint is 1 again."""
    writer = await LogWriter.open(str(tmp_path / "log"), fs=SlowSyncFs(0.02))
    slow = False

    def listener(_hwm: int) -> None:
        if slow:
            time.sleep(0.06)  # the loop's own work, as a dispatcher's pass is

    writer.add_listener(listener)
    try:
        await _commits(writer, WARMUP_COMMITS)
        assert writer.commit_cost.in_flight_hint == PIPELINED
        assert writer.commit_cost.disk_s >= 0.02
        assert writer.commit_cost.notify_s < 0.005
        slow = True
        await _commits(writer, 8)
        assert writer.commit_cost.in_flight_hint == 1
        assert writer.commit_cost.notify_s > writer.commit_cost.disk_s
    finally:
        await writer.aclose()


@pytest.mark.asyncio
async def test_without_a_sync_nothing_is_observed(tmp_path: Path) -> None:
    writer = await LogWriter.open(
        str(tmp_path / "log"), LogConfig(fsync=FsyncPolicy.NEVER), fs=SlowSyncFs(0.02)
    )
    try:
        await _commits(writer, WARMUP_COMMITS + 2)
        assert writer.commit_cost.commits == 0
        assert writer.commit_cost.in_flight_hint == 1
    finally:
        await writer.aclose()
