"""Offsets, admission control, data-loss rules and planning: pure, no Spark."""

from __future__ import annotations

import json
from itertools import pairwise

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spark_connector.errors import ConnectorError
from spark_connector.offsets import (
    Loss,
    Range,
    Retained,
    admit,
    from_spark,
    losses,
    plan,
    recreated,
    resolve,
    skip_lost,
    to_spark,
    topic_id_of,
)
from spark_connector.options import EARLIEST, LATEST


def test_spark_offsets_are_built_in_partition_order() -> None:
    """Scenario: offsets given in scrambled order, partitions 0-11. Expected: JSON keys in
    numeric order (Spark compares the JSON text), and a round trip gives them back."""
    offsets = {p: p * 10 for p in (11, 2, 0, 10, 1)}
    doc = to_spark(offsets)
    assert list(doc) == ["0", "1", "2", "10", "11"]
    assert json.dumps(to_spark(dict(reversed(list(offsets.items()))))) == json.dumps(doc)
    assert from_spark(json.loads(json.dumps(doc))) == offsets


def test_spark_offsets_carry_the_topic_id_last_and_read_back_without_it() -> None:
    """Scenario: offsets of partitions 1 and 0 under topic id "ab12", and ones without an
    id (a checkpoint written before ids). Expected: the id is the last key; positions read
    back without it; topic_id_of gives it, or "" when absent; an id that is not a string is
    refused as a foreign offset."""
    doc = to_spark({1: 5, 0: 3}, "ab12")
    assert list(doc) == ["0", "1", "topic_id"]
    assert from_spark(json.loads(json.dumps(doc))) == {0: 3, 1: 5}
    assert topic_id_of(doc) == "ab12"
    assert topic_id_of(to_spark({0: 3})) == ""
    assert "topic_id" not in to_spark({0: 3}, "")
    with pytest.raises(ConnectorError, match="new checkpoint"):
        from_spark({"0": 3, "topic_id": 7})


def test_recreated_loses_every_partition_only_when_both_ids_are_known_and_differ() -> None:
    """Scenario: a position {0: 100, 1: 100, 2: 7} taken under id "old"; the topic now has
    id "new" and two partitions whose heads (150) lie past the position. Expected: every
    partition is lost, resuming at the new first offsets (None for the partition gone),
    the reason naming both ids; no loss when the ids match or either is unknown."""
    position = {0: 100, 1: 100, 2: 7}
    retained = [Retained(0, 150), Retained(4, 150)]
    found = recreated(position, "old", "new", retained)
    assert [(x.partition, x.expected, x.resume) for x in found] == [
        (0, 100, 0),
        (1, 100, 4),
        (2, 7, None),
    ]
    assert all("created again (its id was old, now new)" in x.reason for x in found)
    assert losses(position, retained) == [
        Loss(2, 7, None, "the partition no longer exists")
    ]  # what the heads alone show
    for was, now in [("same", "same"), ("", "new"), ("old", "")]:
        assert recreated(position, was, now, retained) == []


@pytest.mark.parametrize("doc", [{"a": 1}, {"0": -1}, {"0": "5"}, {"0": 1.5}, {"0": True}])
def test_foreign_offsets_are_refused(doc: dict[str, object]) -> None:
    """Scenario: an offset from another source's checkpoint. Expected: ConnectorError that
    says to use a new checkpoint."""
    with pytest.raises(ConnectorError, match="new checkpoint"):
        from_spark(doc)


def test_resolve_turns_earliest_and_latest_into_offsets() -> None:
    """Scenario: {0: EARLIEST, 1: LATEST, 2: 7}, partition 3 unnamed. Expected: first,
    head, 7, and the default for 3; a partition the topic lacks is an error."""
    retained = [Retained(5, 9), Retained(0, 4), Retained(0, 10), Retained(2, 3)]
    got = resolve({0: EARLIEST, 1: LATEST, 2: 7}, retained, default=LATEST)
    assert got == {0: 5, 1: 4, 2: 7, 3: 3}
    with pytest.raises(ConnectorError, match="partition 9 does not exist"):
        resolve({9: 0}, retained, default=EARLIEST)


