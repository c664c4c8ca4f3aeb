"""dispatcher.cursor_journal: batches framed and read back, a torn tail dropped, damage
inside found, and the replay over checkpoints (newest state wins, tombstones delete,
states the damage may have superseded restart at the earliest offset). Pure."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import pytest

from dispatcher import SubscriptionRegistry, cursor_journal, state_file
from dispatcher.cursor_journal import Entry
from dispatcher.cursor_recovery import read_states
from wal import LogWriter, SimulatedCrash, encode_columns


def _doc(name: str, cursor: int, seq: int, type_: str = "exclusive") -> state_file.StateDoc:
    return state_file.StateDoc(
        version=state_file.VERSION,
        seq=seq,
        topic="t",
        subscription=name,
        type=type_,
        partitions=[state_file.PartitionDoc(cursor=cursor)],
    )


def _entry(name: str, cursor: int | None, seq: int) -> Entry:
    return Entry(seq, name, None if cursor is None else _doc(name, cursor, seq))


def _cursors_of(merged: cursor_journal.Merged) -> dict[str, int | None]:
    return {n: (d.partitions[0].cursor if d.partitions else None) for n, d in merged.states.items()}


def test_batches_read_back_in_order() -> None:
    """Scenario: three batches appended. Expected: every entry, in order; the good bytes
    are the whole file; no torn tail, no damage."""
    data = b"".join(
        cursor_journal.frame(batch)
        for batch in ([_entry("a", 1, 1), _entry("b", 2, 2)], [_entry("a", 3, 3)], [])
    )
    parsed = cursor_journal.parse(data)
    assert [(e.subscription, e.seq) for e in parsed.entries] == [("a", 1), ("b", 2), ("a", 3)]
    assert (parsed.good_bytes, parsed.torn_bytes, parsed.damaged) == (len(data), 0, [])


@pytest.mark.parametrize("cut", [1, 5, 12, 20, -1])
def test_a_torn_last_batch_is_dropped(cut: int) -> None:
    """Scenario: the last batch is cut short at several points (in its header, in its
    payload, its last byte). Expected: the batches before it are read; the rest is a torn
    tail, not damage."""
    whole = cursor_journal.frame([_entry("a", 1, 1)])
    last = cursor_journal.frame([_entry("a", 2, 2), _entry("b", 9, 3)])
    parsed = cursor_journal.parse(whole + last[:cut])
    assert [e.seq for e in parsed.entries] == [1]
    assert parsed.good_bytes == len(whole)
    assert parsed.torn_bytes == len(last[:cut])
    assert parsed.damaged == []


def test_zeros_after_the_last_batch_are_a_torn_tail() -> None:
    """Scenario: a power cut left a page of zeros where the last, unsynced batch was.
    Expected: a torn tail."""
    whole = cursor_journal.frame([_entry("a", 1, 1)])
    parsed = cursor_journal.parse(whole + bytes(4096))
    assert ([e.seq for e in parsed.entries], parsed.torn_bytes, parsed.damaged) == ([1], 4096, [])


def test_damage_inside_is_found_and_reading_goes_on_after_it() -> None:
    """Scenario: three batches; one byte of the middle one's payload flipped. Expected:
    the first and last batches are read; the middle one is reported damaged, with the
    first sequence number after it."""
    batches = [
        cursor_journal.frame([_entry("a", 1, 1), _entry("b", 1, 2)]),
        cursor_journal.frame([_entry("a", 5, 3)]),
        cursor_journal.frame([_entry("b", 7, 4)]),
    ]
    data = bytearray(b"".join(batches))
    data[len(batches[0]) + cursor_journal.HEADER.size + 3] ^= 0xFF
    parsed = cursor_journal.parse(bytes(data))
    assert [e.seq for e in parsed.entries] == [1, 2, 4]
    start = len(batches[0])
    assert parsed.damaged == [(start, start + len(batches[1]))]
    assert parsed.suspect_below == 4
    assert parsed.torn_bytes == 0


def test_the_newest_state_wins_and_a_tombstone_deletes() -> None:
    """Scenario: checkpoints of a (seq 5), b (seq 2) and c (seq 3); the journal holds an
    older state of a (seq 4, left by a crash before the journal was emptied), a newer b,
    a tombstone of c and a new d. Expected: a's checkpoint, b's and d's journal states;
    c is gone; the top sequence number is 8."""
    checkpoints = {"a": _doc("a", 50, 5), "b": _doc("b", 20, 2), "c": _doc("c", 30, 3)}
    journal = cursor_journal.frame(
        [_entry("a", 40, 4), _entry("b", 21, 6), _entry("c", None, 7), _entry("d", 1, 8)]
    )
    merged = cursor_journal.merge(checkpoints, cursor_journal.parse(journal))
    assert _cursors_of(merged) == {"a": 50, "b": 21, "d": 1}
    assert (merged.reset, merged.top_seq) == ([], 8)


def test_damage_resets_only_what_it_may_have_superseded() -> None:
    """Scenario: a checkpoint of x (seq 1, shared); journal batches: a and b (seqs 2, 3),
    a damaged batch, then b and c (seqs 6, 7). Expected: b and c keep their states (their
    newest came after the damage); a and x, whose newer state the damage may have held,
    keep their type but lose their partitions (the earliest offset)."""
    good1 = cursor_journal.frame([_entry("a", 10, 2), _entry("b", 10, 3)])
    bad = bytearray(cursor_journal.frame([_entry("a", 20, 4), _entry("x", 20, 5)]))
    bad[-2] ^= 0xFF
    good2 = cursor_journal.frame([_entry("b", 30, 6), _entry("c", 30, 7)])
    parsed = cursor_journal.parse(good1 + bytes(bad) + good2)
    merged = cursor_journal.merge({"x": _doc("x", 5, 1, "shared")}, parsed)
    assert _cursors_of(merged) == {"a": None, "b": 30, "c": 30, "x": None}
    assert merged.reset == ["a", "x"]
    assert merged.states["x"].type == "shared"


@pytest.mark.asyncio
async def test_a_damaged_journal_is_kept_and_reported_at_open(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Scenario: a registry saves a and b, then a at 10 and at 20, then b at 40; it dies
    (no final save); one byte inside the batch of a at 20 is flipped; a new registry
    opens. Expected: b, saved after the damage, resumes at 40; a, whose newest state the
    damage took, restarts at the earliest offset (not at 10, which would skip nothing but
    cannot be known to be its newest); the journal's bytes are kept beside it as
    ``cursors.journal.corrupt.<size>``; one error names the damage and a; the files now
    agree with what was loaded (a with no
    saved position)."""
    writer = await LogWriter.open(str(tmp_path / "log"))
    await writer.append(encode_columns([b"x"] * 50))
    data = tmp_path / "data"
    reg = SubscriptionRegistry(str(data), flush_interval_s=3600)
    await reg.open({"t": [writer]})
    a = await reg.subscribe("t", "a", [writer])
    b = await reg.subscribe("t", "b", [writer])
    journal = data / "subscriptions" / "t" / cursor_journal.NAME
    marks = []
    for offset in (10, 20):
        a.commit(0, offset)
        await reg.save(a)
        marks.append(journal.stat().st_size)
    b.commit(0, 40)
    await reg.save(b)
    raw = bytearray(journal.read_bytes())
    raw[marks[0] + cursor_journal.HEADER.size + 2] ^= 0xFF  # the batch of a at 20
    # the registry "dies": its files stay as they are (no final save)
    journal.write_bytes(bytes(raw))

    def crash(point: str) -> None:
        if point == "checkpoint.after_files":
            raise SimulatedCrash(point)

    cut_short = SubscriptionRegistry(str(data), flush_interval_s=3600, crash_point=crash)
    again = SubscriptionRegistry(str(data), flush_interval_s=3600)
    with caplog.at_level(logging.ERROR, logger="dispatcher.cursor_store"):
        with pytest.raises(SimulatedCrash):  # an open that dies before emptying the journal
            await cut_short.open({"t": [writer]})
        await again.open({"t": [writer]})
    try:
        assert again.get("t", "b").state.cursor(0) == 40
        assert again.get("t", "a").state.cursor(0) == 0
        kept = journal.with_name(f"{cursor_journal.NAME}.corrupt.{len(raw)}")
        assert kept.read_bytes() == bytes(raw)
        errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
        assert len(errors) == 2  # one per open
        assert all("is damaged" in e for e in errors)
        assert errors[0].endswith(": a")  # the second open finds a's reset in its file
        assert errors[1].endswith(": none")
        states = read_states(str(data / "subscriptions"), "t")
        assert _cursors_of(cursor_journal.Merged(states)) == {"a": None, "b": 40}
    finally:
        await again.aclose()
        await reg.aclose()
        await writer.aclose()


