"""Offline, read-only inspection of a partition directory.

Role: answer "what is in this log, and is any of it damaged?" without changing a byte, so
an operator can look before a broker's recovery cuts anything. Every segment is scanned in
full (unlike recovery, which trusts data before the newest index entry).

Invariants: opens files read-only through :class:`wal.fs.FileSystem`; never writes,
truncates or removes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from itertools import pairwise

from wal.fs import FileSystem
from wal.naming import LOG_SUFFIX, parse_segment_name, segment_name
from wal.recovery import scan_file


@dataclass(frozen=True, slots=True)
class SegmentReport:
    """What a full scan of one segment found.

    Attributes:
        name: File name of the ``.log``.
        base_offset: Offset the name declares.
        size_bytes: Bytes in the file.
        valid_bytes: Bytes of valid batches from the start.
        batches: Valid batches.
        records: Records in them.
        next_offset: Offset after the last valid record.
        problem: Empty when the whole file is valid, else what stopped the scan.
    """

    name: str
    base_offset: int
    size_bytes: int
    valid_bytes: int
    batches: int
    records: int
    next_offset: int
    problem: str

    @property
    def is_clean(self) -> bool:
        """Whether every byte of the segment is valid."""
        return not self.problem


def inspect_dir(path: str, fs: FileSystem | None = None) -> list[SegmentReport]:
    """Scan every segment of the log in ``path``, oldest first. Changes nothing.

    Raises:
        OSError: the directory or a file cannot be read.
    """
    fs = fs or FileSystem()
    bases = sorted(
        p[0] for n in fs.listdir(path) if (p := parse_segment_name(n)) and p[1] == LOG_SUFFIX
    )
    reports = [_inspect_segment(fs, path, base) for base in bases]
    for i, (prev, nxt) in enumerate(pairwise(reports)):
        if prev.is_clean and prev.next_offset != nxt.base_offset:
            reports[i] = _with_problem(
                prev,
                f"ends at offset {prev.next_offset} but the next segment starts at "
                f"{nxt.base_offset}",
            )
    return reports


def _with_problem(r: SegmentReport, problem: str) -> SegmentReport:
    return SegmentReport(
        r.name,
        r.base_offset,
        r.size_bytes,
        r.valid_bytes,
        r.batches,
        r.records,
        r.next_offset,
        problem,
    )


def _inspect_segment(fs: FileSystem, path: str, base: int) -> SegmentReport:
    name = segment_name(base, LOG_SUFFIX)
    fd = fs.open_readonly(os.path.join(path, name))
    try:
        size = fs.size(fd)
        result = scan_file(fs, fd, 0, size, base)
    finally:
        fs.close(fd)
    problem = (
        ""
        if result.stop.is_clean()
        else (f"{result.stop.value} at byte {result.end}: {result.detail}")
    )
    records = sum(b.next_offset - b.base_offset for b in result.batches)
    return SegmentReport(
        name, base, size, result.end, len(result.batches), records, result.next_offset, problem
    )
