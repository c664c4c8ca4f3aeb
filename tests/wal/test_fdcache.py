"""Tests of :class:`wal.fdcache.FileCache` and of the logs that open their files through it.

Covers LRU eviction, pins that keep a descriptor open under its user, ``forget`` while in
use, reads that reopen an evicted sealed segment, and the descriptors a log holds open and
opens at start, counted in ``/proc/self/fd`` (the kernel's count, not the cache's own).
"""

from __future__ import annotations

import errno
import hashlib
import os
import random
import threading
from pathlib import Path

import pytest

from tests.wal._helpers import read_all
from wal import FileSystem, Log, LogConfig, encode_columns
from wal.fdcache import MAX_CAPACITY, MIN_CAPACITY, FileCache, default_capacity
from wal.segment import Segment

SMALL = LogConfig(segment_bytes=512, index_interval_bytes=100)


def open_fds() -> int:
    """Descriptors open in this process, as the kernel lists them."""
    return len(os.listdir("/proc/self/fd"))


def is_open(fd: int) -> bool:
    """Whether ``fd`` is an open descriptor."""
    try:
        os.fstat(fd)
    except OSError as exc:
        if exc.errno != errno.EBADF:
            raise
        return False
    return True


def files(directory: Path, n: int) -> list[str]:
    """``n`` small files in ``directory``; file ``i`` holds ``b"file i"``."""
    paths = []
    for i in range(n):
        path = directory / f"f{i}"
        path.write_bytes(b"file %d" % i)
        paths.append(str(path))
    return paths


def value_for(i: int) -> bytes:
    """A payload that names its record id."""
    return b"%08d:" % i + hashlib.sha256(b"%d" % i).digest()[: i % 29]


def fill(log: Log, batches: int, first_id: int = 0) -> None:
    """Append ``batches`` batches of 3 records each (ids from ``first_id``), then flush."""
    for k in range(batches):
        ids = range(first_id + 3 * k, first_id + 3 * k + 3)
        log.append(encode_columns([value_for(i) for i in ids]))
    log.flush()


def values(log: Log) -> list[bytes]:
    """Every value in the log, in order."""
    return [v for b in read_all(log) for v in b.values()]


def test_lru_closes_the_least_recently_used_idle_descriptor(tmp_path: Path) -> None:
    """Scenario: capacity 2; lease a, b, c in turn, then a again. Expected: the third lease
    closes a (least recently used), the kernel agrees, and a's next lease opens it again
    and reads the right file."""
    fs, cache = FileSystem(), FileCache(2)
    a, b, c = files(tmp_path, 3)
    before = open_fds()
    with cache.lease(fs, a) as fd_a:
        pass
    with cache.lease(fs, b):
        pass
    with cache.lease(fs, c):
        pass
    assert not is_open(fd_a)
    assert (cache.idle_count, cache.opens, cache.closes) == (2, 3, 1)
    assert open_fds() == before + 2
    with cache.lease(fs, a) as fd:
        assert fs.pread(fd, 100, 0) == b"file 0"
    assert cache.opens == 4
    assert open_fds() == before + 2


def test_a_hit_opens_nothing_and_refreshes_recency(tmp_path: Path) -> None:
    """Scenario: capacity 2; lease a, b, then a again, then c. Expected: the second lease
    of a opens nothing; c then evicts b, not a."""
    fs, cache = FileSystem(), FileCache(2)
    a, b, c = files(tmp_path, 3)
    for path in (a, b, a, c):
        with cache.lease(fs, path):
            pass
    assert cache.opens == 3
    with cache.lease(fs, a):
        pass
    assert cache.opens == 3, "a was evicted instead of b"


def test_a_pinned_descriptor_is_never_closed(tmp_path: Path) -> None:
    """Scenario: capacity 1; a is leased and stays leased while 20 other files are leased
    and released. Expected: a's descriptor stays open and reads a's bytes throughout; at
    most one idle descriptor besides it is open."""
    fs, cache = FileSystem(), FileCache(1)
    a, *others = files(tmp_path, 21)
    before = open_fds()
    with cache.lease(fs, a) as fd_a:
        for path in others:
            with cache.lease(fs, path):
                pass
            assert fs.pread(fd_a, 100, 0) == b"file 0"
            assert open_fds() <= before + 2
        assert cache.busy_count == 1
    assert cache.idle_count == 1


def test_forget_while_leased_closes_at_the_end_of_the_lease(tmp_path: Path) -> None:
    """Scenario: a is leased; it is forgotten (renamed, deleted); then the lease ends.
    Expected: the descriptor stays usable until the lease ends, is closed then, and a new
    lease opens the file afresh."""
    fs, cache = FileSystem(), FileCache(4)
    (a,) = files(tmp_path, 1)
    before = open_fds()
    with cache.lease(fs, a) as fd:
        cache.forget(a)
        assert fs.pread(fd, 100, 0) == b"file 0"
        assert open_fds() == before + 1
    assert open_fds() == before
    assert cache.open_count == 0
    with cache.lease(fs, a):
        assert cache.opens == 2


def test_clear_closes_every_idle_descriptor(tmp_path: Path) -> None:
    """Scenario: 3 idle descriptors and a leased one; clear. Expected: only the leased one
    is still open."""
    fs, cache = FileSystem(), FileCache(8)
    a, *rest = files(tmp_path, 4)
    before = open_fds()
    for path in rest:
        with cache.lease(fs, path):
            pass
    with cache.lease(fs, a):
        cache.clear()
        assert open_fds() == before + 1
    assert cache.idle_count == 1


