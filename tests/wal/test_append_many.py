"""``Log.append_many`` at the edge where a group stops fitting the active segment.

A group that fits the active segment whole skips the per-batch roll check; any other goes
batch by batch. Both must place batches exactly as appending them one at a time would:
the same offsets and results, the same segments (a group that fills a segment to the byte
does not roll; one byte more rolls before the batch that does not fit), the same crash
point once per call, and an empty group writes nothing.
"""

from __future__ import annotations

from pathlib import Path

from tests.wal._helpers import read_all
from wal import FaultyFs, Log, LogConfig, RecordBatch, encode_columns
from wal.log import AppendResult


def make_batches(log: Log, n: int) -> list[RecordBatch]:
    """``n`` batches of one record each, all the same size."""
    return [log.validate(encode_columns([b"record-%04d" % i])) for i in range(n)]


def open_log(path: Path, fs: FaultyFs, segment_bytes: int) -> Log:
    return Log.open(str(path), LogConfig(segment_bytes=segment_bytes), fs=fs)


def batch_size(tmp_path: Path) -> int:
    log = Log.open(str(tmp_path / "probe"))
    try:
        return make_batches(log, 1)[0].size
    finally:
        log.close()


def layout(log: Log) -> list[tuple[int, int, int]]:
    return [(s.base_offset, s.next_offset, s.size_bytes) for s in log.segment_infos()]


def test_groups_at_the_fit_edge_place_batches_as_single_appends_do(tmp_path: Path) -> None:
    size = batch_size(tmp_path)
    segment_bytes = 4 * size  # four batches fill a segment to the byte
    assert segment_bytes >= 128
    # Group sizes: 4 fill segment 0 exactly (no roll); 3 roll first; 2 fill segment 4 and
    # roll before the second; 1 fits what is left of segment 8.
    groups = [4, 3, 2, 1]

    grouped_fs = FaultyFs()
    grouped = open_log(tmp_path / "grouped", grouped_fs, segment_bytes)
    batches = make_batches(grouped, sum(groups))
    grouped_results: list[AppendResult] = []
    layouts = []
    start = 0
    for n in groups:
        grouped_results += grouped.append_many(batches[start : start + n])
        start += n
        layouts.append(layout(grouped))
    assert layouts[0] == [(0, 4, segment_bytes)], "a group that fills the segment rolled"
    assert layouts[1] == [(0, 4, segment_bytes), (4, 7, 3 * size)]
    assert layouts[2] == [(0, 4, segment_bytes), (4, 8, segment_bytes), (8, 9, size)]

    single_fs = FaultyFs()
    single = open_log(tmp_path / "single", single_fs, segment_bytes)
    single_results: list[AppendResult] = []
    for b in batches:
        single_results += single.append_many([b])

    assert grouped_results == single_results == [AppendResult(i, i) for i in range(10)]
    assert layout(grouped) == layout(single)
    assert [b.base_offset for b in read_all(grouped)] == list(range(10))
    assert [bytes(b.buffer[8:]) for b in read_all(grouped)] == [
        bytes(b.buffer[8:]) for b in read_all(single)
    ]
    point = "crash_point:append.after_write"
    assert grouped_fs.calls[point] == len(groups)
    assert single_fs.calls[point] == len(batches)
    grouped.close()
    single.close()


def test_an_empty_group_writes_nothing(tmp_path: Path) -> None:
    fs = FaultyFs()
    log = open_log(tmp_path / "log", fs, 1024)
    log.append_many(make_batches(log, 2))
    writes = fs.calls.get("pwritev", 0)
    assert log.append_many([]) == []
    assert log.head == 2
    assert fs.calls.get("pwritev", 0) == writes
    assert fs.calls["crash_point:append.after_write"] == 1
    log.close()
