"""Every error the write-ahead log raises, under one root: :class:`WalError`.

The record batch codec's own errors (:class:`BatchError` and its subclasses
:class:`InvalidBatchError`, :class:`EmptyBatchError`, :class:`CorruptBatchError`) belong to
the wire contract, :mod:`proto.errors`, and are re-exported here (the same classes) because
the log raises them too. A batch the log refuses is a :class:`BatchRejectedError`, both a
:class:`WalError` and an :class:`InvalidBatchError`.

Role: the typed vocabulary of failure for ``wal``. Callers (the broker's status table, the
CLI) branch on these classes and read their fields; they never parse messages.

Invariants:
- Each class is raised for exactly one cause, named in its docstring.
- Errors carry the facts as fields (offsets, positions, sizes, limits), and the message says
  what was wrong and what to do about it.
- Foreign exceptions (``OSError``) are translated once, at the layer edge, with
  ``raise WalIOError(...) from exc``.

Pure module: imports only :mod:`proto.errors`, and neither ``asyncio``, ``os`` nor
``time``.
"""

from __future__ import annotations

import errno as _errno

from proto.errors import BatchError, CorruptBatchError, EmptyBatchError, InvalidBatchError

__all__ = [
    "DISK_FULL_ERRNOS",
    "BatchError",
    "BatchRejectedError",
    "BatchTooLargeError",
    "CorruptBatchError",
    "CorruptSegmentError",
    "DataDirLockedError",
    "DiskFullError",
    "EmptyBatchError",
    "HeaderLimitError",
    "IndexCorruptError",
    "InvalidBatchError",
    "LeaderEpochsCorruptError",
    "NotBatchBoundaryError",
    "OffsetOutOfRangeError",
    "RecordTooLargeError",
    "ReplicaOffsetMismatchError",
    "WalClosedError",
    "WalConfigError",
    "WalError",
    "WalFailedError",
    "WalIOError",
    "io_error",
]

#: errno values that mean the filesystem is full: no space (ENOSPC) or over quota (EDQUOT).
DISK_FULL_ERRNOS = frozenset({_errno.ENOSPC, _errno.EDQUOT})


class WalError(Exception):
    """Root of every error raised by the ``wal`` package."""


class WalConfigError(WalError, ValueError):
    """Raised when a configuration value is out of range or of the wrong kind."""

    def __init__(self, field: str, value: object, requirement: str) -> None:
        self.field = field
        self.value = value
        self.requirement = requirement
        super().__init__(f"invalid WAL setting {field}={value!r}: {requirement}")


class BatchRejectedError(WalError, InvalidBatchError):
    """Raised when the log refuses a batch offered for append; nothing was appended.

    It is both a :class:`WalError` and the codec's
    :class:`~proto.errors.InvalidBatchError`: ``reason`` and ``field`` are the codec's
    (which rule, which field), and the message adds what the log did (nothing).
    """

    def __init__(self, reason: str, *, field: str | None = None, message: str = "") -> None:
        InvalidBatchError.__init__(self, reason, field=field)
        Exception.__init__(self, message or f"invalid record batch: {reason}; nothing was appended")


class RecordTooLargeError(BatchRejectedError):
    """Raised when one record's key, value and headers exceed ``max_record_bytes``."""

    def __init__(self, index: int, size: int, limit: int) -> None:
        self.index = index
        self.size = size
        self.limit = limit
        super().__init__(
            "record too large",
            message=f"record {index} of the batch is {size} bytes, over the limit of {limit} "
            "bytes (max_record_bytes); split the value or raise the limit; nothing was appended",
        )


class BatchTooLargeError(BatchRejectedError):
    """Raised when an encoded batch exceeds ``max_batch_bytes``."""

    def __init__(self, size: int, limit: int) -> None:
        self.size = size
        self.limit = limit
        super().__init__(
            "batch too large",
            field="batch_length",
            message=f"record batch is {size} bytes, over the limit of {limit} bytes "
            "(max_batch_bytes); send smaller batches; nothing was appended",
        )


class HeaderLimitError(BatchRejectedError):
    """Raised when one record's headers break a header limit: too many headers, too many
    header bytes, or too long a header name. ``setting`` names the limit: the broker sets
    these from its ``[limits]`` table, under the same key."""

    def __init__(self, index: int, setting: str, found: str, limit: int) -> None:
        self.index = index
        self.setting = setting
        self.limit = limit
        super().__init__(
            "headers over a limit",
            message=f"record {index} has {found}; the limit is {limit} ([limits] {setting}); "
            "send fewer or smaller headers; nothing was appended",
        )


class ReplicaOffsetMismatchError(WalError):
    """Raised when a follower is given a leader's batch that does not start where its log
    goes on: the first one not at the log's head, or a later one not right after the batch
    before it (a gap or an overlap); nothing was appended.

    ``index`` is the batch's position among those given (0: the first), ``expected`` the
    offset it had to start at, ``found`` its base offset.
    """

    def __init__(self, index: int, expected: int, found: int) -> None:
        self.index = index
        self.expected = expected
        self.found = found
        what = "a gap" if found > expected else "an overlap"
        where = (
            f"the follower's log ends at {expected}"
            if index == 0
            else f"the batch before it ends at {expected}"
        )
        super().__init__(
            f"replicated batch {index} starts at offset {found}, but {where} ({what} of "
            f"{abs(found - expected)} records); fetch again from the log's head; nothing "
            "was appended"
        )


