"""The tail cache: the newest committed batches of one log, kept in memory.

Role: serve reads near the head without touching the file. Every subscription of a topic
reads the batch a group commit just wrote; without the cache each of them preads it, walks
the index to it and checks its CRC on its own, so 100 subscriptions cost 100 reads of the
same bytes. The writer adds each committed batch once, as the producer sent it, with the
base offset the log assigned; the first read of it patches that offset into a copy of its
bytes (one copy per batch, and none for a batch nobody reads before it is evicted, so the
commit path pays nothing for readers that are not there; a batch over a buffer that is not
``bytes`` of exactly the batch, which its owner may reuse or which holds more, is copied at
once), and from then on readers share the same immutable
:class:`~proto.batch.RecordBatch` objects and the same ``bytes``.

Invariants:
- The cached batches are consecutive: each starts where the one before ends. A batch that
  does not follow on (which the single writer never produces) empties the cache first.
- Only batches the writer has written are added, so a read bounded by the high-water mark
  returns exactly what the file would.
- It never holds more than ``max_bytes`` (0 disables it), counting each batch as its size
  plus :data:`ENTRY_OVERHEAD_BYTES`, the Python objects that carry it; the oldest go first.
  Counting the bytes alone let 1 MiB of 100-byte batches take about 8 MiB.

Not task-safe on its own: the writer adds (in its completions, on the loop) and the event
loop reads, both on one loop.
"""

from __future__ import annotations

import struct
from bisect import bisect_right
from collections.abc import Sequence

from proto.batch import RecordBatch

_BASE = struct.Struct("<Q")
#: What one cached batch costs beyond its bytes: its ``RecordBatch`` and ``Layout`` tuples,
#: the memoryview, the ``bytes`` header and the list slots (tracemalloc: ~700 bytes for a
#: one-record batch on CPython 3.11), rounded up.
ENTRY_OVERHEAD_BYTES = 768


class TailCache:
    """The newest batches of one log, up to ``max_bytes`` of them."""

    __slots__ = ("_bases", "_batches", "_bytes", "_charged", "_max_bytes", "_ready", "_start")

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be at least 0, not {max_bytes}")
        self._max_bytes = max_bytes
        self._batches: list[RecordBatch] = []
        self._bases: list[int] = []
        self._ready = bytearray()  # 1: that batch's bytes carry its assigned base offset
        self._start = 0  # index of the oldest live entry; entries before it are evicted
        self._bytes = 0
        self._charged = 0  # _bytes plus ENTRY_OVERHEAD_BYTES per batch: what max_bytes bounds

    @property
    def first_offset(self) -> int | None:
        """The first offset held, or ``None`` when empty."""
        return self._bases[self._start] if self._start < len(self._bases) else None

    @property
    def next_offset(self) -> int | None:
        """The offset just past the last batch held, or ``None`` when empty."""
        if self._start >= len(self._batches):
            return None
        return self._bases[-1] + self._batches[-1].record_count

    @property
    def size_bytes(self) -> int:
        """Bytes of the batches held."""
        return self._bytes

    def add(self, batches: Sequence[RecordBatch], base_offsets: Sequence[int]) -> None:
        """Hold ``batches``, just written at ``base_offsets`` (their bytes still carry the
        producer's base offset; the first read of each patches in the assigned one).

        Runs on the loop once per group commit, for every batch: no copy here."""
        if self._max_bytes == 0:
            return
        fits = self._max_bytes - ENTRY_OVERHEAD_BYTES
        cached, bases, ready = self._batches, self._bases, self._ready
        added = count = 0  # bytes and batches held since the last clear
        for batch, base in zip(batches, base_offsets, strict=True):
            size = len(batch.buffer)
            if size > fits:
                self.clear()  # too big to hold; the next batch starts the cache afresh
                added = count = 0
                continue
            if self._start < len(cached) and bases[-1] + cached[-1].record_count != base:
                self.clear()
                added = count = 0
            cached.append(batch)
            bases.append(base)
            ready.append(0)
            owner = batch.buffer.obj
            if type(owner) is not bytes or len(owner) != size:
                # Its owner may reuse the buffer, or hold more than this batch (a read's
                # buffer): copy now, so the cache holds only what it charges for.
                self._patched(len(cached) - 1)
            added += size
            count += 1
        self._bytes += added
        self._charged += added + ENTRY_OVERHEAD_BYTES * count
        self._evict()

    def read(self, offset: int, max_bytes: int, upper: int) -> list[RecordBatch] | None:
        """Batches from the one holding ``offset``, as ``Log.read`` returns them: the first
        whole even past ``max_bytes``, then more while they fit, none starting at or past
        ``upper``. ``None`` when the cache does not hold ``offset`` (read the file)."""
        first = self.first_offset
        if first is None or offset < first or offset >= upper:
            return None
        bases, batches = self._bases, self._batches
        i = bisect_right(bases, offset, self._start) - 1
        if offset >= bases[i] + batches[i].record_count:
            return None  # past the newest batch held
        out = [self._patched(i)]
        budget = max_bytes - len(batches[i].buffer)
        for j in range(i + 1, len(batches)):
            size = len(batches[j].buffer)
            if bases[j] >= upper or size > budget:
                break
            out.append(self._patched(j))
            budget -= size
        return out

    def _patched(self, i: int) -> RecordBatch:
        """Entry ``i`` with its assigned base offset in its own bytes (patched once, then
        shared by every reader)."""
        batch = self._batches[i]
        if not self._ready[i]:
            base = self._bases[i]
            view = memoryview(_BASE.pack(base) + batch.buffer[8:])
            batch = self._batches[i] = RecordBatch._make((view, base, *batch[2:]))
            self._ready[i] = 1
        return batch

    def clear(self) -> None:
        """Forget every batch."""
        self._batches.clear()
        self._bases.clear()
        self._ready.clear()
        self._start = 0
        self._bytes = 0
        self._charged = 0

    def _evict(self) -> None:
        batches = self._batches
        start, charged, held = self._start, self._charged, self._bytes
        while charged > self._max_bytes:  # locals: this runs for every batch added
            size = len(batches[start].buffer)
            held -= size
            charged -= size + ENTRY_OVERHEAD_BYTES
            start += 1
        self._start, self._charged, self._bytes = start, charged, held
        if self._start > 64 and self._start * 2 > len(batches):
            del batches[: self._start]
            del self._bases[: self._start]
            del self._ready[: self._start]
            self._start = 0
