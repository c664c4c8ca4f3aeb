"""Sorted, disjoint offset ranges that each carry a value: what the dispatch state machine
uses to know which offsets are leased to which consumer, waiting to be sent again, or being
written to the dead-letter queue.

Owns :class:`RangeMap`. Pure: no I/O, no clock.

Invariants:
- Ranges are non-empty, sorted and disjoint; ``total`` is the sum of their lengths.
- :meth:`RangeMap.cut` removes exactly the intersection with the given span (optionally
  only the pieces carrying one value) and returns what it removed, splitting ranges that
  stick out on either side.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class RangeMap(Generic[T]):
    """Offset ranges ``[begin, end)``, each with a value. Ranges never overlap."""

    __slots__ = ("_begins", "_ends", "_values", "total")

    def __init__(self) -> None:
        self._begins: list[int] = []
        self._ends: list[int] = []
        self._values: list[T] = []
        #: How many offsets the ranges cover.
        self.total = 0

    def __len__(self) -> int:
        return len(self._begins)

    def __bool__(self) -> bool:
        return bool(self._begins)

    def __iter__(self) -> Iterator[tuple[int, int, T]]:
        return iter(list(zip(self._begins, self._ends, self._values, strict=True)))

    def __repr__(self) -> str:
        return f"RangeMap({list(self)})"

    def add(self, begin: int, end: int, value: T) -> None:
        """Add ``[begin, end)``; it must not overlap a range already held."""
        if begin >= end:
            return
        begins, ends = self._begins, self._ends
        if not ends or ends[-1] <= begin:  # past every held range (a new send): no search
            i = len(ends)
        else:
            i = bisect_left(begins, begin)
            if (i and ends[i - 1] > begin) or (i < len(begins) and begins[i] < end):
                raise ValueError(f"[{begin}, {end}) overlaps a range already held: {self!r}")
        begins.insert(i, begin)
        ends.insert(i, end)
        self._values.insert(i, value)
        self.total += end - begin

    def overlapping(self, begin: int, end: int) -> Iterator[tuple[int, int, T]]:
        """The pieces of held ranges inside ``[begin, end)``, in order (a snapshot)."""
        i = bisect_right(self._ends, begin)
        out = []
        while i < len(self._begins) and self._begins[i] < end:
            out.append((max(self._begins[i], begin), min(self._ends[i], end), self._values[i]))
            i += 1
        return iter(out)

    def cut(self, begin: int, end: int, only: T | None = None) -> list[tuple[int, int, T]]:
        """Remove what lies in ``[begin, end)`` (only ranges whose value *is* ``only``,
        when given); return the removed pieces in order."""
        removed: list[tuple[int, int, T]] = []
        begins, ends, values = self._begins, self._ends, self._values
        i = bisect_right(ends, begin)
        if only is None:  # every overlapping range goes: one slice, not one per range
            j = bisect_left(begins, end, i)
            if i == j:
                return removed
            for k in range(i, j):
                cb, ce = max(begins[k], begin), min(ends[k], end)
                removed.append((cb, ce, values[k]))
                self.total -= ce - cb
            kept_b: list[int] = []
            kept_e: list[int] = []
            kept_v: list[T] = []
            if begins[i] < begin:  # the first range sticks out on the left
                kept_b.append(begins[i])
                kept_e.append(begin)
                kept_v.append(values[i])
            if ends[j - 1] > end:  # the last range sticks out on the right
                kept_b.append(end)
                kept_e.append(ends[j - 1])
                kept_v.append(values[j - 1])
            begins[i:j] = kept_b
            ends[i:j] = kept_e
            values[i:j] = kept_v
            return removed
        while i < len(begins) and begins[i] < end:
            rb, re, value = begins[i], ends[i], values[i]
            if only is not None and value is not only:
                i += 1
                continue
            cb, ce = max(rb, begin), min(re, end)
            removed.append((cb, ce, value))
            self.total -= ce - cb
            keep_b = [b for b in ((rb, cb), (ce, re)) if b[0] < b[1]]
            begins[i : i + 1] = [b for b, _ in keep_b]
            ends[i : i + 1] = [e for _, e in keep_b]
            values[i : i + 1] = [value] * len(keep_b)
            i += len(keep_b)
        return removed

    def clear(self) -> None:
        """Forget every range."""
        self._begins.clear()
        self._ends.clear()
        self._values.clear()
        self.total = 0
