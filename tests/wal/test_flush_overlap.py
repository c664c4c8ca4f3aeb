"""Overlapping syncs of one segment write only the index entries their sync covered.

Under the ``interval`` policy the periodic ``fdatasync`` runs on its own thread while the
writer thread appends and may flush (an explicit flush) or roll (a seal). An index entry
may reach the ``.index`` only after a sync that began after the entry's batch was written
(``wal.segment``'s invariant, which lets recovery trust every byte before the newest entry).

The tests hold one thread's ``fdatasync`` on an event while the other thread appends,
flushes and appends again, then let it finish: no sleeps, the order is forced. The file
system records what each finished sync covered (the ``.log`` size when the sync began) and
checks every index entry against it at the moment the entry is written.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path

from tests.wal._helpers import read_all
from wal import Fault, FaultyFs, Log, LogConfig, encode_columns
from wal.fs import Buffer
from wal.index import ENTRY, ENTRY_SIZE

HOLD_THREAD = "periodic-sync"


class SyncWitnessFs(FaultyFs):
    """Holds the first ``.log`` fdatasync made on the thread named ``HOLD_THREAD`` until
    ``release`` is set, and records each ``.index`` write beside what the ``.log`` syncs
    that had finished by then covered."""

    def __init__(self, faults: Sequence[Fault] = ()) -> None:
        super().__init__(faults=faults)
        self.held = threading.Event()
        self.release = threading.Event()
        self._lock = threading.Lock()
        #: .log path -> bytes covered by a finished sync (its size when the sync began).
        self.durable: dict[str, int] = {}
        #: (.log path, byte position in the .index, bytes written, durable then).
        self.index_writes: list[tuple[str, int, bytes, int]] = []

    def fdatasync(self, fd: int) -> None:
        path = self._paths.get(fd, "")
        covers = self.size(fd)  # a sync covers what was written before it began
        if (
            path.endswith(".log")
            and threading.current_thread().name == HOLD_THREAD
            and not self.held.is_set()
        ):
            self.held.set()
            assert self.release.wait(10), "the held sync was never released"
        super().fdatasync(fd)
        if path.endswith(".log"):
            with self._lock:
                self.durable[path] = max(self.durable.get(path, 0), covers)

    def pwritev(self, fd: int, buffers: Sequence[Buffer], offset: int) -> int:
        path = self._paths.get(fd, "")
        with self._lock:
            durable = self.durable.get(path.removesuffix(".index") + ".log", 0)
        n = super().pwritev(fd, buffers, offset)  # a failed write is not recorded
        if path.endswith(".index"):
            data = b"".join(bytes(b) for b in buffers)
            self.index_writes.append((path.removesuffix(".index") + ".log", offset, data, durable))
        return n


def batch(i: int) -> bytes:
    return encode_columns([b"record-%04d" % i])


class Appender:
    """Appends one-record batches and remembers where each batch ends in its segment."""

    def __init__(self, log: Log) -> None:
        self.log = log
        self.end_of: dict[tuple[int, int], int] = {}  # (segment base, position) -> end

    def append(self, n: int) -> None:
        for _ in range(n):
            base, pos = self.log.active_position
            if pos == self.log.config.segment_bytes:
                raise AssertionError("the test expects no roll here")
            self.log.append(batch(self.log.head))
            new_base, end = self.log.active_position
            assert new_base == base
            self.end_of[(base, pos)] = end


def entries_of(data: bytes) -> list[tuple[int, int]]:
    """(relative offset, position) of each entry in ``data``."""
    return [ENTRY.unpack_from(data, i)[:2] for i in range(0, len(data), ENTRY_SIZE)]


def assert_entries_were_covered(fs: SyncWitnessFs, appender: Appender) -> None:
    """Each index entry, when written, named a batch that a finished sync had covered."""
    for log_path, _at, data, durable in fs.index_writes:
        base = int(Path(log_path).stem)
        for rel, pos in entries_of(data):
            end = appender.end_of[(base, pos)]
            assert end <= durable, (
                f"index entry for offset {base + rel} (batch bytes {pos}..{end}) written when "
                f"a finished sync covered only {durable} bytes of {log_path}"
            )


def index_file(log: Log, base: int) -> list[tuple[int, int]]:
    return entries_of((Path(log.path) / f"{base:020d}.index").read_bytes())


def open_log(tmp_path: Path, fs: SyncWitnessFs) -> Log:
    # An entry for every batch after the first: each pending entry is one batch.
    return Log.open(str(tmp_path / "log"), LogConfig(index_interval_bytes=1), fs=fs)


class HeldFlush:
    """A flush on the periodic-sync thread, held inside its sync until :meth:`finish`."""

    def __init__(self, log: Log, fs: SyncWitnessFs) -> None:
        self.fs = fs
        self.errors: list[BaseException] = []
        self.thread = threading.Thread(target=self._run, args=(log,), name=HOLD_THREAD)
        self.thread.start()
        assert fs.held.wait(10), "the flush never reached its sync"

    def _run(self, log: Log) -> None:
        try:
            log.flush()
        except BaseException as exc:  # reported by finish(), on the test's thread
            self.errors.append(exc)

    def finish(self) -> None:
        self.fs.release.set()
        self.thread.join(10)
        assert not self.thread.is_alive()
        assert not self.errors


def reopened_offsets(log: Log, fs: SyncWitnessFs) -> list[int]:
    log.close()
    again = Log.open(log.path, fs=fs)
    try:
        return [b.base_offset for b in read_all(again)]
    finally:
        again.close()


def test_an_older_sync_ending_last_writes_no_entry_it_did_not_cover(tmp_path: Path) -> None:
    fs = SyncWitnessFs()
    log = open_log(tmp_path, fs)
    app = Appender(log)
    app.append(6)  # 5 pending entries
    periodic = HeldFlush(log, fs)  # its sync covers those 5 ...
    app.append(2)  # ... but not these
    log.flush()  # the writer's flush: covers all 7 and writes them
    assert len(index_file(log, 0)) == 7
    app.append(3)  # 3 entries pending, their batches not synced by anyone
    periodic.finish()  # the periodic sync ends last

    assert len(index_file(log, 0)) == 7, "entries written for batches no finished sync covered"
    assert_entries_were_covered(fs, app)
    log.flush()  # the next sync covers the 3 and writes them
    assert len(index_file(log, 0)) == 10
    assert_entries_were_covered(fs, app)
    assert reopened_offsets(log, fs) == list(range(11))


def test_a_sync_ending_after_a_roll_leaves_the_sealed_index_alone(tmp_path: Path) -> None:
    fs = SyncWitnessFs()
    log = open_log(tmp_path, fs)
    app = Appender(log)
    app.append(6)
    periodic = HeldFlush(log, fs)  # holds a sync of segment 0
    app.append(2)
    log.roll()  # seals segment 0: syncs it and writes all 7 entries
    app.append(4)  # 3 pending entries in segment 8
    periodic.finish()

    assert len(index_file(log, 0)) == 7
    assert index_file(log, 8) == []
    assert_entries_were_covered(fs, app)
    assert reopened_offsets(log, fs) == list(range(12))


def test_entries_a_failed_index_write_left_pending_go_with_the_older_sync(
    tmp_path: Path,
) -> None:
    # The writer's flush fails to write its entries: they stay pending, and the periodic
    # sync that ends after it writes those its own sync covered, no more.
    fs = SyncWitnessFs(faults=[Fault("pwritev", path_contains=".index")])
    log = open_log(tmp_path, fs)
    app = Appender(log)
    app.append(6)  # 5 pending entries
    periodic = HeldFlush(log, fs)
    app.append(2)
    log.flush()  # syncs all 7; writing their entries fails, so they stay pending
    assert index_file(log, 0) == []
    app.append(3)
    periodic.finish()

    assert len(index_file(log, 0)) == 5
    assert_entries_were_covered(fs, app)
    log.flush()
    assert len(index_file(log, 0)) == 10
    assert_entries_were_covered(fs, app)
    assert reopened_offsets(log, fs) == list(range(11))
