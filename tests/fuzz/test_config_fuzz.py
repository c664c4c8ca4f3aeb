"""The config loader, fed random files and random values in the right structure.

Claims checked: ``BrokerConfig.from_toml`` of any file contents, and
``BrokerConfig.from_mapping`` of any document shaped like the real one (known tables and
keys, plus unknown ones, holding values of every TOML type), either build a config or raise
``ConfigError`` whose message is one line naming the problem; never another exception.
"""

from __future__ import annotations

import dataclasses
import datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.backlog import BacklogConfig
from broker.config import BrokerConfig
from broker.config_cluster import ClusterConfig
from broker.errors import ConfigError
from tests.fuzz.conftest import SLOW, examples
from wal import LogConfig

CI = 200

_TABLES = {"wal", "heartbeat", "backlog", "dispatch", "cluster"}
KEYS: dict[str, list[str]] = {
    "broker": sorted({f.name for f in dataclasses.fields(BrokerConfig)} - _TABLES),
    "wal": sorted(f.name for f in dataclasses.fields(LogConfig)),
    "heartbeat": ["interval_ms", "stall_timeout_ms", "topics", "subscriptions"],
    "backlog": sorted(f.name for f in dataclasses.fields(BacklogConfig)),
    "dispatch": [
        "ack_timeout_ms",
        "backoff_initial_ms",
        "backoff_max_ms",
        "backoff_multiplier",
        "backoff_jitter",
        "max_deliveries",
        "poison_policy",
        "subscriptions",
    ],
    "dlq": ["max_entries", "max_age_ms", "overflow", "max_event_bytes", "max_replays"],
    "cluster": sorted(f.name for f in dataclasses.fields(ClusterConfig)),
}

_SCALARS = st.one_of(
    st.integers(-3, 10),
    st.integers(-(2**63), 2**63 - 1),
    st.sampled_from([0, 1, 1023, 1024, 65535, 65536, 2**30, 2**31, 2**62, 2**63 - 1]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.sampled_from(
        [
            "",
            "always",
            "never",
            "interval",
            "drop_oldest",
            "dead_letter",
            "reject_producer",
            "127.0.0.1:0",
            "127.0.0.1:99999",
            "[::1]:1",
            ":1",
            "host:\u00b2",
            "host:\u0661\u0662",
            "host:",
            "/",
            "a/b",
        ]
    ),
    st.text(max_size=20),
    st.from_regex(r"[a-z0-9.\[\]:]{0,8}:[0-9\u00b2\u0661 -]{0,6}", fullmatch=True),  # host:port-ish
    st.datetimes(timezones=st.none() | st.just(datetime.UTC)),
    st.dates(),
    st.times(),
)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=6,
)


def _table(name: str) -> st.SearchStrategy[dict[str, Any]]:
    keys = st.one_of(st.sampled_from(KEYS[name]), st.text(max_size=10))
    return st.dictionaries(keys, _VALUES, max_size=4)


_DOCS = st.fixed_dictionaries(
    {},
    optional={
        **{name: st.one_of(_table(name), _VALUES) for name in KEYS},
        "extra": _VALUES,
    },
)

_TOML_WORDS = [
    "[broker]",
    "[wal]",
    "[dispatch]",
    '[dispatch.subscriptions."a/b"]',
    "[heartbeat.topics]",
    "[dlq]",
    "[cluster]",
    "etcd = ",
    'node_id = "b1"',
    "[[broker]]",
    "listen = ",
    "fsync = ",
    "max_request_bytes = ",
    "= ",
    '"',
    "'''",
    "\n",
    "1e999",
    "nan",
    "inf",
    "0x7fffffffffffffff",
    "99999999999999999999",
    "1979-05-27T07:32:00Z",
    "[",
    "]",
    "{",
    "}",
    ",",
    "true",
]
_TOML_TEXT = st.lists(st.sampled_from(_TOML_WORDS) | st.text(max_size=8), max_size=30).map("".join)
_FILE_BYTES = st.one_of(
    _TOML_TEXT.map(str.encode),
    st.binary(max_size=200),
    _TOML_TEXT.map(lambda t: t.encode() + b"\xff\xfe"),
)


def _load_claims(load: Any, *args: Any) -> None:
    try:
        config = load(*args)
    except ConfigError as exc:
        message = str(exc)
        assert message
        assert "\n" not in message, f"a multi-line error: {message!r}"
        return
    assert isinstance(config, BrokerConfig)


@settings(max_examples=examples(CI))
@given(doc=_DOCS)
def test_any_document_gives_a_config_or_a_config_error(doc: dict[str, Any]) -> None:
    """Scenario: documents with the real tables and keys (and unknown ones) holding values
    of every TOML type, in and out of range. Expected: a BrokerConfig or a one-line
    ConfigError; never another exception."""
    _load_claims(BrokerConfig.from_mapping, doc)


def test_any_file_gives_a_config_or_a_config_error(tmp_path: Path) -> None:
    """Scenario: files of TOML-ish text, random bytes, and text with invalid UTF-8.
    Expected: a BrokerConfig or a one-line ConfigError; never another exception."""
    path = tmp_path / "headrace.toml"

    @settings(max_examples=examples(CI))
    @given(data=_FILE_BYTES)
    def one(data: bytes) -> None:
        path.write_bytes(data)
        _load_claims(BrokerConfig.from_toml, str(path))

    one()


@pytest.mark.slow
@settings(max_examples=examples(SLOW * 10))
@given(doc=_DOCS)
def test_config_long_run(doc: dict[str, Any]) -> None:
    """Scenario: as the short document run, with many more examples. Expected: the same."""
    _load_claims(BrokerConfig.from_mapping, doc)
