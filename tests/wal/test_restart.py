"""Disk tests of :meth:`wal.log.Log.restart_at`: a replica emptying its log to a new start.

Segments roll at ~512 B, so the logs span many segments. The crash tests stop a restart at
each named crash point it passes, drop the descriptors unsynced, cut the power and reopen
with the real filesystem: the log must be a prefix of the old one or empty (at the old
first offset or the new one), and a second call must finish the job.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from tests.wal._helpers import CrashableFs
from tests.wal.test_truncate import CONFIG, fill, segment_bases, values_of
from wal import Log, SimulatedCrash, encode_columns
from wal.leader_epochs import EpochEntry


def _filled(path: str, fs: CrashableFs | None = None) -> tuple[Log, list[bytes]]:
    """A log of 40 batches over many segments, with epochs (3, 0) and (5, 30)."""
    log = Log.open(path, CONFIG, fs=fs) if fs is not None else Log.open(path, CONFIG)
    log.leader_epochs.assign(3, 0)
    values = fill(log, 20)
    log.leader_epochs.assign(5, log.head)
    values += fill(log, 20, first_id=len(values))
    return log, values


@pytest.mark.parametrize("where", ["above-head", "at-head", "at-first", "below-first"])
def test_restart_empties_the_log_and_appends_go_on_from_the_new_start(
    tmp_path: Path, where: str
) -> None:
    """Scenario: a log over many segments with two epochs (its oldest segments deleted for
    'below-first') restarts above its head, at its head, at its first offset, or below it.
    Expected: one empty segment based at the new start remains, the epoch history is
    empty, the next append is given the new start, and a reopen sees the same."""
    path = str(tmp_path / "log")
    log, _values = _filled(path)
    if where == "below-first":
        log.delete_before(log.segment_infos()[3].base_offset)
    start = {
        "above-head": log.head + 1000,
        "at-head": log.head,
        "at-first": log.first_offset,
        "below-first": log.first_offset - 7,
    }[where]
    removed = log.restart_at(start)
    assert removed  # every old segment went
    assert (log.first_offset, log.head) == (start, start)
    assert segment_bases(path) == [start]
    assert log.leader_epochs.entries() == []
    assert log.append(encode_columns([b"after"])).first_offset == start
    log.close()
    reopened = Log.open(path, CONFIG)
    assert (reopened.first_offset, reopened.head) == (start, start + 1)
    assert values_of(reopened) == [b"after"]
    assert reopened.leader_epochs.entries() == []
    reopened.close()


def test_a_negative_start_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    """Scenario: restart at -1. Expected: ValueError; the log keeps every record and its
    epochs."""
    path = str(tmp_path / "log")
    log, values = _filled(path)
    with pytest.raises(ValueError, match="negative"):
        log.restart_at(-1)
    assert values_of(log) == values
    assert [e.epoch for e in log.leader_epochs.entries()] == [3, 5]
    log.close()


RESTART_POINTS = [
    "truncate.after_segment_delete",
    "truncate.after_index",
    "truncate.after_data",
    "leader_epochs.after_tmp",
    "leader_epochs.after_rename",
    "restart.after_create",
]


@pytest.mark.parametrize("above", [True, False], ids=["above-head", "below-first"])
@pytest.mark.parametrize("seed", range(2))
@pytest.mark.parametrize("point", RESTART_POINTS)
def test_a_crash_in_a_restart_leaves_a_prefix_or_an_empty_log(
    tmp_path: Path, point: str, seed: int, above: bool
) -> None:
    """Scenario: a restart (above the head, or below the first offset) crashes at
    ``point``; descriptors dropped unsynced, power cut. Expected: the reopened log is a
    prefix of the old one, or empty at the old first offset or at the new start, with no
    epoch starting past its head; restarting again gives exactly an empty log at the new
    start, appends going on from it."""
    path = str(tmp_path / "log")
    fs = CrashableFs(page_size=64)
    log, values = _filled(path, fs)
    first = log.first_offset
    start = log.head + 500 if above else 0
    if not above:
        log.delete_before(log.segment_infos()[2].base_offset)
        first = log.first_offset
        values = values[first:]
    fs.crash_at = point
    with pytest.raises(SimulatedCrash):
        log.restart_at(start)
    fs.die()
    fs.power_cut(random.Random(seed))
    log = Log.open(path, CONFIG)
    kept = values_of(log)
    if log.head > log.first_offset:
        assert log.first_offset == first
        assert kept == values[: len(kept)]
    else:
        assert log.head in (first, start)
    assert all(e.start_offset <= log.head for e in log.leader_epochs.entries())
    log.restart_at(start)
    assert (log.first_offset, log.head, log.leader_epochs.entries()) == (start, start, [])
    assert log.append(encode_columns([b"after"])).first_offset == start
    log.leader_epochs.assign(9, start)
    log.close()
    log = Log.open(path, CONFIG)
    assert values_of(log) == [b"after"]
    assert log.leader_epochs.entries() == [EpochEntry(9, start)]
    assert sorted(n for n in os.listdir(path) if n.endswith(".log")) == [f"{start:020d}.log"]
    log.close()
