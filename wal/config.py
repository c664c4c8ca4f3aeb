"""Configuration of one log: limits, segment rolling, retention and the fsync policy.

Role: a frozen, validated value. Every field states its unit and default; an invalid value
raises :class:`~wal.errors.WalConfigError` naming the field and what is allowed.

Pure module: imports neither ``asyncio``, ``os`` nor ``time``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from proto.batch import HEADER_SIZE
from wal.errors import WalConfigError
from wal.validate import BatchLimits

KIB = 1024
MIB = 1024 * KIB
_SEGMENT_MAX = 2**31  # positions in the index are u32; keep well inside.
#: The header limits: fields the broker fills from its ``[limits]`` table, not ``[wal]``.
HEADER_LIMITS = ("max_headers_per_record", "max_header_bytes", "max_header_name_bytes")


class FsyncPolicy(enum.Enum):
    """When appended data is forced to stable storage, and so when an append is acknowledged.

    - ``ALWAYS`` (default): fdatasync before every acknowledgement. Concurrent appends share
      one fdatasync (group commit). Survives power loss; costs one disk flush per group.
    - ``INTERVAL``: acknowledge after the write reaches the OS, fdatasync every
      ``fsync_interval_ms``. A power loss can lose up to one interval of acknowledged data;
      a process crash loses nothing.
    - ``NEVER``: acknowledge after the write reaches the OS; the OS flushes when it likes.
      A power loss can lose anything not yet written back; a process crash loses nothing.

    The high-water mark (what consumers may read) advances only over data that is durable
    under the policy: after the fdatasync for ``ALWAYS`` and ``INTERVAL``, after the write
    for ``NEVER``. So consumers never see a record that a power loss could take back, except
    under ``NEVER``.
    """

    ALWAYS = "always"
    INTERVAL = "interval"
    NEVER = "never"

    def is_always(self) -> bool:
        """Whether every acknowledgement waits for fdatasync."""
        return self is FsyncPolicy.ALWAYS


@dataclass(frozen=True, slots=True)
class LogConfig:
    """Settings of one partition's log.

    Attributes:
        segment_bytes: Roll the active segment before it would exceed this size, in bytes.
            Default 128 MiB; from 128 B (tests roll at ~512 B) to 2 GiB.
        segment_ms: Roll the active segment once it is this old (ms since its first append in
            this process); ``None`` (default) rolls by size only.
        index_interval_bytes: Add a sparse index entry after this many bytes. Default 4 KiB.
            Smaller means faster lookups and recovery, a bigger ``.index``.
        max_record_bytes: Largest key + value + headers of one record, bytes. Default 1 MiB.
        max_batch_bytes: Largest encoded batch, bytes. Default 16 MiB.
        retention_ms: Delete sealed segments whose newest record is older, ms; ``None``
            (default) keeps them.
        retention_bytes: Delete oldest sealed segments while the log without them still
            holds at least this many bytes (Kafka's rule: never below the limit);
            ``None`` (default) keeps them.
        fsync: When data is forced to disk; see :class:`FsyncPolicy`. Default ``ALWAYS``.
        fsync_interval_ms: Period of the ``INTERVAL`` policy, ms. Default 100.
        max_group_bytes: Most bytes one group commit writes with one fdatasync. Default 32 MiB.
        tail_cache_bytes: The newest batches kept in memory, bytes, so that every reader
            near the head (each subscription of a topic) shares one copy instead of reading
            the file. Default 1 MiB per partition; 0 turns the cache off.
        max_headers_per_record: Most headers of one record; ``None`` (default) no limit.
        max_header_bytes: Most bytes of one record's header names and values; ``None``
            (default) no limit.
        max_header_name_bytes: Longest header name, bytes; ``None`` (default) no limit.
            The broker sets these three from its ``[limits]`` table (same key names).
    """

    segment_bytes: int = 128 * MIB
    segment_ms: int | None = None
    index_interval_bytes: int = 4 * KIB
    max_record_bytes: int = 1 * MIB
    max_batch_bytes: int = 16 * MIB
    retention_ms: int | None = None
    retention_bytes: int | None = None
    fsync: FsyncPolicy = FsyncPolicy.ALWAYS
    fsync_interval_ms: int = 100
    max_group_bytes: int = 32 * MIB
    tail_cache_bytes: int = 1 * MIB
    max_headers_per_record: int | None = None
    max_header_bytes: int | None = None
    max_header_name_bytes: int | None = None

    def __post_init__(self) -> None:
        for name, (lo, hi) in RANGES.items():
            _positive(name, getattr(self, name), lo, hi)
        for name in OPTIONAL:
            _optional(name, getattr(self, name))
        for name in HEADER_LIMITS:
            if getattr(self, name) is not None:
                _positive(name, getattr(self, name), 0, 256 * MIB)
        if not isinstance(self.fsync, FsyncPolicy):
            raise WalConfigError(
                "fsync", self.fsync, "must be one of " + ", ".join(p.value for p in FsyncPolicy)
            )

    @property
    def limits(self) -> BatchLimits:
        """The limits applied to each appended batch."""
        return BatchLimits(
            self.max_record_bytes,
            self.max_batch_bytes,
            self.max_headers_per_record,
            self.max_header_bytes,
            self.max_header_name_bytes,
        )


#: Allowed range of each integer setting, inclusive (the configuration reference reads it).
RANGES: dict[str, tuple[int, int]] = {
    "segment_bytes": (128, _SEGMENT_MAX),
    "index_interval_bytes": (1, _SEGMENT_MAX),
    "max_record_bytes": (1, 256 * MIB),
    "max_batch_bytes": (HEADER_SIZE + 64, 256 * MIB),
    "fsync_interval_ms": (1, 3_600_000),
    "max_group_bytes": (1, 1024 * MIB),
    "tail_cache_bytes": (0, 1024 * MIB),
}
#: Settings that are off when ``None`` and otherwise a positive integer, with no upper bound.
OPTIONAL = ("segment_ms", "retention_ms", "retention_bytes")


def _positive(field: str, value: object, lo: int, hi: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise WalConfigError(field, value, f"must be an integer from {lo} to {hi}")


def _optional(field: str, value: object) -> None:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise WalConfigError(field, value, "must be a positive integer, or None to disable")
