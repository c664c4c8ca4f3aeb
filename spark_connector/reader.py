"""The readers: batch (``spark.read``) and streaming (``spark.readStream``).

Role: the Spark-facing shells around :mod:`spark_connector.offsets` (which records) and
:mod:`spark_connector.arrow` (how rows are built). Where Spark runs each method (see
SPARK_NOTES): ``initialOffset``, ``latestOffset``, ``partitions`` and ``commit`` run on the
driver side, in one long-lived process per query; ``read`` runs in Python workers, on an
unpickled copy of the reader, and opens its own connection. So the driver-side clients are
made lazily and dropped when the reader is pickled, and nothing ``read`` needs lives
anywhere but in the reader's options and the partition it is given.

Acks. Spark's checkpoint is the query's position; the subscription's cursor follows it.
Spark calls ``commit(end)`` one batch late, and never for the last batch of a run. But it
plans every micro-batch with ``latestOffset(start, ...)``, where ``start`` is the end of
the previous batch, which Spark has already written to its commit log (micro-batches run
one at a time). So ``latestOffset`` acks ``start``: the last batch is acked within one
trigger, and so is the final batch of a ``trigger(availableNow=True)`` run, whose end
Spark passes to one more ``latestOffset`` to learn that nothing is left. ``commit`` acks
too. A failed ack never fails the query: it is logged, counted, and retried at the next
call (acks only move a cursor forward, so a repeated one is harmless).

Owners (a cluster; the ``broker`` option a list of seeds). The driver looks the topic's
owner up when it plans a batch (:meth:`_Driver.owner`, one Lookup) and puts its address in
each :class:`HeadracePartition`; a task's fetcher goes there first (the owner, then the
seeds), and follows a refusal by itself (:mod:`client._async._routing`: the owner it names,
or a backoff and a Lookup) if the topic is no longer there. Acks (``AckUpTo``) go through
the driver's routed fetcher, so they reach the owner too.

Retention. Acks never run ahead of Spark's commits, and the broker never deletes records
at or above a subscription's saved cursor, so a replay of a failed batch can always re-read
its exact range.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from client import (
    AdminClient,
    ClientError,
    Fetcher,
    NotFound,
    PermissionDenied,
    RecordBatch,
    TopicInfo,
    Unauthenticated,
    Unavailable,
)
from proto.shown import shown_text
from spark_connector import offsets as off
from spark_connector.arrow import concat, to_arrow
from spark_connector.errors import (
    ConnectorError,
    DataLossError,
    OptionError,
    access_denied,
    unreachable,
)
from spark_connector.options import EARLIEST, LATEST, SinkOptions, SourceOptions

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: Bytes one Fetch asks for (the broker answers at most 16 MiB).
FETCH_BYTES = 8 << 20
#: Arrow batches smaller than this many rows are joined before Spark gets them: Spark
#: pays per batch it receives, and a log of one-record batches would cost it per record.
MIN_ARROW_ROWS = 4096
#: The longest the driver waits for the Lookup of the topic's owner, seconds.
LOOKUP_S = 5.0
#: How long driver-side calls keep retrying a broker that does not answer (a restart), s.
BROKER_WAIT_S = 60.0
#: Deadline of one ack, seconds: acks are retried at the next trigger, never waited on long.
ACK_TIMEOUT_S = 5.0
#: Who the broker records as the subscription's committer (``subscriptions describe``);
#: a consumer that attaches to it without ``--force`` is refused, naming it.
COMMITTER = "spark"


@dataclass(frozen=True)
class HeadracePartition(InputPartition):
    """One Spark task: offsets ``[start, end)`` of one topic partition, and where the
    topic's owner was when the driver planned it (``""``: ask the seeds). Picklable."""

    partition: int
    start: int
    end: int
    owner: str = ""


