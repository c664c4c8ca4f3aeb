"""What an open of the cursor store finds on disk: one topic's files, read and judged.

Sync I/O through :class:`wal.FileSystem`, run in a thread at open, before the store
starts (:meth:`~dispatcher.cursor_store.CursorStore.load_all`, which then repairs what
this module reports: it resumes the journal, appends reset states, checkpoints a topic
whose journal held damage). Per topic directory, :func:`load_topic` reads every
checkpoint file (``<subscription>.json``) and the journal (``cursors.journal``), merges
them by sequence number (:func:`dispatcher.cursor_journal.merge`: the newest state
wins; a tombstone deletes), and says what the files need to agree with the result:

- a checkpoint cut short by a crash (``.tmp``) is removed;
- a damaged checkpoint is kept as ``.corrupt`` and its subscription reset (it restarts
  at the earliest retained offset: duplicates, never a skip);
- a file that is not a subscription's state, or a journal that is not a file, is moved
  aside as ``.corrupt``;
- journal entries of another topic or a bad name are ignored and reported; damage
  inside the journal keeps a copy (``cursors.journal.corrupt.<size>``), resets every
  subscription whose newest state it may have held, and asks for a rewrite;
- a torn last write is reported (it was never reported saved) and left to be cut.

:func:`read_states` reads the same files without repairing anything, for inspection and
tests.

Example: a topic directory holds ``a.json`` (seq 4), ``b.json`` (damaged), ``c.json``
(seq 3) and a journal with a state of ``a`` at seq 9 and a tombstone of ``c`` at seq 7:
``a`` is loaded at seq 9, ``b`` is reset (``b.json`` kept as ``b.json.corrupt``), and
``c`` is in ``deleted`` (the open removes its file).
"""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass

from dispatcher import cursor_journal, state_file
from dispatcher.names import is_valid_name
from dispatcher.protocol import DeliveryMode, SubscriptionType
from wal import FileSystem

logger = logging.getLogger(__name__)

#: The suffix a damaged checkpoint or journal is kept under.
CORRUPT_SUFFIX = ".corrupt"
#: The suffix of a checkpoint file being written (``FileSystem.atomic_write_many``).
TMP_SUFFIX = ".tmp"


@dataclass
class Loaded:
    """One topic as an open found it."""

    merged: cursor_journal.Merged
    parsed: cursor_journal.Parsed
    #: Checkpoint every subscription and empty the journal (damage or foreign entries).
    rewrite: bool
    #: Subscriptions whose checkpoint was damaged: reset, to be saved so.
    reset: list[str]
    #: Subscriptions whose checkpoint a tombstone in the journal supersedes.
    deleted: list[str]


