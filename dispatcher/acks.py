"""Which offsets of one partition a subscription has acknowledged.

Owns :class:`AckRanges`: the cursor (the first offset not yet acknowledged) plus the
acknowledged ranges above it (the "ack holes" between them are what is still owed). Acks
may arrive in any order and overlap; the cursor advances over every contiguous acknowledged
prefix. Pure: no I/O, no clock.

Invariants:
- ``cursor`` never moves backwards, except through :meth:`AckRanges.reset` (a seek).
- The ranges are sorted, disjoint, non-adjacent, non-empty and all start above ``cursor``.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Iterator

Range = tuple[int, int]  # [begin, end)


class AckRanges:
    """The acknowledged offsets of one partition, as a cursor plus ranges above it."""

    __slots__ = ("_begins", "_ends", "cursor")

    def __init__(self, cursor: int = 0, ranges: Iterable[Range] = ()) -> None:
        self.cursor = cursor
        self._begins: list[int] = []
        self._ends: list[int] = []
        for begin, end in ranges:
            self.ack(begin, end)

    def __repr__(self) -> str:
        return f"AckRanges(cursor={self.cursor}, ranges={self.ranges()})"

    def ranges(self) -> list[Range]:
        """The acknowledged ranges above the cursor, in order."""
        return list(zip(self._begins, self._ends, strict=True))

    def has_ranges(self) -> bool:
        """Whether any offset above the cursor is acknowledged (an ack hole is owed)."""
        return bool(self._begins)

    def acked_count(self, below: int) -> int:
        """How many offsets in ``[cursor, below)`` are acknowledged."""
        total = 0
        for begin, end in zip(self._begins, self._ends, strict=True):
            if begin >= below:
                break
            total += min(end, below) - begin
        return total

    def is_acked(self, offset: int) -> bool:
        """Whether ``offset`` is acknowledged."""
        if offset < self.cursor:
            return True
        i = bisect_right(self._begins, offset) - 1
        return i >= 0 and offset < self._ends[i]

    def ack(self, begin: int, end: int) -> int:
        """Acknowledge ``[begin, end)``; return how many offsets were newly acknowledged."""
        begin = max(begin, self.cursor)
        if begin >= end:
            return 0
        # The stored ranges that touch [begin, end) (adjacent ones merge too).
        lo = bisect_left(self._ends, begin)
        hi = bisect_right(self._begins, end)
        if lo < hi:
            begin = min(begin, self._begins[lo])
            end = max(end, self._ends[hi - 1])
        newly = (end - begin) - sum(self._ends[i] - self._begins[i] for i in range(lo, hi))
        self._begins[lo:hi] = [begin]
        self._ends[lo:hi] = [end]
        if self._begins[0] == self.cursor:
            self.cursor = self._ends[0]
            del self._begins[0], self._ends[0]
        return newly

    def ack_up_to(self, offset: int) -> int:
        """Acknowledge everything below ``offset``; return how many were newly acknowledged."""
        if offset <= self.cursor:
            return 0
        newly = offset - self.cursor - self.acked_count(offset)
        keep = bisect_left(self._ends, offset + 1)  # ranges ending at or before offset go
        del self._begins[:keep], self._ends[:keep]
        self.cursor = offset
        if self._begins and self._begins[0] <= offset:
            self.cursor = self._ends[0]
            del self._begins[0], self._ends[0]
        return newly

    def unacked(self, begin: int, end: int) -> Iterator[Range]:
        """The maximal sub-ranges of ``[begin, end)`` that are not acknowledged."""
        begin = max(begin, self.cursor)
        i = bisect_right(self._ends, begin)
        while begin < end:
            if i < len(self._begins) and self._begins[i] <= begin:
                begin = self._ends[i]
                i += 1
                continue
            stop = min(end, self._begins[i]) if i < len(self._begins) else end
            if begin < stop:
                yield begin, stop
            begin = stop

    def reset(self, cursor: int) -> None:
        """Forget every ack and put the cursor at ``cursor`` (a seek)."""
        self.cursor = cursor
        self._begins.clear()
        self._ends.clear()
