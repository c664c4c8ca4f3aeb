"""Helpers shared by the log's tests: a filesystem whose process can "die", and a dense
read of a whole log."""

from __future__ import annotations

from collections.abc import Sequence

from wal import Fault, FaultyFs, Log, RecordBatch


class CrashableFs(FaultyFs):
    """A FaultyFs that tracks open descriptors, so a "dead" process can drop them unsynced."""

    def __init__(
        self, *, faults: Sequence[Fault] = (), crash_at: str | None = None, page_size: int = 4096
    ) -> None:
        super().__init__(faults=faults, crash_at=crash_at, page_size=page_size)
        self.open_fds: set[int] = set()

    def open(self, path: str, *, create: bool = False, exclusive: bool = False) -> int:
        fd = super().open(path, create=create, exclusive=exclusive)
        self.open_fds.add(fd)
        return fd

    def close(self, fd: int) -> None:
        self.open_fds.discard(fd)
        super().close(fd)

    def die(self) -> None:
        """Close every descriptor still open, without any sync: what process death does."""
        for fd in sorted(self.open_fds):
            super().close(fd)
        self.open_fds.clear()


def read_all(log: Log, start: int | None = None) -> list[RecordBatch]:
    """Every batch from ``start`` (default: the first offset) to the head, checked dense."""
    offset = log.first_offset if start is None else start
    out: list[RecordBatch] = []
    while offset < log.head:
        got = log.read(offset)
        assert got, f"read at {offset} returned nothing below head {log.head}"
        for b in got:
            assert b.base_offset == offset, f"expected a batch at {offset}, got {b.base_offset}"
            offset = b.next_offset
        out += got
    return out
