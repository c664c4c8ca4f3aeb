"""The follower of a replicated topic: one task fetching every log of the topic from its
leader and appending the leader's bytes.

Role: one :class:`FollowerTopic` per topic this broker follows, made by the replica
manager when the broker becomes a follower at ``record.epoch`` and closed when it stops
following. Its task keeps one ``ReplicaStream`` call open to the leader and loops: one
fetch on it (a long poll) with every log's head, durable end and the epoch of its last
record, then for each log the action of :func:`broker.replica.fetch_rules.plan`:

- append: the leader's epoch entries that date the batches are copied into the log's
  ``leader-epochs`` (on a worker thread, durable), the batches' producers noted in the
  partition's producer table (so a promotion needs no scan), then
  ``LogWriter.append_replicated`` (durable under the fsync policy before it returns);
  then the follower's mark is committed to ``min(leader's high watermark, its end)``.
  An append with no epoch entry to copy (the steady state) is *pipelined*: it is queued
  on the writer, the next fetch goes out at once from the head it will leave (so it is
  parked on the leader while this one syncs, ready for the next record), and once it
  is durable a ``progress_only`` message reports the new durable end, which is what the
  leader's high watermark counts. The next answer waits for it to end before anything
  of that answer is planned or written (one append in flight at a time);
- cut back (``truncate_to``, to the divergence point: never to the high watermark alone)
  or empty the log to a new start (``restart_at``), then the producer table is rebuilt
  from the log;
- an error of the whole fetch or of a log (``NOT_LEADER``, ``FENCED_LEADER_EPOCH``,
  ``UNKNOWN_LEADER_EPOCH``, an unreachable leader...) pauses the loop
  (:func:`~broker.replica.fetch_rules.backoff_s`: exponential, jittered) before the next
  fetch; :meth:`FollowerTopic.update` (a new epoch or leader) ends a pause at once.
  Except at a new leader's start: a follower often learns of an election before the
  winner has begun its epoch (both watch the same record), so a ``NOT_LEADER`` or
  ``UNKNOWN_LEADER_EPOCH`` answer after a start or an update is asked again after
  :data:`STARTING_RETRY_S`, up to :data:`STARTING_RETRIES` times, before the backoff
  applies (it was 25-50 ms of every failover's first fetch).

Invariants:

- The offset a log is fetched from is its head, or the head the append in flight will
  leave: always a batch boundary (every write is whole batches: ``append_replicated``
  runs to its end even when its caller is cancelled, and a crash leaves a prefix of
  whole batches, which opening keeps).
- Against an older leader, which serves no ``ReplicaStream`` (``UNIMPLEMENTED``: a
  rolling upgrade), the follower fetches with unary ``ReplicaFetch`` and nothing is
  pipelined: that leader counts the fetch offset as durable, so every append is synced
  before the next fetch, as before the stream existed.
- The durable offset reported is the writer's head: under the ``always`` fsync policy the
  log's durable end (the head moves only when a write's sync is done); under
  ``interval`` and ``never`` the written end, as ``append_replicated`` says. The leader
  counts only it toward its high watermark, never the fetch offset.
- An epoch entry is durable before the first record it dates is written.
- The follower's writer holds its commits (``LogWriter.hold_commits``): its mark is what
  its leader committed and it has, never more. A restarted replica's log opens with its
  mark at its high-watermark checkpoint (which the writer saves as the mark moves), not
  at its head (:meth:`wal.writer.LogWriter.open`).

Stopping (:meth:`FollowerTopic.aclose`): the long poll is cancelled at once; an append,
a cut or an epoch write in flight runs to its end first; nothing else is started. A
failed call (an error of gRPC, a timeout), a wake-up (:meth:`update`) or a stop ends the
stream call, and a new one starts only once the append in flight ended; an error the
leader *answers* (``NOT_LEADER`` while it starts its epoch, a log's back-off) keeps the
call, so a quick retry costs one message, not a new call.

Task-safety: one event loop; the task alone writes the topic's logs (itself, or through
the one pipelined append it started, which it awaits before it writes again);
:meth:`update` and :meth:`aclose` only set state and wake it.

One piece, though past 600 lines (about 650; :class:`FollowerTopic` about 480): the
loop, the stream it keeps, the pipelined append and the progress report share one
state (the call, the append in flight and the heads it will leave) that every round
reads and changes; the rules are already pure and apart
(:mod:`broker.replica.fetch_rules`). The seam, should it grow: the actions carried out
on a log (``_carry_out``, ``_append``, ``_truncate``, ``_follow_log_start``,
``_copy_epochs``: about 120 lines), which touch one partition and none of that state.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TypeVar

import grpc

from broker.partition import Partition
from broker.replica.fetch_rules import (
    BACKOFF_BASE_S,
    BACKOFF_MAX_S,
    Action,
    Append,
    BackOff,
    Commit,
    LogPosition,
    RestartAt,
    TruncateTo,
    backoff_s,
    last_fetched_epoch,
    plan,
    reply_from_pb,
)
from broker.replica.leader import log_id
from broker.topics import Topic
from cluster.records import TopicRecord
from proto import replication_pb2 as _pb
from proto import replication_pb2_grpc as _grpc
from wal import NotBatchBoundaryError, WalError, run_to_end
from wal.leader_epochs import EpochEntry, LeaderEpochs

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: How much longer than ``max_wait_ms`` a fetch may take before it counts as failed (s):
#: the leader holds it that long at most, the rest is the network and its disk.
RPC_MARGIN_S = 5.0
#: The pause after a new leader answered that it does not lead (yet) at this epoch (s),
#: and how many such answers in a row get it before the usual backoff (module docstring).
STARTING_RETRY_S = 0.01
STARTING_RETRIES = 20
#: The whole-fetch errors of a leader that has not begun the epoch the follower asks at.
_NOT_STARTED = frozenset({_pb.NOT_LEADER, _pb.UNKNOWN_LEADER_EPOCH})

_Call = grpc.aio.StreamStreamCall[_pb.ReplicaFetchRequest, _pb.ReplicaFetchResponse]
#: One pipelined append: the partition, the leader's answer for its log, the append.
_Pending = tuple[Partition, _pb.LogData, Append]


class FollowerTopic:
    """This broker follows ``topic``, whose leader is at ``leader_address``, at
    ``record.epoch``.

    Args:
        topic: the topic's local partitions (made by the member before it follows).
        record: the topic's record (its id, epoch and leader).
        node_id: this broker's node id (the leader checks it is a replica).
        leader_address: ``host:port`` of the leader.
        channel: opens a channel to an address; the follower owns each channel it gets
            and closes it when the leader moves or the follower closes.
        credential: the cluster's internal secret, sent as ``authorization: Bearer``;
            ``None`` when tokens are off.
        max_bytes: bytes one fetch asks for at most, over all logs. Default 1 MiB.
        max_wait_ms: how long the leader may hold a fetch with no data (ms). Default 500.
        backoff_base_s: the first pause after a failed fetch (s). Default 0.05.
        backoff_max_s: the longest pause (s). Default 2.
        rng: the jitter's randomness. Default: a new ``random.Random``.
        extra_logs: logs of the topic beside its partitions, by log id (``state``:
            :class:`broker.replica.state_log.ReplicaStateLog`). They have no retention
            of their own: their segments wholly below the leader's log start are
            deleted. Default: none.
    """

    def __init__(
        self,
        topic: Topic,
        record: TopicRecord,
        node_id: str,
        leader_address: str,
        *,
        channel: Callable[[str], grpc.aio.Channel],
        credential: str | None,
        max_bytes: int = 1 << 20,
        max_wait_ms: int = 500,
        backoff_base_s: float = BACKOFF_BASE_S,
        backoff_max_s: float = BACKOFF_MAX_S,
        rng: random.Random | None = None,
        extra_logs: Mapping[str, Partition] | None = None,
        open_log: Callable[[str], Awaitable[Partition | None]] | None = None,
    ) -> None:
        self._topic = topic
        self._record = record
        self._node = node_id
        self._address = leader_address
        self._open_channel = channel
        self._metadata = (("authorization", f"Bearer {credential}"),) if credential else None
        self._max_bytes = max_bytes
        self._max_wait_ms = max_wait_ms
        self._backoff = (backoff_base_s, backoff_max_s)
        self._rng = rng or random.Random()
        self._logs = {log_id(p.index): p for p in topic.partitions}
        self._logs.update(extra_logs or {})
        #: The extra logs have no retention of their own: their start follows the leader's.
        self._trimmed_by_leader = set(extra_logs or ())
        self._open_log = open_log
        self._opened: set[str] = set()  # the logs open_log gave (dropped with the leader's)
        self._channel: grpc.aio.Channel | None = None
        self._channel_address = ""
        self._call: _Call | None = None  # the stream to the leader, while open
        self._sending = asyncio.Lock()  # one write at a time on the call
        self._applying: asyncio.Task[None] | None = None  # the pipelined appends in flight
        self._heads: dict[str, int] = {}  # log id -> the head once they are written
        self._apply_failure: str | None = None  # why one of them failed
        #: The leader serves no ReplicaStream (an older broker): unary fetches, unpipelined.
        self._unary = False
        self._task: asyncio.Task[None] | None = None
        self._woken = asyncio.Event()  # update() or aclose(): stop waiting, look again
        self._closing = False
        #: Fetches that failed (the whole fetch or a log's answer), since the start.
        self.failures = 0
        #: Cuts back to a divergence point, and logs emptied to a new start.
        self.truncations = 0
        self.restarts = 0
        #: The last failure, for a person (``None`` once a fetch succeeds).
        self.last_error: str | None = None
        self._leader_ends: dict[str, int] = {}  # log id -> the leader's end, last told
        self._rotation = 0  # the log asked first in the next fetch (see _request)
        self._quick = STARTING_RETRIES  # short pauses left while the leader starts
        self._not_started = False  # the last fetch: the leader does not lead this epoch yet

    @property
    def record(self) -> TopicRecord:
        """The topic's record as last given."""
        return self._record

    @property
    def leader_address(self) -> str:
        """Where the leader is, as last given."""
        return self._address

    @property
    def fetch_offsets(self) -> dict[str, int]:
        """Log id -> the offset it is fetched from next (its head; under the ``always``
        policy its durable end)."""
        return {log: p.writer.head for log, p in self._logs.items()}

    @property
    def lag(self) -> dict[str, int]:
        """Log id -> records this follower lacks of the leader's durable end as the
        leader last told it (0 before the first answer; for metrics)."""
        return {
            log: max(0, self._leader_ends.get(log, 0) - p.writer.head)
            for log, p in self._logs.items()
        }

    async def start(self) -> None:
        """Hold every log's commits and start the fetch task. Idempotent."""
        if self._task is not None:
            return
        for partition in self._logs.values():
            partition.writer.hold_commits()  # opened held at its checkpoint if it has one
        self._task = asyncio.create_task(self._run(), name=f"replica-fetch:{self._topic.name}")

    def update(self, record: TopicRecord, leader_address: str) -> None:
        """A new epoch or leader: the next fetch uses them, at once (a fetch held by the
        old leader is given up; a pause after a failure ends)."""
        changed = (record.epoch, leader_address) != (self._record.epoch, self._address)
        if leader_address != self._address:
            self._unary = False  # another broker: it may serve the stream
        self._record, self._address = record, leader_address
        if changed:
            logger.info(
                "%s: following %s at epoch %d", self._topic.name, leader_address, record.epoch
            )
            self._quick = STARTING_RETRIES
            self._woken.set()

    async def aclose(self) -> None:
        """Stop fetching: the long poll ends at once, an append or a cut in flight runs
        to its end first. Idempotent."""
        self._closing = True
        self._woken.set()
        if self._task is not None:
            await asyncio.wait([self._task])  # shielded: a cancelled aclose leaves it be
        if self._channel is not None:
            channel, self._channel = self._channel, None
            await channel.close()

    # -- the loop ---------------------------------------------------------------------------

    async def _run(self) -> None:
        failures = 0
        while not self._closing:
            self._woken.clear()
            self._not_started = False
            try:
                ok = await self._round()
            except (grpc.RpcError, WalError, OSError) as exc:
                self._drop_call()  # the stream failed: the next fetch starts a new one
                ok = self._failed(f"{type(exc).__name__}: {_describe(exc)}")
            except Exception:  # a bug: logged with its trace, then backed off as any
                logger.exception("%s: fetch round failed", self._topic.name)
                self._drop_call()
                ok = self._failed("internal error (see the broker's log)")
            if self._woken.is_set():
                self._drop_call()  # a new leader or epoch: a new stream, settled
            if self._closing:
                break
            if ok:
                failures = 0
                self._quick = 0  # the leader answered: it has started
                continue
            if self._not_started and self._quick > 0:
                self._quick -= 1  # a new leader beginning its epoch: ask again soon
                await self._until_woken(asyncio.sleep(STARTING_RETRY_S))
                continue
            failures += 1
            base_s, max_s = self._backoff
            pause = backoff_s(failures, self._rng, base_s=base_s, max_s=max_s)
            await self._until_woken(asyncio.sleep(pause))
        self._drop_call()
        await self._settle()  # an append in flight runs to its end before aclose returns

    async def _round(self) -> bool:
        """One fetch and what its answer says; whether it went well (no pause)."""
        if self._woken.is_set():  # updated while the last answer was carried out
            return True
        try:
            response = await self._fetch()
        except Exception as exc:  # the stream failed: the append in flight settles first
            if (failure := await self._settle()) is not None:
                self._failed(failure)
            if not self._unary and await self._no_stream_served(exc):
                logger.info(
                    "%s: %s serves no ReplicaStream (an older broker): fetching with "
                    "ReplicaFetch, one fetch at a time",
                    self._topic.name,
                    self._address,
                )
                self._unary = True
                self._drop_call()
                return True  # no pause: ask again at once, the other way
            raise
        failure = await self._settle()  # the last answer's appends: written and reported
        if failure is not None:
            return self._failed(failure)
        if response is None:  # woken: a new leader or epoch, or closing
            return True
        if not isinstance(response, _pb.ReplicaFetchResponse):  # EOF: the leader ended it
            self._drop_call()
            return self._failed("the leader ended the replication stream")
        if response.error != _pb.REPLICA_ERROR_NONE:
            self._not_started = response.error in _NOT_STARTED
            name = _pb.ReplicaError.Name(response.error)
            return self._failed(f"{name}: {response.message}")
        await self._open_new_logs(response.log_ids)
        ok = True
        pipelined: list[_Pending] = []
        for data in response.logs:
            partition = self._logs.get(data.log)
            if partition is None:
                continue  # a log of a later wave (dead letters, state): not followed yet
            self._leader_ends[data.log] = data.log_end
            action = plan(_position(partition), reply_from_pb(data))
            if isinstance(action, Append) and not action.assign and action.drop_epochs_from is None:
                pipelined.append((partition, data, action))
                continue
            try:
                ok = await self._carry_out(partition, data.log, action) and ok
                if data.log in self._trimmed_by_leader:
                    await _follow_log_start(partition, data)
            except (WalError, OSError) as exc:  # this log's disk: the others go on
                ok = self._failed(f"{data.log}: {type(exc).__name__}: {exc}")
        if pipelined:
            for _partition, data, action in pipelined:
                self._heads[data.log] = action.headers[-1].last_offset + 1
            self._applying = asyncio.create_task(self._apply(pipelined, clear=ok))
            # An older leader counts the fetch offset as durable: settle first.
            if self._unary and (failure := await self._settle()) is not None:
                ok = self._failed(failure)
        if ok and not pipelined:  # else once the appends are done (_apply)
            self.last_error = None
        return ok

    async def _no_stream_served(self, exc: BaseException) -> bool:
        """Whether the stream failed because the leader has no ReplicaStream (an older
        broker answers ``UNIMPLEMENTED``; a write racing that answer may fail otherwise,
        so the call's own status is asked too)."""
        if _unimplemented(exc):
            return True
        call = self._call
        if call is None or not call.done() or call.cancelled():
            return False
        return await call.code() == grpc.StatusCode.UNIMPLEMENTED

    async def _fetch(self) -> _pb.ReplicaFetchResponse | object | None:
        """The next fetch's answer: on the stream (``grpc.aio.EOF`` when the leader ended
        it), or a unary ReplicaFetch from an older leader; ``None`` once woken."""
        timeout = self._max_wait_ms / 1000 + RPC_MARGIN_S
        if self._unary:
            stub = await self._stub()
            request = self._request()
            return await self._until_woken(
                stub.ReplicaFetch(request, timeout=timeout, metadata=self._metadata)
            )
        call = await self._stream()
        await self._send(call, self._request())
        return await self._until_woken(asyncio.wait_for(call.read(), timeout))

    async def _apply(self, pipelined: list[_Pending], *, clear: bool) -> None:
        """The pipelined appends of one answer, log by log, as :meth:`_carry_out` does
        them; then the new durable ends reported to the leader. A failure is kept for the
        next round (:meth:`_settle`); the logs after it are still written. ``clear``: the
        rest of the answer went well, so once these do too the last error is cleared
        (not before: a failing append must not read as a good round meanwhile)."""
        try:
            for partition, data, action in pipelined:
                try:
                    await self._append(partition, action)
                    if data.log in self._trimmed_by_leader:
                        await _follow_log_start(partition, data)
                except (WalError, OSError) as exc:
                    self._apply_failure = f"{data.log}: {type(exc).__name__}: {exc}"
        finally:
            self._heads.clear()
        if clear and self._apply_failure is None:
            self.last_error = None
        await self._report()

    async def _settle(self) -> str | None:
        """Wait for the pipelined appends in flight, if any; why one failed, or None."""
        task, self._applying = self._applying, None
        if task is not None:
            await asyncio.wait([task])  # shielded: a cancelled caller leaves it be
            if not task.cancelled() and task.exception() is not None:
                exc = task.exception()
                logger.error("%s: pipelined append failed", self._topic.name, exc_info=exc)
                self._apply_failure = self._apply_failure or "internal error (see the log)"
        failure, self._apply_failure = self._apply_failure, None
        return failure

    async def _report(self) -> None:
        """Tell the leader this follower's durable ends (a ``progress_only`` message on
        the open stream); nothing when the stream ended meanwhile (the next fetch tells)
        or there is none (an older leader: the next fetch tells)."""
        call = self._call
        if call is None or call.done() or self._closing or self._unary:
            return
        request = self._request(progress_only=True)
        with contextlib.suppress(grpc.RpcError, asyncio.InvalidStateError):
            await self._send(call, request)

    async def _send(self, call: _Call, request: _pb.ReplicaFetchRequest) -> None:
        """Write ``request`` on ``call``, one write at a time (no-op once it ended)."""
        async with self._sending:
            if self._call is call and not call.done():
                await call.write(request)

    async def _stream(self) -> _Call:
        """The open stream to the current leader, or a new one (the last append settled
        first, so a new stream starts from heads on disk)."""
        if self._call is not None and not self._call.done():
            return self._call
        self._drop_call()  # ended by the leader's side: a new one
        failure = await self._settle()
        if failure is not None:
            logger.warning("%s: %s", self._topic.name, failure)
        stub = await self._stub()
        self._call = stub.ReplicaStream(metadata=self._metadata)
        return self._call

    def _drop_call(self) -> None:
        """End the stream (the leader drops its held fetch); the next round opens another."""
        call, self._call = self._call, None
        if call is not None:
            call.cancel()

    async def _open_new_logs(self, log_ids: Sequence[str]) -> None:
        """Open the logs the leader named that this follower lacks (a dead-letter queue
        made on the leader since), through ``open_log``; each is fetched from the next
        round on, from its head, its start following the leader's. A log ``open_log``
        declines (``None``: not one it keeps) is not asked for; one it gave that the
        leader no longer names is not asked for any more (no ``UNKNOWN_LOG`` back-off)."""
        if self._open_log is None:
            return
        named = set(log_ids)
        for log in sorted(self._opened - named) if named else ():
            # The leader has it no more (its subscription deleted): not asked again.
            self._opened.discard(log)
            self._logs.pop(log, None)
            self._leader_ends.pop(log, None)
            logger.info(
                "%s: log %s is gone from the leader; no longer followed", self._topic.name, log
            )
        for log in log_ids:
            if log in self._logs or log.startswith("p/"):
                continue
            partition = await self._open_log(log)
            if partition is None or self._closing:
                continue
            partition.writer.hold_commits()
            self._logs[log] = partition
            self._opened.add(log)
            self._trimmed_by_leader.add(log)
            logger.info(
                "%s: following log %s from offset %d", self._topic.name, log, partition.writer.head
            )

    def _request(self, *, progress_only: bool = False) -> _pb.ReplicaFetchRequest:
        """The next fetch, or a progress report. Each log is asked from its head (or the
        head its append in flight will leave), with its durable end beside it. The logs
        are asked in an order that rotates by one at each fetch: the leader fills
        ``max_bytes`` in the order asked, so a log far behind (or one whose appends fail)
        would otherwise take every fetch's bytes from the others."""
        logs = []
        order = list(self._logs.items())
        if not progress_only:
            self._rotation = (self._rotation + 1) % len(order) if order else 0
        for log, partition in order[self._rotation :] + order[: self._rotation]:
            position = _position(partition)
            head = self._heads.get(log, position.head)
            logs.append(
                _pb.LogFetch(
                    log=log,
                    fetch_offset=head,
                    last_fetched_epoch=last_fetched_epoch(position.epochs, head),
                    durable_offset=position.head,
                )
            )
        return _pb.ReplicaFetchRequest(
            topic=self._record.name,
            topic_id=self._record.id,
            replica_node=self._node,
            leader_epoch=self._record.epoch,
            logs=logs,
            max_bytes=self._max_bytes,
            max_wait_ms=self._max_wait_ms,
            progress_only=progress_only,
        )

    async def _stub(self) -> _grpc.ReplicationStub:
        """A stub on a channel to the current leader (the old channel closed first)."""
        if self._channel is not None and self._channel_address != self._address:
            channel, self._channel = self._channel, None
            await channel.close()
        if self._channel is None:
            self._channel = self._open_channel(self._address)
            self._channel_address = self._address
        return _grpc.ReplicationStub(self._channel)

    async def _until_woken(self, work: Awaitable[T]) -> T | None:
        """``work``'s result, or ``None`` (``work`` cancelled) once :meth:`update` or
        :meth:`aclose` wakes the loop."""
        job = asyncio.ensure_future(work)
        woken = asyncio.ensure_future(self._woken.wait())
        try:
            await asyncio.wait({job, woken}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            woken.cancel()
            if not job.done():
                job.cancel()
        if not job.done():  # cancelled just now: let it end (a gRPC call is cancelled)
            await asyncio.wait([job])
            if not job.cancelled():
                job.exception()  # retrieved: nobody wants it any more
            return None
        return job.result()

    def _failed(self, why: str) -> bool:
        """Count a failure and say it (once while it repeats); returns False."""
        self.failures += 1
        if why != self.last_error:
            logger.warning("%s: fetching from %s failed: %s", self._topic.name, self._address, why)
        self.last_error = why
        return False

    # -- the actions ------------------------------------------------------------------------

    async def _carry_out(self, partition: Partition, log: str, action: Action) -> bool:
        writer = partition.writer
        if isinstance(action, Append):
            await self._append(partition, action)
        elif isinstance(action, Commit):
            writer.commit_to(action.high_watermark)
        elif isinstance(action, TruncateTo):
            logger.warning(
                "%s %s: truncating to %d: %s", self._topic.name, log, action.offset, action.why
            )
            await _truncate(partition, action.offset)
            self.truncations += 1
        elif isinstance(action, RestartAt):
            logger.warning(
                "%s %s: emptied, restarting at %d: %s",
                self._topic.name,
                log,
                action.offset,
                action.why,
            )
            await writer.restart_at(action.offset)
            await partition.reload_producers()
            self.restarts += 1
        else:
            assert isinstance(action, BackOff)
            return self._failed(action.why)
        return True

    async def _append(self, partition: Partition, action: Append) -> None:
        """Copy the epochs that date the batches, note their producers, append them,
        commit. A failed append drops what it did not write from the epochs and the
        producer table again."""
        writer = partition.writer
        epochs = writer.log.leader_epochs
        if action.assign or action.drop_epochs_from is not None:
            copy = asyncio.to_thread(_copy_epochs, epochs, action.drop_epochs_from, action.assign)
            await run_to_end(copy)
        partition.note_replicated(action.headers)
        try:
            await writer.append_replicated(action.batches)
        except WalError:
            try:  # what it did not write dates nothing and produced nothing
                await run_to_end(asyncio.to_thread(epochs.truncate_from, writer.head + 1))
                await partition.reload_producers()
            except Exception as exc:  # the append's error is the one to report
                logger.warning("%s: cleaning up after a failed append: %s", writer.log.path, exc)
            raise
        writer.commit_to(action.high_watermark)


async def _follow_log_start(partition: Partition, data: _pb.LogData) -> None:
    """Delete the segments wholly below the leader's log start (a log with no retention
    of its own, such as ``state``, whose leader deletes what a snapshot replaced)."""
    if data.error != _pb.REPLICA_ERROR_NONE or data.HasField("diverging"):
        return
    writer = partition.writer
    if data.log_start > writer.first_offset:
        if data.log_start == writer.head:  # the leader deleted all (a purged queue):
            await writer.roll()  # so does this replica, its active segment sealed first
        await writer.delete_before(min(data.log_start, writer.head))


def _position(partition: Partition) -> LogPosition:
    writer = partition.writer
    return LogPosition(writer.first_offset, writer.head, writer.log.leader_epochs.entries())


def _copy_epochs(epochs: LeaderEpochs, drop_from: int | None, assign: Sequence[EpochEntry]) -> None:
    """On a worker thread: drop the entries that date nothing, then copy the leader's."""
    if drop_from is not None:
        epochs.truncate_from(drop_from)
    for entry in assign:
        epochs.assign(entry.epoch, entry.start_offset)


async def _truncate(partition: Partition, offset: int) -> None:
    """Cut the log to ``offset``, or to the batch boundary below it when ``offset`` falls
    inside one of this log's batches; then rebuild the producer table."""
    writer = partition.writer
    try:
        await writer.truncate_to(offset)
    except NotBatchBoundaryError:
        batches = await asyncio.to_thread(writer.log.read, offset, 1)
        await writer.truncate_to(batches[0].base_offset)
    await partition.reload_producers()


def _unimplemented(exc: BaseException) -> bool:
    """Whether ``exc`` says the leader has no such RPC (an older broker)."""
    return isinstance(exc, grpc.aio.AioRpcError) and exc.code() == grpc.StatusCode.UNIMPLEMENTED


def _describe(exc: BaseException) -> str:
    if isinstance(exc, grpc.aio.AioRpcError):
        return f"{exc.code().name}: {exc.details()}"
    return str(exc)
