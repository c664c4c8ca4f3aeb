"""Sparse offset index of one segment: offset -> byte position of the batch holding it.

Role: a cache that turns ``read(offset)`` into a bisect plus a short forward scan, and that
remembers the segment's newest record timestamp. Entries are
``(relative_offset: u32, position: u32, max_timestamp_before: i64)``, 16 bytes each,
appended in order. An entry is added when at least ``index_interval_bytes`` were written
since the last one, so the scan after a lookup covers at most that many bytes plus one
batch. ``max_timestamp_before`` is the largest record timestamp in the segment *before* the
entry's batch (``NO_TIMESTAMP`` if none), so the newest entry plus a scan of the tail after
it give the segment's largest timestamp exactly, which retention by age needs, even though
producer timestamps need not increase (the role of Kafka's time index).

Invariants:
- Relative offsets and positions both strictly increase.
- Each entry names the *first* offset of a batch and that batch's position.
- The index holds no checksum: if it is missing, torn or implausible it is rebuilt from the
  log (``IndexCorruptError`` tells the caller to do so).

Example: base 100, entries [(140, 4096, ts), ...]: ``lookup(139)`` -> (100, 0);
``lookup(140)`` -> (140, 4096); ``lookup(99)`` -> ``None`` (below the segment).

Pure module: imports neither ``asyncio``, ``os`` nor ``time``.
"""

from __future__ import annotations

import struct
from array import array
from bisect import bisect_right

from wal.errors import IndexCorruptError

ENTRY = struct.Struct("<IIq")
ENTRY_SIZE = ENTRY.size
#: ``max_timestamp_before`` of an entry with no record before it.
NO_TIMESTAMP = -(2**63)


class OffsetIndex:
    """In-memory sparse index of one segment. Not task-safe: owned by its ``Segment``."""

    __slots__ = ("_max_ts", "_offsets", "_positions", "base_offset")

    def __init__(self, base_offset: int) -> None:
        self.base_offset = base_offset
        self._offsets = array("Q")
        self._positions = array("Q")
        self._max_ts = array("q")

    def __len__(self) -> int:
        return len(self._offsets)

    def append(self, offset: int, position: int, max_timestamp_before: int = NO_TIMESTAMP) -> None:
        """Add an entry. Offsets and positions must strictly increase."""
        if self._offsets and (offset <= self._offsets[-1] or position <= self._positions[-1]):
            raise ValueError(
                f"index entries must increase: ({offset}, {position}) after "
                f"({self._offsets[-1]}, {self._positions[-1]})"
            )
        if offset < self.base_offset or offset - self.base_offset > 0xFFFFFFFF:
            raise ValueError(f"offset {offset} does not fit segment base {self.base_offset}")
        if position > 0xFFFFFFFF:
            raise ValueError(f"position {position} does not fit in a u32")
        self._offsets.append(offset)
        self._positions.append(position)
        self._max_ts.append(max_timestamp_before)

    def lookup(self, offset: int) -> tuple[int, int] | None:
        """Return the last entry at or below ``offset`` as ``(offset, position)``.

        Falls back to ``(base_offset, 0)`` when no entry is at or below ``offset``; returns
        ``None`` when ``offset`` is below the segment's base.
        """
        if offset < self.base_offset:
            return None
        i = bisect_right(self._offsets, offset)
        if i == 0:
            return self.base_offset, 0
        return self._offsets[i - 1], self._positions[i - 1]

    def entries(self) -> list[tuple[int, int]]:
        """All entries as ``(offset, position)``, oldest first."""
        return list(zip(self._offsets, self._positions, strict=True))

    def last(self) -> tuple[int, int] | None:
        """The newest entry, or ``None``."""
        if not self._offsets:
            return None
        return self._offsets[-1], self._positions[-1]

    def last_max_timestamp(self) -> int:
        """``max_timestamp_before`` of the newest entry (``NO_TIMESTAMP`` when empty)."""
        return self._max_ts[-1] if self._max_ts else NO_TIMESTAMP

    def truncate_entries(self, count: int) -> None:
        """Keep only the first ``count`` entries."""
        del self._offsets[count:]
        del self._positions[count:]
        del self._max_ts[count:]

    def truncate_to_position(self, position: int) -> None:
        """Drop entries at or beyond ``position`` (the log was cut there)."""
        i = bisect_right(self._positions, position - 1) if position > 0 else 0
        self.truncate_entries(i)

    def encode_entry(self, offset: int, position: int, max_timestamp_before: int) -> bytes:
        """The 16 on-disk bytes of one entry."""
        return ENTRY.pack(offset - self.base_offset, position, max_timestamp_before)

    def to_bytes(self) -> bytes:
        """The whole index as stored on disk."""
        return b"".join(
            self.encode_entry(o, p, t)
            for o, p, t in zip(self._offsets, self._positions, self._max_ts, strict=True)
        )

    @classmethod
    def from_bytes(
        cls, data: bytes, base_offset: int, log_size: int, *, strict: bool = True
    ) -> OffsetIndex:
        """Load stored entries, checking they are plausible for a log of ``log_size`` bytes.

        Args:
            data: The stored index.
            base_offset: The segment's base offset.
            log_size: Bytes in the segment's log.
            strict: When false (the active segment after a crash), a torn last entry and
                entries pointing past the log are dropped instead of rejected.

        Raises:
            IndexCorruptError: torn size, non-increasing entries, or a position past the log.
        """
        if len(data) % ENTRY_SIZE:
            if strict:
                raise IndexCorruptError(f"index size {len(data)} is not a multiple of {ENTRY_SIZE}")
            data = data[: len(data) - len(data) % ENTRY_SIZE]
        rows = list(ENTRY.iter_unpack(data))
        rel = [r[0] for r in rows]
        pos = [r[1] for r in rows]
        if not strict:
            keep = bisect_right(pos, log_size - 1) if pos == sorted(pos) else len(pos)
            rows, rel, pos = rows[:keep], rel[:keep], pos[:keep]
        index = cls(base_offset)
        if rel and (rel != sorted(set(rel)) or pos != sorted(set(pos)) or pos[-1] >= log_size):
            raise IndexCorruptError("index entries do not increase or point past the log")
        index._offsets = array("Q", (base_offset + r for r in rel))
        index._positions = array("Q", pos)
        index._max_ts = array("q", (r[2] for r in rows))
        return index
