"""Tests of :class:`broker.topics.TopicRegistry`: creates and deletes that cannot be cut short.

Each admin change is stopped at every named crash point (the hook raises
:class:`wal.SimulatedCrash` there, then the registry is dropped and a new one opens the same
directory), and its caller is cancelled at those points and at a chosen file open. After
each: the topic is whole (``topic.json``, every partition, registered, writable) or absent
(nothing of it on disk or in memory), no other file is left, and no task outlives the
registry. The file descriptor budget refuses a topic that cannot fit before any file is made.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from broker.errors import (
    FileLimitError,
    InvalidRequestError,
    TopicExistsError,
    TopicNotFoundError,
)
from broker.fd_budget import RESERVE, FdUsage
from broker.topics import CRASH_POINTS, TopicRegistry
from wal import (
    Fault,
    FaultyFs,
    FileSystem,
    LogConfig,
    SimulatedCrash,
    WalIOError,
    encode_columns,
)
from wal.fdcache import FileCache

pytestmark = pytest.mark.asyncio(loop_scope="function")

CONFIG = LogConfig(segment_bytes=4096)
NAME = "orders"
PARTITIONS = 6
CREATE_POINTS = [p for p in CRASH_POINTS if p.startswith("create.")]
DELETE_POINTS = [p for p in CRASH_POINTS if p.startswith("delete.")]


def registry(
    data: Path,
    *,
    hook: Callable[[str], None] = lambda _p: None,
    fs: FileSystem | None = None,
    usage: FdUsage | None = None,
) -> TopicRegistry:
    """A registry on ``data`` with a small descriptor cache and the given test hooks."""
    return TopicRegistry(
        str(data),
        CONFIG,
        fs,
        files=FileCache(16),
        crash_point=hook,
        fd_usage=None if usage is None else (lambda _files: usage),
    )


def crash_at(point: str) -> Callable[[str], None]:
    """A crash hook that raises ``SimulatedCrash`` at ``point``."""

    def hook(name: str) -> None:
        if name == point:
            raise SimulatedCrash(name)

    return hook


def on_disk(data: Path) -> list[str]:
    """Every entry under ``topics/``, with each topic's own entries (sorted)."""
    root = data / "topics"
    entries = []
    for path in sorted(root.iterdir()):
        entries.append(path.name)
        if path.is_dir():
            entries += [f"{path.name}/{p.name}" for p in sorted(path.iterdir())]
    return entries


def assert_whole(data: Path, reg: TopicRegistry, name: str, partitions: int) -> None:
    """``name`` is registered with ``partitions`` partitions and whole on disk, alone."""
    assert reg.names() == [name]
    assert len(reg.get(name).partitions) == partitions
    meta = json.loads((data / "topics" / name / "topic.json").read_bytes())
    assert meta == {"name": name, "partitions": partitions, "id": reg.get(name).topic_id}
    assert len(meta["id"]) == 16
    top = [e for e in on_disk(data) if "/" not in e]
    assert top == [name], f"stray entries: {top}"
    dirs = {p.name for p in (data / "topics" / name).iterdir() if p.is_dir()}
    assert dirs == {str(p) for p in range(partitions)}


def assert_absent(data: Path, reg: TopicRegistry, name: str) -> None:
    """``name`` is neither registered nor on disk, and nothing else is left."""
    with pytest.raises(TopicNotFoundError):
        reg.get(name)
    assert on_disk(data) == []


async def close(reg: TopicRegistry) -> None:
    """Close ``reg`` and check that no task of it is left running."""
    await reg.aclose()
    assert asyncio.all_tasks() == {asyncio.current_task()}


async def reopened(data: Path) -> TopicRegistry:
    """A new registry on ``data``, as after a restart."""
    reg = registry(data)
    await reg.open()
    return reg


async def publish_one(reg: TopicRegistry, name: str) -> None:
    """Append one record to every partition of ``name``; each lands at offset 0."""
    for partition in reg.get(name).partitions:
        result, _dup = await partition.append(encode_columns([b"x"]))
        assert result.first_offset == 0