class _Driver:
    """The driver side's broker clients, made on first use. Not picklable on purpose:
    readers drop it in ``__getstate__``."""

    def __init__(self, options: SourceOptions | SinkOptions, wait_s: float = BROKER_WAIT_S) -> None:
        self.options = options
        self.wait_s = wait_s
        self._admin: AdminClient | None = None
        self._fetcher: Fetcher | None = None

    @property
    def admin(self) -> AdminClient:
        if self._admin is None:
            self._admin = AdminClient(
                self.options.broker, timeout_s=10.0, **self.options.security()
            )
        return self._admin

    @property
    def fetcher(self) -> Fetcher:
        if self._fetcher is None:
            self._fetcher = Fetcher(
                self.options.broker, timeout_s=ACK_TIMEOUT_S, **self.options.security()
            )
        return self._fetcher

    def call(self, what: str, fn: Callable[[], T], wait_s: float | None = None) -> T:
        """``fn()``, retried while the broker is unavailable (restarting), up to
        ``wait_s`` (default: the driver's); errors become :class:`ConnectorError`
        messages that say what to do."""
        deadline = time.monotonic() + (self.wait_s if wait_s is None else wait_s)
        pause = 0.1
        while True:
            try:
                return fn()
            except Unavailable as exc:
                if time.monotonic() + pause >= deadline:
                    raise unreachable(
                        self.options.broker,
                        f" while {what}",
                        exc,
                        tls=self.options.tls_ca is not None,
                    ) from exc
                logger.info("broker %s unavailable while %s; retrying", self.options.broker, what)
                time.sleep(pause)
                pause = min(pause * 2, 2.0)
            except NotFound as exc:
                raise ConnectorError(f"{what}: {exc}") from exc
            except (Unauthenticated, PermissionDenied) as exc:
                raise access_denied(what, exc) from exc
            except ClientError as exc:
                raise ConnectorError(f"{what}: the broker said {exc}") from exc

    def topic(self, wait_s: float | None = None) -> TopicInfo:
        name = self.options.topic
        try:
            return self.call(
                f"looking up topic {name!r}", lambda: self.admin.describe_topic(name), wait_s
            )
        except ConnectorError as exc:
            if isinstance(exc.__cause__, NotFound):
                raise ConnectorError(
                    f"topic {name!r} does not exist on {self.options.broker} (option 'topic'):"
                    f" create it with `headrace topics create {name} --partitions N`"
                ) from exc
            raise

    def retained(self, wait_s: float | None = None) -> list[off.Retained]:
        return self.snapshot(wait_s)[1]

    def snapshot(self, wait_s: float | None = None) -> tuple[str, list[off.Retained]]:
        """The topic's id and what each partition retains, from one answer."""
        info = self.topic(wait_s)
        return info.topic_id, [off.Retained(p.first_offset, p.head) for p in info.partitions]

    def cursors(self, subscription: str) -> off.Offsets | None:
        """The subscription's saved cursors, or None when it does not exist."""
        topic = self.options.topic
        try:
            info = self.call(
                f"reading subscription {subscription!r}",
                lambda: self.admin.describe_subscription(topic, subscription),
            )
        except ConnectorError as exc:
            if isinstance(exc.__cause__, NotFound):
                return None
            raise
        return {p.partition: p.cursor for p in info.partitions}

    def owner(self) -> str:
        """The address of the topic's owner now (one Lookup on a seed); ``""`` when no
        seed answers or the topic is not online (the tasks then ask the seeds)."""
        fetcher = self.fetcher
        fetcher.router.refresh([self.options.topic], time.monotonic() + LOOKUP_S)
        route = fetcher.router.table.route(self.options.topic)
        return route.address if route is not None else ""

    def close(self) -> None:
        for client in (self._admin, self._fetcher):
            if client is not None:
                client.close()
        self._admin = self._fetcher = None


def starting_offsets(
    driver: _Driver, o: SourceOptions, retained: list[off.Retained]
) -> off.Offsets:
    """Where a read starts, per partition, from the options (not yet checked for loss)."""
    if o.starting_timestamp_ms is not None:
        ts = o.starting_timestamp_ms
        found = driver.call(
            "finding offsets by time", lambda: driver.admin.offsets_for_time(o.topic, ts)
        )
        return dict(enumerate(found))
    if o.starting == "acked":
        cursors = driver.cursors(o.subscription or "")
        if cursors is None:
            return off.resolve({}, retained, default=EARLIEST)
        return {p: cursors.get(p, r.first) for p, r in enumerate(retained)}
    if isinstance(o.starting, dict):
        _within_heads("startingOffsets", o.starting, retained)
        return off.resolve(o.starting, retained, default=EARLIEST)
    return off.resolve({}, retained, default=EARLIEST if o.starting == "earliest" else LATEST)