class CorruptSegmentError(WalError):
    """Raised when a read meets damaged data inside a segment; reads stop there.

    The log never skips past damage silently. Run ``headrace wal inspect`` on the partition
    directory to see the damage, then restore the segment or truncate the log deliberately.
    """

    def __init__(self, path: str, base_offset: int, position: int, reason: str) -> None:
        self.path = path
        self.base_offset = base_offset
        self.position = position
        self.reason = reason
        super().__init__(
            f"segment {path} (base offset {base_offset}) is damaged at byte {position}: "
            f"{reason}; reads stop here; restore the segment from a replica or backup"
        )


class IndexCorruptError(WalError):
    """Raised by :meth:`wal.index.OffsetIndex.from_bytes` when stored entries are implausible;
    the caller rebuilds the index from the log."""


class OffsetOutOfRangeError(WalError):
    """Raised when a read asks for an offset below the first retained offset or past the head."""

    def __init__(self, offset: int, first_offset: int, head: int) -> None:
        self.offset = offset
        self.first_offset = first_offset
        self.head = head
        super().__init__(
            f"offset {offset} is out of range: the log holds offsets [{first_offset}, {head}); "
            "seek to a retained offset"
        )


class NotBatchBoundaryError(WalError, ValueError):
    """Raised when :meth:`wal.log.Log.truncate_to` is given an offset inside a batch; the
    log is left unchanged."""

    def __init__(self, path: str, offset: int, batch_base: int, batch_next: int) -> None:
        self.path = path
        self.offset = offset
        self.batch_base = batch_base
        self.batch_next = batch_next
        super().__init__(
            f"log {path}: cannot truncate to offset {offset}: it falls inside the batch "
            f"[{batch_base}, {batch_next}); truncate to a batch boundary ({batch_base} or "
            f"{batch_next}); nothing was changed"
        )


class LeaderEpochsCorruptError(WalError):
    """Raised when a partition's ``leader-epochs`` file is torn, fails its checksum or
    holds entries that do not increase; it is never read as empty."""

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(
            f"leader-epochs file {path} is damaged: {reason}; restore it from a backup, or "
            "(a replicated topic only) empty this partition's directory so that it "
            "re-replicates from the leader; "
            "the log was not opened"
        )


class WalClosedError(WalError):
    """Raised when an operation is attempted on a log or writer that has been closed."""

    def __init__(self, path: str) -> None:
        self.path = path
        super().__init__(f"log {path} is closed")


class WalIOError(WalError):
    """Raised when the filesystem reports an error (EIO, EROFS, EACCES, ...) on ``path``.

    Build one from an ``OSError`` with :func:`io_error`, which picks :class:`DiskFullError`
    when the disk is full and names the file the OS names.
    """

    def __init__(self, op: str, path: str, errno: int | None, detail: str) -> None:
        self.op = op
        self.path = path
        self.errno = errno
        super().__init__(f"{op} failed on {path}: {detail}")


class DiskFullError(WalIOError):
    """Raised when a write finds the filesystem full (ENOSPC or EDQUOT).

    What the write began was cut back, so nothing torn stays behind, and the log stays
    healthy: the next write tries the disk again, so writes resume by themselves once space
    is freed. ``written`` counts the batches of one append call that were written whole
    before the disk filled (a call whose batches span a segment roll); the rest were not.
    """

    def __init__(self, op: str, path: str, errno: int | None, *, written: int = 0) -> None:
        self.written = written
        cause = _errno.errorcode.get(errno or 0, "ENOSPC")
        WalIOError.__init__(
            self,
            op,
            path,
            errno,
            f"the disk is full ({cause}); nothing of this write was kept; free space on "
            "that filesystem, then retry",
        )


def io_error(op: str, path: str, exc: OSError, *, written: int = 0) -> WalIOError:
    """The typed error for ``exc``, raised while doing ``op`` on ``path``.

    Args:
        op: What was being done ("append", "open", "save state").
        path: The file or directory worked on; the file the OS names wins when it names one.
        exc: The error the OS raised.
        written: For appends, the batches written whole before the error.

    Returns:
        A :class:`DiskFullError` when the disk is full, else a :class:`WalIOError`.
    """
    where = exc.filename if isinstance(exc.filename, str) and exc.filename else path
    if exc.errno in DISK_FULL_ERRNOS:
        return DiskFullError(op, where, exc.errno, written=written)
    cause = exc.strerror or str(exc)
    name = _errno.errorcode.get(exc.errno or 0)
    return WalIOError(op, where, exc.errno, f"{cause} ({name})" if name else cause)


class WalFailedError(WalError):
    """Raised by every append after an I/O error latched the log as failed.

    Nothing half-written was acknowledged. Reopening the log recovers it (the torn tail is
    cut and kept in a ``.broken`` file); free disk space or replace the disk first.
    """

    def __init__(self, path: str, cause: str) -> None:
        self.path = path
        self.cause = cause
        super().__init__(
            f"log {path} failed and refuses writes: {cause}; fix the disk, then reopen the log "
            "(restart the broker) to recover"
        )


class DataDirLockedError(WalError):
    """Raised when another process holds a data directory's lock (one broker per
    directory)."""

    def __init__(self, path: str, pid: int | None) -> None:
        self.path = path
        self.pid = pid
        holder = f"pid {pid}" if pid is not None else "a process whose pid is unknown"
        super().__init__(
            f"data directory {path} is in use by another headrace broker ({holder}); stop "
            "it, or give this one another --data-dir"
        )
