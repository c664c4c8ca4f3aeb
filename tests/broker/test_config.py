"""BrokerConfig: defaults, TOML, environment and flags, and clear errors for bad input."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from broker.backlog import BacklogConfig, BacklogPolicy
from broker.config import BrokerConfig, parse_address
from broker.errors import ConfigError
from dispatcher import DeliveryMode, PoisonPolicy, SubscriptionType
from dispatcher.dead_letter_config import DlqConfig, OverflowPolicy
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
        ("[backlog]\npolicy = 'drop'\n", "must be one of reject_producer, block_producer"),
        ("[backlog]\nquota_messages = -1\n", "[backlog] quota_messages = -1: must be"),
        ("[backlog]\nquota_messages = 1.5\n", "[backlog] quota_messages = 1.5"),
        ("[backlog]\nblock_timeout_ms = 0\n", "[backlog] block_timeout_ms = 0: must be"),
        ("[backlog]\nquota = 5\n", "[backlog]: unknown setting(s) quota"),
        ("backlog = 5\n", "backlog must be a table ([backlog]), not 5"),
        ("[broker]\nretention_check_interval_ms = 0\n", "retention_check_interval_ms = 0"),
        ("[dispatch]\npoison_policy = 'retry'\n", "must be one of dead_letter, drop, block"),
        ("[dispatch]\nack_timeout_ms = -5\n", "ack_timeout_ms = -5: must be milliseconds"),
        ("[dispatch]\nmax_deliveries = -1\n", "max_deliveries: -1 must be from 0"),
        ("[dispatch]\nbackoff_jitter = 2\n", "backoff_jitter: 2 must be from 0 to 1"),
        ("[dispatch]\nbackoff_max_ms = 10\n", "backoff_max: 0.01 must be from 1.0"),
        ("[dispatch]\nretries = 3\n", "[dispatch]: unknown setting(s) retries"),
        (
            '[dispatch.subscriptions."t"]\nmax_deliveries = 3\n',
            "'t' must be \"topic/subscription\"",
        ),
        ('[dispatch.subscriptions."t/s"]\nsubscriptions = 3\n', "unknown setting(s) subscriptions"),
        ("[dlq]\noverflow = 'spill'\n", "must be one of drop_oldest, reject, block"),
        ("[dlq]\nmax_entries = 0\n", "max_entries"),
        ("[dlq]\nmax_age_ms = -1\n", "max_age_ms = -1: must be milliseconds"),
        ("[dlq]\nsize = 1\n", "[dlq]: unknown setting(s) size"),
        # Found by tests/fuzz/test_config_fuzz.py: each raised something else before.
        ("broker = 5\n", "broker must be a table ([broker]), not 5"),
        ("wal = 'x'\n", "wal must be a table ([wal]), not 'x'"),
        ('[broker]\n"a\\nb" = 1\n', "unknown setting(s) 'a\\nb'; known:"),
        ("[broker]\nlisten = 'h:\u00b2'\n", "listen: 'h:\u00b2' is not host:port"),
        ("[broker]\ngrace_seconds = true\n", "grace_seconds must be a number"),
        # [wal.topics.<name>]: one topic's log settings.
        ('[wal.topics.m]\nfsync = "sometimes"\n', "[wal.topics.m] fsync = 'sometimes'"),
        ("[wal.topics.m]\nsegment_byte = 1\n", "[wal.topics.m]: unknown setting(s) segment_byte"),
        ("[wal.topics.m]\nsegment_bytes = 0\n", "[wal.topics.m]: "),
        ("[wal.topics.m]\nmax_headers_per_record = 3\n", "unknown setting(s) max_headers"),
        ('[wal.topics."a b"]\nfsync = "never"\n', "[wal.topics.a b]: not a valid topic name"),
        ("[wal]\ntopics = 3\n", "[wal] topics must be a table of tables"),
        ("[wal.topics]\nm = 3\n", "m must be a table ([m])"),
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
        "backlog-policy",
        "backlog-negative-quota",
        "backlog-float-quota",
        "backlog-zero-timeout",
        "backlog-unknown",
        "backlog-not-table",
        "retention-interval",
        "dispatch-poison",
        "dispatch-timeout",
        "dispatch-deliveries",
        "dispatch-jitter",
        "dispatch-backoff-order",
        "dispatch-unknown",
        "dispatch-override-name",
        "dispatch-override-nested",
        "dlq-overflow",
        "dlq-entries",
        "dlq-age",
        "dlq-unknown",
        "broker-not-table",
        "wal-not-table",
        "key-with-newline",
        "port-superscript-digit",
        "grace-bool",
        "wal-topic-policy",
        "wal-topic-unknown",
        "wal-topic-range",
        "wal-topic-header-limit",
        "wal-topic-name",
        "wal-topics-scalar",
        "wal-topic-scalar",
    ],
)
def test_bad_config_file_names_the_problem(tmp_path: Path, text: str, words: str) -> None:
    """Scenario: each kind of bad config file. Expected: ConfigError with a one-line
    message that names the setting and what is allowed."""
    path = tmp_path / "bad.toml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        BrokerConfig.from_toml(str(path))
    assert words in str(info.value)
    assert "\n" not in str(info.value)


def test_config_file_that_is_not_utf8_is_a_config_error(tmp_path: Path) -> None:
    """Scenario: a config file holding a byte that is not UTF-8 (found by the config fuzz
    test; it raised UnicodeDecodeError). Expected: ConfigError naming the file, the byte
    position and the fix."""
    path = tmp_path / "latin1.toml"
    path.write_bytes(b"[broker]\ndata_dir = '/tmp/caf\xe9'\n")
    with pytest.raises(ConfigError, match=r"latin1.toml is not UTF-8 text \(byte 29\)"):
        BrokerConfig.from_toml(str(path))


def test_dispatch_and_dlq_tables(tmp_path: Path) -> None:
    """Scenario: ``[dispatch]`` with an override and ``[dlq]``, in milliseconds. Expected:
    the defaults apply where nothing is set; an override inherits from ``[dispatch]`` and
    wins for its subscription only; ack_timeout_ms = 0 and max_age_ms = 0 mean never."""
    default = BrokerConfig().dispatch
    assert default.defaults.ack_timeout_s == 30.0
    assert default.defaults.max_deliveries == 10
    assert default.defaults.poison is PoisonPolicy.DEAD_LETTER
    assert default.dlq.overflow is OverflowPolicy.DROP_OLDEST
    path = tmp_path / "d.toml"
    path.write_text(
        "[dispatch]\nack_timeout_ms = 0\nbackoff_initial_ms = 200\nmax_deliveries = 4\n"
        'poison_policy = "drop"\n'
        '[dispatch.subscriptions."orders/billing"]\nmax_deliveries = 2\npoison_policy = "block"\n'
        "[dlq]\nmax_entries = 50\nmax_age_ms = 0\noverflow = 'reject'\nmax_event_bytes = 64\n"
    )
    dispatch = BrokerConfig.from_toml(str(path)).dispatch
    plain = dispatch.policy_for(
        "orders", "audit", SubscriptionType.SHARED, DeliveryMode.AT_LEAST_ONCE
    )
    assert (plain.ack_timeout_s, plain.backoff_initial_s) == (None, 0.2)
    assert (plain.max_deliveries, plain.poison, plain.type) == (
        4,
        PoisonPolicy.DROP,
        SubscriptionType.SHARED,
    )
    billing = dispatch.policy_for(
        "orders", "billing", SubscriptionType.EXCLUSIVE, DeliveryMode.AT_MOST_ONCE
    )
    assert (billing.max_deliveries, billing.poison) == (2, PoisonPolicy.BLOCK)
    assert (billing.backoff_initial_s, billing.mode) == (0.2, DeliveryMode.AT_MOST_ONCE)
    assert dispatch.dlq == DlqConfig(
        max_entries=50, max_age_s=None, overflow=OverflowPolicy.REJECT, max_event_bytes=64
    )


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


def test_backlog_table_and_retention_interval(tmp_path: Path) -> None:
    """Scenario: defaults, then a file with a [backlog] table and
    retention_check_interval_ms. Expected: by default no quota, reject_producer, 30 s block
    timeout and a 5 s retention pass; the file's values are taken as written, the policy as
    its enum member."""
    default = BrokerConfig()
    assert default.retention_check_interval_ms == 5_000
    assert default.backlog == BacklogConfig(0, BacklogPolicy.REJECT_PRODUCER, 30_000)
    path = tmp_path / "b.toml"
    path.write_text(
        "[broker]\nretention_check_interval_ms = 250\n"
        '[backlog]\nquota_messages = 100000\npolicy = "block_producer"\n'
        "block_timeout_ms = 1500\n"
    )
    config = BrokerConfig.from_toml(str(path))
    assert config.retention_check_interval_ms == 250
    assert config.backlog == BacklogConfig(100_000, BacklogPolicy.BLOCK_PRODUCER, 1_500)


@pytest.mark.parametrize(
    "backlog",
    [
        BacklogConfig(quota_messages=-5),
        BacklogConfig(block_timeout_ms=0),
        BacklogConfig(policy="reject_producer"),  # type: ignore[arg-type]
    ],
    ids=["quota", "timeout", "policy-as-string"],
)
def test_bad_backlog_config_in_code_is_refused(backlog: BacklogConfig) -> None:
    """Scenario: a BrokerConfig built in code with an invalid BacklogConfig. Expected:
    ConfigError naming the [backlog] setting."""
    with pytest.raises(ConfigError, match=r"\[backlog\]"):
        BrokerConfig(backlog=backlog)


def test_producer_expiry_ms(tmp_path: Path) -> None:
    """Scenario: the default, then a file setting [broker] producer_expiry_ms = 3600000.
    Expected: 7 days (604,800,000 ms) by default; the file's value taken as written."""
    assert BrokerConfig().producer_expiry_ms == 604_800_000
    path = tmp_path / "p.toml"
    path.write_text("[broker]\nproducer_expiry_ms = 3600000\n")
    assert BrokerConfig.from_toml(str(path)).producer_expiry_ms == 3_600_000


