"""A subscription's state file: its format, its versions, and fitting it to the logs.

Owns the document a subscription's state is saved as (:class:`StateDoc`), its encoding
(:func:`encode`, :func:`decode`, which checks the version and the enum values) and the two
conversions to and from the state machine's :class:`~dispatcher.protocol.PartitionSnapshot`
(:func:`partition_doc`, :func:`restore`, which fits saved offsets to what the logs hold).
Where the documents are kept (a checkpoint file per subscription and a journal per topic)
is :mod:`dispatcher.cursor_store`'s and :mod:`dispatcher.cursor_journal`'s. The format
(version 3)::

    {"version": 3, "seq": 41, "topic": "orders", "subscription": "billing",
     "type": "shared", "mode": "at_least_once",
     "partitions": [{"cursor": 1200, "acked": [[1205, 1210]], "delivered": 1300,
                     "failures": [[1200, 1201, 3, "timeout", [1700000000000, ...]]]}, ...],
     "committer": "spark"}

A partition whose failure runs a consumer rejected (a nack with ``dead_letter``, waiting
for the poison policy) also has ``"rejected": [[1200, 1201]]``, those runs' ranges.
``committer`` (who commits to the subscription by offset, see
:attr:`~dispatcher.subscription.Subscription.committer`) is written only when set. Both are
left out otherwise, so such a file is what an older broker wrote and reads.

``seq`` orders the saved states of the store (the newest wins, see
:mod:`dispatcher.cursor_journal`). Version 2 files (no ``seq``: 0) and version 1 files
(no ``mode``, ``delivered`` or ``failures`` either) are read as well.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import msgspec

from dispatcher.protocol import (
    DeliveryMode,
    FailureRun,
    PartitionSnapshot,
    SubscriptionType,
)
from wal import LogWriter

logger = logging.getLogger(__name__)

#: The file name suffix of a subscription's state file.
SUFFIX = ".json"
#: The version written.
VERSION = 3
#: The versions read.
READABLE_VERSIONS = (1, 2, 3)


class FailureDoc(msgspec.Struct, array_like=True, forbid_unknown_fields=True):
    begin: int
    end: int
    deliveries: int
    reason: str
    times_ms: list[int]


class PartitionDoc(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    cursor: int
    acked: list[tuple[int, int]] = []
    delivered: int = 0
    failures: list[FailureDoc] = []
    #: The ``[begin, end)`` of each failure run a consumer rejected (written when any).
    rejected: list[tuple[int, int]] = []


class StateDoc(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    version: int
    topic: str
    subscription: str
    type: str
    partitions: list[PartitionDoc]
    mode: str = DeliveryMode.AT_LEAST_ONCE.value
    seq: int = 0
    #: Who commits to it by offset (AckUpTo's committer, e.g. "spark"); "" none.
    committer: str = ""
    #: A replicated topic's dead-letter queue of this subscription holds no entry below
    #: this sequence (its acks, purges and evictions, replicated with the state); 0: no
    #: removal saved here (a factor-1 queue keeps its own ``state.json`` only).
    dlq_first: int = 0


_decoder = msgspec.json.Decoder(StateDoc)
_encoder = msgspec.json.Encoder()


def encode(doc: StateDoc) -> bytes:
    """The file's bytes."""
    return _encoder.encode(doc)


def decode(data: bytes) -> StateDoc:
    """The document in ``data``.

    Raises:
        ValueError: not a state document, an unknown version, type or mode (the message
            says which).
    """
    try:
        doc = _decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise ValueError(str(exc)) from exc
    check(doc)
    return doc


def check(doc: StateDoc) -> None:
    """Raise ValueError unless ``doc``'s version, type and mode are known ones."""
    if doc.version not in READABLE_VERSIONS:
        raise ValueError(f"version {doc.version} is not one of {READABLE_VERSIONS}")
    SubscriptionType(doc.type)
    DeliveryMode(doc.mode)


def restore(
    doc: StateDoc | None,
    writers: Sequence[LogWriter],
    topic: str,
    name: str,
    *,
    ends: Sequence[int] | None = None,
) -> list[PartitionSnapshot]:
    """Persisted state per partition from ``doc``, fitted to what the logs hold: below
    each log's high watermark, or ``ends`` when given (a promoted replica's durable ends:
    its uncommitted tail is committed in its new epoch, so a cursor there stays)."""
    snaps = []
    for i, writer in enumerate(writers):
        saved = doc.partitions[i] if doc is not None and i < len(doc.partitions) else None
        if saved is None:
            snaps.append(PartitionSnapshot(writer.first_offset))
            continue
        head = writer.high_water_mark if ends is None else ends[i]
        cursor = max(saved.cursor, writer.first_offset)
        if cursor > head:
            logger.warning(
                "%s/%s partition %d: saved cursor %d is past the head %d; using the head",
                topic,
                name,
                i,
                cursor,
                head,
            )
            cursor = head
        acked = tuple((b, min(e, head)) for b, e in saved.acked if b < min(e, head))
        rejected = {begin for begin, _end in saved.rejected}
        failures = tuple(
            FailureRun(
                f.begin,
                min(f.end, head),
                f.deliveries,
                f.reason,
                tuple(f.times_ms),
                f.begin in rejected,
            )
            for f in saved.failures
            if f.begin < min(f.end, head)
        )
        snaps.append(PartitionSnapshot(cursor, acked, min(saved.delivered, head), failures))
    return snaps


def partition_doc(snap: PartitionSnapshot) -> PartitionDoc:
    return PartitionDoc(
        cursor=snap.cursor,
        acked=list(snap.acked),
        delivered=snap.delivered,
        failures=[
            FailureDoc(f.begin, f.end, f.deliveries, f.reason, list(f.times_ms))
            for f in snap.failures
        ],
        rejected=[(f.begin, f.end) for f in snap.failures if f.rejected],
    )
