"""Idempotent producers: which batches of a partition are retries of ones already appended.

Role: a pure state machine per partition. A producer stamps each batch with its id and the
sequence number of the batch's first record; sequences of one producer on one partition
are consecutive. :meth:`ProducerTable.admit` decides, for a batch about to be appended:

- ``Admit``: the next batch in sequence (or the first seen from this producer): append it.
- ``Duplicate``: a retry of one of the producer's last ``WINDOW`` appended batches: answer
  with the original offsets, append nothing.
- ``AppendedLongAgo``: a retry of an older batch, wholly inside the producer's run of
  appended sequences but no longer in the window: answer "duplicate" without offsets (the
  broker answers ``duplicate=True`` with offsets -1), append nothing.
- ``InFlight``: a retry of a batch still being appended: wait for that append's answer.
- ``OutOfSequence``: a gap, a batch that straddles the next expected sequence, or one that
  starts below the producer's first sequence: reject (FAILED_PRECONDITION).

Invariant: every sequence in ``[first_sequence, appended_through)`` of a producer is in the
log, where ``appended_through`` ends the last appended batch and ``first_sequence`` starts
the unbroken run of appended sequences that ends there. In practice ``first_sequence`` is
the lowest sequence the producer ever appended; it moves up only if a run breaks (a batch
admitted behind an in-flight one whose append then failed), so a batch in a hole is never
taken for a duplicate. That lets a producer re-send *all* its batches from sequence 0 (a
replayed Spark micro-batch) and have each one answered as a duplicate, however many there
were.

Worked example: producer 7 appended sequences 0-9 (offsets 100-109) and 10-19 (110-119).
``admit(7, 10, 10)`` -> Duplicate(110, 119); ``admit(7, 20, 5)`` -> Admit (then
``commit``); ``admit(7, 30, 5)`` -> OutOfSequence (expected 25). After five more batches of
five (25-49), 0-9 has left the window: ``admit(7, 0, 10)`` -> AppendedLongAgo
(``first_sequence`` 0 <= 0 and 0 + 10 <= 50); ``admit(7, 45, 10)`` -> OutOfSequence (it
straddles 50).

Batches without a producer id (``-1``) are always admitted. State survives restarts through
:meth:`snapshot` / :meth:`restore` plus :meth:`observe` of the batches after the snapshot;
:meth:`observe` of the whole log rebuilds ``first_sequence`` too (as the lowest retained).

Expiry: each producer keeps ``last_append_ms``, the latest ``at_ms`` given to
:meth:`commit` or :meth:`observe` (ms since the epoch; it never moves back).
``expire(now_ms, max_idle_ms)`` forgets every producer with no batch in flight whose
``last_append_ms < now_ms - max_idle_ms``. A forgotten producer is unknown again, exactly as
after a rebuild that no longer finds its batches: its next batch is admitted as the first
from it, whatever its sequence, so a retry that comes after the expiry is appended a second
time. That is the price of a bounded table (Kafka's ``producer.id.expiration.ms``); the
expiry must be far longer than any producer retries.

Worked example, ``max_idle_ms`` = 60,000: producer 7 commits 0-9 at ``at_ms`` 1,000 and
producer 8 commits 0-4 at 50,000; producer 9's batch 0-1 was admitted at 0 and is still in
flight. ``expire(61_000, 60_000)`` -> 0 (7 is idle exactly 60,000: not older).
``expire(61_001, 60_000)`` -> 1: 7 is forgotten; 8 (idle 11,001) stays; 9 stays, in flight.
Then ``admit(7, 0, 10)`` -> Admit: the retry is appended a second time (a batch at any
other sequence would have been admitted just as well), while ``admit(8, 0, 5)`` ->
Duplicate as before.

Cap: the table holds at most ``max_producers`` producers (``[limits]
max_producers_per_partition``). Each costs about 2 KiB, and producer ids come from clients,
so without a cap a client that invents ids (or many short-lived producers within the
expiry) grows the broker without bound. Admitting a new producer past the cap forgets the
least recently active one with nothing in flight, exactly as expiry would (its retries
would be appended again); :meth:`take_evicted` counts them for the metrics. Worked example,
``max_producers`` = 2: producers 7 and 8 commit, then 7 commits again; ``admit(9, 0, 1)``
forgets 8 (7 was active since), and the table holds 7 and 9.

Pure module: imports neither ``asyncio``, ``os`` nor ``time``.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from itertools import islice, pairwise
from typing import Any

WINDOW = 5
#: Default of ``max_producers``: ~20 MiB of producer state per partition at most.
DEFAULT_MAX_PRODUCERS = 10_000


@dataclass(frozen=True, slots=True)
class Admit:
    """Append the batch; call ``commit`` or ``release`` afterwards."""


@dataclass(frozen=True, slots=True)
class Duplicate:
    """A retry of an appended batch: answer with these offsets."""

    first_offset: int
    last_offset: int


@dataclass(frozen=True, slots=True)
class AppendedLongAgo:
    """A retry of a batch appended before the window: a duplicate whose offsets are gone.

    Every sequence of the batch lies in the producer's run of appended sequences, so its
    records are in the log (or were, before retention); only where is no longer known.
    """


@dataclass(frozen=True, slots=True)
class InFlight:
    """A retry of a batch whose append has not finished: wait for it."""

    producer_id: int
    base_sequence: int


@dataclass(frozen=True, slots=True)
class OutOfSequence:
    """A gap, a batch straddling ``expected`` or one starting below the producer's first
    sequence; ``expected`` is the sequence the broker wants next."""

    expected: int
    got: int


Decision = Admit | Duplicate | AppendedLongAgo | InFlight | OutOfSequence


@dataclass(slots=True)
class _Appended:
    base_sequence: int
    count: int
    first_offset: int
    last_offset: int


@dataclass(slots=True)
class _Producer:
    appended: deque[_Appended] = field(default_factory=lambda: deque(maxlen=WINDOW))
    in_flight: dict[int, int] = field(default_factory=dict)  # base_sequence -> count
    #: Start of the unbroken run of appended sequences that ends at ``appended_through``;
    #: ``None`` until a batch is appended.
    first_sequence: int | None = None
    #: When the producer last appended (the largest ``at_ms`` seen), ms since the epoch.
    last_append_ms: int = 0

    def appended_through(self) -> int | None:
        """The sequence after the last appended batch, or ``None``."""
        if not self.appended:
            return None
        last = self.appended[-1]
        return last.base_sequence + last.count

    def next_sequence(self) -> int | None:
        ends = [s + c for s, c in self.in_flight.items()]
        through = self.appended_through()
        if through is not None:
            ends.append(through)
        return max(ends) if ends else None

    def record(self, done: _Appended, at_ms: int) -> None:
        """Add an appended batch; a batch that does not continue the run starts a new one."""
        if done.base_sequence != self.appended_through():
            self.first_sequence = done.base_sequence
        self.appended.append(done)
        self.last_append_ms = max(self.last_append_ms, at_ms)

    def is_idle_since(self, cutoff_ms: int) -> bool:
        """Whether nothing is in flight and the last append was before ``cutoff_ms``."""
        return not self.in_flight and self.last_append_ms < cutoff_ms

    def appended_long_ago(self, base_sequence: int, count: int) -> bool:
        """Whether every sequence of the batch is in ``[first_sequence, appended_through)``."""
        through = self.appended_through()
        return (
            self.first_sequence is not None
            and through is not None
            and self.first_sequence <= base_sequence
            and base_sequence + count <= through
        )


class ProducerTable:
    """Dedup state of one partition. Not task-safe: used from one event loop.

    Args:
        max_producers: Producers held at most; past it the least recently active idle one
            is forgotten (see the module docstring). Default :data:`DEFAULT_MAX_PRODUCERS`.
    """

    def __init__(self, max_producers: int = DEFAULT_MAX_PRODUCERS) -> None:
        if max_producers < 1:
            raise ValueError(f"max_producers must be at least 1, not {max_producers}")
        self.max_producers = max_producers
        # Least recently active first: a producer moves to the end when it is admitted a
        # batch, or one of its batches is committed or observed.
        self._producers: dict[int, _Producer] = {}
        self._evicted = 0

    def admit(self, producer_id: int, base_sequence: int, count: int) -> Decision:
        """Decide what to do with a batch; on ``Admit`` the batch is reserved.

        Args:
            producer_id: The batch's producer, or -1 (not idempotent: always admitted).
            base_sequence: The sequence number of the batch's first record.
            count: The batch's records (>= 1).

        Returns:
            The decision; see the module docstring.
        """
        if producer_id < 0:
            return Admit()
        state = self._active(producer_id)
        for done in state.appended:
            if done.base_sequence == base_sequence and done.count == count:
                return Duplicate(done.first_offset, done.last_offset)
        if state.in_flight.get(base_sequence) == count:
            return InFlight(producer_id, base_sequence)
        if state.appended_long_ago(base_sequence, count):
            return AppendedLongAgo()
        expected = state.next_sequence()
        if expected is not None and base_sequence != expected:
            return OutOfSequence(expected, base_sequence)
        state.in_flight[base_sequence] = count
        return Admit()

    def commit(
        self, producer_id: int, base_sequence: int, first: int, last: int, *, at_ms: int
    ) -> None:
        """Record an admitted batch as appended at offsets ``first``..``last``.

        Args:
            producer_id: The batch's producer (-1: nothing to record).
            base_sequence: The sequence ``admit`` reserved.
            first: The batch's first offset.
            last: The batch's last offset.
            at_ms: When it was appended, ms since the epoch (the shell's wall clock).
        """
        if producer_id < 0:
            return
        state = self._producers[producer_id]  # in flight, so never evicted
        count = state.in_flight.pop(base_sequence)
        state.record(_Appended(base_sequence, count, first, last), at_ms)

    def release(self, producer_id: int, base_sequence: int) -> None:
        """Forget an admitted batch whose append failed (its retry may come again)."""
        state = self._producers.get(producer_id)
        if state is not None:
            state.in_flight.pop(base_sequence, None)

    def observe(
        self, producer_id: int, base_sequence: int, first: int, last: int, *, at_ms: int
    ) -> None:
        """Learn a batch found in the log (rebuilding state after a restart).

        Args:
            producer_id: The batch's producer (-1: ignored).
            base_sequence: The sequence of its first record (-1: ignored).
            first: The batch's first offset.
            last: The batch's last offset.
            at_ms: When the producer counts as having appended it, ms since the epoch.
        """
        if producer_id < 0 or base_sequence < 0:
            return
        state = self._active(producer_id)
        count = last - first + 1
        state.record(_Appended(base_sequence, count, first, last), at_ms)

    def expire(self, now_ms: int, max_idle_ms: int) -> int:
        """Forget every producer idle longer than ``max_idle_ms`` with nothing in flight.

        Args:
            now_ms: The current time, ms since the epoch.
            max_idle_ms: A producer whose ``last_append_ms`` is older than
                ``now_ms - max_idle_ms`` is forgotten (idle exactly that long: kept).

        Returns:
            How many producers were forgotten.
        """
        cutoff = now_ms - max_idle_ms
        idle = [pid for pid, state in self._producers.items() if state.is_idle_since(cutoff)]
        for pid in idle:
            del self._producers[pid]
        return len(idle)

    def take_evicted(self) -> int:
        """How many producers the cap forgot since the last call."""
        evicted, self._evicted = self._evicted, 0
        return evicted

    def _active(self, producer_id: int) -> _Producer:
        """The producer's state, made the most recently active (created if new, which
        may forget the least recently active idle one past ``max_producers``)."""
        state = self._producers.pop(producer_id, None)
        if state is None:
            state = _Producer()
            self._evict_for_one_more()
        self._producers[producer_id] = state
        return state

    def _evict_for_one_more(self) -> None:
        over = len(self._producers) + 1 - self.max_producers
        if over <= 0:
            return
        idle = (pid for pid, st in self._producers.items() if not st.in_flight)
        for pid in list(islice(idle, over)):  # oldest activity first; in flight: kept
            del self._producers[pid]
            self._evicted += 1

    def __len__(self) -> int:
        """Producers the table holds state for."""
        return len(self._producers)

    def snapshot(self, below: int | None = None) -> dict[str, Any]:
        """JSON-able state of the appended batches (in-flight ones are not durable).

        Args:
            below: Keep only the batches that end below this offset (default: all), so
                that the snapshot says what the table knew of the log below ``below``
                while later batches were being committed. A producer whose run of
                sequences broke after ``below`` gets, as its run start, that of the rows
                kept: the start it had at ``below`` is gone, and a later start only
                answers fewer retries as duplicates, never a batch in a hole.

        Returns:
            ``{producer id: {"first_sequence": S, "last_append_ms": T, "appended":
            [[base_sequence, count, first_offset, last_offset], ...]}}``, oldest batch
            first.
        """
        doc: dict[str, Any] = {}
        for pid, state in self._producers.items():
            rows = [
                [a.base_sequence, a.count, a.first_offset, a.last_offset]
                for a in state.appended
                if below is None or a.last_offset < below
            ]
            if not rows:
                continue
            first_sequence = state.first_sequence
            if first_sequence is not None and first_sequence > _run_start(rows):
                first_sequence = _run_start(rows)
            doc[str(pid)] = {
                "first_sequence": first_sequence,
                "last_append_ms": state.last_append_ms,
                "appended": rows,
            }
        return doc

    @classmethod
    def restore(
        cls, doc: dict[str, Any], *, now_ms: int, max_producers: int = DEFAULT_MAX_PRODUCERS
    ) -> ProducerTable:
        """Rebuild from :meth:`snapshot` output.

        Also reads the two older formats. Before ``first_sequence``, a bare list of rows per
        producer: the run then starts at the oldest row, so retries older than the window
        stay OutOfSequence, as they were when that snapshot was written. Before
        ``last_append_ms``, an object without it. A producer without ``last_append_ms``
        counts as having appended at ``now_ms``: its state is kept a full expiry period
        from the restore rather than dropped at the first check (an old snapshot says
        nothing of when its producers were last heard from).

        Args:
            doc: The snapshot.
            now_ms: The restore time, ms since the epoch.

        Raises:
            ValueError: the document is not a snapshot.
        """
        table = cls(max_producers)
        for pid, entry in doc.items():
            rows, first_sequence, at_ms = _parse_entry(pid, entry, now_ms)
            for seq, count, first, last in rows:
                if last - first + 1 != count:
                    raise ValueError(
                        f"producer snapshot row {[seq, count, first, last]} is damaged"
                    )
                table.observe(int(pid), int(seq), int(first), int(last), at_ms=at_ms)
            if first_sequence is not None and rows:
                table._restore_first_sequence(int(pid), int(first_sequence), int(rows[0][0]))
        return table

    def _restore_first_sequence(self, pid: int, first_sequence: int, oldest: int) -> None:
        """Lower the run the rows imply to the saved one, if the rows allow it.

        Raises:
            ValueError: the saved run start contradicts the rows (a hole after it).
        """
        state = self._producers[pid]
        run = state.first_sequence
        assert run is not None  # rows were observed
        if first_sequence > run or (first_sequence < run and run != oldest):
            raise ValueError(
                f"producer {pid}: snapshot first_sequence {first_sequence} contradicts its "
                f"rows (their unbroken run starts at {run})"
            )
        state.first_sequence = first_sequence


def _run_start(rows: list[list[int]]) -> int:
    """Where the unbroken run of sequences that ends the snapshot ``rows`` starts."""
    start = rows[0][0]
    for (seq, count, _, _), (nxt, _, _, _) in pairwise(rows):
        if nxt != seq + count:
            start = nxt
    return start


def _parse_entry(pid: str, entry: object, now_ms: int) -> tuple[list[Any], Any, int]:
    """One producer's snapshot entry, in any format, as (rows, first_sequence, at_ms).

    Raises:
        ValueError: the entry has none of the known shapes.
    """
    if isinstance(entry, list):  # the format before first_sequence
        return entry, None, now_ms
    if not isinstance(entry, dict):
        raise ValueError(f"producer {pid}: snapshot entry {entry!r} is damaged")
    at_ms = entry.get("last_append_ms", now_ms)  # absent before last_append_ms existed
    if not isinstance(at_ms, int) or isinstance(at_ms, bool):
        raise ValueError(f"producer {pid}: snapshot last_append_ms {at_ms!r} is damaged")
    return entry["appended"], entry["first_sequence"], at_ms
