"""BrokerConfig: defaults, TOML, environment and flags, and clear errors for bad input."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.config import BrokerConfig, ConfigError, parse_address
from wal import FsyncPolicy


def test_defaults_match_the_design() -> None:
    """The documented defaults: ./data, 127.0.0.1:50051, 127.0.0.1:9464, no auto-create."""
    config = BrokerConfig()
    assert (config.data_dir, config.listen, config.metrics_listen) == (
        "./data",
        "127.0.0.1:50051",
        "127.0.0.1:9464",
    )
    assert config.auto_create_topics is False
    assert config.wal.fsync is FsyncPolicy.ALWAYS


def test_toml_then_env_then_flags(tmp_path: Path) -> None:
    """Scenario: a TOML file sets data_dir, listen and fsync; env overrides listen; a flag
    overrides data_dir. Expected: flags > env > file > defaults."""
    path = tmp_path / "h.toml"
    path.write_text(
        '[broker]\ndata_dir = "/from/file"\nlisten = "0.0.0.0:1"\n'
        'auto_create_topics = true\n[wal]\nfsync = "interval"\nsegment_bytes = 1048576\n'
    )
    config = BrokerConfig.load(
        str(path), env={"HEADRACE_LISTEN": "127.0.0.1:2"}, data_dir="/from/flag"
    )
    assert config.data_dir == "/from/flag"
    assert config.listen == "127.0.0.1:2"
    assert config.auto_create_topics is True
    assert config.wal.fsync is FsyncPolicy.INTERVAL
    assert config.wal.segment_bytes == 1 << 20


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("[broker]\nlisten = 'nope'\n", "not host:port"),
        ("[broker]\nlisten = '127.0.0.1:70000'\n", "not host:port"),
        ("[broker]\ncolour = 'blue'\n", "unknown setting(s) colour"),
        ("[brokr]\n", "unknown setting(s) brokr"),
        ("[wal]\nfsync = 'sometimes'\n", "must be one of always, interval, never"),
        ("[wal]\nsegment_bytes = 1\n", "segment_bytes"),
        ("[broker]\ndefault_partitions = 0\n", "default_partitions"),
        ("[broker]\nauto_create_topics = 'yes'\n", "auto_create_topics"),
        ("not toml [", "not valid TOML"),
        ("[heartbeat]\ninterval_ms = 0\n", "interval_ms = 0: must be from 1 to 3600000"),
        ("[heartbeat]\nstall_timeout_ms = 'long'\n", "stall_timeout_ms = 'long'"),
        ("[heartbeat]\nevery = 5\n", "unknown setting(s) every"),
        ("[heartbeat.topics]\norders = -5\n", "[heartbeat].topics = -5"),
        ("[heartbeat.subscriptions]\nbilling = 50\n", "'topic/subscription'"),
        ("[heartbeat]\ntopics = 5\n", "topics must be a table"),
    ],
    ids=[
        "listen",
        "port",
        "unknown-key",
        "unknown-table",
        "fsync",
        "segment",
        "partitions",
        "bool",
        "syntax",
        "heartbeat-zero",
        "heartbeat-type",
        "heartbeat-unknown",
        "heartbeat-topic",
        "heartbeat-subscription-name",
        "heartbeat-not-table",
    ],
)
def test_bad_config_file_names_the_problem(tmp_path: Path, text: str, words: str) -> None:
    """Scenario: each kind of bad config file. Expected: ConfigError with a message that
    names the setting and what is allowed."""
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        BrokerConfig.from_toml(str(path))
    assert words in str(info.value)


def test_heartbeat_table_in_milliseconds(tmp_path: Path) -> None:
    """``[heartbeat]`` is in milliseconds; the config holds seconds, with per-topic and
    per-subscription intervals resolved in that order."""
    assert BrokerConfig().heartbeat.interval_s == 0.5
    path = tmp_path / "h.toml"
    path.write_text(
        "[heartbeat]\ninterval_ms = 250\nstall_timeout_ms = 3000\n"
        '[heartbeat.topics]\norders = 100\n[heartbeat.subscriptions]\n"orders/billing" = 20\n'
    )
    hb = BrokerConfig.from_toml(str(path)).heartbeat
    assert hb.stall_timeout_s == 3.0
    assert hb.interval_for("orders", "billing") == 0.02
    assert hb.interval_for("orders", "audit") == 0.1
    assert hb.interval_for("events", "audit") == 0.25


def test_missing_config_file_is_a_clear_error(tmp_path: Path) -> None:
    """A config path that does not exist: ConfigError naming the file."""
    with pytest.raises(ConfigError, match="cannot read config file"):
        BrokerConfig.from_toml(str(tmp_path / "absent.toml"))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("127.0.0.1:50051", ("127.0.0.1", 50051)),
        ("[::1]:0", ("::1", 0)),
        ("localhost:9", ("localhost", 9)),
    ],
)
def test_parse_address(text: str, expected: tuple[str, int]) -> None:
    """host:port parsing, IPv6 in brackets."""
    assert parse_address(text) == expected
