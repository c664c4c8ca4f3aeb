"""Tests of :mod:`wal.leader_epochs`: the rules against brute-force models (no disk), the
file's codec against damage, and the file's replacement against crashes.

The property tests draw histories of strictly increasing ``(epoch, start)`` entries and
check :func:`end_offset_for`, :func:`entries_from` and :func:`entries_before` against the
definitions spelt out offset by offset.
"""

from __future__ import annotations

import errno
import os
import random
import threading
import time
import zlib
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.wal._helpers import CrashableFs
from wal import (
    Fault,
    FaultyFs,
    FileSystem,
    LeaderEpochsCorruptError,
    SimulatedCrash,
    WalIOError,
)
from wal.fs import CRASH_POINTS
from wal.leader_epochs import (
    FILE_NAME,
    UNDEFINED,
    EpochEntry,
    LeaderEpochs,
    decode,
    encode,
    end_offset_for,
    entries_before,
    entries_from,
)


@st.composite
def histories(draw: st.DrawFn) -> list[EpochEntry]:
    """Entries strictly increasing in epoch and start offset (possibly none)."""
    epochs = sorted(draw(st.sets(st.integers(0, 40), max_size=8)))
    starts = sorted(draw(st.sets(st.integers(0, 200), min_size=len(epochs), max_size=len(epochs))))
    return [EpochEntry(e, s) for e, s in zip(epochs, starts, strict=True)]


def model_end_offset_for(entries: list[EpochEntry], epoch: int, log_end: int) -> tuple[int, int]:
    """The definition: the largest epoch at or below ``epoch``; it ends where the next
    entry starts, the latest at the log end; (-1, -1) when there is none."""
    at_or_below = [i for i, e in enumerate(entries) if e.epoch <= epoch]
    if not at_or_below:
        return (-1, -1)
    i = max(at_or_below, key=lambda i: entries[i].epoch)
    return entries[i].epoch, entries[i + 1].start_offset if i + 1 < len(entries) else log_end


def epoch_at(entries: list[EpochEntry], offset: int) -> int | None:
    """The epoch that wrote ``offset``, by the definition (None: before every entry)."""
    found = None
    for e in entries:
        if e.start_offset <= offset:
            found = e.epoch
    return found


@given(histories(), st.integers(-1, 45), st.integers(0, 60))
def test_end_offset_for_matches_the_definition(
    entries: list[EpochEntry], epoch: int, extra: int
) -> None:
    """Scenario: any history, any epoch asked, a log ending at or past the last start.
    Expected: the answer of the brute-force definition."""
    log_end = (entries[-1].start_offset if entries else 0) + extra
    assert end_offset_for(entries, epoch, log_end) == model_end_offset_for(entries, epoch, log_end)


@given(histories(), st.integers(0, 210))
def test_truncate_from_keeps_exactly_the_epochs_of_the_kept_offsets(
    entries: list[EpochEntry], offset: int
) -> None:
    """Scenario: any history cut at any offset. Expected: the kept entries are those
    starting below the cut, so every offset below the cut keeps the epoch that wrote it."""
    kept = entries_from(entries, offset)
    assert kept == [e for e in entries if e.start_offset < offset]
    for o in range(offset):
        assert epoch_at(kept, o) == epoch_at(entries, o)


@given(histories(), st.integers(0, 210))
def test_truncate_before_keeps_every_offset_s_epoch_from_the_new_start(
    entries: list[EpochEntry], offset: int
) -> None:
    """Scenario: any history whose log start rises to any offset. Expected: every offset
    from the new start on keeps the epoch that wrote it, no entry starts below the new
    start, and entries still strictly increase."""
    kept = entries_before(entries, offset)
    assert all(e.start_offset >= offset for e in kept) or kept == entries
    for o in range(offset, 215):
        assert epoch_at(kept, o) == epoch_at(entries, o)
    decode(encode(kept), "x")  # strictly increasing, else decode raises


@given(histories())
def test_the_codec_round_trips(entries: list[EpochEntry]) -> None:
    """Scenario: any history encoded then decoded. Expected: the same entries."""
    assert decode(encode(entries), "x") == entries


