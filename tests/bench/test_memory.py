"""The ``memory`` bench scenario, run briefly against a real ``headrace serve``: a publish
flood and stalled consumers leave the broker's RSS bounded."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.memory import Load, measure

#: RSS growth the broker must stay under. Its fixed buffers: group commits (up to
#: ``max_group_bytes`` 32 MiB per partition), 256 publishes of 64 KiB in flight per
#: PublishStream, ``max_unacked`` records per subscription, HTTP/2 windows. Measured peak
#: growth: about 90 MiB in 4 s and at most 250 MiB over 45 s (no upward trend).
GROWTH_CAP_MIB = 400.0


def test_rss_stays_bounded_under_flood_and_stalled_consumers(tmp_path: Path) -> None:
    """Scenario: for 3 s, four producers flood PublishStream (a fifth never reads its
    answers) while four consumers never read their Subscribe streams, two never ack and
    one reads slowly. Expected: the broker's RSS grows by less than GROWTH_CAP_MIB, though
    buffering what the stalled consumers did not read would have taken more than that
    (published x stalled consumers > the cap): the broker applies backpressure."""
    load = Load(seconds=3.0)
    m = asyncio.run(measure(tmp_path, load))
    assert m.published_mib * load.stalled > GROWTH_CAP_MIB, m
    assert m.growth_mib < GROWTH_CAP_MIB, m


@pytest.mark.slow
def test_cli_prints_json_lines(tmp_path: Path) -> None:
    """Scenario: ``python -m bench memory --quick --json``. Expected: exit 0, the machine
    record, then one JSON line per metric: baseline_rss, peak_rss, rss_growth, published,
    publish_rate."""
    done = subprocess.run(
        [sys.executable, "-m", "bench", "memory", "--quick", "--json", "--dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    machine, *rows = [json.loads(line) for line in done.stdout.splitlines()]
    assert (machine["system"], machine["metric"]) == ("machine", "cpu_cores")
    assert [r["metric"] for r in rows] == [
        "baseline_rss",
        "peak_rss",
        "rss_growth",
        "published",
        "publish_rate",
    ]
    assert all(r["bench"] == "memory" and r["system"] == "headrace" for r in rows)
