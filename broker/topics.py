"""Topics: names, partitions and the log writer of each partition.

Role: create, find, list and delete topics on disk, and own every partition's
:class:`wal.LogWriter`. No protobuf types here.

On-disk layout::

    <data_dir>/topics/<name>/topic.json      {"name": ..., "partitions": N}: the commit point
    <data_dir>/topics/<name>/<partition>/    one WAL directory per partition
    <data_dir>/topics/<name>/<partition>.producers.json   idempotent-producer snapshot

Invariants:
- A topic exists exactly when its ``topic.json`` exists. It is written last, atomically
  (temp, fsync, rename, fsync of the directory), so a crash mid-create leaves a directory
  without it, which opening the registry removes.
- Deleting renames the directory to ``.<name>.deleting`` first (atomic), then removes it;
  opening the registry finishes any such leftover.

Task-safe on one event loop: create and delete hold a lock; lookups are plain dict reads.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import re
import shutil
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

from broker.errors import InvalidRequestError, TopicExistsError, TopicNotFoundError
from broker.partition import DEFAULT_SNAPSHOT_BYTES, Partition
from wal import FileSystem, LogConfig, run_to_end
from wal.log import Clock

logger = logging.getLogger(__name__)

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")
_META = "topic.json"
MAX_PARTITIONS = 10_000
T = TypeVar("T", Partition, "Topic")


def check_topic_name(name: str) -> None:
    """Raise ``InvalidRequestError`` unless ``name`` is a valid topic name."""
    if not _NAME.fullmatch(name or ""):
        raise InvalidRequestError(
            "topic",
            f"{name!r} is not a valid topic name: use 1-200 characters from A-Z a-z 0-9 . _ -, "
            "starting with a letter or digit",
        )


@dataclass
class Topic:
    """One topic and its partitions."""

    name: str
    partitions: list[Partition]
    _round_robin: itertools.cycle[int] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._round_robin = itertools.cycle(range(len(self.partitions)))

    def partition(self, index: int) -> Partition:
        """Partition ``index``; -1 picks the next one round robin.

        Raises:
            InvalidRequestError: ``index`` is out of range.
        """
        if index == -1:
            index = next(self._round_robin)
        if not 0 <= index < len(self.partitions):
            raise InvalidRequestError(
                "partition",
                f"topic {self.name!r} has partitions 0-{len(self.partitions) - 1}, not {index}",
            )
        return self.partitions[index]


class TopicRegistry:
    """Every topic of one broker. Task-safe on one loop (see the module docstring).

    Args:
        data_dir: The broker's data directory (topics live under ``topics/``).
        wal_config: Settings of every partition's log.
        fs: The file system. Default: the real one.
        on_open: Called with each partition opened (e.g. to hook up its metrics).
        clock: Wall-clock ms since the epoch for every partition's log and producer table.
            Default: the system clock.
        snapshot_bytes: Each partition snapshots its producer table after this many bytes
            appended (and at each roll). Default 32 MiB.
        open_concurrency: Partitions opened (recovered, producer state rebuilt) at once
            when the registry opens. Default 8.
    """

    def __init__(
        self,
        data_dir: str,
        wal_config: LogConfig,
        fs: FileSystem | None = None,
        *,
        on_open: Callable[[str, Partition], None] = lambda _topic, _partition: None,
        clock: Clock | None = None,
        snapshot_bytes: int = DEFAULT_SNAPSHOT_BYTES,
        open_concurrency: int = 8,
    ):
        self._clock = clock
        self._snapshot_bytes = snapshot_bytes
        self._open_concurrency = open_concurrency
        self._on_open = on_open  # e.g. hooks a partition's log up to the metrics
        self._root = os.path.join(data_dir, "topics")
        self._wal_config = wal_config
        self._fs = fs or FileSystem()
        self._topics: dict[str, Topic] = {}
        self._lock = asyncio.Lock()

    async def open(self) -> None:
        """Load every topic on disk, finishing interrupted creates and deletes.

        Partitions of every topic open concurrently, ``open_concurrency`` at a time: each
        recovers its log and rebuilds its producer state on a worker thread.
        """
        found = await asyncio.to_thread(self._scan)
        limit = asyncio.Semaphore(self._open_concurrency)
        topics = await _open_all([self._open_topic(n, p, limit) for n, p in found])
        for topic in topics:
            self._topics[topic.name] = topic
        logger.info("opened %d topics under %s", len(self._topics), self._root)

    def _scan(self) -> list[tuple[str, int]]:
        """The topics on disk as (name, partitions); removes interrupted creates/deletes."""
        self._fs.makedirs(self._root)
        found = []
        for name in sorted(os.listdir(self._root)):
            path = os.path.join(self._root, name)
            meta = os.path.join(path, _META)
            if name.startswith(".") or not os.path.exists(meta):
                logger.warning("removing %s: an interrupted topic create or delete", path)
                shutil.rmtree(path, ignore_errors=True)
                continue
            found.append((name, self._read_meta(meta, name)))
        return found

    def _read_meta(self, meta: str, name: str) -> int:
        with open(meta, "rb") as f:
            doc = json.load(f)
        partitions = doc.get("partitions")
        if doc.get("name") != name or not isinstance(partitions, int) or partitions < 1:
            raise ValueError(f"{meta} is damaged: {doc!r}")
        return partitions

    async def _open_topic(
        self, name: str, partitions: int, limit: asyncio.Semaphore | None = None
    ) -> Topic:
        """Open a topic's partitions concurrently, at most ``limit`` at once (default
        ``open_concurrency``); on any failure close those that opened, and raise."""
        limit = limit or asyncio.Semaphore(self._open_concurrency)
        topic_dir = os.path.join(self._root, name)

        async def open_one(index: int) -> Partition:
            async with limit:
                return await Partition.open(
                    index,
                    topic_dir,
                    self._wal_config,
                    self._fs,
                    clock=self._clock,
                    snapshot_bytes=self._snapshot_bytes,
                )

        opened = await _open_all([open_one(p) for p in range(partitions)])
        for partition in opened:
            self._on_open(name, partition)
        return Topic(name, opened)

    def get(self, name: str) -> Topic:
        """The topic called ``name``.

        Raises:
            TopicNotFoundError: there is none.
        """
        topic = self._topics.get(name)
        if topic is None:
            raise TopicNotFoundError(name)
        return topic

    def names(self) -> list[str]:
        """Every topic name, sorted."""
        return sorted(self._topics)

    async def create(self, name: str, partitions: int) -> Topic:
        """Create a topic with ``partitions`` empty partitions.

        Raises:
            InvalidRequestError: bad name or partition count.
            TopicExistsError: the name is taken.
        """
        check_topic_name(name)
        if not 1 <= partitions <= MAX_PARTITIONS:
            raise InvalidRequestError(
                "partitions", f"must be from 1 to {MAX_PARTITIONS}, got {partitions}"
            )
        async with self._lock:
            if name in self._topics:
                raise TopicExistsError(name)
            topic = await self._open_topic(name, partitions)
            meta = json.dumps({"name": name, "partitions": partitions}).encode()
            await asyncio.to_thread(
                self._fs.atomic_write, os.path.join(self._root, name, _META), meta
            )
            await asyncio.to_thread(self._fs.fsync_dir, self._root)
            self._topics[name] = topic
        logger.info("created topic %s with %d partitions", name, partitions)
        return topic

    async def get_or_create(self, name: str, partitions: int) -> Topic:
        """The topic, created with ``partitions`` if missing (auto-create on publish)."""
        try:
            return self.get(name)
        except TopicNotFoundError:
            try:
                return await self.create(name, partitions)
            except TopicExistsError:
                return self.get(name)

    async def delete(self, name: str) -> None:
        """Delete a topic and all its data.

        Raises:
            TopicNotFoundError: there is none.
        """
        async with self._lock:
            topic = self.get(name)
            del self._topics[name]
            for partition in topic.partitions:
                await partition.aclose()
            doomed = os.path.join(self._root, f".{name}.deleting")
            await asyncio.to_thread(self._fs.rename, os.path.join(self._root, name), doomed)
            await asyncio.to_thread(self._fs.fsync_dir, self._root)
            await asyncio.to_thread(shutil.rmtree, doomed)
        logger.info("deleted topic %s", name)

    async def aclose(self) -> None:
        """Close every partition (each settles its appends, syncs, snapshots)."""
        topics, self._topics = list(self._topics.values()), {}
        for topic in topics:
            for partition in topic.partitions:
                await partition.aclose()


async def _open_all(openings: list[Coroutine[Any, Any, T]]) -> list[T]:
    """Run ``openings`` concurrently to their end, even if the caller is cancelled; return
    what they opened, in order. If any failed (or the caller was cancelled), close what
    the others opened and raise the first failure: all open, or nothing left open."""
    tasks = [asyncio.ensure_future(o) for o in openings]
    try:
        results = await run_to_end(asyncio.gather(*tasks, return_exceptions=True))
    except BaseException:
        await _close_opened([t.result() for t in tasks if _succeeded(t)])
        raise
    opened = [r for r in results if not isinstance(r, BaseException)]
    failure = next((r for r in results if isinstance(r, BaseException)), None)
    if failure is not None:
        await _close_opened(opened)
        raise failure
    return opened


async def _close_opened(opened: list[Partition] | list[Topic]) -> None:
    for item in opened:
        for partition in item.partitions if isinstance(item, Topic) else [item]:
            await partition.aclose()


def _succeeded(task: asyncio.Future[Any]) -> bool:
    return task.done() and not task.cancelled() and task.exception() is None
