"""Smoke test of the ``wal_replica`` bench scenario: tiny logs, in-process, checked for
shape (never for timings)."""

from __future__ import annotations

import json
from pathlib import Path

from bench import wal_replica
from bench._runner import SCENARIOS
from bench._scenario import RunOptions
from wal import FsyncPolicy, Log, iter_batches

METRICS = {
    f"{name}_{unit}"
    for name in ("read_raw", "append_replicated", "replicate")
    for unit in ("mb_s", "records_s")
}


def test_every_metric_for_every_cell_is_positive_json(tmp_path: Path) -> None:
    """Scenario: the scenario over 256 KiB leader logs of 1- and 10-record batches, the
    follower under fsync always. Expected: the six metrics for each batch size, each a JSON
    line of the bench format with a positive value and the cell's params; registered."""
    sizes = wal_replica.Sizes(256 * 1024, 1, batches=(1, 10), fsync=(FsyncPolicy.ALWAYS,))
    results = list(wal_replica.run(RunOptions(quick=True, data_dir=tmp_path), sizes=sizes))
    assert len(results) == 12
    for batch in (1, 10):
        got = {r.metric for r in results if r.params["batch"] == batch}
        assert got == METRICS
    for result in results:
        line = json.loads(result.to_json())
        assert line["bench"] == "wal_replica"
        assert line["system"] == "headrace"
        assert line["value"] > 0
        assert line["params"]["record_bytes"] == 100
        assert line["params"]["chunk_bytes"] == 65536
        assert line["params"]["fsync"] == "always"
    assert "wal_replica" in SCENARIOS


def test_next_offset_reads_the_last_batch_header(tmp_path: Path) -> None:
    """Scenario: a leader log of 3-record batches; raw chunks of its files cut at batch
    boundaries. Expected: ``_next_offset`` of each chunk is its last batch's next offset
    (the bench's read loop steps by it, so a wrong answer would loop or skip)."""
    records = wal_replica._build_leader(tmp_path, 3, 20_000)
    log = Log.open(str(tmp_path))
    try:
        batches = log.read(0, 1 << 30)
    finally:
        log.close()
    data = b"".join(bytes(b.buffer) for b in batches)
    assert records == batches[-1].next_offset
    pos = 0
    for b in iter_batches(data):
        pos += b.size
        assert wal_replica._next_offset(data[:pos]) == b.next_offset