def test_threads_never_read_through_a_closed_descriptor(tmp_path: Path) -> None:
    """Scenario: 4 threads lease 16 files at random through a cache of capacity 2, 2,000
    times each, and read each through its lease. Expected: every read returns its own
    file's bytes (a descriptor closed and reused under a reader would return another
    file's, or fail), and at the end at most 2 descriptors are open."""
    fs, cache = FileSystem(), FileCache(2)
    paths = files(tmp_path, 16)
    before = open_fds()
    errors: list[str] = []

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(2000):
            i = rng.randrange(len(paths))
            with cache.lease(fs, paths[i]) as fd:
                got = fs.pread(fd, 100, 0)
            if got != b"file %d" % i:
                errors.append(f"read {got!r} through the lease of file {i}")

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert cache.open_count <= 2
    assert open_fds() <= before + 2


@pytest.mark.parametrize(
    ("soft", "expected"),
    [(256, MIN_CAPACITY), (1024, 128), (20_000, 2500), (1 << 20, MAX_CAPACITY)],
)
def test_default_capacity_is_an_eighth_of_the_soft_limit_within_bounds(
    soft: int, expected: int
) -> None:
    """Scenario: soft limits from small to huge. Expected: an eighth, clamped."""
    assert default_capacity(soft) == expected


def test_capacity_below_one_is_refused() -> None:
    """Scenario: a cache of capacity 0. Expected: ValueError naming the capacity."""
    with pytest.raises(ValueError, match="at least 1, got 0"):
        FileCache(0)


# -- logs over the cache -----------------------------------------------------------------


def test_an_open_log_holds_one_descriptor_whatever_its_segments(tmp_path: Path) -> None:
    """Scenario: a log of 30+ segments is written, closed, and reopened with a cache of
    capacity 2. Expected: reopening leaves the active .log open plus at most 2 idle ones
    (the kernel's count), and opens at most 2 files; closing returns to the baseline."""
    log = Log.open(str(tmp_path / "log"), SMALL)
    fill(log, 120)
    assert log.segment_count > 30
    log.close()
    cache = FileCache(2)
    before = open_fds()
    log = Log.open(str(tmp_path / "log"), SMALL, files=cache)
    assert cache.opens <= 2
    assert cache.busy_count == 1
    assert open_fds() <= before + 1 + 2
    log.close()
    cache.clear()
    assert open_fds() == before


def test_reads_reopen_evicted_sealed_segments(tmp_path: Path) -> None:
    """Scenario: three logs share a cache of capacity 1; each gets 40 batches over many
    segments, interleaved; each is read whole twice. Expected: every record reads back in
    order (sealed segments were closed and reopened under the reads), the descriptors open
    never exceed 3 active + 1 idle + 1 being read, and closing every log frees them all."""
    cache = FileCache(1)
    before = open_fds()
    logs = [Log.open(str(tmp_path / f"log{i}"), SMALL, files=cache) for i in range(3)]
    for round_ in range(4):
        for i, log in enumerate(logs):
            fill(log, 10, first_id=1000 * i + 30 * round_)
    for _ in range(2):
        for i, log in enumerate(logs):
            assert values(log) == [value_for(1000 * i + k) for k in range(120)]
            assert open_fds() <= before + 3 + 1 + 1
    assert cache.opens > 3 * logs[0].segment_count  # evicted, reopened
    for log in logs:
        log.close()
    cache.clear()
    assert open_fds() == before


def test_appends_after_the_index_was_evicted_keep_the_index_usable(tmp_path: Path) -> None:
    """Scenario: two logs share a cache of capacity 1, so each append's index write reopens
    the index evicted by the other's; both are closed and reopened. Expected: the reopened
    logs need no index rebuild (the index files are whole) and read every record."""
    cache = FileCache(1)
    logs = [Log.open(str(tmp_path / f"log{i}"), SMALL, files=cache) for i in range(2)]
    for k in range(30):
        for i, log in enumerate(logs):
            fill(log, 1, first_id=1000 * i + 3 * k)
    for log in logs:
        log.close()
    for i in range(2):
        log = Log.open(str(tmp_path / f"log{i}"), SMALL, files=cache)
        assert not log.recovery.tail.index_rebuilt
        assert values(log) == [value_for(1000 * i + k) for k in range(90)]
        log.close()


def test_a_flush_after_a_seal_gave_up_the_pin_still_syncs(tmp_path: Path) -> None:
    """Scenario: the INTERVAL ticker's flush meets a roll: it holds the segment that the
    roll just sealed (its pin given up), and another file's lease evicted the descriptor
    (capacity 1). Expected: flush syncs through a fresh lease (one open); before, it used
    the writer's descriptor, gone by then (EBADF), which latched the log as failed."""
    cache, fs = FileCache(1), FileSystem()
    seg = Segment.create(fs, str(tmp_path), 0, 100, files=cache)
    seg.seal()
    (other,) = files(tmp_path, 1)
    with cache.lease(fs, other):
        pass  # on release two are idle: the sealed .log, least recent, is closed
    opens = cache.opens
    seg.flush()
    assert cache.opens == opens + 1
    seg.close()