def test_the_worked_example_of_the_module_docstring() -> None:
    """Scenario: entries [(1, 0), (3, 120), (4, 200)], log end 250. Expected: the answers
    the module docstring gives."""
    entries = [EpochEntry(1, 0), EpochEntry(3, 120), EpochEntry(4, 200)]
    assert end_offset_for(entries, 3, 250) == (3, 200)
    assert end_offset_for(entries, 2, 250) == (1, 120)
    assert end_offset_for(entries, 9, 250) == (4, 250)
    assert end_offset_for(entries, 0, 250) == UNDEFINED
    assert entries_from(entries, 150) == entries[:2]
    assert entries_before(entries, 130) == [EpochEntry(3, 130), EpochEntry(4, 200)]


GOOD = encode([EpochEntry(1, 0), EpochEntry(3, 120)])


def _damaged() -> list[tuple[str, bytes]]:
    cases = [(f"torn-at-{n}", GOOD[:n]) for n in range(len(GOOD))]
    flipped = bytearray(GOOD)
    flipped[GOOD.index(b"120")] = ord("7")
    cases.append(("digit-flipped", bytes(flipped)))
    body = b"headrace leader-epochs 1\n2\n3 0\n1 120\n"
    cases.append(("not-increasing", body + b"crc32 %08x\n" % zlib.crc32(body)))
    body = b"headrace leader-epochs 1\n3\n1 0\n3 120\n"
    cases.append(("count-mismatch", body + b"crc32 %08x\n" % zlib.crc32(body)))
    body = b"headrace leader-epochs 9\n0\n"
    cases.append(("unknown-version", body + b"crc32 %08x\n" % zlib.crc32(body)))
    cases.append(("trailing-junk", GOOD + b"x"))
    return cases


@pytest.mark.parametrize(("name", "data"), _damaged(), ids=[c[0] for c in _damaged()])
def test_a_damaged_file_is_an_error_never_an_empty_history(name: str, data: bytes) -> None:
    """Scenario: the file torn at every length (empty included), a digit flipped, entries
    that do not increase, a wrong count or version (with valid checksums), junk after it.
    Expected: LeaderEpochsCorruptError naming the file, every time."""
    with pytest.raises(LeaderEpochsCorruptError) as info:
        decode(data, "/data/t/0/leader-epochs")
    assert "/data/t/0/leader-epochs" in str(info.value)


def test_assign_rules(tmp_path: Path) -> None:
    """Scenario: assign epochs 1 at 0, 1 again at 10, 2 at 10, 3 at 10, 4 at 30, then a
    stale epoch and a start going back. Expected: a repeat of the latest epoch is a no-op;
    an epoch at the latest start replaces it (it wrote nothing); stale epochs and starts
    raise ValueError and change nothing; the file agrees after a reload."""
    epochs = LeaderEpochs.open(str(tmp_path), fs=FileSystem(), log_end=lambda: 50)
    assert epochs.latest() is None
    assert epochs.end_offset_for(5) == UNDEFINED
    assert not (tmp_path / FILE_NAME).exists()  # nothing written until there is something
    epochs.assign(1, 0)
    epochs.assign(1, 10)
    epochs.assign(2, 10)
    epochs.assign(3, 10)
    epochs.assign(4, 30)
    expected = [EpochEntry(1, 0), EpochEntry(3, 10), EpochEntry(4, 30)]
    assert epochs.entries() == expected
    for epoch, start in ((2, 40), (5, 20)):
        with pytest.raises(ValueError, match="only increase"):
            epochs.assign(epoch, start)
    assert epochs.latest() == EpochEntry(4, 30)
    assert epochs.end_offset_for(4) == (4, 50)
    reloaded = LeaderEpochs.open(str(tmp_path), fs=FileSystem(), log_end=lambda: 50)
    assert reloaded.entries() == expected


OLD = [EpochEntry(1, 0), EpochEntry(3, 120), EpochEntry(4, 200)]
#: Each change, and the entries it leaves.
CHANGES: dict[str, tuple[Callable[[LeaderEpochs], None], list[EpochEntry]]] = {
    "assign": (lambda e: e.assign(5, 300), [*OLD, EpochEntry(5, 300)]),
    "truncate_from": (lambda e: e.truncate_from(120), OLD[:1]),
    "truncate_before": (lambda e: e.truncate_before(150), [EpochEntry(3, 150), OLD[2]]),
}