def load_topic(fs: FileSystem, root: str, topic: str) -> Loaded:
    """``topic``'s merged states under ``root``, and what its files need to agree with
    them; damaged and stray files are set aside (kept) and reported as it reads."""
    directory = os.path.join(root, topic)
    checkpoints: dict[str, state_file.StateDoc] = {}
    damaged: list[str] = []
    for entry in sorted(fs.listdir(directory)):
        path = os.path.join(directory, entry)
        if entry.endswith(TMP_SUFFIX) and os.path.isfile(path):  # cut short by a crash
            fs.remove(path)
        elif entry.endswith(state_file.SUFFIX):
            name = entry[: -len(state_file.SUFFIX)]
            if not os.path.isfile(path) or not is_valid_name(name):
                _set_aside(fs, path, "not a subscription's state file")
                continue
            doc = _load_checkpoint(fs, path, topic, name)
            if doc is None:
                damaged.append(name)
            else:
                checkpoints[name] = doc
    path = os.path.join(directory, cursor_journal.NAME)
    data = b""
    if os.path.isfile(path):
        data = fs.read_file(path)
    elif fs.exists(path):
        _set_aside(fs, path, "not a file")
    parsed = cursor_journal.parse(data)
    foreign = [e for e in parsed.entries if not belongs(e, topic)]
    if foreign:
        logger.error(
            "%s: ignoring %d entries that are not states of a subscription of %r "
            "(a bad name, or a state of another subscription or topic): %s",
            path,
            len(foreign),
            topic,
            ", ".join(sorted({repr(e.subscription) for e in foreign})),
        )
        parsed.entries = [e for e in parsed.entries if belongs(e, topic)]
    if parsed.torn_bytes:
        logger.warning(
            "%s: dropped the last %d bytes, a write torn by a crash (states never reported saved)",
            path,
            parsed.torn_bytes,
        )
    merged = cursor_journal.merge(checkpoints, parsed)
    if parsed.damaged:
        kept = path + CORRUPT_SUFFIX + f".{len(data)}"
        if not fs.exists(kept):  # else an open cut short by a crash kept it
            fs.write_new(kept, data)
        logger.error(
            "%s is damaged at bytes %s (kept as %s); %d subscriptions whose newest "
            "state it may have held restart at the earliest offset: %s",
            path,
            ", ".join(f"{b}-{e}" for b, e in parsed.damaged),
            kept,
            len(merged.reset),
            ", ".join(merged.reset) or "none",
        )
    for name in damaged:
        held = merged.states.get(name)
        merged.states[name] = state_file.StateDoc(
            version=state_file.VERSION,
            topic=topic,
            subscription=name,
            type=held.type if held is not None else SubscriptionType.EXCLUSIVE.value,
            mode=held.mode if held is not None else DeliveryMode.AT_LEAST_ONCE.value,
            partitions=[],
            committer=held.committer if held is not None else "",
        )
    return Loaded(
        merged,
        parsed,
        rewrite=bool(parsed.damaged or foreign),
        reset=damaged,
        deleted=sorted(set(checkpoints) - set(merged.states)),
    )


def _set_aside(fs: FileSystem, path: str, why: str) -> None:
    """Rename ``path``, which the store did not write, out of its way."""
    logger.error("%s is %s; moved aside as %s%s", path, why, path, CORRUPT_SUFFIX)
    fs.rename(path, path + CORRUPT_SUFFIX)


def _load_checkpoint(
    fs: FileSystem, path: str, topic: str, name: str
) -> state_file.StateDoc | None:
    """The checkpoint of ``topic``/``name`` at ``path``; ``None`` when it is damaged
    (kept as ``.corrupt``: the subscription restarts at the earliest offset)."""
    try:
        doc = state_file.decode(fs.read_file(path))
        if (doc.topic, doc.subscription) != (topic, name):
            raise ValueError(f"it holds the state of {doc.topic}/{doc.subscription}")
    except ValueError as exc:
        logger.error(
            "%s is damaged (%s); kept as %s.corrupt, the subscription restarts at the "
            "earliest offset",
            path,
            exc,
            path,
        )
        fs.rename(path, path + CORRUPT_SUFFIX)
        return None
    return doc


def belongs(entry: cursor_journal.Entry, topic: str) -> bool:
    """Whether a journal entry is a state (or tombstone) of a subscription of ``topic``."""
    if not is_valid_name(entry.subscription):
        return False
    state = entry.state
    return state is None or (state.topic, state.subscription) == (topic, entry.subscription)


def read_states(
    root: str, topic: str, fs: FileSystem | None = None
) -> dict[str, state_file.StateDoc]:
    """The saved state of every subscription of ``topic`` under ``root``
    (``<data dir>/subscriptions``), checkpoints and journal merged, as the next open
    would load them; read only (a damaged checkpoint is left out, nothing is repaired).
    For inspection and tests."""
    fs = fs or FileSystem()
    directory = os.path.join(root, topic)
    checkpoints = {}
    for entry in fs.listdir(directory) if fs.exists(directory) else []:
        if entry.endswith(state_file.SUFFIX):
            with contextlib.suppress(ValueError):
                doc = state_file.decode(fs.read_file(os.path.join(directory, entry)))
                checkpoints[entry[: -len(state_file.SUFFIX)]] = doc
    path = os.path.join(directory, cursor_journal.NAME)
    parsed = cursor_journal.parse(fs.read_file(path) if os.path.isfile(path) else b"")
    parsed.entries = [e for e in parsed.entries if belongs(e, topic)]
    return cursor_journal.merge(checkpoints, parsed).states
