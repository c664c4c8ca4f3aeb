"""msgspec's validation errors put in the config's words (``broker.config_errors``), and the
Structs of ``broker.config_schema`` agreeing with the domain types they feed.

Each shape of message is checked whole, on a document converted by the real parser; the
range tables of ``wal.config`` and ``broker.limits`` are probed against the schema at both
ends, so the file's check and the domain type's own check cannot drift apart.
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from broker.config import BrokerConfig
from broker.config_errors import explain
from broker.config_keys import key
from broker.config_schema import ConfigFile, WalTopicTable
from broker.errors import ConfigError
from broker.limits import RANGES as LIMIT_RANGES
from broker.limits import LimitsConfig
from wal import LogConfig, WalConfigError
from wal.config import RANGES as WAL_RANGES


def _message(doc: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as caught:
        BrokerConfig.from_mapping(doc, source="h.toml")
    return str(caught.value)


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        (
            {"wal": {"topics": {"a": {"fsync": "never"}, "b": {"segment_bytes": 0}}}},
            "h.toml [wal.topics.b]: segment_bytes = 0: must be an integer from 128 to 2147483648",
        ),
        (
            {"dlq": {"y": 1, "max_entries": 5, "x": 2}},
            "h.toml [dlq]: unknown setting(s) x, y; known: max_age_ms, max_entries, "
            "max_event_bytes, max_replays, overflow",
        ),
        (
            {"subscriptions": {"inactive_expiry_ms": 315_360_000_001}},
            "h.toml [subscriptions] inactive_expiry_ms = 315360000001: must be at most "
            "315360000000 (ten years; leave it out to never expire subscriptions)",
        ),
        (
            {"dispatch": {"subscriptions": {"t/s": {"backoff_jitter": 2}}}},
            "h.toml [dispatch.subscriptions.t/s] backoff_jitter: 2 must be from 0 to 1",
        ),
        (
            {"heartbeat": {"subscriptions": {"t/a": 5, "t/b": 0.5}}},
            "h.toml [heartbeat].subscriptions = 0.5: must be from 1 to 3600000 milliseconds",
        ),
        (
            {"broker": {"data_dir": ""}},
            "h.toml [broker] data_dir must be a non-empty path, not ''",
        ),
        (
            {"backlog": {"policy": 3}},
            "h.toml [backlog] policy = 3: must be one of reject_producer, block_producer, "
            "evict_oldest_backlog",
        ),
        (
            {"dispatch": {"subscriptions": 4}},
            "h.toml [dispatch] subscriptions must be a table of tables "
            "([dispatch.subscriptions.<name>]), not 4",
        ),
        ({"limits": [1]}, "h.toml: limits must be a table ([limits]), not [1]"),
    ],
    ids=[
        "entry-of-table-of-tables",
        "every-unknown-key",
        "over-the-top",
        "dispatcher-words-in-an-override",
        "entry-of-table-of-values",
        "empty-path",
        "choice-of-wrong-type",
        "not-a-table-of-tables",
        "not-a-table",
    ],
)
def test_each_message_shape(doc: dict[str, Any], message: str) -> None:
    """Scenario: a document breaking one rule, for each shape of message (the failing entry
    among good ones, several unknown keys, a value over the top, the dispatcher's words, a
    value in a table of values, a path, a choice, tables that are not). Expected: exactly
    this one line."""
    assert _message(doc) == message


@pytest.mark.parametrize(
    ("changes", "table"),
    [
        ({"max_unacked": 0}, "broker"),
        ({"grace_seconds": True}, "broker"),
        ({"producer_snapshot_bytes": 1.5}, "broker"),
        ({"data_dir": ""}, "broker"),
    ],
)
def test_code_and_file_are_refused_in_the_same_words(changes: dict[str, Any], table: str) -> None:
    """Scenario: the same bad value set in code (``BrokerConfig(...)``) and in the file.
    Expected: both refused through the same Struct, the file's message being the code's
    with the file's name in front."""
    with pytest.raises(ConfigError) as in_code:
        BrokerConfig(**changes)
    assert _message({table: changes}) == f"h.toml {in_code.value}"


def test_a_path_msgspec_does_not_lead_to_is_still_one_line() -> None:
    """Scenario: an error whose path does not match the document it names (the walk cannot
    follow it). Expected: msgspec's own words with the file and path, on one line."""
    exc = msgspec.ValidationError("Expected `int`\n - at `$.nowhere.x`")
    text = explain(exc, {}, ConfigFile, "h.toml")
    assert text.startswith("h.toml: Expected `int`")
    assert "\n" not in text


@pytest.mark.parametrize("name", sorted(WAL_RANGES))
def test_wal_ranges_are_log_configs(name: str) -> None:
    """Scenario: each ranged [wal] key at its ends and one past them, in the Struct and in
    wal.LogConfig (which the wal package checks on its own). Expected: the same range in
    the reference row and both accept the ends and refuse the steps past."""
    lo, hi = WAL_RANGES[name]
    assert (key("wal", name).low, key("wal", name).high) == (lo, hi)
    for value, ok in ((lo, True), (hi, True), (lo - 1, False), (hi + 1, False)):
        converts = _converts({name: value}, WalTopicTable)
        values: dict[str, Any] = {name: value}
        try:
            LogConfig(**values)
            domain = True
        except WalConfigError:
            domain = False
        assert (converts, domain) == (ok, ok), (name, value)


@pytest.mark.parametrize("name", sorted(LIMIT_RANGES))
def test_limit_ranges_are_limits_configs(name: str) -> None:
    """Scenario: each [limits] key at its ends and one past them, through the file and
    through broker.limits.LimitsConfig. Expected: the same range in the reference row, and
    both accept the ends and refuse the steps past."""
    lo, hi = LIMIT_RANGES[name]
    assert (key("limits", name).low, key("limits", name).high) == (lo, hi)
    for value, ok in ((lo, True), (hi, True), (lo - 1, False), (hi + 1, False)):
        converts = _converts({"limits": {name: value}}, ConfigFile)
        try:
            LimitsConfig(**{name: value})
            domain = True
        except ValueError:
            domain = False
        assert (converts, domain) == (ok, ok), (name, value)


def _converts(doc: dict[str, Any], schema: type[msgspec.Struct]) -> bool:
    try:
        msgspec.convert(doc, schema)
    except msgspec.ValidationError:
        return False
    return True
