"""The configuration reference page is generated from the code and says what the parser does.

The page (``docs/operations/configuration.md``) is rendered from the Structs of
``broker.config_schema`` (as ``broker.config_keys`` rows) and the defaults of
``BrokerConfig``. These tests fail when the committed page is stale, when
the parser knows a key the table does not (or the reverse), when a documented range is not
where the validator draws it, and when the page's file of defaults does not parse back to
the defaults.
"""

from __future__ import annotations

import re
import tomllib
from typing import Any

import pytest

from broker import config_reference
from broker.config import BrokerConfig
from broker.config_keys import KEYS, Key, Kind
from broker.errors import ConfigError

#: Keys whose range holds only together with another key's value (the validator compares
#: them): backoff_max_ms must be at least backoff_initial_ms.
COMPANIONS: dict[tuple[str, str], dict[str, Any]] = {
    ("dispatch", "backoff_max_ms"): {"backoff_initial_ms": 0},
    ("dispatch", "backoff_initial_ms"): {"backoff_max_ms": 86_400_000},
}


def test_the_committed_page_is_current() -> None:
    """Scenario: render the page from the code and compare with the committed file.
    Expected: identical, and `--check` exits 0; otherwise run
    `python -m broker.config_reference` and commit the page."""
    assert config_reference.PAGE.read_text() == config_reference.render()
    assert config_reference.main(["--check"]) == 0


def test_check_fails_on_a_stale_page(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """Scenario: `--check` against a page with one default edited by hand. Expected: exit 1
    (the check compares, it does not only look for the file)."""
    page = tmp_path / "docs" / "operations" / "configuration.md"
    page.parent.mkdir(parents=True)
    page.write_text(config_reference.render().replace("`17825792`", "`1000`"))
    monkeypatch.setattr(config_reference, "PAGE", page)
    assert config_reference.main(["--check"]) == 1


def _known_by_parser(table: str) -> set[str]:
    """The keys the parser accepts in ``[table]``, from its own unknown-key error."""
    with pytest.raises(ConfigError) as caught:
        BrokerConfig.from_mapping({table: {"no_such_key": 1}})
    return set(re.split(r", ", str(caught.value).split("known: ", 1)[1]))


@pytest.mark.parametrize("table", sorted({k.table for k in KEYS}))
def test_every_key_the_parser_knows_is_documented(table: str) -> None:
    """Scenario: one unknown key in each table; the parser's error lists the keys it knows.
    Expected: they are exactly the page's keys of that table (sub-tables such as
    `[wal.topics]` are documented as tables)."""
    documented = {k.name for k in KEYS if k.table == table}
    tables = {k.name for k in KEYS if k.table == table and k.kind is Kind.TABLE}
    assert _known_by_parser(table) | tables == documented


def _parse(k: Key, value: float) -> BrokerConfig:
    return BrokerConfig.from_mapping(
        {k.table: {**COMPANIONS.get((k.table, k.name), {}), k.name: value}}
    )


RANGED = [k for k in KEYS if k.low is not None]


@pytest.mark.parametrize("k", RANGED, ids=[f"{k.table}.{k.name}" for k in RANGED])
def test_every_documented_range_is_the_validators(k: Key) -> None:
    """Scenario: the key set to each end of its documented range, then one step past it
    (1 for integers, 0.001 for numbers). Expected: the ends are accepted, the steps past
    them refused with a ConfigError that names the key."""
    step = 1 if k.kind is Kind.INTEGER else 0.001
    assert k.low is not None
    low: float = int(k.low) if k.kind is Kind.INTEGER else k.low
    _parse(k, low)
    with pytest.raises(ConfigError, match=k.name.removesuffix("_ms")):
        _parse(k, low - step)
    if k.high is not None:
        high: float = int(k.high) if k.kind is Kind.INTEGER else k.high
        _parse(k, high)
        with pytest.raises(ConfigError, match=k.name.removesuffix("_ms")):
            _parse(k, high + step)


def test_every_toml_block_on_the_page_is_a_valid_config() -> None:
    """Scenario: each ```toml block of the page (the overrides example, the defaults).
    Expected: the broker's parser accepts each, and the overrides example sets what its
    comments say."""
    blocks = re.findall(r"^```toml\n(.*?)^```$", config_reference.render(), re.M | re.S)
    assert len(blocks) == 2
    configs = [BrokerConfig.from_mapping(tomllib.loads(block)) for block in blocks]
    overrides = configs[0]
    assert overrides.wal_topics["metrics"].fsync.value == "interval"
    assert overrides.heartbeat.interval_for("orders", "billing") == 0.05
    assert overrides.dispatch.subscriptions["orders/billing"].max_deliveries == 3


def test_the_file_of_defaults_parses_to_the_defaults() -> None:
    """Scenario: the page's "Every default in one file" TOML, parsed by the broker.
    Expected: a config equal to BrokerConfig() (every default and unit conversion on the
    page is the code's)."""
    page = config_reference.render()
    block = page.split("## Every default in one file", 1)[1]
    block = block.split("```toml\n", 1)[1].split("```", 1)[0]
    assert BrokerConfig.from_mapping(tomllib.loads(block)) == BrokerConfig()
    assert "ack_timeout_ms = 30000\n" in block  # seconds in the code, ms in the file