def _foreign_doc(name: str, topic: str = "t") -> state_file.StateDoc:
    return state_file.StateDoc(
        version=state_file.VERSION,
        seq=5,
        topic=topic,
        subscription=name,
        type="exclusive",
        partitions=[state_file.PartitionDoc(cursor=1)],
    )


def _journal_of(root: Path, *entries: Entry) -> None:
    (root / "t" / cursor_journal.NAME).write_bytes(cursor_journal.frame(entries))


#: Case -> (what to put under the root, subscriptions loaded, the topic directory after).
SET_ASIDE: dict[str, tuple[Callable[[Path], object], list[str], list[str]]] = {
    "a directory named like a state file": (
        lambda root: (root / "t" / "d.json").mkdir(),
        [],
        ["d.json.corrupt"],
    ),
    "a state file whose name is no subscription name": (
        lambda root: (root / "t" / "bad name.json").write_bytes(
            state_file.encode(_foreign_doc("bad name"))
        ),
        [],
        ["bad name.json.corrupt"],
    ),
    "a directory where the journal goes": (
        lambda root: (root / "t" / cursor_journal.NAME).mkdir(),
        [],
        [f"{cursor_journal.NAME}.corrupt"],
    ),
    "a file beside the topics' directories": (
        lambda root: (root / "stray").write_bytes(b"x"),
        [],
        [],
    ),
    "a journal entry whose name climbs out of the directory": (
        lambda root: _journal_of(root, Entry(5, "../../evil", _foreign_doc("../../evil"))),
        [],
        [cursor_journal.NAME],
    ),
    "a journal entry holding another subscription's state": (
        lambda root: _journal_of(root, Entry(5, "a", _foreign_doc("b", topic="zz"))),
        [],
        [cursor_journal.NAME],
    ),
    "a state file holding another subscription's state": (
        lambda root: (root / "t" / "a.json").write_bytes(
            state_file.encode(_foreign_doc("b", topic="zz"))
        ),
        ["a"],  # its own name's file was damaged: it restarts at the earliest offset
        ["a.json", "a.json.corrupt", cursor_journal.NAME],
    ),
}