def _within_heads(option: str, spec: dict[int, int], retained: list[off.Retained]) -> None:
    """Refuse offsets of ``spec`` (the option's JSON) past their partition's head: the
    user asked for records that were never written (a partition the topic lacks is
    :func:`~spark_connector.offsets.resolve`'s to refuse)."""
    for p, offset in sorted(spec.items()):
        if p < len(retained) and offset not in (EARLIEST, LATEST) and offset > retained[p].head:
            raise OptionError(
                option,
                f"partition {p} is at {offset}, past its head {retained[p].head} (the next "
                f"offset to be written); give at most {retained[p].head}, or -1 for latest",
            )


def checked(
    options: SourceOptions,
    position: off.Offsets,
    retained: list[off.Retained],
    ids: tuple[str, str] = ("", ""),
) -> off.Offsets:
    """``position``, or past lost records under ``failOnDataLoss=false``. ``ids``: the
    topic id ``position`` was taken under, and the topic's id now.

    Raises:
        DataLossError: Records at the position are gone and ``failOnDataLoss`` is true.
    """
    found = off.recreated(position, *ids, retained) or off.losses(position, retained)
    if not found:
        return position
    message = off.describe(options.topic, found)
    if options.fail_on_data_loss:
        raise DataLossError(
            f"{message}. Set failOnDataLoss=false to skip ahead, or start a new query"
        )
    logger.warning("%s; skipping ahead (failOnDataLoss=false)", message)
    return off.skip_lost(position, found)


