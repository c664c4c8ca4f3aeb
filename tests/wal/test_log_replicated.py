"""Tests of :meth:`wal.Log.append_replicated` on disk: the leader's bytes unchanged, the
offset rule, and crashes in the middle of a replicated append.

The crash tests run a follower on :class:`CrashableFs` with tiny segments (so one chunk
spans several rolls) and 64-byte pages (so one segment spans many). A crash fires at a named
point, or a write tears; the descriptors are dropped unsynced, the power is cut (unsynced
pages survive or not, each on its own), and the log is reopened with the real filesystem.
"""

from __future__ import annotations

import errno
import random
from pathlib import Path

import pytest

from tests.wal._helpers import CrashableFs
from tests.wal._replica import boundaries, log_bytes, random_batches
from wal import (
    Fault,
    Log,
    LogConfig,
    RecordBatch,
    ReplicaOffsetMismatchError,
    SimulatedCrash,
    WalFailedError,
    iter_batches,
)
from wal.validate import check_replicated

CONFIG = LogConfig(segment_bytes=512, index_interval_bytes=100)


def leader_bytes(path: Path, seed: int, n: int = 60) -> bytes:
    """A leader's log of ``n`` random batches, its segment files end to end."""
    log = Log.open(str(path), CONFIG)
    for batch in random_batches(random.Random(seed), n):
        log.append(batch)
    log.close()
    return log_bytes(path)


def test_the_log_holds_the_leaders_bytes(tmp_path: Path) -> None:
    """Scenario: a follower Log is given the leader's whole log in one call, then flushed
    and closed. Expected: the results name each batch's leader offsets; the follower's
    segment files end to end are the leader's bytes."""
    data = leader_bytes(tmp_path / "leader", 1)
    batches = check_replicated(data)
    log = Log.open(str(tmp_path / "follower"), CONFIG)
    results = log.append_replicated(batches)
    assert [r.first_offset for r in results] == [b.base_offset for b in batches]
    assert log.head == batches[-1].next_offset
    log.flush()
    log.close()
    assert log_bytes(tmp_path / "follower") == data


@pytest.mark.parametrize("shift", [-1, 1])
def test_a_first_batch_not_at_the_head_writes_nothing(tmp_path: Path, shift: int) -> None:
    """Scenario: a follower holding the first 10 batches is given batches starting one
    batch before or after its head. Expected: ReplicaOffsetMismatchError naming index 0,
    the head and the batch's offset; the head and file bytes unchanged."""
    batches = list(iter_batches(leader_bytes(tmp_path / "leader", 2)))
    log = Log.open(str(tmp_path / "follower"), CONFIG)
    log.append_replicated(batches[:10])
    log.flush()
    before = log_bytes(tmp_path / "follower")
    start = 10 + shift
    with pytest.raises(ReplicaOffsetMismatchError) as info:
        log.append_replicated(batches[start:20])
    err = info.value
    assert (err.index, err.expected, err.found) == (0, log.head, batches[start].base_offset)
    assert log.head == batches[9].next_offset
    assert log_bytes(tmp_path / "follower") == before
    log.close()


def test_a_gap_inside_the_batches_writes_nothing(tmp_path: Path) -> None:
    """Scenario: Log.append_replicated (called without the writer's check) is given
    batches 0..9 with batch 5 missing. Expected: ReplicaOffsetMismatchError at index 5;
    nothing written (head 0, no bytes)."""
    batches = list(iter_batches(leader_bytes(tmp_path / "leader", 3)))
    log = Log.open(str(tmp_path / "follower"), CONFIG)
    with pytest.raises(ReplicaOffsetMismatchError) as info:
        log.append_replicated(batches[:5] + batches[6:10])
    assert (info.value.index, info.value.expected) == (5, batches[4].next_offset)
    assert log.head == 0
    log.close()
    assert log_bytes(tmp_path / "follower") == b""


def replicate_and_sync(log: Log, batches: list[RecordBatch]) -> None:
    """What the writer thread does with a replicated append under ``always``."""
    log.append_replicated(batches)
    log.flush()


#: Where a replicated append can stop: at its write, inside a roll (the chunk spans
#: several segments), after its sync; "torn" is a pwritev that lands part of its bytes and
#: fails (EIO), latching the log.
STOPS = ["append.after_write", "roll.after_seal", "roll.after_create", "append.after_sync", "torn"]


@pytest.mark.parametrize("seed", range(1, 5))
@pytest.mark.parametrize("stop", STOPS)
def test_a_crash_inside_a_replicated_append_leaves_whole_batches(
    tmp_path: Path, stop: str, seed: int
) -> None:
    """Scenario: a follower holds (synced) the leader's first 15 batches; it is given the
    rest in one call (several segments' worth) and stops at ``stop``; the process dies and
    the power is cut. Expected: the stop happened; reopened with the real fs, the follower
    is a prefix of the leader's bytes that ends at a batch boundary and keeps the synced
    15 batches (after ``append.after_sync``, everything); a second open cuts nothing."""
    rng = random.Random(f"{stop}/{seed}")
    data = leader_bytes(tmp_path / "leader", seed)
    batches = check_replicated(data)
    path = tmp_path / "follower"
    fs = CrashableFs(page_size=64)
    log = Log.open(str(path), CONFIG, fs=fs)
    log.append_replicated(batches[:15])
    log.flush()
    synced = batches[14].next_offset
    if stop == "torn":
        fs.faults.append(Fault("pwritev", errno.EIO, partial=rng.randint(1, 400)))
    else:
        fs.crash_at = stop
    with pytest.raises((SimulatedCrash, WalFailedError)) as info:
        replicate_and_sync(log, batches[15:])
    if stop != "torn":
        assert isinstance(info.value, SimulatedCrash)
        assert info.value.point == stop
    fs.die()
    fs.power_cut(rng)
    reopened = Log.open(str(path), CONFIG)
    kept = log_bytes(path)
    assert data.startswith(kept)
    assert len(kept) in boundaries(data)
    assert reopened.head == sum(b.record_count for b in iter_batches(kept))
    assert reopened.head >= synced
    if stop == "append.after_sync":
        assert reopened.head == batches[-1].next_offset
    reopened.close()
    again = Log.open(str(path), CONFIG)
    assert again.recovery.truncated_bytes == 0
    assert again.head == reopened.head
    again.close()
