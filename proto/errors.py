"""Every error the record batch codec raises, under one root: :class:`BatchError`.

Role: the typed vocabulary of a batch that breaks the wire format, for every side of the
wire: a producer that encodes, the broker that checks what it is sent, a consumer or the
log that decodes. The messages speak of the format (fields, byte positions, the rule that
was broken), never of one program's remedies, because a client in any language reads them
in a gRPC status. Callers that own a remedy (the log: "nothing was appended") subclass or
wrap these errors and add it.

Invariants:
- Each class is raised for exactly one cause, named in its docstring.
- Errors carry the facts as fields (``reason``, ``field``, ``position``, CRCs).
- ``BatchError`` is a ``ValueError``: a batch is a value, and a bad one is a bad value.

Pure module: imports nothing of ours, and neither ``asyncio``, ``os`` nor ``time``.
"""

from __future__ import annotations


class BatchError(ValueError):
    """Root of every error raised by the record batch codec (:mod:`proto.batch`)."""


class InvalidBatchError(BatchError):
    """Raised when a batch, or the columns offered to encode one, break a rule of the format.

    ``field`` names the batch field that broke the rule (``"base_offset"``,
    ``"max_timestamp_ms"``, ``"key_validity"``, ...), or is ``None`` when no one field is to
    blame; ``reason`` says what was wrong.
    """

    def __init__(self, reason: str, *, field: str | None = None) -> None:
        self.reason = reason
        self.field = field
        super().__init__(f"invalid record batch: {reason}")


class EmptyBatchError(InvalidBatchError):
    """Raised when a batch would hold no records (``record_count`` must be at least 1)."""

    def __init__(self) -> None:
        super().__init__("a batch must hold at least one record", field="record_count")


class CorruptBatchError(BatchError):
    """Raised when bytes that should hold a batch fail the magic, length, CRC or layout check.

    ``position`` is the byte position of the batch in the buffer that was decoded.
    ``field`` names the header field at fault when one is (``"crc32c"``, ``"flags"``, ...).
    ``expected_crc`` / ``actual_crc`` are set when the checksum did not match.
    """

    def __init__(
        self,
        position: int,
        reason: str,
        *,
        field: str | None = None,
        expected_crc: int | None = None,
        actual_crc: int | None = None,
    ) -> None:
        self.position = position
        self.reason = reason
        self.field = field
        self.expected_crc = expected_crc
        self.actual_crc = actual_crc
        detail = reason
        if expected_crc is not None and actual_crc is not None:
            detail = f"{reason} (stored crc32c {expected_crc:#010x}, computed {actual_crc:#010x})"
        super().__init__(f"corrupt record batch at byte {position}: {detail}")