def test_losses_name_retention_recreation_and_missing_partitions() -> None:
    """Scenario: positions below the first retained offset, past the head, in range, and
    on a partition that no longer exists. Expected: three losses with where reading can go
    on; skip_lost moves past them and drops the missing partition."""
    retained = [Retained(50, 100), Retained(0, 5), Retained(0, 20)]
    position = {0: 10, 1: 30, 2: 20, 3: 4}
    found = losses(position, retained)
    assert [(x.partition, x.expected, x.resume) for x in found] == [
        (0, 10, 50),
        (1, 30, 0),
        (3, 4, None),
    ]
    assert "deleted by retention" in found[0].reason
    assert "created again" in found[1].reason
    assert skip_lost(position, found) == {0: 50, 1: 0, 2: 20}
    assert losses({0: 50, 1: 5}, retained) == []


@pytest.mark.parametrize(
    ("start", "heads", "limit", "end"),
    [
        ({0: 0, 1: 0}, {0: 10, 1: 10}, None, {0: 10, 1: 10}),
        ({0: 40, 1: 10, 2: 0}, {0: 100, 1: 10, 2: 0}, 30, {0: 70, 1: 10, 2: 0}),
        ({0: 40, 1: 10}, {0: 100, 1: 15}, 30, {0: 65, 1: 15}),
        ({0: 0, 1: 0, 2: 0}, {0: 100, 1: 100, 2: 100}, 10, {0: 3, 1: 3, 2: 4}),
        ({0: 0, 1: 0}, {0: 5, 1: 5}, 100, {0: 5, 1: 5}),
        ({0: 3}, {0: 3, 1: 8}, 4, {0: 3, 1: 4}),  # partition 1 is new: from 0
        ({0: 9, 1: 0}, {0: 5, 1: 2}, None, {0: 9, 1: 2}),  # never backwards
    ],
)
def test_admit_splits_the_limit_fairly(
    start: dict[int, int], heads: dict[int, int], limit: int | None, end: dict[int, int]
) -> None:
    """Scenario: a table of starts, heads and limits. Expected: the worked ends."""
    assert admit(start, heads, limit) == end


@given(
    st.lists(st.tuples(st.integers(0, 50), st.integers(0, 200)), min_size=1, max_size=6),
    st.integers(1, 300),
)
def test_admit_never_exceeds_the_limit_or_wastes_it(
    parts: list[tuple[int, int]], limit: int
) -> None:
    """Property: the batch holds min(limit, waiting) records, no partition moves past its
    head or backwards, and a partition gets less than another only if it has less waiting."""
    start = {p: s for p, (s, _) in enumerate(parts)}
    heads = {p: s + w for p, (s, w) in enumerate(parts)}
    end = admit(start, heads, limit)
    taken = {p: end[p] - start[p] for p in start}
    waiting = {p: heads[p] - start[p] for p in start}
    assert sum(taken.values()) == min(limit, sum(waiting.values()))
    assert all(0 <= taken[p] <= waiting[p] for p in start)
    for p in start:
        for q in start:
            if taken[p] < waiting[p]:  # p was capped by the share, so it is not starved
                assert taken[p] + 1 >= min(taken[q], waiting[q])


def test_plan_gives_one_task_per_partition_with_records() -> None:
    """Scenario: three partitions, one without records, one re-created (end < start).
    Expected: one range each for the two with records, the re-created one read from 0."""
    assert plan({0: 0, 1: 5, 2: 9}, {0: 10, 1: 5, 2: 3}, None) == [Range(0, 0, 10), Range(2, 0, 3)]


def test_plan_cuts_large_ranges_for_min_partitions() -> None:
    """Scenario: 900 records on partition 0 and 100 on 1, minPartitions 10. Expected: ten
    tasks or more, contiguous and covering each range exactly once, the large range cut
    into more pieces."""
    ranges = plan({0: 0, 1: 0}, {0: 900, 1: 100}, 10)
    assert len(ranges) >= 10
    for p, size in ((0, 900), (1, 100)):
        mine = [r for r in ranges if r.partition == p]
        assert mine[0].start == 0
        assert mine[-1].end == size
        assert all(a.end == b.start for a, b in pairwise(mine))
    assert len([r for r in ranges if r.partition == 0]) == 9
    assert plan({0: 0}, {0: 3}, 10) == [Range(0, 0, 1), Range(0, 1, 2), Range(0, 2, 3)]


def test_loss_is_a_value() -> None:
    """Scenario: two equal losses. Expected: equal (frozen dataclass), usable in sets."""
    assert {Loss(0, 1, 2, "r"), Loss(0, 1, 2, "r")} == {Loss(0, 1, 2, "r")}
