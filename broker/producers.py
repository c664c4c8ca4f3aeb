"""Idempotent producers: which batches of a partition are retries of ones already appended.

Role: a pure state machine per partition. A producer stamps each batch with its id and the
sequence number of the batch's first record; sequences of one producer on one partition
are consecutive. :meth:`ProducerTable.admit` decides, for a batch about to be appended:

- ``Admit``: the next batch in sequence (or the first seen from this producer): append it.
- ``Duplicate``: a retry of one of the producer's last ``WINDOW`` appended batches: answer
  with the original offsets, append nothing.
- ``InFlight``: a retry of a batch still being appended: wait for that append's answer.
- ``OutOfSequence``: a gap, or a retry too old to answer: reject (FAILED_PRECONDITION).

Worked example: producer 7 appended sequences 0-9 (offsets 100-109) and 10-19 (110-119).
``admit(7, 10, 10)`` -> Duplicate(110, 119); ``admit(7, 20, 5)`` -> Admit (then
``commit``); ``admit(7, 30, 5)`` -> OutOfSequence (expected 25).

Batches without a producer id (``-1``) are always admitted. State survives restarts through
:meth:`snapshot` / :meth:`restore` plus :meth:`observe` of the batches after the snapshot.

Pure module: imports neither ``asyncio``, ``os`` nor ``time``.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

WINDOW = 5


@dataclass(frozen=True, slots=True)
class Admit:
    """Append the batch; call ``commit`` or ``release`` afterwards."""


@dataclass(frozen=True, slots=True)
class Duplicate:
    """A retry of an appended batch: answer with these offsets."""

    first_offset: int
    last_offset: int


@dataclass(frozen=True, slots=True)
class InFlight:
    """A retry of a batch whose append has not finished: wait for it."""

    producer_id: int
    base_sequence: int


@dataclass(frozen=True, slots=True)
class OutOfSequence:
    """A gap or a too-old retry; ``expected`` is the sequence the broker wants next."""

    expected: int
    got: int


Decision = Admit | Duplicate | InFlight | OutOfSequence


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

    def next_sequence(self) -> int | None:
        ends = [s + c for s, c in self.in_flight.items()]
        if self.appended:
            last = self.appended[-1]
            ends.append(last.base_sequence + last.count)
        return max(ends) if ends else None


class ProducerTable:
    """Dedup state of one partition. Not task-safe: used from one event loop."""

    def __init__(self) -> None:
        self._producers: dict[int, _Producer] = {}

    def admit(self, producer_id: int, base_sequence: int, count: int) -> Decision:
        """Decide what to do with a batch; on ``Admit`` the batch is reserved."""
        if producer_id < 0:
            return Admit()
        state = self._producers.setdefault(producer_id, _Producer())
        for done in state.appended:
            if done.base_sequence == base_sequence and done.count == count:
                return Duplicate(done.first_offset, done.last_offset)
        if state.in_flight.get(base_sequence) == count:
            return InFlight(producer_id, base_sequence)
        expected = state.next_sequence()
        if expected is not None and base_sequence != expected:
            return OutOfSequence(expected, base_sequence)
        state.in_flight[base_sequence] = count
        return Admit()

    def commit(self, producer_id: int, base_sequence: int, first: int, last: int) -> None:
        """Record an admitted batch as appended at offsets ``first``..``last``."""
        if producer_id < 0:
            return
        state = self._producers[producer_id]
        count = state.in_flight.pop(base_sequence)
        state.appended.append(_Appended(base_sequence, count, first, last))

    def release(self, producer_id: int, base_sequence: int) -> None:
        """Forget an admitted batch whose append failed (its retry may come again)."""
        state = self._producers.get(producer_id)
        if state is not None:
            state.in_flight.pop(base_sequence, None)

    def observe(self, producer_id: int, base_sequence: int, first: int, last: int) -> None:
        """Learn a batch found in the log (rebuilding state after a restart)."""
        if producer_id < 0 or base_sequence < 0:
            return
        state = self._producers.setdefault(producer_id, _Producer())
        count = last - first + 1
        state.appended.append(_Appended(base_sequence, count, first, last))

    def snapshot(self) -> dict[str, Any]:
        """JSON-able state of the appended batches (in-flight ones are not durable)."""
        return {
            str(pid): [
                [a.base_sequence, a.count, a.first_offset, a.last_offset] for a in state.appended
            ]
            for pid, state in self._producers.items()
            if state.appended
        }

    @classmethod
    def restore(cls, doc: dict[str, Any]) -> ProducerTable:
        """Rebuild from :meth:`snapshot` output.

        Raises:
            ValueError: the document is not a snapshot.
        """
        table = cls()
        for pid, rows in doc.items():
            for seq, count, first, last in rows:
                if last - first + 1 != count:
                    raise ValueError(
                        f"producer snapshot row {[seq, count, first, last]} is damaged"
                    )
                table.observe(int(pid), int(seq), int(first), int(last))
        return table