@pytest.mark.parametrize("change", sorted(CHANGES))
@pytest.mark.parametrize("point", [p for p in CRASH_POINTS if p.startswith("leader_epochs.")])
@pytest.mark.parametrize("seed", range(3))
def test_a_crash_while_replacing_leaves_the_old_or_the_new_file(
    tmp_path: Path, change: str, point: str, seed: int
) -> None:
    """Scenario: a history of three entries is changed (an assign, a truncation from the
    end, one from the start) and the replacement crashes at ``point``; the descriptors are
    dropped and the power cut. Expected: reopening reads either the old entries or the new
    ones, never an error or an empty history, and leaves no temp file."""
    directory = str(tmp_path)
    epochs = LeaderEpochs.open(directory, fs=FileSystem(), log_end=lambda: 400)
    for e in OLD:
        epochs.assign(*e)
    apply, new = CHANGES[change]
    fs = CrashableFs(crash_at=point, page_size=16)
    epochs = LeaderEpochs.open(directory, fs=fs, log_end=lambda: 400)
    with pytest.raises(SimulatedCrash):
        apply(epochs)
    assert epochs.entries() == OLD  # memory changes only once the file is durable
    fs.die()
    fs.power_cut(random.Random(seed))
    reopened = LeaderEpochs.open(directory, fs=FileSystem(), log_end=lambda: 400)
    assert reopened.entries() in (OLD, new)
    if point == "leader_epochs.after_tmp":
        assert reopened.entries() == OLD
    assert not os.path.exists(os.path.join(directory, FILE_NAME + ".tmp"))


def test_a_failed_write_changes_nothing(tmp_path: Path) -> None:
    """Scenario: the temp file's write fails (a full disk). Expected: WalIOError; the
    entries in memory and on disk are the old ones; no temp file is left."""
    fs = FaultyFs(faults=[Fault("pwritev", error=errno.ENOSPC, path_contains=".tmp")])
    epochs = LeaderEpochs.open(str(tmp_path), fs=FileSystem(), log_end=lambda: 9)
    epochs.assign(1, 0)
    epochs = LeaderEpochs.open(str(tmp_path), fs=fs, log_end=lambda: 9)
    with pytest.raises(WalIOError):
        epochs.assign(2, 5)
    assert epochs.entries() == [EpochEntry(1, 0)]
    assert LeaderEpochs.open(str(tmp_path), fs=FileSystem(), log_end=lambda: 9).entries() == [
        EpochEntry(1, 0)
    ]
    assert not (tmp_path / (FILE_NAME + ".tmp")).exists()


class _SlowFs(FileSystem):
    """A filesystem whose file writes take 0.2 ms more (as a disk's fdatasync does), so
    two threads' changes overlap."""

    def write_new(self, path: str, data: bytes | bytearray | memoryview) -> None:
        time.sleep(0.0002)
        super().write_new(path, data)


def test_changes_from_two_threads_at_once_are_each_kept_whole(tmp_path: Path) -> None:
    """Scenario: one thread assigns epochs 1-150 (epoch e at offset 10e, as a follower
    copies its leader's on a worker thread) while another trims the history from the
    front at 5, 10, ... 750, each once the assigns are past it (retention's
    truncate_before, on the event loop in a broker); file writes take 0.2 ms, so the
    two overlap. Expected: neither raises; afterwards the file and the entries in memory
    agree, and they are exactly every epoch assigned, trimmed at 750: no change lost
    (without the lock, a trim that read the entries before an assign replaced them
    drops that epoch, or both write the temp file at once)."""
    epochs = LeaderEpochs.open(str(tmp_path), fs=_SlowFs(), log_end=lambda: 10_000)
    epochs.assign(0, 0)
    errors: list[BaseException] = []
    done = threading.Event()

    def assign_all() -> None:
        try:
            for i in range(1, 151):
                epochs.assign(i, 10 * i)
        except BaseException as exc:  # reported by the test's thread
            errors.append(exc)
        finally:
            done.set()

    def trim_all() -> None:
        try:
            for i in range(1, 151):
                while epochs.entries()[-1].start_offset < 5 * i and not done.is_set():
                    time.sleep(0)
                epochs.truncate_before(5 * i)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=assign_all), threading.Thread(target=trim_all)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    on_disk = LeaderEpochs.open(str(tmp_path), fs=FileSystem(), log_end=lambda: 10_000)
    assert on_disk.entries() == epochs.entries()
    every = [EpochEntry(i, 10 * i) for i in range(151)]
    assert epochs.entries() == entries_before(every, 750)
