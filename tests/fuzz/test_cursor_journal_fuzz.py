"""The cursor journal's reader, fed random and damaged bytes.

Claims checked:
- ``cursor_journal.parse`` of any bytes returns (never raises), and ``merge`` of what it
  found returns too.
- A journal damaged anywhere (flipped, overwritten, truncated, cut, padded, doubled) never
  yields a state that was not written: every state the merge keeps whole is one a batch
  held for that subscription, and one a subscription reset to the earliest offset keeps
  only its type and mode.
- A journal cut anywhere (a torn tail) yields, for each subscription, its newest state in
  the whole batches before the cut: nothing newer, nothing older.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from dispatcher import cursor_journal, state_file
from tests.fuzz._strategies import mutations
from tests.fuzz.conftest import CI, examples

NAMES = ("a", "b", "c")


def _doc(name: str, cursor: int, seq: int) -> state_file.StateDoc:
    return state_file.StateDoc(
        version=state_file.VERSION,
        seq=seq,
        topic="t",
        subscription=name,
        type="shared",
        partitions=[state_file.PartitionDoc(cursor=cursor)],
    )


@st.composite
def journals(draw: st.DrawFn) -> tuple[bytes, list[list[cursor_journal.Entry]]]:
    """A journal of 1-8 batches of 1-3 entries (a tombstone now and then), seqs rising."""
    batches: list[list[cursor_journal.Entry]] = []
    seq = 0
    for _ in range(draw(st.integers(1, 8))):
        batch = []
        for name in draw(st.lists(st.sampled_from(NAMES), min_size=1, max_size=3, unique=True)):
            seq += 1
            dead = draw(st.integers(0, 9)) == 0
            state = None if dead else _doc(name, draw(st.integers(0, 10**6)), seq)
            batch.append(cursor_journal.Entry(seq, name, state))
        batches.append(batch)
    return b"".join(cursor_journal.frame(b) for b in batches), batches


@settings(max_examples=examples(CI * 10))
@given(st.binary(max_size=512))
def test_any_bytes_parse_and_merge_without_raising(data: bytes) -> None:
    parsed = cursor_journal.parse(data)
    cursor_journal.merge({}, parsed)
    assert parsed.good_bytes + parsed.torn_bytes <= len(data)


@settings(max_examples=examples(CI * 5))
@given(st.data())
def test_a_damaged_journal_never_yields_a_state_not_written(data: st.DataObject) -> None:
    raw, batches = data.draw(journals())
    damaged = data.draw(mutations(raw))
    merged = cursor_journal.merge({}, cursor_journal.parse(damaged))
    written = {(e.subscription, e.state.seq): e.state for b in batches for e in b if e.state}
    for name, doc in merged.states.items():
        if name in merged.reset:
            assert doc.partitions == []
            assert doc.type == "shared"
        else:
            assert written[(name, doc.seq)] == doc


@settings(max_examples=examples(CI * 5))
@given(st.data())
def test_a_torn_tail_yields_the_newest_state_before_it(data: st.DataObject) -> None:
    raw, batches = data.draw(journals())
    cut = data.draw(st.integers(0, len(raw)))
    parsed = cursor_journal.parse(raw[:cut])
    assert parsed.damaged == []
    whole, end = [], 0
    for batch in batches:
        end += len(cursor_journal.frame(batch))
        if end <= cut:
            whole.append(batch)
    expected: dict[str, state_file.StateDoc | None] = {}
    for batch in whole:
        for entry in batch:
            expected[entry.subscription] = entry.state
    alive = {name: doc for name, doc in expected.items() if doc is not None}
    assert cursor_journal.merge({}, parsed).states == alive