async def test_create_and_delete_leave_the_expected_files(tmp_path: Path) -> None:
    """Scenario: create a topic, publish to it, reopen, delete it. Expected: whole after
    the create and after a reopen; nothing at all under topics/ after the delete."""
    reg = registry(tmp_path)
    await reg.open()
    await reg.create(NAME, PARTITIONS)
    await publish_one(reg, NAME)
    assert_whole(tmp_path, reg, NAME, PARTITIONS)
    await close(reg)
    reg = await reopened(tmp_path)
    assert_whole(tmp_path, reg, NAME, PARTITIONS)
    await reg.delete(NAME)
    assert_absent(tmp_path, reg, NAME)
    await close(reg)


async def test_a_topic_keeps_its_id_across_restarts_and_a_new_one_gets_another(
    tmp_path: Path,
) -> None:
    """Scenario: create a topic, reopen the registry, delete the topic and create it again
    under its name; then a topic.json without an id (written before topics had one).
    Expected: the id survives the reopen; the topic created again has another; the old
    topic opens with the id "" (unknown)."""
    reg = registry(tmp_path)
    await reg.open()
    first = (await reg.create(NAME, PARTITIONS)).topic_id
    await close(reg)
    reg = await reopened(tmp_path)
    assert reg.get(NAME).topic_id == first
    await reg.delete(NAME)
    second = (await reg.create(NAME, PARTITIONS)).topic_id
    assert second != first
    assert len(second) == 16
    await close(reg)
    meta = tmp_path / "topics" / NAME / "topic.json"
    meta.write_text(json.dumps({"name": NAME, "partitions": PARTITIONS}))
    reg = await reopened(tmp_path)
    assert reg.get(NAME).topic_id == ""
    await close(reg)


async def test_a_create_given_an_id_records_that_id_and_refuses_a_malformed_one(
    tmp_path: Path,
) -> None:
    """Scenario: a cluster member creates a topic with the id etcd gave it, then tries ids
    that are not 16 lowercase hex digits. Expected: the given id survives a reopen; each
    bad id is refused naming topic_id, and no file of that topic is made."""
    reg = registry(tmp_path)
    await reg.open()
    await reg.create(NAME, PARTITIONS, topic_id="0123456789abcdef")
    for bad in ("", "0123456789ABCDEF", "0123456789abcde", "0123456789abcdefa", "g" * 16):
        with pytest.raises(InvalidRequestError, match="topic_id"):
            await reg.create("other", 1, topic_id=bad)
        assert not (tmp_path / "topics" / "other").exists()
    await close(reg)
    reg = await reopened(tmp_path)
    assert reg.get(NAME).topic_id == "0123456789abcdef"
    await close(reg)


@pytest.mark.parametrize("point", CREATE_POINTS)
async def test_a_create_crashing_at_a_point_leaves_the_topic_whole_or_absent(
    tmp_path: Path, point: str
) -> None:
    """Scenario: a create crashes at ``point``; the registry is dropped and a new one opens.
    Expected: before the rename the topic is absent (the build directory is removed), after
    it whole, with every partition writable; no other file is left."""
    reg = registry(tmp_path, hook=crash_at(point))
    await reg.open()
    with pytest.raises(SimulatedCrash):
        await reg.create(NAME, PARTITIONS)
    await close(reg)
    reg = await reopened(tmp_path)
    if point == "create.after_build":
        assert_absent(tmp_path, reg, NAME)
    else:
        assert_whole(tmp_path, reg, NAME, PARTITIONS)
        await publish_one(reg, NAME)
    await close(reg)


