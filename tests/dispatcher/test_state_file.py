"""dispatcher.state_file: a subscription's saved state, encoded, decoded and refused."""

from __future__ import annotations

import pytest

from dispatcher import state_file
from dispatcher.protocol import FailureRun, PartitionSnapshot


def _doc(**overrides: object) -> state_file.StateDoc:
    fields: dict[str, object] = {
        "version": state_file.VERSION,
        "topic": "orders",
        "subscription": "billing",
        "type": "shared",
        "mode": "at_least_once",
        "seq": 41,
        "partitions": [
            state_file.partition_doc(
                PartitionSnapshot(
                    1200,
                    ((1205, 1210),),
                    1300,
                    (FailureRun(1200, 1201, 3, "timeout", (1_700_000_000_000,)),),
                )
            )
        ],
    }
    fields.update(overrides)
    return state_file.StateDoc(**fields)  # type: ignore[arg-type]


def test_a_document_survives_encoding() -> None:
    """Scenario: a document of the version written (3) with its sequence number, a cursor,
    an ack range, the delivered mark and one failure run. Expected: decode(encode(doc))
    gives it back, field for field."""
    doc = _doc()
    assert state_file.decode(state_file.encode(doc)) == doc


def test_a_version_2_file_reads_as_the_oldest_state() -> None:
    """Scenario: a version 2 file, written before the cursor journal: no ``seq``.
    Expected: it reads with sequence number 0, so any state the journal holds of it wins."""
    doc = state_file.decode(
        b'{"version": 2, "topic": "t", "subscription": "s", "type": "shared",'
        b' "mode": "at_most_once", "partitions": [{"cursor": 7}]}'
    )
    assert (doc.seq, doc.mode, doc.partitions[0].cursor) == (0, "at_most_once", 7)


def test_a_version_1_file_is_read_with_defaults() -> None:
    """Scenario: a version 1 file: no mode, no delivered mark, no failures. Expected: it
    reads as at_least_once with a delivered mark of 0 and no failures."""
    doc = state_file.decode(
        b'{"version": 1, "topic": "t", "subscription": "s", "type": "exclusive",'
        b' "partitions": [{"cursor": 7, "acked": [[9, 10]]}]}'
    )
    assert doc.mode == "at_least_once"
    [part] = doc.partitions
    assert (part.cursor, part.acked, part.delivered, part.failures) == (7, [(9, 10)], 0, [])


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (b'{"version": 1, "topic": "t", "subscr', "truncated|malformed|Input data"),
        (
            b'{"version": 4, "topic": "t", "subscription": "s", "type": "exclusive",'
            b' "partitions": []}',
            r"version 4 is not one of \(1, 2, 3\)",
        ),
        (
            b'{"version": 2, "topic": "t", "subscription": "s", "type": "fanout",'
            b' "partitions": []}',
            "fanout",
        ),
        (
            b'{"version": 2, "topic": "t", "subscription": "s", "type": "shared",'
            b' "mode": "twice", "partitions": []}',
            "twice",
        ),
        (
            b'{"version": 2, "topic": "t", "subscription": "s", "type": "shared",'
            b' "partitions": [], "extra": 1}',
            "extra",
        ),
    ],
    ids=["torn", "future-version", "unknown-type", "unknown-mode", "unknown-field"],
)
def test_a_damaged_or_unknown_file_is_refused_with_the_reason(data: bytes, match: str) -> None:
    """Scenario: a torn file, a newer version, an unknown type or mode, an unknown field.
    Expected: ValueError (the registry then keeps the file as .corrupt) naming what is
    wrong."""
    with pytest.raises(ValueError, match=match):
        state_file.decode(data)