class HeadraceBatchReader(DataSourceReader):
    """``spark.read.format("headrace")``: one fixed range, planned on the driver."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options

    def partitions(self) -> list[HeadracePartition]:
        """One task per partition's range (more with ``minPartitions``). An end before
        the start the options ask for is refused; one that only lies before where
        ``failOnDataLoss=false`` moved the start (past records retention deleted) reads
        nothing there."""
        driver = _Driver(self.options)
        try:
            retained = driver.retained()
            asked = starting_offsets(driver, self.options, retained)
            start = checked(self.options, asked, retained)
            o = self.options
            if o.ending == "latest":
                end = {p: r.head for p, r in enumerate(retained)}
            else:
                assert isinstance(o.ending, dict)
                _within_heads("endingOffsets", o.ending, retained)
                end = off.resolve(o.ending, retained, default=LATEST)
            for p, e in sorted(end.items()):
                if e < asked[p]:
                    raise OptionError(
                        "endingOffsets",
                        f"partition {p} ends at {e}, before the read's start there "
                        f"({asked[p]}); give an end at or after the start",
                    )
            end = {p: max(e, start[p]) for p, e in end.items() if p in start}
            owner = driver.owner()
        finally:
            driver.close()
        ranges = off.plan(start, end, self.options.min_partitions)
        return [HeadracePartition(r.partition, r.start, r.end, owner) for r in ranges]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(self.options, partition)


class HeadraceStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("headrace")``: micro-batches through a subscription."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._driver: _Driver | None = None
        self._target: off.Offsets | None = None  # availableNow: the heads at its start
        self._acked: off.Offsets = {}
        self._heads: off.Offsets | None = None  # the heads latestOffset last saw
        self._topic_id = ""  # the topic's id latestOffset last saw ("" before, or none)
        self.ack_failures = 0

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_driver"] = None  # gRPC channels and loop threads do not pickle
        return state

    @property
    def driver(self) -> _Driver:
        if self._driver is None:
            self._driver = _Driver(self.options)
        return self._driver

    def initialOffset(self) -> dict[str, int | str]:  # noqa: N802 - Spark's method name
        """The query's first position; the subscription is moved there (or created)."""
        self._topic_id, retained = self.driver.snapshot()
        start = checked(
            self.options, starting_offsets(self.driver, self.options, retained), retained
        )
        if self.options.subscription is None:
            logger.warning(
                "stream on %s has no 'subscription' option: nothing is acked, so the broker "
                "shows no lag for it and retention may delete records it has not read",
                self.options.topic,
            )
        else:
            self._align(start)
        return off.to_spark(start, self._topic_id)

    def _align(self, start: off.Offsets) -> None:
        """Make the subscription's cursor the query's start, so lag and retention follow
        the query from its first batch."""
        o = self.options
        sub = o.subscription or ""
        if self.driver.cursors(sub) is None:
            fetcher = self.driver.fetcher
            for p, offset in start.items():  # AckUpTo creates it (at the earliest offsets)
                self.driver.call(
                    f"creating subscription {sub!r}",
                    functools.partial(
                        fetcher.ack_up_to, o.topic, sub, p, offset, committer=COMMITTER
                    ),
                )
        elif o.starting != "acked" or o.starting_timestamp_ms is not None:
            self.driver.call(
                f"moving subscription {sub!r} to the query's start",
                lambda: self.driver.admin.seek(o.topic, sub, offsets=start),
            )
        self._acked = dict(start)

    def getDefaultReadLimit(self) -> ReadLimit:  # noqa: N802 - Spark's method name
        """``maxRecordsPerTrigger`` as Spark's read limit."""
        n = self.options.max_records_per_trigger
        return ReadAllAvailable() if n is None else ReadMaxRows(n)

    def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802 - Spark's method name
        """Remember the heads: an availableNow run reads up to them and no further."""
        self._target = {p: r.head for p, r in enumerate(self.driver.retained())}

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, int | str]:  # noqa: N802
        """The end of the next micro-batch; acks ``start`` first (see the module docstring),
        unless the topic was created again since ``start`` was planned: its offsets then
        name other records, and acking them would move the new subscription's cursor past
        records nobody read."""
        position = off.from_spark(start)
        was = off.topic_id_of(start)
        now, retained = self.driver.snapshot()
        if off.topic_changed(was, now):
            self._acked = {}  # the cursors acked so far were the old topic's
        else:
            self._ack(position)
        self._topic_id = now
        position = checked(self.options, position, retained, (was, now))
        heads = {p: r.head for p, r in enumerate(retained)}
        self._heads = heads  # what reportLatestOffset reports when Spark plans the batch
        if self._target is not None:
            heads = {
                p: min(h, max(self._target.get(p, 0), position.get(p, 0))) for p, h in heads.items()
            }
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        return off.to_spark(off.admit(position, heads, max_rows), now)

    def reportLatestOffset(self) -> dict[str, int | str] | None:  # noqa: N802 - Spark's method name
        """The heads, for the query's progress report: those the last ``latestOffset`` read
        (no second round trip per trigger), else asked once; None (not reported) when the
        broker does not answer at once, since a report must not hold up or fail the query."""
        if self._heads is not None:  # what latestOffset just read: no second round trip
            return off.to_spark(self._heads, self._topic_id)
        try:
            topic_id, retained = self.driver.snapshot(wait_s=0)
        except ConnectorError as exc:
            logger.info("no latest offset for the progress report: %s", shown_text(str(exc)))
            return None
        return off.to_spark({p: r.head for p, r in enumerate(retained)}, topic_id)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[HeadracePartition]:
        """The tasks of the batch ``[start, end)``; when the topic was created again
        between them (``failOnDataLoss=false`` let the query go on), the new topic is read
        from its beginning, since ``start`` counts the old topic's records."""
        changed = off.topic_changed(off.topic_id_of(start), off.topic_id_of(end))
        begin = {} if changed else off.from_spark(start)
        ranges = off.plan(begin, off.from_spark(end), self.options.min_partitions)
        owner = self.driver.owner() if ranges else ""
        return [HeadracePartition(r.partition, r.start, r.end, owner) for r in ranges]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(self.options, partition)

    def commit(self, end: dict[str, Any]) -> None:
        """Spark committed a batch: ack its end (one batch late; see the module docstring)."""
        self._ack(off.from_spark(end))

    def stop(self) -> None:
        if self._driver is not None:
            self._driver.close()
            self._driver = None

    def _ack(self, position: off.Offsets) -> None:
        """AckUpTo every partition that moved; a failure is logged and counted, ends this
        pass (each try waits up to ACK_TIMEOUT_S), and the next call tries again."""
        o = self.options
        if o.subscription is None:
            return
        sub = o.subscription
        for p, offset in sorted(position.items()):
            if offset <= self._acked.get(p, -1):
                continue
            try:
                self.driver.fetcher.ack_up_to(o.topic, sub, p, offset, committer=COMMITTER)
            except ClientError as exc:
                self.ack_failures += 1
                logger.warning(
                    "ack of %s/%d up to %d for subscription %r failed (%s); %d failed so far, "
                    "retrying every partition left at the next trigger",
                    o.topic,
                    p,
                    offset,
                    sub,
                    shown_text(str(exc)),
                    self.ack_failures,
                )
                return  # the broker is likely down: do not wait once per partition
            self._acked[p] = offset


