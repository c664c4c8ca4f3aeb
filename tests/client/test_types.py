"""The client's plain result values: pure, no loop, no broker."""

from __future__ import annotations

from client._types import PublishedRange, PublishOutcome, RecordMetadata, SentRecords


def test_sent_records_of_a_duplicate_without_offsets_report_minus_one() -> None:
    """Scenario: send_many's second batch was answered duplicate with offsets -1 (appended
    too long ago for the broker to remember where). Expected: its records report offset
    -1 and duplicate, never -1 + position; the first batch keeps its real offsets."""
    sent = SentRecords(
        "t",
        [
            PublishedRange(0, 40, 2, False, (0, 1)),
            PublishedRange(0, -1, 3, True, (2, 3, 4)),
        ],
    )
    assert list(sent) == [
        RecordMetadata("t", 0, 40),
        RecordMetadata("t", 0, 41),
        *[RecordMetadata("t", 0, -1, duplicate=True)] * 3,
    ]


def test_publish_outcome_predicate_and_advice() -> None:
    """REFUSED is refused and says the records were not written; UNKNOWN is not refused
    and warns that resending may duplicate."""
    assert PublishOutcome.REFUSED.is_refused()
    assert PublishOutcome.REFUSED.advice == "not written; safe to resend"
    assert not PublishOutcome.UNKNOWN.is_refused()
    assert PublishOutcome.UNKNOWN.advice == (
        "may or may not have been written; resending may duplicate"
    )
