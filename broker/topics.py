"""Topics: names, partitions and the log writer of each partition.

Role: create, find, list and delete topics on disk, and own every partition's
:class:`wal.LogWriter` and the descriptor cache their segments share. No protobuf types here.

On-disk layout::

    <data_dir>/topics/<name>/topic.json      {"name": ..., "partitions": N, "id": ...}: the
                                             commit point; "id" (random, 16 hex digits; absent
                                             in topics made before issue 17) tells a topic
                                             created again under its old name apart
    <data_dir>/topics/<name>/<partition>/    one WAL directory per partition
    <data_dir>/topics/<name>/<partition>.producers.json   idempotent-producer snapshot
    <data_dir>/topics/.<name>.creating/      a create being built (never a topic)
    <data_dir>/topics/.<name>.deleting/      a delete being finished (never a topic)

Invariants:
- A topic exists exactly when ``<name>/topic.json`` exists; opening the registry removes
  every other directory (a dot name, or no ``topic.json``): the leftovers of a create or a
  delete cut short by a crash.
- Create builds the whole topic in ``.<name>.creating`` (partition directories, then
  ``topic.json`` written and fsynced, then a fsync of the directory) and renames it to
  ``<name>`` (fsync of ``topics/``): a crash leaves the topic fully there or fully absent.
  Then it opens the partitions; if that fails, the topic is deleted again as below.
- Delete removes ``topic.json`` first (fsync of the topic directory): that is its commit
  point. Then subscriptions stop, partitions settle and close, the directory is renamed to
  ``.<name>.deleting`` (fsync) and removed. A crash after the commit point leaves a
  directory that the next open removes; before it, the topic stays, whole.
- Once started (past the name lock and the checks), a create or delete runs to its end
  whatever happens to its caller (:func:`wal.run_to_end`); :meth:`TopicRegistry.aclose`
  waits for it.
- A create that would not fit under the open-files limit (:mod:`broker.fd_budget`) is
  refused before any file is made.

Task-safe on one event loop: creates and deletes of one name are serialized by that name's
lock; lookups are plain dict reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import json
import logging
import os
import resource
import secrets
import shutil
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from broker.errors import (
    BrokerError,
    FileLimitError,
    InvalidRequestError,
    ShuttingDownError,
    TopicDeletedError,
    TopicExistsError,
    TopicMetadataError,
    TopicNotFoundError,
)
from broker.fd_budget import FdUsage, fds_needed, shortfall
from broker.partition import DEFAULT_SNAPSHOT_BYTES, Partition
from broker.producers import DEFAULT_MAX_PRODUCERS
from dispatcher.names import NAME_RULE, is_valid_name
from proto.shown import shown
from wal import FileSystem, LogConfig, run_to_end
from wal.fdcache import FileCache, default_capacity
from wal.log import Clock

logger = logging.getLogger(__name__)

_META = "topic.json"
MAX_PARTITIONS = 10_000
T = TypeVar("T")

#: Named points of a create and a delete where tests crash (``crash_point`` argument).
CRASH_POINTS = (
    "create.after_build",  # .<name>.creating complete and synced, not yet renamed
    "create.after_rename",  # renamed to <name> (not yet fsynced), partitions not opened
    "delete.after_commit",  # topic.json removed and synced; data still there
    "delete.after_close",  # subscriptions stopped, partitions closed, not yet renamed
    "delete.after_rename",  # renamed to .<name>.deleting, not yet removed
)
_Opened = TypeVar("_Opened", Partition, "Topic")


def new_topic_id() -> str:
    """A new topic id: 16 random lowercase hex digits."""
    return secrets.token_hex(8)


def _is_topic_id(text: str) -> bool:
    return len(text) == 16 and all(c in "0123456789abcdef" for c in text)


def check_topic_name(name: str, field: str = "topic") -> None:
    """Raise ``InvalidRequestError`` naming ``field`` (the request's field that holds the
    name) unless ``name`` is a valid topic name."""
    if not is_valid_name(name):
        raise InvalidRequestError(field, f"{shown(name)} is not a valid topic name: {NAME_RULE}")


@dataclass
class Topic:
    """One topic and its partitions.

    ``topic_id``: 16 random hex digits chosen when the topic was created, so a topic
    deleted and created again under the same name is told apart (readers that keep
    offsets, such as a Spark query, compare it); ``""`` for a topic created before topics
    had one.
    """

    name: str
    partitions: list[Partition]
    topic_id: str = ""
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
        wal_config: Settings of every partition's log, except those of the topics in
            ``topic_wal_configs``.
        fs: The file system. Default: the real one.
        on_open: Called with each partition opened (e.g. to hook up its metrics).
        on_delete: Called with a topic's name once its delete has closed its partitions
            (e.g. to drop its metrics' label sets, which would otherwise outlive it).
        clock: Wall-clock ms since the epoch for every partition's log and producer table.
            Default: the system clock.
        snapshot_bytes: Each partition snapshots its producer table after this many bytes
            appended (and at each roll). Default 32 MiB.
        open_concurrency: Partitions opened (recovered, producer state rebuilt) at once
            when the registry opens. Default 8.
        files: The descriptor cache every partition's segments share. Default: one of
            :func:`~wal.fdcache.default_capacity` for the soft ``RLIMIT_NOFILE`` when the
            registry opens (so after the broker raised it).
        fd_usage: Measures the process's descriptors for the budget check. Default: the
            soft limit and ``/proc/self/fd``; tests pass a fake.
        crash_point: Called with each name of :data:`CRASH_POINTS` as a create or delete
            passes it. Default: nothing; tests raise or exit there.
        max_partitions: Most partitions one topic may be created with (``[limits]
            max_partitions_per_topic``). Default :data:`MAX_PARTITIONS`.
        max_producers: Idempotent producers each partition remembers (``[limits]
            max_producers_per_partition``). Default 10,000.
        topic_wal_configs: The log settings of named topics (``[wal.topics.<name>]``),
            used for their partitions instead of ``wal_config``: a topic's own fsync policy,
            segment size or retention. Default: none.
    """

    def __init__(
        self,
        data_dir: str,
        wal_config: LogConfig,
        fs: FileSystem | None = None,
        *,
        on_open: Callable[[str, Partition], None] = lambda _topic, _partition: None,
        on_delete: Callable[[str], None] = lambda _topic: None,
        clock: Clock | None = None,
        snapshot_bytes: int = DEFAULT_SNAPSHOT_BYTES,
        open_concurrency: int = 8,
        files: FileCache | None = None,
        fd_usage: Callable[[FileCache], FdUsage] | None = None,
        crash_point: Callable[[str], None] = lambda _point: None,
        max_partitions: int = MAX_PARTITIONS,
        max_producers: int = DEFAULT_MAX_PRODUCERS,
        topic_wal_configs: Mapping[str, LogConfig] | None = None,
    ):
        self._max_partitions = max_partitions
        self._max_producers = max_producers
        self._clock = clock
        self._snapshot_bytes = snapshot_bytes
        self._open_concurrency = open_concurrency
        self._on_open = on_open  # e.g. hooks a partition's log up to the metrics
        self._on_delete = on_delete
        self._root = os.path.join(data_dir, "topics")
        self._wal_config = wal_config
        self._topic_wal_configs = dict(topic_wal_configs or {})
        self._fs = fs or FileSystem()
        self._files = files
        self._fd_usage = fd_usage or measure_fd_usage
        self._crash_point = crash_point
        self._topics: dict[str, Topic] = {}
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()
        self._reserved = 0  # descriptors promised to creates still opening partitions
        self._work: set[asyncio.Task[Any]] = set()
        self._closing = False

    @property
    def files(self) -> FileCache:
        """The descriptor cache of every partition's segments."""
        if self._files is None:
            self._files = FileCache(default_capacity(resource.getrlimit(resource.RLIMIT_NOFILE)[0]))
        return self._files

    async def open(self) -> None:
        """Load every topic on disk, finishing interrupted creates and deletes.

        Partitions of every topic open concurrently, ``open_concurrency`` at a time: each
        recovers its log and rebuilds its producer state on a worker thread.

        Raises:
            FileLimitError: the topics on disk need more descriptors than the limit leaves.
        """
        found = await asyncio.to_thread(self._scan)
        total = sum(partitions for _name, partitions, _id in found)
        self._check_budget(f"the {total} partitions of the {len(found)} topics on disk", total)
        limit = asyncio.Semaphore(self._open_concurrency)
        topics = await _open_all([self._open_topic(n, p, i, limit) for n, p, i in found])
        for topic in topics:
            self._topics[topic.name] = topic
        logger.info(
            "opened %d topics (%d partitions) under %s; %d descriptors held",
            len(self._topics),
            total,
            self._root,
            self.files.open_count,
        )

    def _scan(self) -> list[tuple[str, int, str]]:
        """The topics on disk as (name, partitions, id); removes interrupted creates and
        deletes."""
        self._fs.makedirs(self._root)
        found = []
        for name in sorted(os.listdir(self._root)):
            path = os.path.join(self._root, name)
            meta = os.path.join(path, _META)
            if name.startswith(".") or not os.path.exists(meta):
                logger.warning("removing %s: an interrupted topic create or delete", path)
                shutil.rmtree(path, ignore_errors=True)
                continue
            found.append((name, *self._read_meta(meta, name)))
        return found

    def _read_meta(self, meta: str, name: str) -> tuple[int, str]:
        """The partition count and id ``topic.json`` records (the id is ``""`` for a
        topic created before topics had one)."""
        with open(meta, "rb") as f:
            raw = f.read()
        try:
            doc = json.loads(raw)
        except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
            raise TopicMetadataError(meta, f"not JSON: {exc}") from exc
        if not isinstance(doc, dict):
            raise TopicMetadataError(meta, f"not a JSON object: {raw[:80]!r}")
        partitions, topic_id = doc.get("partitions"), doc.get("id", "")
        if doc.get("name") != name:
            raise TopicMetadataError(meta, f"its name is {doc.get('name')!r}, not {name!r}")
        if type(partitions) is not int or partitions < 1:
            raise TopicMetadataError(meta, f"partitions is {partitions!r}, not a count >= 1")
        if not isinstance(topic_id, str):
            raise TopicMetadataError(meta, f"id is {topic_id!r}, not a string")
        return partitions, topic_id

    async def _open_topic(
        self, name: str, partitions: int, topic_id: str, limit: asyncio.Semaphore | None = None
    ) -> Topic:
        """Open a topic's partitions concurrently, at most ``limit`` at once (default
        ``open_concurrency``); on any failure close those that opened, and raise."""
        limit = limit or asyncio.Semaphore(self._open_concurrency)
        topic_dir = os.path.join(self._root, name)
        wal_config = self.wal_config(name)

        async def open_one(index: int) -> Partition:
            async with limit:
                return await Partition.open(
                    index,
                    topic_dir,
                    wal_config,
                    self._fs,
                    clock=self._clock,
                    snapshot_bytes=self._snapshot_bytes,
                    max_producers=self._max_producers,
                    files=self.files,
                )

        opened = await _open_all([open_one(p) for p in range(partitions)])
        for partition in opened:
            self._on_open(name, partition)
        return Topic(name, opened, topic_id)

    def wal_config(self, name: str) -> LogConfig:
        """The log settings of topic ``name``'s partitions: its own if it has some, else
        every topic's."""
        return self._topic_wal_configs.get(name, self._wal_config)

    def set_default_wal_config(self, config: LogConfig) -> None:
        """Use ``config`` for every topic opened or created from now on that has no
        settings of its own (cluster mode: the cluster's defaults over ``[wal]``); the
        partitions already open keep theirs."""
        self._wal_config = config

    def get(self, name: str) -> Topic:
        """The topic called ``name``.

        Raises:
            InvalidRequestError: ``name`` is empty or not a valid topic name (no such topic
                can exist, so the advice to create it would be wrong).
            TopicNotFoundError: there is none.
        """
        topic = self._topics.get(name)
        if topic is None:
            if not name:
                raise InvalidRequestError(
                    "topic",
                    "topic name is empty; name an existing topic (`headrace topics "
                    "list` shows them)",
                )
            check_topic_name(name)
            raise TopicNotFoundError(name)
        return topic

    def closed_under(self, topic: Topic) -> BrokerError | None:
        """Why a log of ``topic`` was closed under a request that held it: the broker
        shuts down (:class:`ShuttingDownError`), or the topic was deleted
        (:class:`TopicDeletedError`); ``None`` when neither is so."""
        if self._closing:
            return ShuttingDownError()
        if self._topics.get(topic.name) is not topic:
            return TopicDeletedError(topic.name)
        return None

    def names(self) -> list[str]:
        """Every topic name, sorted."""
        return sorted(self._topics)

    def directory(self, name: str) -> str:
        """The directory of topic ``name`` (whether or not it exists)."""
        return os.path.join(self._root, name)

    # -- admin changes ----------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _name_lock(self, name: str) -> AsyncIterator[None]:
        """Serialize the admin changes of one topic name (the lock lives while in use)."""
        lock = self._locks.get(name)
        if lock is None:
            lock = self._locks[name] = asyncio.Lock()
        async with lock:
            yield

    async def _to_end(self, work: Coroutine[Any, Any, T]) -> T:
        """Run ``work`` to its end whatever happens to the caller; ``aclose`` waits for it."""
        task = asyncio.ensure_future(work)
        self._work.add(task)
        task.add_done_callback(self._work.discard)
        return await run_to_end(task)

    def _check_budget(self, what: str, partitions: int) -> None:
        """Raise ``FileLimitError`` unless ``partitions`` more partitions fit."""
        usage = dataclasses.replace(self._fd_usage(self.files), reserved=self._reserved)
        short = shortfall(partitions, usage)
        if short is not None:
            logger.error("refused: %s: %s", what, short)
            raise FileLimitError(what, short.needed, short.available, short.limit)

    def check_create(self, name: str, partitions: int) -> None:
        """Whether :meth:`create` of ``name`` with ``partitions`` would be refused now for
        a reason that a retry does not cure: the name, the partition count, or the
        open-files budget (measured as :meth:`create` measures it; no other I/O). Whether
        the name is taken is not checked (a create checks it under its lock).

        Raises:
            InvalidRequestError: bad name or partition count.
            FileLimitError: the partitions would not fit under the open-files limit now.
        """
        self._check_request(name, partitions)
        self._check_budget(f"topic {name!r} with {partitions} partitions", partitions)

    def _check_request(self, name: str, partitions: int) -> None:
        check_topic_name(name)
        if not 1 <= partitions <= self._max_partitions:
            raise InvalidRequestError(
                "partitions",
                f"must be from 1 to {self._max_partitions} ([limits] max_partitions_per_topic), "
                f"got {partitions}",
            )

    async def create(self, name: str, partitions: int, *, topic_id: str | None = None) -> Topic:
        """Create a topic with ``partitions`` empty partitions.

        ``topic_id`` is the id to record (16 hex digits); by default a random one. A
        cluster member passes the id the topic was given in etcd, so that the topic's files
        and its cluster record name the same topic.

        Once past the checks it runs to its end even if the caller is cancelled: the topic
        is then fully created, or (if opening it failed) fully removed again.

        Raises:
            InvalidRequestError: bad name or partition count.
            TopicExistsError: the name is taken.
            FileLimitError: the partitions would not fit under the open-files limit
                (nothing was created).
        """
        check_topic_name(name)
        if topic_id is not None and not _is_topic_id(topic_id):
            raise InvalidRequestError(
                "topic_id", f"must be 16 lowercase hex digits, got {topic_id!r}"
            )
        self._check_request(name, partitions)
        async with self._name_lock(name):
            if name in self._topics:
                raise TopicExistsError(name)
            self._check_budget(f"topic {name!r} with {partitions} partitions", partitions)
            self._reserved += fds_needed(partitions)  # no await since the check
            try:
                topic = await self._to_end(self._create(name, partitions, topic_id))
            finally:  # after the work ended, even if the caller was cancelled
                self._reserved -= fds_needed(partitions)
        logger.info("created topic %s with %d partitions", name, partitions)
        return topic

    async def _create(self, name: str, partitions: int, topic_id: str | None) -> Topic:
        topic_id = topic_id or new_topic_id()
        await asyncio.to_thread(self._build, name, partitions, topic_id)
        try:
            # closes what it opened if not
            topic = await self._open_topic(name, partitions, topic_id)
        except BaseException:
            await asyncio.to_thread(self._remove, name, committed=False)
            raise
        self._topics[name] = topic
        return topic

    def _build(self, name: str, partitions: int, topic_id: str) -> None:
        """Lay the topic out in ``.<name>.creating`` and rename it in (see the module
        docstring); the rename is the commit point."""
        building = os.path.join(self._root, f".{name}.creating")
        if self._fs.exists(building):
            shutil.rmtree(building)
        os.mkdir(building)
        # Plain mkdirs (not fs.makedirs, which fsyncs the parent of each): one fsync of
        # the build directory below covers all of them.
        for p in range(partitions):
            os.mkdir(os.path.join(building, str(p)))
        meta = json.dumps({"name": name, "partitions": partitions, "id": topic_id}).encode()
        self._fs.write_new(os.path.join(building, _META), meta)
        self._fs.fsync_dir(building)
        self._crash_point("create.after_build")
        self._fs.rename(building, os.path.join(self._root, name))
        self._crash_point("create.after_rename")
        self._fs.fsync_dir(self._root)

    async def get_or_create(self, name: str, partitions: int) -> Topic:
        """The topic, created with ``partitions`` if missing (auto-create on publish)."""
        try:
            return self.get(name)
        except TopicNotFoundError:
            try:
                return await self.create(name, partitions)
            except TopicExistsError:
                return self.get(name)

    async def delete(
        self, name: str, *, before_close: Callable[[], Awaitable[None]] | None = None
    ) -> None:
        """Delete a topic and all its data.

        Once the topic is found it runs to its end even if the caller is cancelled.

        Args:
            name: The topic.
            before_close: Awaited after the commit point, before the partitions close
                (the broker stops and drops the topic's subscriptions there).

        Raises:
            TopicNotFoundError: there is none.
        """
        async with self._name_lock(name):
            topic = self.get(name)
            await self._to_end(self._delete(topic, before_close))
        logger.info("deleted topic %s", name)

    async def _delete(
        self, topic: Topic, before_close: Callable[[], Awaitable[None]] | None
    ) -> None:
        meta = os.path.join(self._root, topic.name, _META)
        await asyncio.to_thread(self._commit_delete, meta)
        del self._topics[topic.name]
        try:
            if before_close is not None:
                await before_close()
        finally:
            # Together: each close waits on its syncs in the thread pool.
            await asyncio.gather(*(p.aclose() for p in topic.partitions))
            self._on_delete(topic.name)
            self._crash_point("delete.after_close")
            await asyncio.to_thread(self._remove, topic.name, committed=True)

    def _commit_delete(self, meta: str) -> None:
        self._fs.remove(meta)
        self._fs.fsync_dir(os.path.dirname(meta))
        self._crash_point("delete.after_commit")

    def _remove(self, name: str, *, committed: bool) -> None:
        """Remove ``<name>``: drop its ``topic.json`` unless ``committed`` already did, then
        rename it to ``.<name>.deleting`` (fsync) and remove that."""
        path = os.path.join(self._root, name)
        if not committed:
            self._commit_delete(os.path.join(path, _META))
        doomed = os.path.join(self._root, f".{name}.deleting")
        if self._fs.exists(doomed):
            shutil.rmtree(doomed)
        self._fs.rename(path, doomed)
        self._fs.fsync_dir(self._root)
        self._crash_point("delete.after_rename")
        shutil.rmtree(doomed)

    async def aclose(self) -> None:
        """Let running creates and deletes finish, then close every partition (each
        settles its appends, syncs, snapshots)."""
        self._closing = True
        if self._work:
            await asyncio.gather(*self._work, return_exceptions=True)
        topics, self._topics = list(self._topics.values()), {}
        for topic in topics:
            for partition in topic.partitions:
                await partition.aclose()
        self.files.clear()


async def _open_all(openings: list[Coroutine[Any, Any, _Opened]]) -> list[_Opened]:
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


def measure_fd_usage(files: FileCache) -> FdUsage:
    """The process's descriptors now: the soft limit and a count of ``/proc/self/fd``."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    limit = soft if soft != resource.RLIM_INFINITY else 1 << 30
    fd_dir = "/proc/self/fd" if os.path.isdir("/proc/self/fd") else "/dev/fd"
    return FdUsage(limit, len(os.listdir(fd_dir)), files.idle_count, files.capacity)