TEN_YEARS_MS = 3_650 * 86_400_000


@pytest.mark.parametrize(
    ("value", "accepted"),
    [
        (0, False),
        (59_999, False),
        (60_000, True),
        (TEN_YEARS_MS, True),
        (TEN_YEARS_MS + 1, False),
        (-1, False),
        ("7d", False),
        (True, False),
        (60_000.0, False),
    ],
)
def test_producer_expiry_ms_range(value: Any, accepted: bool) -> None:
    """Scenario: producer_expiry_ms at and around its bounds, and of the wrong type.
    Expected: integers from 60,000 (one minute) to ten years are taken; anything else,
    0 included (there is no "never"), is a ConfigError naming the setting and the range."""
    if accepted:
        assert BrokerConfig(producer_expiry_ms=value).producer_expiry_ms == value
        return
    with pytest.raises(ConfigError) as info:
        BrokerConfig(producer_expiry_ms=value)
    assert f"producer_expiry_ms = {value!r}: must be an integer from 60000 to" in str(info.value)


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


def test_limits_table(tmp_path: Path) -> None:
    """Scenario: a [limits] table sets four keys. Expected: they are read; the others keep
    their documented defaults; the header limits reach every partition's log config (and
    are not [wal] keys)."""
    path = tmp_path / "b.toml"
    path.write_text(
        "[limits]\nmax_headers_per_record = 8\nmax_header_bytes = 1024\n"
        "max_streams_per_connection = 5\nmax_publish_stream_in_flight = 16\n"
    )
    config = BrokerConfig.from_toml(str(path))
    assert config.limits.max_headers_per_record == 8
    assert config.limits.max_streams_per_connection == 5
    assert config.limits.max_publish_stream_in_flight == 16
    assert config.limits.max_credit_per_consumer == 100_000
    assert config.limits.max_partitions_per_topic == 10_000
    log = config.log_config
    assert (log.max_headers_per_record, log.max_header_bytes, log.max_header_name_bytes) == (
        8,
        1024,
        256,
    )
    assert BrokerConfig().wal.max_headers_per_record is None


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("[limits]\nmax_headers = 3\n", "[limits]: unknown setting(s) max_headers"),
        (
            "[limits]\nmax_streams_per_connection = 0\n",
            "[limits] max_streams_per_connection = 0: must be an integer from 1 to 100000",
        ),
        ("[wal]\nmax_headers_per_record = 3\n", "[wal]: unknown setting(s) max_headers_per_record"),
        (
            "[broker]\ndefault_partitions = 8\n[limits]\nmax_partitions_per_topic = 4\n",
            "default_partitions = 8 is over [limits] max_partitions_per_topic = 4",
        ),
    ],
)
def test_bad_limits_name_the_key(tmp_path: Path, text: str, words: str) -> None:
    """Scenario: a [limits] key unknown or out of range, a header limit under [wal], and
    auto-created topics wider than the partition limit. Expected: ConfigError naming it."""
    path = tmp_path / "b.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        BrokerConfig.from_toml(str(path))
    assert words in str(info.value)
