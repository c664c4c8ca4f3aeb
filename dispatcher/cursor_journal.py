"""The cursor journal: one append-only log per topic of its subscriptions' saved states.

Owns the journal's format, :func:`frame` (one batch of entries, as one flush appends it),
:func:`parse` (the batches of a file, a torn tail, damage inside it) and :func:`merge`
(a topic's checkpoint files and its journal, replayed into one state per subscription).
Where the journal lives, when it is appended to and when it is checkpointed is
:mod:`dispatcher.cursor_store`'s. No I/O here.

A subscription's saved state lives in two places, both under
``<data dir>/subscriptions/<topic>/``:

- ``<subscription>.json``, the checkpoint (:mod:`dispatcher.state_file`), replaced
  atomically, and
- ``cursors.journal``, appended to by every flush and fdatasynced once per flush,
  whatever the number of subscriptions it saves (DESIGN section 2, invariant 3: "an
  equivalent log").

Every saved state carries a sequence number, unique and increasing across the store, in
the journal and in the checkpoint alike. The newest one wins: replay never depends on
which of the two places was written last, so a crash between writing the checkpoints and
emptying the journal changes nothing. A deleted subscription leaves a tombstone entry
(``state`` null) newer than its states.

The format of one batch (one flush)::

    magic  b"HRCJ"       4 bytes
    length              4 bytes, big-endian: the payload's size
    crc                 4 bytes, big-endian: CRC-32C of the payload
    payload             JSON: [{"seq": 41, "subscription": "billing", "state": {...}}, ...]

where ``state`` is a state document as the checkpoint holds it, or null (deleted).

Damage. A batch is appended and fdatasynced before the next one is written, so only the
last batch can be torn by a crash: a bad batch with no good batch after it is a torn tail,
dropped (those states were never reported saved). A bad batch with a good one after it is
damage inside the journal: the states it held are lost, and with them perhaps a
subscription's newest state. Every subscription whose newest surviving state is older than
the first good batch after the damage is then reset to the earliest retained offset
(:func:`merge`): duplicates, never a skip.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import crc32c
import msgspec

from dispatcher import state_file

#: The journal's file name in a topic's directory. Subscription names start with a letter
#: or digit and their files end in ``.json``, so it never collides with one.
NAME = "cursors.journal"
MAGIC = b"HRCJ"
HEADER = struct.Struct(">4sII")
#: No batch is larger: a length above it is damage, not a batch to read.
MAX_PAYLOAD = 256 * 1024 * 1024


class Entry(msgspec.Struct, forbid_unknown_fields=True):
    """One subscription's state as one flush saved it; ``state`` None: deleted."""

    seq: int
    subscription: str
    state: state_file.StateDoc | None


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(list[Entry])


def frame(entries: Iterable[Entry]) -> bytes:
    """One batch: the bytes one flush appends."""
    payload = _encoder.encode(list(entries))
    return HEADER.pack(MAGIC, len(payload), crc32c.crc32c(payload)) + payload


@dataclass
class Parsed:
    """What a journal file holds."""

    #: Every entry of every good batch, in file order.
    entries: list[Entry] = field(default_factory=list)
    #: The bytes up to the end of the last good batch: where the next batch goes.
    good_bytes: int = 0
    #: Bytes after the last good batch: a torn last write, dropped.
    torn_bytes: int = 0
    #: Byte ranges ``(begin, end)`` of damage inside the journal (a good batch follows).
    damaged: list[tuple[int, int]] = field(default_factory=list)
    #: The lowest sequence number of the first good batch after the last damage; states
    #: older than it may have been superseded by one the damage took.
    suspect_below: int | None = None


def _batch_at(data: bytes, pos: int) -> list[Entry] | None:
    """The entries of the batch at ``pos``, or None if there is no good batch there."""
    if len(data) - pos < HEADER.size:
        return None
    magic, length, crc = HEADER.unpack_from(data, pos)
    end = pos + HEADER.size + length
    if magic != MAGIC or length > MAX_PAYLOAD or end > len(data):
        return None
    payload = memoryview(data)[pos + HEADER.size : end]
    if crc32c.crc32c(payload) != crc:
        return None
    try:
        entries = _decoder.decode(payload)
        for entry in entries:
            if entry.state is not None:
                state_file.check(entry.state)
    except (msgspec.DecodeError, ValueError):
        return None
    return entries


def _next_good(data: bytes, start: int) -> int | None:
    """The position of the next good batch at or after ``start``."""
    pos = data.find(MAGIC, start)
    while pos != -1:
        if _batch_at(data, pos) is not None:
            return pos
        pos = data.find(MAGIC, pos + 1)
    return None


def parse(data: bytes) -> Parsed:
    """The good batches of a journal file, its torn tail and the damage inside it."""
    parsed = Parsed()
    pos = 0
    while pos < len(data):
        entries = _batch_at(data, pos)
        if entries is None:
            resume = _next_good(data, pos + 1)
            if resume is None:
                parsed.torn_bytes = len(data) - pos
                break
            parsed.damaged.append((pos, resume))
            entries = _batch_at(data, resume)
            assert entries is not None
            parsed.suspect_below = min((e.seq for e in entries), default=None)
            pos = resume
        parsed.entries.extend(entries)
        pos += HEADER.size + HEADER.unpack_from(data, pos)[1]
        parsed.good_bytes = pos
    return parsed


@dataclass
class Merged:
    """A topic's subscriptions as its checkpoints and journal say, newest state winning."""

    #: Every subscription that exists, with its state.
    states: dict[str, state_file.StateDoc] = field(default_factory=dict)
    #: The subscriptions reset to the earliest offset because damage may have taken their
    #: newest state.
    reset: list[str] = field(default_factory=list)
    #: The highest sequence number seen.
    top_seq: int = 0


def merge(checkpoints: Mapping[str, state_file.StateDoc], journal: Parsed) -> Merged:
    """Replay ``journal`` over ``checkpoints`` (by subscription): for each subscription
    the state with the highest sequence number wins, a tombstone deleting it. If the
    journal is damaged inside, a subscription whose winning state is older than
    :attr:`Parsed.suspect_below` keeps its type and mode but restarts at the earliest
    offset (its partitions are dropped)."""
    newest: dict[str, tuple[int, state_file.StateDoc | None]] = {
        name: (doc.seq, doc) for name, doc in checkpoints.items()
    }
    for entry in journal.entries:
        held = newest.get(entry.subscription)
        if held is None or entry.seq > held[0]:
            newest[entry.subscription] = (entry.seq, entry.state)
    merged = Merged(top_seq=max((seq for seq, _ in newest.values()), default=0))
    for name, (seq, doc) in sorted(newest.items()):
        if doc is None:
            continue
        if journal.suspect_below is not None and seq < journal.suspect_below:
            merged.states[name] = msgspec.structs.replace(doc, partitions=[])
            merged.reset.append(name)
        else:
            merged.states[name] = doc
    return merged
