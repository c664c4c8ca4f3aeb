"""The record: the unit a producer publishes and a consumer receives.

Role: a plain value type. A record has a key (or none), a value, headers and a timestamp.
Records travel and are stored in :mod:`proto.batch` record batches; this module knows
nothing of bytes.

Pure module: imports nothing of ours, and neither ``asyncio``, ``os`` nor ``time``.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Record:
    """One record.

    Attributes:
        value: The payload.
        key: Partitioning key, or ``None``. An empty key is a key, distinct from ``None``.
        headers: Header names (UTF-8 strings) to binary values.
        timestamp_ms: Milliseconds since the Unix epoch, set by the producer or the broker.
    """

    value: bytes
    key: bytes | None = None
    headers: dict[str, bytes] = field(default_factory=dict)
    timestamp_ms: int = 0

    @property
    def size(self) -> int:
        """Bytes of key, value and headers: the figure ``max_record_bytes`` limits."""
        n = len(self.value) + (len(self.key) if self.key is not None else 0)
        for name, val in self.headers.items():
            n += len(name.encode()) + len(val)
        return n
