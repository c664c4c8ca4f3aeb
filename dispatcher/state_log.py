"""A replicated topic's subscription-state log: its records and how they are replayed.

Role: the format of the ``state`` log of a replicated topic's replica group (issue 37:
"the cursor journal, delivery counts and each dead-letter queue become logs of the
topic's replica group, committed the same way") and the replay that turns it back into
one state per subscription. Where the log lives and who appends to it are the broker's
(``broker.replica.state_log``); the cursor store appends through a :class:`StateSink`.
Pure: no I/O, no ``asyncio``.

The records. Each is one wal record whose value is a cursor-journal frame
(:func:`dispatcher.cursor_journal.frame`: magic, length, CRC-32C, JSON entries of
``seq``, ``subscription`` and the state document or null for a tombstone):

- a *delta* (key ``None``): the entries one cursor-store flush of the topic wrote to its
  journal, or one delete's tombstone;
- a *snapshot* (key :data:`SNAPSHOT_KEY`): every subscription of the topic, as a
  checkpoint writes them; a subscription not in it does not exist. The leader writes
  one when it begins to lead and at every checkpoint of the topic, then deletes the
  log's segments wholly before it.

The replay rule (:func:`replay`): start from the last snapshot (or the log's first
record when none is held), apply every later record in log order (a later entry of a
subscription replaces an earlier one; a tombstone removes it). Log order is save
order: the store writes one flush at a time and numbers its states in that order.

Worked example: records ``0: snapshot {a@10, b@4}``, ``1: delta {a@12}``,
``2: delta {b: tombstone}``, ``3: delta {c@0}`` replay to ``{a@12, c@0}``; a log that
holds only records 1-3 (the snapshot's segment deleted on this replica) replays to the
same, since the snapshot's successor segments start after it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

from dispatcher import cursor_journal, state_file

#: The key of a snapshot record (deltas have none).
SNAPSHOT_KEY = b"snapshot"
#: The log id of the state log in the replication protocol.
LOG_ID = "state"


class StateSink(Protocol):
    """Where a leader's cursor store appends a replicated topic's saves."""

    async def append(self, value: bytes, *, snapshot: bool) -> int:
        """Append one record (durable on this broker when it returns); its offset."""
        ...

    async def committed(self, offset: int) -> None:
        """Return once ``offset`` is committed (below the log's high watermark).

        Raises:
            Exception: it may never be (leadership lost, too few in-sync replicas).
        """
        ...

    async def trim_before(self, offset: int) -> None:
        """Delete the log's segments wholly before ``offset`` (a snapshot's)."""
        ...


def record_value(entries: Iterable[cursor_journal.Entry]) -> bytes:
    """The value of one state-log record holding ``entries``."""
    return cursor_journal.frame(entries)


def replay(
    records: Sequence[tuple[bytes | None, bytes]],
) -> dict[str, state_file.StateDoc] | None:
    """Every subscription's state as ``records`` (``(key, value)`` in log order) say;
    ``None`` when there are none (the log never held a save).

    Raises:
        ValueError: a record is not one frame of whole entries (a replica's log is
            CRC-checked batch by batch, so this is a bug or foreign data).
    """
    if not records:
        return None
    start = 0
    for index, (key, _value) in enumerate(records):
        if key == SNAPSHOT_KEY:
            start = index
    states: dict[str, state_file.StateDoc] = {}
    for key, value in records[start:]:
        parsed = cursor_journal.parse(value)
        if parsed.torn_bytes or parsed.damaged:
            raise ValueError(f"a state-log record is not a whole frame ({len(value)} bytes)")
        if key == SNAPSHOT_KEY:
            states = {}
        for entry in parsed.entries:
            if entry.state is None:
                states.pop(entry.subscription, None)
            else:
                states[entry.subscription] = entry.state
    return states
