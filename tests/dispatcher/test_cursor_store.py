"""The cursor store (dispatcher.cursor_store): coalesced saves of subscription states to a
journal per topic, checkpoints into one file per subscription, at most one flush in flight.

A file system that blocks its write on a threading event the test controls holds a flush
in flight deterministically (the writes run on the store's own thread). Real files
throughout; :class:`wal.FaultyFs` fails syncs and cuts the power."""

from __future__ import annotations

import asyncio
import os
import random
import threading
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from pathlib import Path

import pytest
import pytest_asyncio

from dispatcher import PartitionSnapshot, Subscription, cursor_journal
from dispatcher.cursor_recovery import read_states
from dispatcher.cursor_store import CHECKPOINT_BYTES, CRASH_POINTS, CursorStore
from dispatcher.errors import DispatcherClosedError
from wal import Fault, FaultyFs, FileSystem, LogWriter, SimulatedCrash, encode_columns
from wal.fs import Buffer

pytestmark = pytest.mark.asyncio(loop_scope="function")


class HeldFs(FaultyFs):
    """Records what each flush writes: ``("journal", names)`` for a batch appended to a
    journal, ``("files", names)`` for checkpoint files. The first write waits for
    :attr:`go`; ``fail`` makes the next journal write raise ENOSPC."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[tuple[str, list[str]]] = []
        self.in_write = threading.Event()
        self.go = threading.Event()
        self.fail = False
        self.concurrent = 0
        self.most_concurrent = 0

    def _held(self, what: tuple[str, list[str]]) -> None:
        self.writes.append(what)
        if len(self.writes) == 1:
            self.in_write.set()
            self.go.wait(5)

    def write_all(self, fd: int, buffers: Sequence[Buffer], offset: int) -> int:
        if not self.path_of(fd).endswith(cursor_journal.NAME):
            return super().write_all(fd, buffers, offset)
        self.concurrent += 1
        self.most_concurrent = max(self.most_concurrent, self.concurrent)
        try:
            parsed = cursor_journal.parse(b"".join(bytes(b) for b in buffers))
            self._held(("journal", [e.subscription for e in parsed.entries]))
            if self.fail:
                self.fail = False
                raise OSError(28, "No space left on device")
            return super().write_all(fd, buffers, offset)
        finally:
            self.concurrent -= 1

    def atomic_write_many(self, files: Sequence[tuple[str, Buffer]]) -> None:
        self._held(("files", sorted(os.path.basename(path) for path, _ in files)))
        super().atomic_write_many(files)


@pytest_asyncio.fixture
async def writer(tmp_path: Path) -> AsyncIterator[LogWriter]:
    w = await LogWriter.open(str(tmp_path / "log"))
    await w.append(encode_columns([b"x"] * 100))
    yield w
    await w.aclose()


def _subs(writer: LogWriter, count: int) -> dict[tuple[str, str], Subscription]:
    subs = [Subscription("t", f"s{i}", [writer], [PartitionSnapshot(0)]) for i in range(count)]
    return {(s.topic, s.name): s for s in subs}


def _store(
    root: Path,
    fs: FileSystem,
    subs: dict[tuple[str, str], Subscription],
    *,
    flush_interval_s: float = 3600,
    checkpoint_bytes: int = CHECKPOINT_BYTES,
    crash_point: Callable[[str], None] = lambda _point: None,
) -> CursorStore:
    def members(topic: str) -> Iterable[Subscription]:
        return [s for key, s in sorted(subs.items()) if key[0] == topic]

    return CursorStore(
        str(root),
        fs,
        flush_interval_s=flush_interval_s,
        lookup=subs.get,
        members=members,
        checkpoint_bytes=checkpoint_bytes,
        crash_point=crash_point,
    )


def _cursors(root: Path) -> dict[str, int]:
    return {name: doc.partitions[0].cursor for name, doc in read_states(str(root), "t").items()}


async def _wait_thread(event: threading.Event) -> None:
    assert await asyncio.to_thread(event.wait, 5)


async def test_saves_during_a_flush_share_the_next_one(tmp_path: Path, writer: LogWriter) -> None:
    """Scenario: s0's save starts a flush, which is held in its write; meanwhile s0 moves
    its cursor to 5 and saves again, and s1..s5 save. Then the write goes on.
    Expected: one flush at a time; the held one wrote s0 alone; every later save waited
    for, and shares, the one next flush (one journal batch of all six states), so s0's
    saved cursor is 5; all seven saves return; no checkpoint file was written."""
    subs = _subs(writer, 6)
    fs = HeldFs()
    store = _store(tmp_path / "subs", fs, subs)
    s0 = subs[("t", "s0")]
    first = asyncio.create_task(store.save(s0))
    await _wait_thread(fs.in_write)
    assert await s0.commit(0, 5) == 5  # no dispatch task: the caller applies it
    later = [asyncio.create_task(store.save(s)) for s in subs.values()]
    await asyncio.sleep(0.01)
    assert not first.done()
    assert not any(t.done() for t in later)
    fs.go.set()
    async with asyncio.timeout(5):
        await asyncio.gather(first, *later)
    assert fs.writes == [("journal", ["s0"]), ("journal", [f"s{i}" for i in range(6)])]
    assert fs.most_concurrent == 1
    assert store.flushes == 2
    assert _cursors(tmp_path / "subs") == {"s0": 5, **{f"s{i}": 0 for i in range(1, 6)}}
    assert not list((tmp_path / "subs" / "t").glob("*.json"))
    assert store.saved_floor("t") == [0]
    await store.aclose([])


async def test_a_failed_flush_fails_its_saves_and_keeps_them_dirty(
    tmp_path: Path, writer: LogWriter
) -> None:
    """Scenario: the first flush's write fails (disk full); then the background flush
    runs. Expected: the save that waited raises the OSError and nothing is saved; the
    subscription stays dirty, so the next flush, with no save asking, writes it."""
    subs = _subs(writer, 1)
    fs = HeldFs()
    fs.go.set()
    fs.fail = True
    store = _store(tmp_path / "subs", fs, subs, flush_interval_s=0.01)
    (sub,) = subs.values()
    with pytest.raises(OSError, match="No space left"):
        await store.save(sub)
    assert _cursors(tmp_path / "subs") == {}
    await store.flush()  # what the background flush does: it is still dirty
    assert store.flushes == 1
    assert _cursors(tmp_path / "subs") == {"s0": 0}
    await store.aclose([])


async def test_a_save_after_close_is_refused_with_a_clear_error(
    tmp_path: Path, writer: LogWriter
) -> None:
    """Scenario: the store closes (its final save checkpoints s0), then a late commit asks
    for a save, and aclose is called again. Expected: the final save is s0's file and an
    empty journal; the late save and flush raise DispatcherClosedError (not the executor's
    RuntimeError) and write nothing; the second aclose is a no-op."""
    subs = _subs(writer, 1)
    (sub,) = subs.values()
    fs = HeldFs()
    fs.go.set()
    store = _store(tmp_path / "subs", fs, subs)
    store.start()
    await store.aclose([sub])
    assert fs.writes == [("files", ["s0.json"])]
    assert (tmp_path / "subs" / "t" / cursor_journal.NAME).read_bytes() == b""
    with pytest.raises(DispatcherClosedError, match="shutting down"):
        await store.save(sub)
    with pytest.raises(DispatcherClosedError):
        await store.flush()
    await store.aclose([sub])
    assert fs.writes == [("files", ["s0.json"])]
    assert store.flushes == 1


async def test_a_journal_past_its_limit_is_checkpointed_into_files(
    tmp_path: Path, writer: LogWriter
) -> None:
    """Scenario: three subscriptions, a checkpoint limit of 2 KiB; s0 commits one offset
    further and saves, again and again, s1 and s2 never save after their first. Then a
    reopen. Expected: the journal grows batch by batch until it passes 2 KiB; the next
    flush writes all three files (s1 and s2 too, though not dirty) instead and empties
    the journal; later saves go to the journal again; the reopen loads every newest state
    (s0 at its last commit) from files and journal together, and leaves the journal as it
    was (a restart writes nothing it need not)."""
    subs = _subs(writer, 3)
    root = tmp_path / "subs"
    fs = HeldFs()
    fs.go.set()
    store = _store(root, fs, subs, checkpoint_bytes=2048)
    s0 = subs[("t", "s0")]
    await store.save_all(list(subs.values()))
    journal = root / "t" / cursor_journal.NAME
    sizes = []
    for offset in range(1, 40):
        assert await s0.commit(0, offset) == offset
        await store.save(s0)
        sizes.append(journal.stat().st_size)
    assert store.checkpoints >= 1
    first = next(i for i, w in enumerate(fs.writes) if w[0] == "files")
    assert fs.writes[first] == ("files", ["s0.json", "s1.json", "s2.json"])
    assert all(w == ("journal", ["s0"]) for w in fs.writes[first + 1 :] if w[0] == "journal")
    assert max(sizes) > 2048
    assert sizes[first - 1] == 0  # writes[0] was the first save_all: sizes is one behind
    assert sizes[-1] > 0
    assert _cursors(root) == {"s0": 39, "s1": 0, "s2": 0}
    await store.aclose([])
    # the store closed without a final save: the newest s0 is in the journal only
    assert journal.stat().st_size > 0
    before = journal.read_bytes()
    again = _store(root, FileSystem(), {})
    loaded = {name: doc.partitions[0].cursor for _, name, doc in again.load_all({"t"})}
    assert loaded == {"s0": 39, "s1": 0, "s2": 0}
    assert journal.read_bytes() == before  # an open writes nothing it need not
    assert _cursors(root) == loaded
    await again.aclose([])


async def test_a_power_cut_keeps_every_state_reported_saved(
    tmp_path: Path, writer: LogWriter
) -> None:
    """Scenario (30 seeds): four subscriptions commit random offsets and save, in random
    order, with checkpoints every few flushes; then one more save whose journal sync
    fails, and the power is cut (unsynced bytes of every file may be lost, in part or
    whole). Expected: a reopen loads, for each subscription, a cursor at least its last
    one reported saved and at most its newest."""
    for seed in range(30):
        rng = random.Random(seed)
        root = tmp_path / f"subs{seed}"
        subs = _subs(writer, 4)
        fs = FaultyFs()
        store = _store(root, fs, subs, checkpoint_bytes=512)
        saved = dict.fromkeys((s.name for s in subs.values()), 0)
        newest = dict(saved)
        await store.save_all(list(subs.values()))
        for _ in range(rng.randint(5, 40)):
            chosen = rng.sample(list(subs.values()), rng.randint(1, 4))
            for sub in chosen:
                newest[sub.name] = min(100, newest[sub.name] + rng.randint(1, 9))
                await sub.commit(0, newest[sub.name])
            await store.save_all(chosen)
            for sub in chosen:
                saved[sub.name] = newest[sub.name]
        last = rng.choice(list(subs.values()))
        newest[last.name] = min(100, newest[last.name] + 1)
        await last.commit(0, newest[last.name])
        fs.faults.append(Fault("fdatasync", path_contains=cursor_journal.NAME))
        with pytest.raises(OSError, match="Input/output error"):
            await store.save_all([last])
        await store.aclose([])
        fs.power_cut(rng)
        again = _store(root, FileSystem(), {})
        loaded = {name: doc.partitions[0].cursor for _, name, doc in again.load_all({"t"})}
        await again.aclose([])
        assert set(loaded) == set(saved), seed
        for name, cursor in loaded.items():
            assert saved[name] <= cursor <= newest[name], (seed, name, loaded, saved)


class _StaleFile(FaultyFs):
    """Fails the removal of ``gone.json`` while :attr:`failing` (so a deleted
    subscription's checkpoint outlives its tombstone until the next checkpoint)."""

    failing = True

    def remove(self, path: str) -> None:
        if self.failing and path.endswith("gone.json"):
            raise OSError(5, "Input/output error", path)
        super().remove(path)


class _Crash:
    """A crash-point hook that raises at :attr:`point` once armed."""

    def __init__(self) -> None:
        self.point: str | None = None

    def __call__(self, name: str) -> None:
        if name == self.point:
            raise SimulatedCrash(name)


@pytest.mark.parametrize("point", ["index.after_tmp", *CRASH_POINTS])
async def test_a_checkpoint_crashing_at_a_point_loses_no_state(
    tmp_path: Path, writer: LogWriter, point: str
) -> None:
    """Scenario: s0, s1 and gone are checkpointed; gone is deleted, but removing its file
    fails (so the file outlives the tombstone); s0 commits 7 and 9, saved to the journal;
    then a checkpoint crashes at ``point`` (temp files written; files renamed; stale file
    removed), and a new store opens the directory. Expected: it loads s0 at 9 and s1 at 0,
    never gone; after the open the directory holds exactly s0's and s1's files (gone's
    file, which the journal's tombstone superseded, is removed) and the journal."""
    subs = _subs(writer, 2)
    gone = Subscription("t", "gone", [writer], [PartitionSnapshot(0)])
    subs[("t", "gone")] = gone
    root = tmp_path / "subs"
    fs = _StaleFile()
    crash = _Crash()
    store = _store(root, fs, subs, crash_point=crash)
    await store.save_all(list(subs.values()), checkpoint=True)
    del subs[("t", "gone")]
    store.doom(gone)
    await store.commit_delete(gone, crash)
    store.forget(("t", "gone"))
    assert (root / "t" / "gone.json").exists()
    fs.failing = False
    s0 = subs[("t", "s0")]
    for offset in (7, 9):
        await s0.commit(0, offset)
        await store.save(s0)
    if point in CRASH_POINTS:
        crash.point = point
    else:
        fs.crash_at = point
    with pytest.raises(SimulatedCrash):
        await store.save_all([s0], checkpoint=True)
    await store.aclose([])
    again = _store(root, FileSystem(), {})
    loaded = {name: doc.partitions[0].cursor for _, name, doc in again.load_all({"t"})}
    await again.aclose([])
    assert loaded == {"s0": 9, "s1": 0}
    assert _cursors(root) == loaded
    assert sorted(p.name for p in (root / "t").iterdir()) == [
        cursor_journal.NAME,
        "s0.json",
        "s1.json",
    ]


async def test_an_open_cuts_a_torn_tail_and_appends_after_the_last_good_batch(
    tmp_path: Path, writer: LogWriter
) -> None:
    """Scenario: s0 and s1 saved; the journal then ends in half a batch (a crash during a
    write); a store opens it, s0 commits 12 and saves, and the store stops without a final
    save; a third store opens. Expected: the first open cuts the torn bytes (the journal
    is its good batches again) and writes no file; the save after it lands right behind
    the good batches, so the last open finds s0 at 12, s1 at 0, no damage and nothing
    kept as corrupt."""
    subs = _subs(writer, 2)
    root = tmp_path / "subs"
    store = _store(root, FileSystem(), subs)
    await store.save_all(list(subs.values()))
    await store.aclose([])
    journal = root / "t" / cursor_journal.NAME
    good = journal.read_bytes()
    torn = cursor_journal.frame([cursor_journal.Entry(99, "s0", None)])[:-5]
    journal.write_bytes(good + torn)
    fresh = {key: Subscription("t", key[1], [writer], [PartitionSnapshot(0)]) for key in subs}
    again = _store(root, FileSystem(), fresh)
    loaded = {name: doc.partitions[0].cursor for _, name, doc in again.load_all({"t"})}
    assert loaded == {"s0": 0, "s1": 0}
    assert journal.read_bytes() == good
    assert sorted(p.name for p in (root / "t").iterdir()) == [cursor_journal.NAME]
    s0 = fresh[("t", "s0")]
    await s0.commit(0, 12)
    await again.save(s0)
    await again.aclose([])
    assert cursor_journal.parse(journal.read_bytes()).damaged == []
    last = _store(root, FileSystem(), {})
    loaded = {name: doc.partitions[0].cursor for _, name, doc in last.load_all({"t"})}
    await last.aclose([])
    assert loaded == {"s0": 12, "s1": 0}
    assert not list((root / "t").glob("*.corrupt*"))