@pytest.mark.parametrize("point", DELETE_POINTS)
async def test_a_delete_crashing_at_a_point_leaves_nothing_after_a_restart(
    tmp_path: Path, point: str
) -> None:
    """Scenario: a topic with data is deleted and the delete crashes at ``point`` (each is
    past the commit point); the registry closes and a new one opens. Expected: the topic and
    every file of it are gone, and its name can be created again, empty."""
    reg = registry(tmp_path, hook=crash_at(point))
    await reg.open()
    await reg.create(NAME, PARTITIONS)
    await publish_one(reg, NAME)
    with pytest.raises(SimulatedCrash):
        await reg.delete(NAME)
    await close(reg)
    reg = await reopened(tmp_path)
    assert_absent(tmp_path, reg, NAME)
    await reg.create(NAME, 2)
    assert all(p.writer.head == 0 for p in reg.get(NAME).partitions)
    await close(reg)


def cancel_at(point: str, victim: list[asyncio.Task[object]]) -> Callable[[str], None]:
    """A hook that cancels the caller (``victim[0]``) when the work reaches ``point``; it
    may run on a worker thread, so the cancel goes through the loop."""
    loop = asyncio.get_running_loop()

    def hook(name: str) -> None:
        if name == point:
            loop.call_soon_threadsafe(victim[0].cancel)

    return hook


@pytest.mark.parametrize("point", CREATE_POINTS)
async def test_a_create_whose_caller_is_cancelled_runs_to_its_end(
    tmp_path: Path, point: str
) -> None:
    """Scenario: the caller of a create is cancelled while the create is at ``point``.
    Expected: the caller sees CancelledError; the topic is nonetheless whole, registered and
    writable, and still whole after a restart."""
    victim: list[asyncio.Task[object]] = []
    reg = registry(tmp_path, hook=cancel_at(point, victim))
    await reg.open()
    victim.append(asyncio.create_task(reg.create(NAME, PARTITIONS)))
    with pytest.raises(asyncio.CancelledError):
        await victim[0]
    assert_whole(tmp_path, reg, NAME, PARTITIONS)
    await publish_one(reg, NAME)
    await close(reg)
    reg = await reopened(tmp_path)
    assert_whole(tmp_path, reg, NAME, PARTITIONS)
    await close(reg)


@pytest.mark.parametrize("point", DELETE_POINTS)
async def test_a_delete_whose_caller_is_cancelled_runs_to_its_end(
    tmp_path: Path, point: str
) -> None:
    """Scenario: the caller of a delete is cancelled while the delete is at ``point`` (the
    reported bug: a DeleteTopic past its deadline left topic.json and the data, and the
    topic came back after a restart). Expected: the topic is gone from memory and disk at
    once and after a restart."""
    victim: list[asyncio.Task[object]] = []
    reg = registry(tmp_path, hook=cancel_at(point, victim))
    await reg.open()
    await reg.create(NAME, PARTITIONS)
    await publish_one(reg, NAME)
    victim.append(asyncio.create_task(reg.delete(NAME)))
    with pytest.raises(asyncio.CancelledError):
        await victim[0]
    assert_absent(tmp_path, reg, NAME)
    await close(reg)
    reg = await reopened(tmp_path)
    assert_absent(tmp_path, reg, NAME)
    await close(reg)


class CancellingFs(FaultyFs):
    """Cancels a task (through its loop) at the ``at``-th file open."""

    def __init__(self, at: int) -> None:
        super().__init__()
        self.at = at
        self.opens = 0
        self.victim: asyncio.Task[object] | None = None
        self.loop = asyncio.get_running_loop()

    def open(self, path: str, *, create: bool = False, exclusive: bool = False) -> int:
        self.opens += 1
        if self.opens == self.at and self.victim is not None:
            self.loop.call_soon_threadsafe(self.victim.cancel)
        return super().open(path, create=create, exclusive=exclusive)


@pytest.mark.parametrize("at", [1, 4, 9])
async def test_a_create_cancelled_while_opening_partitions_leaks_no_task(
    tmp_path: Path, at: int
) -> None:
    """Scenario: the caller is cancelled at the ``at``-th file open, while partitions are
    being opened (the reported leak: writer tasks "destroyed but pending"). Expected: the
    create completes anyway; closing the registry leaves no task behind."""
    fs = CancellingFs(at)
    reg = registry(tmp_path, fs=fs)
    await reg.open()
    fs.opens = 0
    fs.victim = asyncio.create_task(reg.create(NAME, PARTITIONS))
    with pytest.raises(asyncio.CancelledError):
        await fs.victim
    assert fs.opens >= at
    assert_whole(tmp_path, reg, NAME, PARTITIONS)
    await close(reg)


