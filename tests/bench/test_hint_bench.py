"""The ``hint`` bench scenario, run briefly through its command line against real
``headrace serve`` processes: every cell reports both systems and the ratios."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.hint import QUICK, SYSTEMS


@pytest.mark.slow
def test_cli_prints_both_systems_and_the_ratios_for_every_cell(tmp_path: Path) -> None:
    """Scenario: ``python -m bench hint --quick --json``. Expected: exit 0, the machine
    record, then for each quick cell and round each system's p50, p99 and broker CPU
    (positive; p50 <= p99; every record arrived), then the cell's two ratios."""
    done = subprocess.run(
        [sys.executable, "-m", "bench", "hint", "--quick", "--json", "--dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    machine, *rows = [json.loads(line) for line in done.stdout.splitlines()]
    assert (machine["system"], machine["metric"]) == ("machine", "cpu_cores")
    per_run = ["e2e_latency_p50_ms", "e2e_latency_p99_ms", "broker_cpu_cores"]
    expected = []
    for cell in QUICK.cells:
        for _ in range(QUICK.rounds):
            expected += [(s, m, cell.partitions) for s in SYSTEMS for m in per_run]
        expected += [
            (SYSTEMS[0], m, cell.partitions) for m in ("e2e_p50_vs_window_1", "e2e_p99_vs_window_1")
        ]
    assert [(r["system"], r["metric"], r["params"]["partitions"]) for r in rows] == expected
    assert all(r["bench"] == "hint" and r["value"] > 0 for r in rows)
    assert not any("arrived" in r["params"] for r in rows), "records were lost or late"
    runs = [r for r in rows if r["metric"] in per_run]
    for p50, p99 in zip(runs[0::3], runs[1::3], strict=True):
        assert p50["value"] <= p99["value"]