def _read(options: SourceOptions, partition: InputPartition) -> Iterator[pa.RecordBatch]:
    """What ``read`` yields for one of our partitions. When :meth:`partitions` plans none
    (nothing to read), Spark still runs one task with a bare ``InputPartition(None)``; it
    yields nothing."""
    if not isinstance(partition, HeadracePartition):
        return iter(())
    return read_range(options, partition)


def read_range(options: SourceOptions, part: HeadracePartition) -> Iterator[pa.RecordBatch]:
    """The rows of ``[part.start, part.end)``, over a connection of this task's own.

    One fetch is always in flight ahead: while Spark takes the rows of one answer, the
    broker is already reading the next. Log batches of at least :data:`MIN_ARROW_ROWS`
    rows go out as they are (no copy); smaller ones are joined until they reach it.
    """
    topic, p, end = options.topic, part.partition, part.end
    offset = part.start
    small: list[pa.RecordBatch] = []
    seeds = [part.owner, options.broker] if part.owner else [options.broker]
    with Fetcher(seeds, timeout_s=BROKER_WAIT_S, **options.security()) as fetcher:
        ahead = fetcher.fetch_ahead(topic, p, offset, end_offset=end, max_bytes=FETCH_BYTES)
        while offset < end:
            got = ahead.result()
            if got.first_offset > offset or (not got.batches and got.high_water_mark <= offset):
                offset = _lost(
                    options, p, offset, end, first=got.first_offset, head=got.high_water_mark
                )
                ahead = fetcher.fetch_ahead(topic, p, offset, end_offset=end, max_bytes=FETCH_BYTES)
                continue
            if not got.batches:
                raise ConnectorError(
                    f"{topic}/{p}: the broker returned no records at offset {offset} below its "
                    f"head {got.high_water_mark}"
                )
            following = got.batches[-1].next_offset
            if following < end:
                ahead = fetcher.fetch_ahead(
                    topic, p, following, end_offset=end, max_bytes=FETCH_BYTES
                )
            for rows in _rows(options, p, got.batches, offset, end):
                if rows.num_rows >= MIN_ARROW_ROWS and not small:
                    yield rows
                    continue
                small.append(rows)
                if sum(r.num_rows for r in small) >= MIN_ARROW_ROWS:
                    yield concat(small)
                    small = []
            offset = min(following, end)
        if small:
            yield concat(small)


def _rows(
    options: SourceOptions, p: int, batches: list[RecordBatch], offset: int, end: int
) -> Iterator[pa.RecordBatch]:
    """Each fetched batch's records in ``[offset, end)`` as Arrow, sharing its bytes."""
    for batch in batches:
        if batch.next_offset <= offset:
            continue
        if batch.base_offset >= end:
            return
        lo = max(offset - batch.base_offset, 0)
        hi = min(end, batch.next_offset) - batch.base_offset
        table = to_arrow(options.topic, p, batch, include_headers=options.include_headers)
        yield table.slice(lo, hi - lo) if (lo, hi) != (0, batch.record_count) else table


def _lost(options: SourceOptions, p: int, offset: int, end: int, *, first: int, head: int) -> int:
    """Where reading goes on after records in ``[offset, end)`` turned out gone."""
    if first > offset:
        reason = f"records {offset}-{min(first, end) - 1} were deleted by retention"
        resume = first
    else:
        reason = f"the head is {head}: the topic was deleted and created again"
        resume = end
    message = f"{options.topic}/{p}: records the query has not read are gone: {reason}"
    if options.fail_on_data_loss:
        raise DataLossError(f"{message}. Set failOnDataLoss=false to skip ahead")
    logger.warning("%s; skipping them (failOnDataLoss=false)", message)
    return resume