async def test_a_failed_partition_open_removes_the_whole_topic(tmp_path: Path) -> None:
    """Scenario: the fourth partition's log cannot be opened (EIO on its files). Expected:
    the create fails with that error; the partitions already opened are closed; the topic
    is absent in memory and on disk, and a retry succeeds."""
    fs = FaultyFs(faults=[Fault("open", path_contains=f"/{NAME}/3/", times=None)])
    reg = registry(tmp_path, fs=fs)
    await reg.open()
    with pytest.raises(WalIOError, match="Input/output error"):
        await reg.create(NAME, PARTITIONS)
    assert_absent(tmp_path, reg, NAME)
    fs.faults.clear()
    await reg.create(NAME, PARTITIONS)
    assert_whole(tmp_path, reg, NAME, PARTITIONS)
    await close(reg)


def usage(limit: int) -> FdUsage:
    """A process with 50 descriptors open, none idle, a cache of 64, under ``limit``."""
    return FdUsage(limit=limit, open_now=50, idle_cached=0, cache_capacity=64)


async def test_a_topic_over_the_fd_budget_is_refused_before_any_file(tmp_path: Path) -> None:
    """Scenario: limit 1,000 leaves 1000 - 50 - 64 - 256 = 630 descriptors; create 700
    partitions, then 630. Expected: the first is refused with the numbers and the remedy,
    and nothing is made on disk; the second fits."""
    reg = registry(tmp_path, usage=usage(1000))
    await reg.open()
    with pytest.raises(FileLimitError) as refused:
        await reg.create(NAME, 700)
    assert (refused.value.needed, refused.value.available, refused.value.limit) == (
        700,
        1000 - 50 - 64 - RESERVE,
        1000,
    )
    assert "ulimit -n" in str(refused.value)
    assert on_disk(tmp_path) == []
    await reg.create(NAME, 630)
    assert len(reg.get(NAME).partitions) == 630
    await close(reg)


async def test_creates_running_together_share_the_budget(tmp_path: Path) -> None:
    """Scenario: budget 630; a create of 400 is held at its build step while a create of
    another topic with 400 arrives. Expected: the second is refused (230 left), and never
    waits for the first; the first completes."""
    gate = threading.Event()
    reached = threading.Event()

    def hold(point: str) -> None:
        if point == "create.after_build":
            reached.set()
            gate.wait(10)

    reg = registry(tmp_path, hook=hold, usage=usage(1000))
    await reg.open()
    first = asyncio.create_task(reg.create("first", 400))
    await asyncio.to_thread(reached.wait, 10)
    with pytest.raises(FileLimitError) as refused:
        await reg.create("second", 400)
    assert refused.value.available == 630 - 400
    gate.set()
    await first
    assert reg.names() == ["first"]
    await close(reg)


async def test_admin_changes_of_one_name_are_serialized(tmp_path: Path) -> None:
    """Scenario: a create is held at its build step; a delete and a second create of the
    same name arrive. Expected: neither runs before the first create ends; then the delete
    removes the topic, and the second create, queued behind it, makes it again."""
    gate = threading.Event()
    reached = threading.Event()

    def hold(point: str) -> None:
        if point == "create.after_build" and not gate.is_set():
            reached.set()
            gate.wait(10)

    reg = registry(tmp_path, hook=hold)
    await reg.open()
    first = asyncio.create_task(reg.create(NAME, 2))
    await asyncio.to_thread(reached.wait, 10)
    delete = asyncio.create_task(reg.delete(NAME))
    again = asyncio.create_task(reg.create(NAME, 3))
    await asyncio.sleep(0.05)
    assert not delete.done()
    assert not again.done()
    gate.set()
    await first
    await delete
    await again
    assert_whole(tmp_path, reg, NAME, 3)
    await close(reg)


