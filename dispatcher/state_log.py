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
- a *snapshot*: every subscription of the topic, as a checkpoint writes them; a
  subscription not in it does not exist. The leader writes one when it begins to lead
  and at every checkpoint of the topic, then deletes the log's segments wholly before
  it. A snapshot is one record (key :data:`SNAPSHOT_KEY`) or, when its entries are
  more than :data:`RECORD_BYTES`, a series of *chunks*, consecutive records keyed
  ``snapshot/<id>/<index>/<count>`` (:func:`chunk_key`), each of at most
  :data:`RECORD_BYTES` (one entry bigger than that alone in its chunk): a record must
  travel in one ``ReplicaFetch`` answer, far below gRPC's message limits.
  A delta of more than :data:`RECORD_BYTES` is likewise several delta records.

The replay rule (:func:`replay`): start from the last *complete* snapshot (or the log's
first record when none is held), apply every later record in log order (a later entry
of a subscription replaces an earlier one; a tombstone removes it). Log order is save
order: the store writes one flush at a time and numbers its states in that order.
A chunked snapshot is complete when its chunks ``0 .. count-1`` of one id are there,
consecutive, in order. A series cut short (the leader crashed or lost leadership
between chunks, and its successor's log goes on after the last chunk it got) is not a
snapshot: its chunks apply as deltas (each entry is that subscription's state when it
was written), over the previous snapshot and the records between, and a subscription
it leaves out still exists.

Worked example: records ``0: snapshot {a@10, b@4}``, ``1: delta {a@12}``,
``2: delta {b: tombstone}``, ``3: delta {c@0}`` replay to ``{a@12, c@0}``; a log that
holds only records 1-3 (the snapshot's segment deleted on this replica) replays to the
same, since the snapshot's successor segments start after it. Chunked: ``0: snapshot
{a@10, b@4}``, ``1: snapshot/x/0/2 {a@30}``, ``2: snapshot/x/1/2 {c@1}``, ``3: delta
{c@2}`` replay to ``{a@30, c@2}`` (b is not in the complete snapshot ``x``); without
record 2 and 3 (cut after chunk 0), to ``{a@30, b@4}``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

from dispatcher import cursor_journal, state_file

#: The key of a one-record snapshot (deltas have none).
SNAPSHOT_KEY = b"snapshot"
#: The prefix of a snapshot chunk's key (``snapshot/<id>/<index>/<count>``).
CHUNK_PREFIX = b"snapshot/"
#: The most entries' bytes one record holds (one entry bigger than this is alone in its
#: record): 1 MiB, the follower's fetch size, far below the 16 MiB a ``ReplicaFetch``
#: answer carries at most and gRPC's 4 MiB default message.
RECORD_BYTES = 1 << 20
#: The log id of the state log in the replication protocol.
LOG_ID = "state"


class StateSink(Protocol):
    """Where a leader's cursor store appends a replicated topic's saves."""

    #: The most entries' bytes one record of this sink holds (:func:`record_values`).
    record_bytes: int

    async def append(self, value: bytes, *, key: bytes | None) -> int:
        """Append one record (durable on this broker when it returns); its offset.
        ``key``: ``None`` for a delta, :data:`SNAPSHOT_KEY` or a :func:`chunk_key`."""
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


def record_values(
    entries: Sequence[cursor_journal.Entry], max_bytes: int = RECORD_BYTES
) -> list[bytes]:
    """``entries`` as the values of consecutive records, in order, each holding at most
    ``max_bytes`` of encoded entries (an entry bigger than that alone); one value for
    no entries (an empty snapshot is still a record)."""
    groups: list[list[cursor_journal.Entry]] = [[]]
    size = 0
    for entry in entries:
        length = len(cursor_journal.frame([entry])) - cursor_journal.HEADER.size
        if groups[-1] and size + length > max_bytes:
            groups.append([])
            size = 0
        groups[-1].append(entry)
        size += length
    return [record_value(group) for group in groups]


def snapshot_keys(snapshot_id: str, count: int) -> list[bytes]:
    """The keys of a snapshot of ``count`` records: :data:`SNAPSHOT_KEY` for one (as
    before chunks existed), else a :func:`chunk_key` each."""
    if count == 1:
        return [SNAPSHOT_KEY]
    return [chunk_key(snapshot_id, index, count) for index in range(count)]


def chunk_key(snapshot_id: str, index: int, count: int) -> bytes:
    """The key of chunk ``index`` (from 0) of ``count`` of snapshot ``snapshot_id`` (a
    token unique to the snapshot, with no ``/``)."""
    return CHUNK_PREFIX + f"{snapshot_id}/{index}/{count}".encode()


def _chunk(key: bytes | None) -> tuple[bytes, int, int] | None:
    """``(id, index, count)`` of a chunk's key; ``None`` for any other key."""
    if key is None or not key.startswith(CHUNK_PREFIX):
        return None
    parts = key[len(CHUNK_PREFIX) :].split(b"/")
    if len(parts) != 3 or not parts[1].isdigit() or not parts[2].isdigit():
        return None
    index, count = int(parts[1]), int(parts[2])
    return (parts[0], index, count) if index < count else None


def only_a_cut_snapshot(keys: Sequence[bytes | None]) -> bool:
    """Whether ``keys`` (a log's records from its first, in order) are nothing but the
    first chunks of one snapshot series, cut short: the shape a log has when its first
    leader stopped in the middle of its first snapshot (a topic of one copy switching to
    the replicated path with more than :data:`RECORD_BYTES` of states, its owner killed
    between chunks). Such a log never held a whole save: its caller replays nothing
    from it (the subscriptions held on the owner's disk are whole), rather than the
    cut chunks as deltas over nothing, which would drop every subscription not in them."""
    if not keys or _last_snapshot(keys) is not None:
        return False
    first = _chunk(keys[0])
    if first is None or first[1] != 0:
        return False
    chunks = [_chunk(key) for key in keys]
    return all(c is not None and c[0] == first[0] and c[1] == i for i, c in enumerate(chunks))


def _last_snapshot(keys: Sequence[bytes | None]) -> tuple[int, int] | None:
    """``(first, last)`` index of the last complete snapshot among ``keys`` (module
    docstring), or ``None``."""
    found: tuple[int, int] | None = None
    run: tuple[bytes, int, int] | None = None  # (id, count, index of its chunk 0)
    for index, key in enumerate(keys):
        chunk = _chunk(key)
        if key == SNAPSHOT_KEY:
            found, run = (index, index), None
        elif chunk is None:
            run = None
        elif chunk[1] == 0:
            run = (chunk[0], chunk[2], index)
        elif run is None or (chunk[0], chunk[2]) != run[:2] or index - run[2] != chunk[1]:
            run = None
        if run is not None and chunk is not None and chunk[1] == chunk[2] - 1:
            found, run = (run[2], index), None
    return found


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
    snapshot = _last_snapshot([key for key, _value in records])
    start = snapshot[0] if snapshot is not None else 0
    states: dict[str, state_file.StateDoc] = {}
    for _key, value in records[start:]:
        parsed = cursor_journal.parse(value)
        if parsed.torn_bytes or parsed.damaged:
            raise ValueError(f"a state-log record is not a whole frame ({len(value)} bytes)")
        for entry in parsed.entries:
            if entry.state is None:
                states.pop(entry.subscription, None)
            else:
                states[entry.subscription] = entry.state
    return states