@pytest.mark.asyncio
@pytest.mark.parametrize("case", list(SET_ASIDE))
async def test_files_the_store_did_not_write_are_set_aside_at_open(
    tmp_path: Path, case: str
) -> None:
    """Scenario: ``case`` under ``<data>/subscriptions`` (every one a way an outsider's
    or a damaged file could mislead the store), then a registry opens. Expected: it opens;
    it loads no subscription the file names, except one restarted at the earliest offset
    under its own file's name; the file is moved aside as ``.corrupt`` (or removed, beside
    the topics' directories); nothing is written outside the topic's directory."""
    make, subscriptions, listing = SET_ASIDE[case]
    writer = await LogWriter.open(str(tmp_path / "log"))
    await writer.append(encode_columns([b"x"] * 5))
    root = tmp_path / "data" / "subscriptions"
    (root / "t").mkdir(parents=True)
    make(root)
    reg = SubscriptionRegistry(str(tmp_path / "data"))
    try:
        await reg.open({"t": [writer]})
        assert [s.name for s in reg.subscriptions()] == subscriptions
        for name in subscriptions:
            assert reg.get("t", name).state.cursor(0) == 0
        await reg.aclose()
        assert sorted(p.name for p in (root / "t").iterdir()) == listing
        assert sorted(p.name for p in root.iterdir()) == ["t"]
        assert sorted(p.name for p in (tmp_path / "data").iterdir()) == ["subscriptions"]
    finally:
        await reg.aclose()
        await writer.aclose()
