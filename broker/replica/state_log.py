"""The replicated topics' subscription-state logs on this broker (issue 37).

Role: a replicated topic's subscription states (what its cursor journal holds: cursors,
acked ranges, delivery counts; :mod:`dispatcher.state_log` gives the records and the
replay) travel to its followers as one more log of the topic, id ``state``, beside
``p/<n>``: the leader serves it in ``ReplicaFetch`` and commits it as it commits a
partition (its high watermark over the in-sync set), a follower fetches and appends it
byte for byte, with divergence and truncation as for a partition.

- :class:`StateLogs` opens each replicated topic's state log, a wal log in
  ``<data dir>/subscriptions/<topic>/state-log/`` (removed with the topic's
  subscriptions), when the broker first leads or follows the topic, and closes it when
  the role ends.
- :class:`ReplicaStateLog` is the log as :class:`~broker.replica.leader.LeaderTopic` and
  :class:`~broker.replica.fetcher.FollowerTopic` see a partition (a writer; no producer
  table, no publish gate); its index is :data:`STATE_INDEX`, so the leader's
  ``committed(STATE_INDEX, offset)`` waits for its watermark.
- :class:`LeaderStateSink` is the cursor store's :class:`~dispatcher.state_log.StateSink`
  on a leader: appends, waits for commits, trims before snapshots.
- :func:`read_states` replays a log (a promoted replica, before its subscriptions open).
- :class:`StateReplication` ties them to the replica manager's switches (open the log
  before a role, the sink and the replay when leading starts, the subscriptions out of
  memory while followed, close at the end).

The replay rule on promotion: everything this replica holds of the state log is
replayed, to its end, not only below the watermark it last learnt. The new leader's logs
are the group's logs from now on (the followers truncate theirs to them), so its tail is
committed in its epoch like a partition's tail. A committed save is never lost: it is on
every in-sync replica, and only an in-sync replica is elected. A save that was not
committed (its caller got an error, or no answer) may take effect or not, as an
unacknowledged publish; acks whose record did not reach this replica are redelivered
(at least once, as after a crash).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import cast

from broker.partition import Partition
from broker.replica.leader import LeaderTopic
from broker.topics import TopicRegistry
from dispatcher import SubscriptionRegistry, state_file
from dispatcher.state_log import RECORD_BYTES, only_a_cut_snapshot, replay
from proto.record import Record
from wal import LogConfig, LogWriter, encode_records, run_to_end

logger = logging.getLogger(__name__)

_Committed = Callable[[int, int], Awaitable[None]]
"""What the sink needs of a leader: ``LeaderTopic.committed(partition, last_offset)``."""

#: The directory of a topic's state log, under its subscriptions directory.
DIRECTORY = "state-log"
#: The partition index the state log stands at in a leader's commit waits.
STATE_INDEX = -1
#: Segments of a state log: small, so a snapshot soon lets the log before it go.
SEGMENT_BYTES = 4 * 1024 * 1024
#: The largest record the log takes. The cursor store writes records of at most
#: ``dispatcher.state_log.RECORD_BYTES`` (1 MiB) of entries, a snapshot in chunks; only
#: one subscription's state bigger than that (thousands of partitions, each with many
#: ack ranges) makes a bigger one, alone.
MAX_RECORD_BYTES = 64 * 1024 * 1024


class ReplicaStateLog:
    """A state log as the leader and follower handle a partition. Task-safety: the
    writer's (one event loop)."""

    index = STATE_INDEX

    def __init__(self, writer: LogWriter) -> None:
        self.writer = writer
        #: Set by a leader (a partition's publish gate); nothing publishes here.
        self.gate: object | None = None

    def note_replicated(self, _batches: Iterable[tuple[int, int, int, int]]) -> None:
        """No producer table: nothing to note."""

    async def reload_producers(self) -> None:
        """No producer table: nothing to rebuild."""


class LeaderStateSink:
    """The cursor store's sink for a topic this broker leads: records go to the state
    log and commit under ``leader`` (a :class:`~broker.replica.leader.LeaderTopic`
    built with the log).

    Args:
        writer: The state log.
        committed: The leader's commit wait.
        record_bytes: The most entries' bytes in one record (a snapshot in chunks).
            Default ``dispatcher.state_log.RECORD_BYTES`` (1 MiB).
    """

    def __init__(
        self, writer: LogWriter, committed: _Committed, record_bytes: int = RECORD_BYTES
    ) -> None:
        self._writer = writer
        self._committed = committed
        self.record_bytes = record_bytes

    async def append(self, value: bytes, *, key: bytes | None) -> int:
        """Append one record; its offset (durable here when it returns)."""
        record = Record(value, key=key)
        result = await self._writer.append(encode_records([record]))
        return result.last_offset

    async def committed(self, offset: int) -> None:
        """Return once ``offset`` is below the state log's high watermark.

        Raises:
            ReplicationOutcomeUnknownError: leadership lost, or too few in-sync replicas.
        """
        await self._committed(STATE_INDEX, offset)

    async def trim_before(self, offset: int) -> None:
        """Delete the log's sealed segments wholly before ``offset``."""
        await self._writer.delete_before(offset)


