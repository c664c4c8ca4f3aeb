"""The leader of a replicated topic: its followers' progress, its high watermark (what is
committed), its in-sync set, and its answers to the followers' fetches.

Role: one :class:`LeaderTopic` per topic this broker leads, made by the replica manager
when the broker becomes leader at ``record.epoch`` and closed when it stops leading. It
owns, per log of the topic (``p/<partition>``):

- each follower's :class:`~cluster.replicas.FollowerProgress` (its durable end, as its
  fetches and progress reports say; when it was last caught up with the leader's
  durable end);
- what the followers are served: the log's *written* end (``_LedLog.served_end``), told
  by the writer between a group's write and its ``fdatasync``
  (``LogWriter.set_written_listener``), so that the followers' copies and syncs overlap
  the leader's own sync instead of following it (Kafka serves its followers its log end
  too);
- the high watermark, ``cluster.replicas.high_watermark`` over the in-sync set, pushed
  into the log's commit gate (``LogWriter.commit_to``): readers of the topic (Fetch,
  Subscribe, lag, metrics) see only committed records, with no change of their own;
- the acknowledgements waiting for it (:meth:`committed`, the partitions'
  :class:`~broker.partition.CommitGate`).

Invariants:

- An acknowledgement is given only once the record is below the high watermark, that
  is durable on the leader and on every member of the in-sync set as committed in etcd
  (a shrink counts once its transaction succeeded; a joining follower counts at once,
  Kafka's "maximal isr", which can only hold the watermark back).
- The watermark never moves back while this broker leads (``commit_to`` never lowers it).
- Serving bytes not yet synced here commits nothing early: the watermark is at most the
  leader's own durable end. Should the leader crash before its sync, its followers may
  hold a tail its disk lost: a new leader (one of them) commits that tail in its own
  epoch, and the old leader, back as a follower, finds its log a prefix of the new
  leader's (same bytes: the followers copied its writes) and fetches the rest.
- A new leader's watermark starts where the log's was: at its checkpoint when the log
  was opened since (:mod:`wal.hw_checkpoint`: a replica's log opens held there), where
  it was as a follower otherwise; and it moves only as the in-sync followers' fetches
  of this epoch confirm (Kafka: a new leader's high watermark advances only after its
  followers fetch in its epoch): each follower counts 0 until its first fetch here. So
  a record a promoted follower holds above its checkpoint (an old leader's uncommitted
  tail) is seen by no consumer until committed in this epoch.
- Nothing of this epoch is appended before :meth:`start` returns: every partition's
  ``leader-epochs`` file holds ``(epoch, head)`` durably first.
- A waiting acknowledgement that can no longer be given (leadership lost, the in-sync
  set below ``min_insync``, the leader stopped) fails with
  :class:`~broker.errors.ReplicationOutcomeUnknownError`: ``UNAVAILABLE``, as a lost
  connection; the idempotent producer's resend is deduplicated wherever it lands.

Worked example: replicas (b1, b2, b3), isr (b1, b2, b3), min_insync 2, b1 leads. A
publish is appended at offset 10 on b1 (durable end 11). b2 fetches from 11 (it has
0-10), b3 still fetches from 9: the watermark is min(11, 11, 9) = 9; the ack waits. b3
stops fetching; after ``lag_time_max_ms`` with b3 not caught up, :meth:`check_isr` asks
``change_isr(("b1", "b2"))``; once it is committed the watermark is min(11, 11) = 11 and
the ack goes. Had b2 gone too, the isr (b1) would be below min_insync 2: the waiting
ack fails "outcome unknown" and new publishes are refused ``not-enough-replicas``
before anything is appended.

Task-safety: one event loop; the fetches, the acknowledgements and the isr checks share
its state on the loop, and :meth:`check_isr` runs one change at a time (a lock).

One piece, though past 600 lines (about 900; :class:`LeaderTopic` about 640): the three
jobs above are one state. A follower's fetch or report is what moves its progress, its
progress is what moves the watermark, the watermark is what releases the waiting acks,
and the same progress decides the in-sync set that the watermark is taken over; split,
each part would call back into the others on every fetch. The rules are already pure
and apart (:mod:`cluster.replicas`: high watermark, in-sync rule, leader choice;
:mod:`broker.replica.answers`: the answers' wire form and the divergence check). The
seam left, should it grow again: the in-sync set's upkeep (``check_isr``, ``_ask``,
``_tick``, ``_expand_soon``: about 90 lines), which reads the progress and writes only
through ``change_isr``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import heapq
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from broker.errors import ReplicaLogUnknownError, ReplicationOutcomeUnknownError
from broker.partition import Partition
from broker.replica.answers import diverging, encode, error_answer
from broker.topics import Topic
from cluster.errors import NotEnoughReplicasError
from cluster.ownership import Refusal
from cluster.records import TopicRecord
from cluster.replicas import (
    FollowerProgress,
    follower_fetched,
    has_min_insync,
    high_watermark,
    isr_to_expand,
    isr_to_shrink,
)
from proto import replication_pb2 as _pb
from wal import OffsetOutOfRangeError, run_to_end

logger = logging.getLogger(__name__)

#: Bytes a fetch gets when it asks for 0 or less.
DEFAULT_MAX_BYTES = 1 << 20
#: The most an answer carries, whatever ``max_bytes`` asks (one whole batch may exceed
#: it): the request is a caller's, and an answer stays well under gRPC's message limits.
MAX_BYTES = 16 << 20
#: The longest a fetch is held, whatever it asks (ms).
MAX_WAIT_MS = 30_000
#: Asks of logs a fetch may make beyond the topic's logs here (a follower asks each log it
#: follows once; a few may be gone here, a dead-letter queue deleted): the rest, and any
#: second ask of a log, are not answered, so a request's size does not set the answer's.
EXTRA_ASKS = 64


@dataclass(frozen=True, slots=True)
class FollowerLag:
    """How far one follower is behind the leader in one partition (for describe,
    status and metrics).

    Attributes:
        partition: the partition's index.
        node: the follower's node id.
        fetch_offset: its durable end as its last fetch or progress report in this epoch
            said (what the watermark counts); 0 before its first fetch here.
        lag_records: the leader's durable end minus ``fetch_offset`` (0 when caught up).
        lag_s: seconds since it was last caught up with the leader's end (0 while it
            is; counted from the start of this leadership when it never was here).
        in_sync: it is in the in-sync set as committed in etcd.
    """

    partition: int
    node: str
    fetch_offset: int
    lag_records: int
    lag_s: float
    in_sync: bool


def log_id(partition: int) -> str:
    """The log id of a partition: ``p/<partition>``."""
    return f"p/{partition}"


def log_kind(log: str) -> str:
    """The kind of log id ``log``: ``partition`` (``p/<n>``), ``state``, ``dlq``
    (``dlq/<subscription>``), else the id itself."""
    if log.startswith("p/"):
        return "partition"
    if log.startswith("dlq/"):
        return "dlq"
    return log


@dataclass(frozen=True, slots=True)
class LogLag:
    """How far one follower is behind the leader in one kind of log beside the
    partitions (for metrics and describe): the largest over the logs of that kind.

    Attributes:
        kind: ``state`` or ``dlq`` (:func:`log_kind`).
        node: the follower's node id.
        lag_records: the leader's durable end minus the follower's fetch offset, the
            largest over the logs of the kind (0: caught up in every one).
        lag_s: seconds since it was last caught up (as :class:`FollowerLag`), the
            largest over the logs of the kind (maybe another log's than the records').
        in_sync: it is in the in-sync set as committed in etcd.
    """

    kind: str
    node: str
    lag_records: int
    lag_s: float
    in_sync: bool


class _LedLog:
    """One log of a led topic: its partition, its followers' progress, the
    acknowledgements waiting for its watermark. State only; :class:`LeaderTopic` acts."""

    def __init__(self, name: str, partition: Partition) -> None:
        self.name = name
        self.partition = partition
        self.writer = partition.writer
        self.progress: dict[str, FollowerProgress] = {}
        #: (last offset, order, future) of each waiting acknowledgement: a heap.
        self.waiters: list[tuple[int, int, asyncio.Future[None]]] = []
        self.epoch_start = 0
        #: The writer's durable and written listeners while the topic is led (removed by
        #: aclose: a later leader's, set meanwhile, stays).
        self.on_durable: Callable[[int], None] | None = None
        self.on_written: Callable[[int], None] = _ignore
        #: The end the followers are served up to: the log's written end as its writer
        #: last told it (before the sync), or its durable end when that is further.
        self.served_end = self.writer.durable_end
        #: The last raw read answered, ``((fetch offset, budget, served end), bytes)``,
        #: for the other followers (``shares_left`` more): see :meth:`read`.
        self.last_read: tuple[tuple[int, int, int], bytes] | None = None
        self.shares_left = 0

    async def read(self, offset: int, budget: int, end: int, sharers: int) -> bytes:
        """The batches from ``offset`` within ``budget`` below ``end`` (the served end,
        the caller's reading of it this turn), read once for up to ``sharers`` more
        followers asking the same: they get the same bytes object.

        The bytes below a written end never change while this broker leads (only a
        follower truncates), and the key names the end, so a shared answer is the one a
        read of its own would give. A read is kept only while the end is still ``end``,
        and dropped once ``sharers`` took it or the served end moves
        (:meth:`LeaderTopic._on_written`): at most one answer per log is held, and only
        until the next append to it.

        Raises:
            OffsetOutOfRangeError: as :meth:`wal.LogWriter.read_raw`.
        """
        key = (offset, budget, end)
        last = self.last_read
        if last is not None and last[0] == key:
            self.shares_left -= 1
            if self.shares_left <= 0:
                self.last_read = None
            return last[1]
        data = await self.writer.read_raw(offset, budget, upper=end)
        if sharers > 0 and self.served_end == end:
            self.last_read, self.shares_left = (key, data), sharers
        return data

    def committed_to(self, mark: int) -> None:
        """The writer's mark listener: answer the acknowledgements below ``mark``."""
        waiters = self.waiters
        while waiters and waiters[0][0] < mark:
            future = heapq.heappop(waiters)[2]
            if not future.done():
                future.set_result(None)


class LeaderTopic:
    """This broker leads ``topic`` at ``record.epoch``.

    Args:
        topic: The topic's partitions (already open).
        record: The topic's record as committed in etcd (``owner`` is this broker).
        node_id: This broker's node id.
        lag_time_max_ms: ``replica_lag_time_max_ms``: a follower not caught up with the
            leader's end for longer leaves the in-sync set. Default of the setting: 10000.
        change_isr: Commits a new in-sync set in etcd (fenced by this leader's epoch and
            lease); True once committed. Given by the replica manager.
        clock: Monotonic seconds (progress times). Default ``time.monotonic``.
        address: This broker's advertised ``host:port``, named in its refusals.
        isr_check_s: How often the in-sync set is checked for laggards (seconds).
            Default: a quarter of ``lag_time_max_ms``, at least 0.05.
        extra_logs: Logs of the topic beside its partitions, by log id (``state``:
            :class:`broker.replica.state_log.ReplicaStateLog`, which stands for a
            partition of index -1 in :meth:`committed`). Default: none.
    """

    def __init__(
        self,
        topic: Topic,
        record: TopicRecord,
        node_id: str,
        *,
        lag_time_max_ms: int,
        change_isr: Callable[[tuple[str, ...]], Awaitable[bool]],
        clock: Callable[[], float] = time.monotonic,
        address: str = "",
        isr_check_s: float | None = None,
        extra_logs: Mapping[str, Partition] | None = None,
    ) -> None:
        self._topic = topic
        self._record = record
        self._node = node_id
        self._lag_ms = lag_time_max_ms
        self._change_isr = change_isr
        self._clock = clock
        self._address = address
        self._isr_check_s = isr_check_s or max(lag_time_max_ms / 4000, 0.05)
        self._logs = {log_id(p.index): _LedLog(log_id(p.index), p) for p in topic.partitions}
        for name, log in (extra_logs or {}).items():
            self._logs[name] = _LedLog(name, log)
        self._by_partition = {led.partition.index: led for led in self._logs.values()}
        self._joining: set[str] = set()  # counted in the watermark before etcd has them
        self._order = itertools.count()
        self._data = asyncio.Event()  # set (and replaced) when a served end advances
        self._isr_lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[None]] = set()
        self._ticker: asyncio.Task[None] | None = None
        self._stopped: str | None = None  # why this broker no longer leads, once so
        self._started_ms = 0  # when start() began tracking the followers

    # -- state ------------------------------------------------------------------------

    @property
    def record(self) -> TopicRecord:
        """The topic's record as this leader last knew it."""
        return self._record

    @property
    def epoch(self) -> int:
        """The leader epoch this broker leads at."""
        return self._record.epoch

    @property
    def counted_isr(self) -> tuple[str, ...]:
        """The members the watermark waits for: the committed isr plus those joining."""
        isr = self._record.effective_isr()
        return isr + tuple(n for n in self._record.effective_replicas() if n in self._joining)

    def progress(self, log: str) -> dict[str, FollowerProgress]:
        """Each follower's progress in ``log`` (a copy; for tests and metrics)."""
        return dict(self._logs[log].progress)

    def fetched_within(self, node: str, ms: int) -> bool:
        """Whether ``node`` fetched any of this topic's logs here in the last ``ms`` (the
        controlled shutdown hands the topic only to a follower that does: one SIGKILLed
        keeps its etcd session until its TTL ends). A follower counts as fetched when
        this leadership started, so for ``ms`` after a start every follower passes."""
        now = self._now_ms()
        return any(
            (seen := led.progress.get(node)) is not None and now - seen.last_fetch_ms <= ms
            for led in self._logs.values()
        )

    def follower_lag(self) -> list[FollowerLag]:
        """Each follower's lag in each partition, by partition then replica order."""
        now, isr = self._now_ms(), self._record.effective_isr()
        lags = []
        for partition in self._topic.partitions:  # not the extra logs (state, dlq)
            index, led = partition.index, self._logs[log_id(partition.index)]
            end = led.writer.durable_end
            for node in self._followers():
                seen = led.progress.get(node)
                offset = seen.fetch_offset if seen is not None else 0
                behind = max(0, end - offset)
                since = max(seen.last_caught_up_ms if seen else 0, self._started_ms)
                lag_s = max(0.0, (now - since) / 1000) if behind else 0.0
                lags.append(FollowerLag(index, node, offset, behind, lag_s, node in isr))
        return lags

    def log_lag(self) -> list[LogLag]:
        """Each follower's largest lag in each kind of log beside the partitions
        (``state``, and ``dlq``: the largest over the topic's dead-letter queues, so a
        topic's many queues make one number), by kind then replica order; a kind with
        no log here has none."""
        now, isr = self._now_ms(), self._record.effective_isr()
        worst: dict[tuple[str, str], LogLag] = {}
        for name, led in self._logs.items():
            kind = log_kind(name)
            if kind == "partition":
                continue
            end = led.writer.durable_end
            for node in self._followers():
                seen = led.progress.get(node)
                behind = max(0, end - (seen.fetch_offset if seen is not None else 0))
                since = max(seen.last_caught_up_ms if seen else 0, self._started_ms)
                lag_s = max(0.0, (now - since) / 1000) if behind else 0.0
                held = worst.get((kind, node))
                if held is not None:  # each number the largest (maybe of different logs)
                    behind, lag_s = max(behind, held.lag_records), max(lag_s, held.lag_s)
                worst[(kind, node)] = LogLag(kind, node, behind, lag_s, node in isr)
        order = {node: n for n, node in enumerate(self._followers())}
        return sorted(worst.values(), key=lambda lag: (lag.kind, order[lag.node]))

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)

    # -- lifecycle --------------------------------------------------------------------

    async def start(self) -> None:
        """Begin the epoch in every partition (``leader-epochs`` gets ``(epoch, head)``
        durably), hold its commits, start tracking the followers; then serve.

        Raises:
            WalError: a partition's log or its ``leader-epochs`` file failed.
        """
        epoch = self._record.epoch
        # Every log's epoch file is synced at once, each on a worker thread (a promotion
        # no longer waits for one sync after another: two per log); all are done, or
        # the first error raised, before anything else here.
        begun = await asyncio.gather(
            *(_begin_epoch(led, epoch) for led in self._logs.values()), return_exceptions=True
        )
        for outcome in begun:
            if isinstance(outcome, BaseException):
                raise outcome
        now = self._now_ms()
        self._started_ms = now
        isr = self._record.effective_isr()
        for led in self._logs.values():
            for node in self._followers():
                led.progress[node] = FollowerProgress.tracked(now, node in isr)
            self._listen(led)
        self._recompute()
        self._ticker = asyncio.create_task(
            self._tick(), name=f"isr-check:{self._topic.name}@{epoch}"
        )
        logger.info("topic %s: leading at epoch %d, isr %s", self._topic.name, epoch, ",".join(isr))

    async def aclose(self) -> None:
        """Stop leading: waiting acknowledgements fail 'outcome unknown', long polls end,
        the partitions accept no publish through this leader. The logs' commits stay
        held: a follower holds them too, and a replicated topic never goes back to
        factor 1 (reassigned down to one replica it keeps a leader, committing alone:
        ``cluster.replica_roles.is_replicated``). Idempotent."""
        self._lose("the leader stopped")
        if self._ticker is not None:
            self._ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._ticker
            self._ticker = None
        for task in list(self._tasks):
            task.cancel()
        for led in self._logs.values():
            self._unlisten(led)

    def _listen(self, led: _LedLog) -> None:
        """Follow ``led``'s writer (its written and durable ends, its mark) and gate its
        publishes through this leader."""
        led.served_end = led.writer.durable_end
        led.on_durable = functools.partial(self._on_durable, led)
        led.on_written = functools.partial(self._on_written, led)
        led.writer.add_durable_listener(led.on_durable)
        led.writer.set_written_listener(led.on_written)
        led.writer.add_listener(led.committed_to)
        led.partition.gate = self

    def _unlisten(self, led: _LedLog) -> None:
        """Undo :meth:`_listen` (idempotent)."""
        if led.on_durable is not None:
            led.writer.remove_durable_listener(led.on_durable)
            led.writer.remove_written_listener(led.on_written)
            led.writer.remove_listener(led.committed_to)
            led.on_durable = None
        if led.partition.gate is self:
            led.partition.gate = None

    async def add_log(self, name: str, log: Partition) -> None:
        """Lead one more log of the topic from now on (a dead-letter queue made while
        leading, ``dlq/<subscription>``), as :meth:`start` does each log: its epoch
        begins at its head, its commits are held, each follower counts 0 in it until
        its first fetch of it (the answers' ``log_ids`` name it). ``log.index`` must be
        unique among the topic's logs (:meth:`committed` finds it by it). Nothing when
        ``name`` is led already or this broker no longer leads.

        Raises:
            WalError: the log or its ``leader-epochs`` file failed.
        """
        if name in self._logs or self._stopped is not None:
            return
        led = _LedLog(name, log)
        await led.writer.flush()
        epochs = led.writer.log.leader_epochs
        await run_to_end(asyncio.to_thread(epochs.assign, self._record.epoch, led.writer.head))
        if name in self._logs or self._stopped is not None:
            return
        latest = epochs.latest()
        led.epoch_start = latest.start_offset if latest is not None else 0
        led.writer.hold_commits()
        now, isr = self._now_ms(), self._record.effective_isr()
        for node in self._followers():
            led.progress[node] = FollowerProgress.tracked(now, node in isr)
        self._listen(led)
        self._logs[name] = led
        self._by_partition[log.index] = led
        self._recompute()
        self._wake()  # held fetches answer now, with the new log in their log_ids
        logger.info("topic %s: leading log %s at epoch %d", self._topic.name, name, self.epoch)

    def remove_log(self, name: str) -> None:
        """Stop leading log ``name`` (its dead-letter queue is being closed or deleted):
        its waiting acknowledgements fail 'outcome unknown'; a follower asking for it
        gets ``UNKNOWN_LOG``. Nothing when it is not led."""
        led = self._logs.pop(name, None)
        if led is None:
            return
        self._by_partition.pop(led.partition.index, None)
        self._unlisten(led)
        waiters, led.waiters = led.waiters, []
        for offset, _, future in waiters:
            if not future.done():
                future.set_exception(
                    ReplicationOutcomeUnknownError(
                        self._topic.name, led.partition.index, offset, f"log {name} was closed"
                    )
                )

    def update(self, record: TopicRecord) -> None:
        """The topic's record changed in etcd (a committed isr, ``min_insync``; or
        another leader or epoch: then this broker no longer leads)."""
        if self._stopped is not None:
            return
        if (
            record.id != self._record.id
            or record.owner != self._node
            or record.epoch != self._record.epoch
        ):
            self._record = record
            self._lose(f"leadership moved to {record.owner or 'nobody'} at epoch {record.epoch}")
            return
        self._record = record
        self._joining -= set(record.effective_isr())
        self._after_isr_change()

    def _lose(self, why: str) -> None:
        if self._stopped is None:
            self._stopped = why
            logger.info("topic %s: not leading at epoch %d: %s", self._topic.name, self.epoch, why)
        self._fail_waiters(why)
        self._wake()

    def _after_isr_change(self) -> None:
        """Fail the waiting acks first when the isr is below min_insync: the watermark
        the smaller isr allows would acknowledge records fewer replicas hold."""
        if not has_min_insync(self._record):
            self._fail_waiters(self._too_few())
        self._recompute()

    def _too_few(self) -> str:
        record = self._record
        return (
            f"the in-sync replicas fell to {len(record.effective_isr())}, below "
            f"min_insync {record.min_insync}"
        )

    # -- the commit gate (broker.partition.CommitGate) ----------------------------------

    def refusal(self) -> Refusal | None:
        """``None`` while a publish may be appended; else why not: ``not-enough-replicas``
        (fewer in-sync replicas than ``min_insync``, naming both numbers), or
        ``not-owner`` once this broker no longer leads."""
        record = self._record
        if self._stopped is not None:
            return Refusal(
                "not-owner",
                record.name,
                record.owner if record.owner != self._node else "",
                "",
                record.epoch,
                f"topic {record.name!r}: {self._stopped}; look it up again",
            )
        if has_min_insync(record):
            return None
        isr, replicas = len(record.effective_isr()), len(record.effective_replicas())
        error = NotEnoughReplicasError(record.name, isr, replicas, record.min_insync)
        return Refusal(
            "not-enough-replicas", record.name, self._node, self._address, record.epoch, str(error)
        )

    async def committed(self, partition: int, last_offset: int) -> None:
        """Return once ``last_offset`` of ``partition`` is committed (below its mark).

        Raises:
            ReplicationOutcomeUnknownError: this broker stopped leading, or the in-sync
                set is below ``min_insync``, before that.
        """
        led = self._by_partition[partition]
        why = self._stopped
        if why is None and not has_min_insync(self._record):
            why = self._too_few()  # committed by fewer replicas than promised
        if why is not None:
            raise ReplicationOutcomeUnknownError(self._topic.name, partition, last_offset, why)
        if led.writer.high_water_mark > last_offset:
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(led.waiters, (last_offset, next(self._order), future))
        await future

    def _fail_waiters(self, why: str) -> None:
        for led in self._logs.values():
            waiters, led.waiters = led.waiters, []
            for offset, _, future in waiters:
                if not future.done():
                    future.set_exception(
                        ReplicationOutcomeUnknownError(
                            self._topic.name, led.partition.index, offset, why
                        )
                    )

    # -- the high watermark -------------------------------------------------------------

    def _followers(self) -> tuple[str, ...]:
        return tuple(n for n in self._record.effective_replicas() if n != self._node)

    def _hw(self, led: _LedLog) -> int:
        offsets = {
            node: led.progress[node].fetch_offset if node in led.progress else 0
            for node in self.counted_isr
            if node != self._node
        }
        return high_watermark(offsets, led.writer.durable_end)

    def _recompute(self) -> None:
        if self._stopped is not None:
            return
        for led in self._logs.values():
            led.writer.commit_to(self._hw(led))

    def _on_written(self, led: _LedLog, end: int) -> None:
        """``led``'s writer wrote a group up to ``end`` and is syncing it: serve it to
        the followers now (long polls wake), so that their copies and syncs overlap the
        leader's own. The watermark still waits for this sync (:meth:`_on_durable`)."""
        if end > led.served_end:
            led.served_end = end
            led.last_read = None  # keyed by the old end: no fetch can share it now
            self._wake()

    def _on_durable(self, led: _LedLog, end: int) -> None:
        """``led``'s durable end advanced: its watermark may move (the leader counts
        itself); long polls wake when it passes what they were served (a write the
        writer did not tell ahead: not a synced group commit)."""
        if self._stopped is None:
            led.writer.commit_to(self._hw(led))
        self._on_written(led, end)

    def _wake(self) -> None:
        self._data.set()
        self._data = asyncio.Event()

    # -- the in-sync set ----------------------------------------------------------------

    async def check_isr(self) -> tuple[str, ...] | None:
        """Shrink the in-sync set by the followers out of sync for ``lag_time_max_ms``,
        or else grow it by those caught up (Kafka's rules, :mod:`cluster.replicas`),
        through ``change_isr``; one change at a time. Returns the isr asked for and
        committed, or ``None`` when there was nothing to change or it was not committed.
        """
        async with self._isr_lock:
            if self._stopped is not None:
                return None
            record, now = self._record, self._now_ms()
            out: set[str] = set()
            for led in self._logs.values():
                out.update(
                    isr_to_shrink(record, led.progress, led.writer.durable_end, now, self._lag_ms)
                )
            isr = record.effective_isr()
            if out:
                return await self._ask(tuple(n for n in isr if n not in out), added=())
            joining = self._caught_up()
            if not joining:
                return None
            self._joining.update(joining)  # counted at once: maximal isr
            self._recompute()
            order = record.effective_replicas()
            wanted = tuple(n for n in order if n in isr or n in joining)
            return await self._ask(wanted, added=joining)

    def _caught_up(self) -> tuple[str, ...]:
        """The followers outside the isr caught up in every log."""
        record = self._record
        common: set[str] | None = None
        for led in self._logs.values():
            offsets = {n: p.fetch_offset for n, p in led.progress.items()}
            found = set(isr_to_expand(record, offsets, led.writer.high_water_mark, led.epoch_start))
            common = found if common is None else common & found
        return tuple(n for n in record.effective_replicas() if n in (common or set()))

    async def _ask(self, isr: tuple[str, ...], *, added: tuple[str, ...]) -> tuple[str, ...] | None:
        epoch = self._record.epoch
        try:
            ok = await self._change_isr(isr)
        except Exception:
            logger.exception("topic %s: changing the isr to %s failed", self._topic.name, isr)
            ok = False
        if not ok or self._stopped is not None or self._record.epoch != epoch:
            self._joining.difference_update(added)
            self._recompute()
            return None
        logger.info(
            "topic %s: isr %s -> %s at epoch %d",
            self._topic.name,
            ",".join(self._record.effective_isr()),
            ",".join(isr),
            epoch,
        )
        self._record = self._record.replace(isr=isr)
        self._joining.difference_update(isr)
        self._after_isr_change()
        return isr

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(self._isr_check_s)
            try:
                await self.check_isr()
            except Exception:
                logger.exception("topic %s: isr check failed", self._topic.name)

    def _expand_soon(self) -> None:
        """After a fetch: check for a follower that may join, unless a check runs."""
        if self._isr_lock.locked() or len(self.counted_isr) == len(
            self._record.effective_replicas()
        ):
            return
        task = asyncio.create_task(self._expand_task())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _expand_task(self) -> None:
        if self._caught_up():
            await self.check_isr()

    # -- the followers' requests ----------------------------------------------------------

    def check_request(
        self, topic: str, topic_id: str, replica: str, epoch: int | None
    ) -> tuple[_pb.ReplicaError, str] | None:
        """``None`` when a replication request from ``replica`` may be served; else its
        ``ReplicaError`` and message. ``epoch`` None: not checked (OffsetForLeaderEpoch)."""
        record = self._record
        if self._stopped is not None:
            return _pb.NOT_LEADER, f"this broker no longer leads {record.name}: {self._stopped}"
        if topic != record.name or topic_id != record.id:
            return _pb.UNKNOWN_TOPIC, f"no topic {topic!r} with id {topic_id!r} here"
        if replica == self._node or replica not in record.effective_replicas():
            return _pb.NOT_REPLICA, f"{replica!r} is not a follower of {record.name}"
        if epoch is not None and epoch < record.epoch:
            return (
                _pb.FENCED_LEADER_EPOCH,
                f"epoch {epoch} is fenced: the leader is at {record.epoch}",
            )
        if epoch is not None and epoch > record.epoch:
            return (
                _pb.UNKNOWN_LEADER_EPOCH,
                f"epoch {epoch} is unknown: this leader is at {record.epoch}",
            )
        return None

    async def fetch(self, request: _pb.ReplicaFetchRequest) -> _pb.ReplicaFetchResponse:
        """:meth:`fetch_raw`'s answer parsed (for tests and in-process callers)."""
        return _pb.ReplicaFetchResponse.FromString(await self.fetch_raw(request))

    async def fetch_raw(self, request: _pb.ReplicaFetchRequest) -> bytes:
        """Answer a follower's fetch, serialized: per log, a divergence, an out-of-range
        error, or the batches from its fetch offset up to the served end (written, maybe
        not yet synced here); held up to ``max_wait_ms`` (at most :data:`MAX_WAIT_MS`)
        while no log has any, until an append is written.

        The batches are never copied into a protobuf message: each log's answer is
        serialized without them and they are spliced in as its ``batches`` field
        (:func:`broker.replica.answers.encode`), so a MiB answer costs one copy here,
        not a copy into the message and another out of it. Followers asking the same
        log at the same offset while the served end stands share one read
        (:meth:`_LedLog.read`)."""
        problem = self.check_request(
            request.topic, request.topic_id, request.replica_node, request.leader_epoch
        )
        if problem is not None:
            return error_answer(problem, self.epoch)
        self._record_progress(request)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + min(max(request.max_wait_ms, 0), MAX_WAIT_MS) / 1000
        while True:
            woken = self._data
            logs, chunks, worth = await self._answer(request)
            remaining = deadline - loop.time()
            if self._stopped is not None:
                problem = self.check_request(request.topic, request.topic_id, "", None)
                assert problem is not None
                return error_answer(problem, self.epoch)
            if remaining <= 0 or worth:
                await self._pace(request.replica_node, sum(len(c) for c in chunks))
                head = _pb.ReplicaFetchResponse(leader_epoch=self.epoch, log_ids=list(self._logs))
                return encode(head, logs, chunks)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(woken.wait(), remaining)

    def note_progress(self, request: _pb.ReplicaFetchRequest) -> None:
        """A follower's progress report (``progress_only``, on ``ReplicaStream``): its
        durable ends counted as a fetch's are, nothing answered. A report that
        :meth:`check_request` refuses counts nothing (its next fetch hears why)."""
        problem = self.check_request(
            request.topic, request.topic_id, request.replica_node, request.leader_epoch
        )
        if problem is None:
            self._record_progress(request)

    def _record_progress(self, request: _pb.ReplicaFetchRequest) -> None:
        """Note where the follower is in each log it asked (where the ask is valid: its
        durable end, at most its fetch offset, within the leader's log), move the
        watermarks, and look for a follower that may join the isr."""
        now = self._now_ms()
        node = request.replica_node
        for ask in self._asks(request):
            led = self._logs.get(ask.log)
            if led is None or diverging(led.writer.log.leader_epochs, ask) is not None:
                continue
            durable = ask.durable_offset if ask.HasField("durable_offset") else ask.fetch_offset
            if not led.writer.first_offset <= durable <= ask.fetch_offset <= led.served_end:
                continue
            seen = led.progress.get(node) or FollowerProgress.tracked(now, False)
            led.progress[node] = follower_fetched(seen, durable, led.writer.durable_end, now)
        self._recompute()
        self._expand_soon()

    def _asks(self, request: _pb.ReplicaFetchRequest) -> list[_pb.LogFetch]:
        """The asks of ``request`` answered: each log's first, among the first
        ``len(logs) +`` :data:`EXTRA_ASKS` (without a bound, one request of a few MiB
        naming a log a million times had a million answers built and sent)."""
        seen: set[str] = set()
        asks = []
        for ask in request.logs[: len(self._logs) + EXTRA_ASKS]:
            if ask.log not in seen:
                seen.add(ask.log)
                asks.append(ask)
        return asks

    def _throttle(self, node: str) -> int:
        """Bytes per second ``node`` may fetch: a reassignment's throttle applies to the
        replicas outside the in-sync set (those catching up); 0: no limit."""
        record = self._record
        if record.reassign_to and node not in record.effective_isr():
            return record.reassign_throttle
        return 0

    async def _pace(self, node: str, sent: int) -> None:
        """Hold a throttled follower's answer as long as its ``sent`` bytes take at its
        rate."""
        rate = self._throttle(node)
        if rate > 0:
            await asyncio.sleep(sent / rate)

    async def _answer(
        self, request: _pb.ReplicaFetchRequest
    ) -> tuple[list[_pb.LogData], list[bytes], bool]:
        """Each log's answer (without its batches), its batches, and whether any must go
        now (data, an error or a divergence)."""
        budget = min(request.max_bytes, MAX_BYTES) if request.max_bytes > 0 else DEFAULT_MAX_BYTES
        rate = self._throttle(request.replica_node)
        if rate > 0:
            budget = min(budget, rate)  # at most a second's worth per answer
        logs: list[_pb.LogData] = []
        chunks: list[bytes] = []
        worth = False
        for ask in self._asks(request):
            data, batches = await self._answer_log(ask, budget)
            if len(batches) > budget and any(chunks):
                # Only the first log with data may pass the budget (by one batch): an
                # answer stays within max(max_bytes, one batch), under the server's send
                # limit; this log's batch goes first in a later fetch (the order rotates).
                batches = b""
            budget -= len(batches)
            worth = worth or bool(batches) or data.error != 0 or data.HasField("diverging")
            logs.append(data)
            chunks.append(batches)
        return logs, chunks, worth

    async def _answer_log(self, ask: _pb.LogFetch, budget: int) -> tuple[_pb.LogData, bytes]:
        """One log's answer, without its batches, and its batches."""
        led = self._logs.get(ask.log)
        if led is None:
            return _pb.LogData(log=ask.log, error=_pb.UNKNOWN_LOG), b""
        writer = led.writer
        end, start = led.served_end, writer.first_offset
        data = _pb.LogData(
            log=ask.log, high_watermark=writer.high_water_mark, log_start=start, log_end=end
        )
        entries = writer.log.leader_epochs.entries()
        data.epochs.extend(
            _pb.EpochStart(epoch=e.epoch, start_offset=e.start_offset)
            for e in entries
            if e.epoch >= ask.last_fetched_epoch
        )
        diverged = diverging(led.writer.log.leader_epochs, ask)
        if diverged is not None:
            data.diverging.CopyFrom(_pb.Divergence(epoch=diverged[0], end_offset=diverged[1]))
            return data, b""
        if not start <= ask.fetch_offset <= end:
            data.error = _pb.OFFSET_OUT_OF_RANGE
            return data, b""
        if ask.fetch_offset < end and budget > 0:
            try:
                sharers = len(self._record.effective_replicas()) - 2  # the other followers
                return data, await led.read(ask.fetch_offset, budget, end, sharers)
            except OffsetOutOfRangeError:  # retention went past it meanwhile
                data.error = _pb.OFFSET_OUT_OF_RANGE
                data.log_start = writer.first_offset  # where the follower restarts
        return data, b""

    def offset_for_epoch(self, log: str, epoch: int) -> tuple[int, int]:
        """Where ``epoch`` ends in ``log`` here (Kafka's OffsetsForLeaderEpoch): the
        largest epoch at or below it and its end offset; ``(-1, -1)`` when none.

        Raises:
            ReplicaLogUnknownError: no such log.
        """
        led = self._logs.get(log)
        if led is None:
            raise ReplicaLogUnknownError(self._topic.name, log)
        return led.writer.log.leader_epochs.end_offset_for(epoch)


def _ignore(_end: int) -> None:
    """No listener yet."""


async def _begin_epoch(led: _LedLog, epoch: int) -> None:
    """``(epoch, head)`` durably in ``led``'s ``leader-epochs`` file, then its commits held
    (:meth:`LeaderTopic.start`, one log)."""
    await led.writer.flush()
    epochs = led.writer.log.leader_epochs
    await run_to_end(asyncio.to_thread(epochs.assign, epoch, led.writer.head))
    latest = epochs.latest()
    led.epoch_start = latest.start_offset if latest is not None else 0
    # A replica's log opened held at its checkpoint (LogWriter.open): its mark stays
    # there, not at the head; records above it may never have been committed and show
    # only once the isr's fetches in this epoch confirm them.
    led.writer.hold_commits()