async def test_a_second_create_of_a_name_is_refused(tmp_path: Path) -> None:
    """Scenario: two creates of one name at once. Expected: one wins, the other gets
    TopicExistsError; the topic is whole once."""
    reg = registry(tmp_path)
    await reg.open()
    results = await asyncio.gather(reg.create(NAME, 2), reg.create(NAME, 2), return_exceptions=True)
    assert sum(isinstance(r, TopicExistsError) for r in results) == 1
    assert_whole(tmp_path, reg, NAME, 2)
    await close(reg)


async def test_opening_finishes_leftovers_of_interrupted_changes(tmp_path: Path) -> None:
    """Scenario: topics/ holds a build directory, a deleting directory, a topic directory
    without topic.json, and a whole topic. Expected: opening keeps only the whole topic."""
    reg = registry(tmp_path)
    await reg.open()
    await reg.create(NAME, 2)
    await close(reg)
    root = tmp_path / "topics"
    for leftover in (".a.creating/0", ".b.deleting/1", "c/0"):
        (root / leftover).mkdir(parents=True)
    reg = await reopened(tmp_path)
    assert_whole(tmp_path, reg, NAME, 2)
    await close(reg)


async def test_topics_on_disk_over_the_budget_are_refused_at_open(tmp_path: Path) -> None:
    """Scenario: a topic of 700 partitions exists; the registry reopens under a budget of
    630. Expected: open fails with FileLimitError naming the topics on disk, having opened
    no partition."""
    reg = registry(tmp_path)
    await reg.open()
    await reg.create(NAME, 700)
    await close(reg)
    reg = registry(tmp_path, usage=usage(1000))
    with pytest.raises(
        FileLimitError, match="the 700 partitions of the 1 topics on disk would need 700"
    ):
        await reg.open()
    assert reg.names() == []
    await close(reg)


class CountingFs(FileSystem):
    """Counts the descriptors opened through :meth:`open` and open now, and the most that
    ever were (segment files; not the transient ones of ``write_new``)."""

    def __init__(self) -> None:
        self.fds: set[int] = set()
        self.peak = 0

    @property
    def open_now(self) -> int:
        """Descriptors opened here and not closed yet."""
        return len(self.fds)

    def open(self, path: str, *, create: bool = False, exclusive: bool = False) -> int:
        fd = super().open(path, create=create, exclusive=exclusive)
        self.fds.add(fd)
        self.peak = max(self.peak, len(self.fds))
        return fd

    def close(self, fd: int) -> None:
        super().close(fd)
        self.fds.discard(fd)


async def test_a_start_with_many_sealed_segments_holds_few_descriptors(tmp_path: Path) -> None:
    """Scenario: 4 partitions of 30 or more segments each; the producer snapshots are removed
    (as after a crash), so the start reads every segment to rebuild producer state; the
    registry reopens with a cache of 4 idle descriptors, opening 2 partitions at a time.
    Expected: at no moment of the start were more than 4 (active) + 4 (idle) + 2 (one being
    read by each partition opening) descriptors open; once open, only the 4 active ones and
    at most 4 idle ones are; closing leaves none."""
    config = LogConfig(segment_bytes=512, index_interval_bytes=100)
    reg = TopicRegistry(str(tmp_path), config, files=FileCache(4))
    await reg.open()
    await reg.create(NAME, 4)
    for partition in reg.get(NAME).partitions:
        for i in range(200):
            await partition.append(encode_columns([b"record %d" % i]))
    assert all(p.log.segment_count >= 30 for p in reg.get(NAME).partitions)
    await close(reg)
    for snapshot in (tmp_path / "topics" / NAME).glob("*.producers.json"):
        snapshot.unlink()
    fs = CountingFs()
    reg = TopicRegistry(str(tmp_path), config, fs, files=FileCache(4), open_concurrency=2)
    await reg.open()
    assert fs.peak <= 4 + 4 + 2
    assert fs.open_now <= 4 + 4
    assert reg.files.busy_count == 4
    await close(reg)
    assert fs.open_now == 0
