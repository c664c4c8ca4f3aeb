"""``[subscriptions]`` in the TOML config: ``inactive_expiry_ms``, off by default, checked, and
refused with one line naming the key; the ``serve`` command prints that line, exit 2."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from broker.config import BrokerConfig, SubscriptionsConfig
from broker.errors import ConfigError
from tests.broker.test_cli_client import CLI


def load(tmp_path: Path, text: str) -> BrokerConfig:
    path = tmp_path / "headrace.toml"
    path.write_text(text)
    return BrokerConfig.from_toml(str(path))


def test_off_by_default_and_read_in_milliseconds(tmp_path: Path) -> None:
    """Scenario: no [subscriptions] table, an empty one, and one with a day's expiry.
    Expected: None, None, then 86400000 ms (86400 s for the registry)."""
    assert BrokerConfig().subscriptions.inactive_expiry_ms is None
    assert load(tmp_path, "[subscriptions]\n").subscriptions.inactive_expiry_s is None
    config = load(tmp_path, "[subscriptions]\ninactive_expiry_ms = 86400000\n")
    assert config.subscriptions == SubscriptionsConfig(inactive_expiry_ms=86_400_000)
    assert config.subscriptions.inactive_expiry_s == 86_400.0


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("0", "must be a positive integer of milliseconds"),
        ("-5", "must be a positive integer of milliseconds"),
        ("1.5", "must be a positive integer of milliseconds"),
        ('"7d"', "must be a positive integer of milliseconds"),
        ("true", "must be a positive integer of milliseconds"),
        ("315360000001", "must be at most 315360000000"),
    ],
)
def test_bad_values_name_the_key(tmp_path: Path, value: str, words: str) -> None:
    """Scenario: inactive_expiry_ms set to ``value``. Expected: ConfigError naming the file,
    [subscriptions] inactive_expiry_ms, the value and what is allowed, on one line."""
    with pytest.raises(ConfigError) as caught:
        load(tmp_path, f"[subscriptions]\ninactive_expiry_ms = {value}\n")
    message = str(caught.value)
    assert "[subscriptions] inactive_expiry_ms = " in message
    assert words in message
    assert "headrace.toml" in message
    assert "\n" not in message


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("[subscriptions]\ninactive_expiry = 5\n", "unknown setting(s) inactive_expiry"),
        ("subscriptions = 5\n", "subscriptions must be a table ([subscriptions]), not 5"),
    ],
)
def test_unknown_keys_and_a_non_table_are_refused(tmp_path: Path, text: str, words: str) -> None:
    """Scenario: a misspelt key, or ``subscriptions`` not a table. Expected: ConfigError
    saying which (and, for the key, the known ones)."""
    with pytest.raises(ConfigError, match="subscriptions") as caught:
        load(tmp_path, text)
    assert words in str(caught.value)


def test_serve_prints_one_line_and_exits_2(tmp_path: Path) -> None:
    """Scenario: ``headrace serve --config`` with inactive_expiry_ms = 0. Expected: exit 2,
    one line on stderr naming the key, no traceback, nothing created."""
    path = tmp_path / "headrace.toml"
    path.write_text("[subscriptions]\ninactive_expiry_ms = 0\n")
    done = subprocess.run(
        [*CLI, "serve", "--config", str(path), "--data-dir", str(tmp_path / "data")],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "[subscriptions] inactive_expiry_ms = 0" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "data").exists()