class StateLogs:
    """Each replicated topic's open state log here. Task-safety: one event loop.

    Args:
        root: ``<data dir>/subscriptions``.
        config: The logs' wal settings. Default: fsync always, 4 MiB segments,
            records up to :data:`MAX_RECORD_BYTES`.
    """

    def __init__(self, root: str, config: LogConfig | None = None) -> None:
        self._root = root
        self._config = config or LogConfig(
            segment_bytes=SEGMENT_BYTES,
            max_record_bytes=MAX_RECORD_BYTES,
            max_batch_bytes=MAX_RECORD_BYTES + 1024 * 1024,
        )
        self._logs: dict[str, ReplicaStateLog] = {}
        self._lock = asyncio.Lock()

    def path(self, topic: str) -> str:
        """The directory of ``topic``'s state log."""
        return os.path.join(self._root, topic, DIRECTORY)

    def get(self, topic: str) -> ReplicaStateLog | None:
        """``topic``'s open state log, or ``None``."""
        return self._logs.get(topic)

    def extra_logs(self, topic: str) -> dict[str, ReplicaStateLog]:
        """The logs a leader or follower of ``topic`` handles beside its partitions."""
        log = self._logs.get(topic)
        return {"state": log} if log is not None else {}

    async def open(self, topic: str) -> ReplicaStateLog:
        """``topic``'s state log, opened (and made) if need be.

        Raises:
            WalError: the log could not be opened.
        """
        async with self._lock:
            log = self._logs.get(topic)
            if log is None:
                writer = await LogWriter.open(self.path(topic), self._config)
                log = self._logs[topic] = ReplicaStateLog(writer)
            return log

    async def close(self, topic: str) -> None:
        """Close ``topic``'s state log (its role ended, or the topic goes). Idempotent."""
        async with self._lock:
            log = self._logs.pop(topic, None)
            if log is not None:
                await log.writer.aclose()

    async def aclose(self) -> None:
        """Close every state log."""
        for topic in list(self._logs):
            await self.close(topic)


def read_states(writer: LogWriter) -> dict[str, state_file.StateDoc] | None:
    """Replay ``writer``'s log from its first record to its end (see the module
    docstring); ``None`` when it holds none, or when, starting at offset 0, it holds
    only the first chunks of its first snapshot (:func:`dispatcher.state_log
    .only_a_cut_snapshot`: a switch from one copy killed between chunks; the states on
    disk are then the whole ones). Blocking: run in a thread, with no append or fetch
    running on the log (the role is switching).

    Raises:
        WalError: a read failed.
        ValueError: a record is not a state-log record.
    """
    log = writer.log
    records: list[tuple[bytes | None, bytes]] = []
    offset, end = log.first_offset, log.head
    while offset < end:
        batches = log.read(offset, 1 << 20, upper=end)
        if not batches:
            break
        for batch in batches:
            for number, record in enumerate(batch.records()):
                if batch.base_offset + number >= offset:
                    records.append((record.key, record.value))
            offset = max(offset, batch.next_offset)
    if log.first_offset == 0 and only_a_cut_snapshot([key for key, _value in records]):
        logger.warning(
            "state log %s holds only the first %d chunk(s) of its first snapshot (cut "
            "short): nothing replayed from it, the subscriptions on disk are taken",
            log.path,
            len(records),
        )
        return None
    return replay(records)


class StateReplication:
    """The subscription side of a replicated topic's roles here: the state logs, and
    the switch of the topic's subscriptions when this broker begins or ends to lead it.
    Task-safety: one event loop (the replica manager's role calls).

    Args:
        topics: The broker's topics (their partitions' writers).
        subscriptions: The broker's subscriptions.
        leader: The started leader of a topic here (``ReplicaManager.leader``).
        logs: The state logs. Default: under the subscriptions' root.
    """

    def __init__(
        self,
        topics: TopicRegistry,
        subscriptions: SubscriptionRegistry,
        leader: Callable[[str], object | None],
        logs: StateLogs | None = None,
    ) -> None:
        self._topics = topics
        self._subscriptions = subscriptions
        self._leader = leader
        self.logs = logs or StateLogs(subscriptions.root)

    async def prepare(self, name: str) -> None:
        """Before ``name`` is led or followed: its state log is open."""
        await self.logs.open(name)

    def extra_logs(self, name: str) -> Mapping[str, Partition]:
        """What a leader or follower of ``name`` handles beside the partitions."""
        return cast(Mapping[str, Partition], self.logs.extra_logs(name))

    async def leading(self, name: str) -> None:
        """``name``'s leader started (the manager's ``on_leading``): its saves go to the
        state log from now on, and its subscriptions are replayed from it
        (``SubscriptionRegistry.take_over``) before any consumer is served here.

        Raises:
            WalError, OSError: the log could not be read or the states written.
        """
        log, leader = self.logs.get(name), self._leader(name)
        if log is None or not isinstance(leader, LeaderTopic):
            return
        self._subscriptions.set_state_sink(name, LeaderStateSink(log.writer, leader.committed))
        states = await run_to_end(asyncio.to_thread(read_states, log.writer))
        writers = [p.writer for p in self._topics.get(name).partitions]
        await self._subscriptions.take_over(name, writers, states)

    async def following(self, name: str) -> None:
        """``name`` is followed here (after the manager's ``follow``): its subscriptions
        leave memory (``SubscriptionRegistry.release``): a follower dispatches nothing
        for them, and :meth:`leading` rebuilds them from the replayed log."""
        await self._subscriptions.release(name)

    async def not_leading(self, name: str) -> None:
        """``name`` stops being led here (the manager's ``on_not_leading``): no more
        appends to its state log from the cursor store (a flush appending to it ends
        first: the follower that comes next must be the log's only writer)."""
        await self._subscriptions.drop_state_sink(name)

    async def close(self, name: str) -> None:
        """``name``'s role ended (stopped or deleted): its state log closes."""
        await self._subscriptions.drop_state_sink(name)
        await self.logs.close(name)

    async def aclose(self) -> None:
        """Close every state log (after every role ended)."""
        await self.logs.aclose()
