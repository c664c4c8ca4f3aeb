"""The commands a :class:`~wal.writer.LogWriter` queues for its thread, and how each ends.

Owns the command types (:class:`Append`, :class:`AppendReplicated`, :class:`Flush`,
:class:`Roll`, :class:`ApplyRetention`, :class:`Close`), what one group commit did
(:class:`Written`), and the helpers that settle an append or resolve a command's future on
the loop (:func:`settle`, :func:`resolve`, :func:`fail`). Plain data and plain functions: the
writer's protocol (who queues, who answers, in what order) is in :mod:`wal.writer`.
Imports ``proto.batch``, ``wal.errors`` and ``wal.log``'s ``AppendResult``, nothing that
runs.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from proto.batch import RecordBatch
from wal.errors import DiskFullError
from wal.log import AppendResult

logger = logging.getLogger(__name__)

#: Told how an append ended (its offsets, or why it failed), once, on the loop.
Settled = Callable[["AppendResult | BaseException"], None]


class Append(NamedTuple):
    """Command: append a validated batch; resolve ``future`` when acknowledged.

    A ``NamedTuple`` rather than a frozen dataclass like the other commands: one is built
    per append, and that construction cost is on every producer's path.
    """

    batch: RecordBatch
    future: asyncio.Future[AppendResult]
    on_done: Settled | None = None


@dataclass(frozen=True, slots=True)
class AppendReplicated:
    """Command: write a leader's batches as they are (``Log.append_replicated``), synced
    under the policy as a group commit is, in a write of their own; ``future`` gets the
    log's head after them."""

    batches: list[RecordBatch]
    future: asyncio.Future[int]


@dataclass(frozen=True, slots=True)
class Flush:
    """Command: make everything written durable; ``future`` is ``None`` for timer ticks."""

    future: asyncio.Future[None] | None


@dataclass(frozen=True, slots=True)
class Roll:
    """Command: seal the active segment."""

    future: asyncio.Future[None]


@dataclass(frozen=True, slots=True)
class ApplyRetention:
    """Command: delete what retention allows, never at or past ``floor_offset``; or, with
    ``before`` set, every sealed segment wholly below ``before`` (see ``Log.delete_before``).
    """

    floor_offset: int | None
    future: asyncio.Future[list[int]]
    before: int | None = None


@dataclass(frozen=True, slots=True)
class Truncate:
    """Command: drop every record at or past ``offset`` (``Log.truncate_to``), or with
    ``restart`` every record, the log starting again at ``offset`` (``Log.restart_at``);
    on the loop while the thread waits, as retention is; ``future`` gets the removed
    segments' bases."""

    offset: int
    future: asyncio.Future[list[int]]
    restart: bool = False


@dataclass(frozen=True, slots=True)
class Close:
    """Command: finish everything queued before it, then stop."""

    future: asyncio.Future[None]


Command = Append | AppendReplicated | Flush | Roll | ApplyRetention | Truncate | Close


class Written(NamedTuple):
    """What one group commit on the writer thread did: the results of the batches written
    (a prefix of the group when the disk filled, then ``full`` says why the rest were not),
    the log's head after the write, and the seconds spent writing and syncing (``None``:
    no sync)."""

    results: list[AppendResult]
    head: int
    write_s: float
    sync_s: float | None
    full: DiskFullError | None


def results_from(first_offset: int, batches: list[RecordBatch]) -> list[AppendResult]:
    """Where ``batches`` landed, appended in order from ``first_offset``."""
    results = []
    for batch in batches:
        results.append(AppendResult(first_offset, first_offset + batch.record_count - 1))
        first_offset += batch.record_count
    return results


def settle(append: Append, outcome: AppendResult | BaseException) -> None:
    """End one append: tell its ``on_done``, then resolve its future (unless its caller
    was cancelled meanwhile)."""
    if append.on_done is not None:
        try:
            append.on_done(outcome)
        except Exception:
            logger.exception("an append's on_done callback failed")
    if isinstance(outcome, BaseException):
        fail(append.future, outcome)
    else:
        resolve(append.future, outcome)


def resolve(future: asyncio.Future[Any], value: object) -> None:
    if not future.done():
        future.set_result(value)


def fail(future: asyncio.Future[Any], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)
